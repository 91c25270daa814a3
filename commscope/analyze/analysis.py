"""The facade: ``analyze(path)`` loads, aligns, diagnoses and returns an :class:`Analysis`.

Algorithm (:func:`analyze`):

1. Load every dump safely (:func:`commscope.analyze.read.load.load_dumps`); several
   inputs or an archive are read as one folder (:mod:`commscope.analyze.read.inputs`).
2. Decide the expected ranks and every group's members
   (:func:`commscope.analyze.align.match.build_groups`).
3. Line up each group's collectives by sequence number
   (:func:`commscope.analyze.align.match.align_group`) and pair p2p ops
   (:func:`commscope.analyze.align.match.match_p2p`).
4. Diagnose (:func:`commscope.analyze.diagnose.findings.diagnose`) into findings, root cause
   first, and a verdict.

Nothing here imports torch: it runs on a laptop that never saw the job.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from commscope.analyze.align.arrivals import STRAGGLER_MS, group_arrivals
from commscope.analyze.align.match import (
    GroupView,
    align_all,
    build_groups,
    expected_ranks,
    match_p2p,
)
from commscope.analyze.align.progress import build_progress
from commscope.analyze.answer import Answer, make_answer
from commscope.analyze.diagnose.context import Context
from commscope.analyze.diagnose.findings import diagnose, verdict
from commscope.analyze.diagnose.hosts import host_rows, hosts_to_exclude
from commscope.analyze.diagnose.timing import ON_DEMAND_STALL_S
from commscope.analyze.model import Finding, Group, HostMap, LoadResult, Unreadable
from commscope.analyze.read.archive import is_archive_name
from commscope.analyze.read.frame_source import FrameSource
from commscope.analyze.read.inputs import Unpacking, gather
from commscope.analyze.read.load import load_dumps
from commscope.analyze.summary import slowest_rows, stuck_lines

__all__ = ["FORMAT", "Analysis", "analyze", "analyze_loaded"]

FORMAT = "commscope.analysis/2"
"""The ``format`` string of the analysis JSON."""


@dataclass
class Analysis:
    """The outcome of one analysis: verdict, findings and everything behind them."""

    verdict: str
    """``healthy``, ``hang``, ``desync``, ``crash`` or ``incomplete``."""
    expected: list[int]
    loaded: list[int]
    missing: list[int]
    unreadable: list[Unreadable]
    findings: list[Finding]
    """Root cause first."""
    groups: dict[str, Group]
    views: dict[str, GroupView]
    load: LoadResult
    elapsed_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    hosts: HostMap = field(default_factory=lambda: HostMap({}))
    """Where every rank ran (from the dumps' places and host tables)."""
    stuck: list[str] = field(default_factory=list)
    """One line per stuck place, for the top of every report (:mod:`~.summary`)."""
    slowest: list[dict[str, Any]] = field(default_factory=list)
    """Per group, the ranks that arrive last most often and what it costs the others
    (:func:`~.summary.slowest_rows`)."""
    answer: Answer = field(default_factory=lambda: Answer(headline=""))
    """The first screen: headline, root cause, stuck places, what next, notes
    (:mod:`~.answer`)."""

    @property
    def root_cause(self) -> Finding:
        """The first finding."""
        return self.findings[0]

    def to_json(self) -> dict[str, Any]:
        """The analysis in the documented ``commscope.analysis/2`` shape."""
        return {
            "format": FORMAT,
            "verdict": self.verdict,
            "answer": self.answer.to_json(),
            "ranks": {
                "expected": list(self.expected),
                "loaded": list(self.loaded),
                "missing": list(self.missing),
            },
            "unreadable": [{"file": u.file, "error": u.error} for u in self.unreadable],
            "other_jobs": [{"file": u.file, "rank": u.rank, "reason": u.error}
                           for u in self.load.other_jobs],
            "findings": [f.to_json() for f in self.findings],
            "hosts": host_rows(self.hosts, set(self.loaded), self.findings),
            "exclude_hosts": hosts_to_exclude(self.hosts, self.findings),
            "stuck": list(self.stuck),
            "slowest": list(self.slowest),
        }


def analyze_loaded(load: LoadResult, *, world_size: int | None = None,
                   straggler_ms: float = STRAGGLER_MS, stall_s: float = ON_DEMAND_STALL_S,
                   in_memory: dict[str, list[Any]] | None = None) -> Analysis:
    """Steps 2-4 of :func:`analyze` on dumps that are already loaded (``in_memory``:
    path → records, for dumps that are not files). ``straggler_ms=inf`` (the live view:
    a record's few entries cannot time anyone) skips the arrival figures altogether."""
    start = time.perf_counter()
    expected = expected_ranks(load, world_size)
    groups = build_groups(load, expected)
    if not world_size:  # the user's --world-size stands; else every member counts
        expected = sorted(set(expected).union(*(g.ranks for g in groups.values())))
    issues = match_p2p(load, groups)  # resolves every op's peer first
    progress = build_progress(load, groups)
    views = align_all(load, groups, progress)
    ctx = Context(load=load, groups=groups, views=views, p2p=issues, expected=expected,
                  frames=FrameSource(load, in_memory), hosts=HostMap(load.dumps),
                  arrivals=group_arrivals(load, views) if straggler_ms != float("inf")
                  else {}, progress=progress)
    findings = diagnose(ctx, straggler_ms=straggler_ms, stall_s=stall_s)
    loaded = sorted(load.dumps)
    decided = verdict(findings)
    stuck = stuck_lines(findings, load, groups, ctx.hosts)
    return Analysis(
        verdict=decided,
        expected=expected,
        loaded=loaded,
        missing=sorted(set(expected) - set(loaded)),
        unreadable=list(load.unreadable),
        findings=findings,
        groups=groups,
        views=views,
        load=load,
        elapsed_s=time.perf_counter() - start,
        hosts=ctx.hosts,
        stuck=stuck,
        slowest=slowest_rows(ctx.arrivals or {}, groups, ctx.hosts, straggler_ms),
        answer=make_answer(decided, findings, load, ctx.hosts, stuck),
    )


def analyze(
    path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    prefix: str | None = None,
    world_size: int | None = None,
    jobs: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    straggler_ms: float = STRAGGLER_MS,
    stall_s: float = ON_DEMAND_STALL_S,
    end_times: bool = False,
    unpacking: Unpacking | None = None,
) -> Analysis:
    """Analyze the flight-recorder dumps under ``path``: a folder, a file, an archive
    (``.tar``, ``.tar.gz``/``.tgz``, ``.zip``) or a list of them, read as one folder.

    ``prefix`` selects file names (``nccl_trace_rank_``); ``world_size`` says how many
    ranks the job had when the dumps cannot tell (gloo); ``jobs`` worker processes read
    files in parallel; ``progress(done, total)`` follows the loading;
    ``stall_s``: in dumps asked for on demand (no incident), an op unfinished for less
    than this was caught mid-flight, not stuck;
    ``straggler_ms`` is the median lag from which a rank that keeps arriving last is
    reported (default :data:`~commscope.analyze.align.arrivals.STRAGGLER_MS`, measured:
    the other thresholds are :data:`~commscope.analyze.align.arrivals.DEFAULT_THRESHOLDS`);
    ``end_times`` keeps each record's completion time for the timeline
    exports (they read the files again without it; always kept from archives, whose
    unpacked files are gone when this returns); ``unpacking(archive, done, total)``
    follows the bytes of each archive. With a list or an archive,
    ``result.extra["inputs"]`` holds one
    :class:`~commscope.analyze.read.inputs.InputReport` per input. Raises
    ``FileNotFoundError`` for a path that does not exist, ``ValueError`` for one that
    is neither a folder, a file nor a supported archive.
    """
    start = time.perf_counter()
    if isinstance(path, (str, os.PathLike)) and not is_archive_name(path):
        load = load_dumps(path, prefix=prefix, jobs=jobs, progress=progress,
                          end_times=end_times, world_size=world_size)
        result = analyze_loaded(load, world_size=world_size, straggler_ms=straggler_ms,
                                stall_s=stall_s)
    else:
        paths = [path] if isinstance(path, (str, os.PathLike)) else list(path)
        with gather(paths, prefix=prefix, unpacking=unpacking) as inputs:
            load = inputs.load(jobs=jobs, progress=progress, world_size=world_size,
                               end_times=end_times or inputs.archives)
            result = analyze_loaded(load, world_size=world_size, straggler_ms=straggler_ms,
                                    stall_s=stall_s)
            inputs.settle(result.load)  # the files are read no more: show the users' paths
        result.unreadable = list(result.load.unreadable)
        result.extra["inputs"] = inputs.reports
    result.elapsed_s = time.perf_counter() - start
    return result
