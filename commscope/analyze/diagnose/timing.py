"""Findings that need time: stragglers, stale dumps, collectives stalled with everyone in.

Stragglers (:func:`straggler_findings`), per group:

1. Take the newest ``window`` sequence numbers (default 256; fewer on huge jobs: about
   400 000 arrivals are read in all, at least 8 collectives per group) that every
   member with a dump recorded and finished, where they agree.
2. For each, the arrival of a rank is its ``time_created_ns``; the last to arrive and
   its lag behind the first are noted.
3. Who straggles is decided by :meth:`~commscope.analyze.align.arrivals.Arrivals.stragglers`
   with the measured defaults (:data:`~commscope.analyze.align.arrivals.DEFAULT_THRESHOLDS`,
   ``threshold_ms`` for the lag): a rank last at enough of them, far enough behind,
   costing the others enough of their time; on several hosts a whole host whose ranks
   come last together is named as one finding (its ranks are its culprits). Arrivals
   are on rank 0's clock when the dumps carry their clock offsets (ours do): the
   message says so on several hosts.

Stale dumps (:func:`stale_dumps`): with ``dump_time_ns`` in at least three dumps (ours
write it), a dump written more than ``stale_s`` seconds before the median of the others
stopped being updated early: that rank crashed or hung before the others dumped.

Stalled (:func:`stalled_findings`): an unfinished collective that every member issued
with the same signature while none finished it is stalled in the transport, not in the
program; reported only with evidence that it is old (the dump says ``timeout`` or the
record is older than a minute at dump time), since a healthy job dumped mid-collective
looks the same.

Caught running (:func:`caught_running`): when every rank dumped on demand (an API call,
``commscope dump``, SIGUSR1) and no unfinished op was older than the stall threshold
(:data:`ON_DEMAND_STALL_S`) at its own rank's dump time, the job was running: the ranks
inside a collective were caught mid-flight. The findings that only read unfinished work
as waits give way to one ``healthy`` finding that says who and for how long; a
disagreement between ranks is still reported.

Open work (:func:`open_work`): a rank's unfinished records, less the gloo collectives
that finished though their mark lags: issued alike by every member of a group whose
members all reached the same newest collective (:func:`posted_alike`: gloo finishes
such a call unless its transport is stuck), and followed on that rank by a finished
one, alike too (a group's calls finish in turn).

Dump reasons (:func:`reason_class`) fall in the columns of the verdict table
(:data:`commscope.analyze.diagnose.findings.VERDICT_TABLE`): on demand, timeout, signal,
exception, thread exception, other, none.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Iterable
from dataclasses import replace

from commscope.analyze.align.arrivals import (
    DEFAULT_THRESHOLDS,
    STRAGGLER_MS,
    WINDOW,
    Arrivals,
    HostLag,
    Thresholds,
    group_arrivals,
)
from commscope.analyze.diagnose.context import Context
from commscope.analyze.model import COMPLETED, GAP, RETIRED, Finding
from commscope.analyze.text import frame_text, ms, rank_list, ranks_phrase
from commscope.collectives import BROADCAST, GATHER, REDUCE, SCATTER

__all__ = ["straggler_findings", "stale_dumps", "stalled_findings", "caught_running",
           "pending_age_ns", "open_work", "posted_alike", "ON_DEMAND_REASONS",
           "ON_DEMAND_STALL_S", "REASONS", "reason_class", "job_reason"]

_DONE = RETIRED | COMPLETED
_OLD_NS = 60 * 10**9


def straggler_findings(
    ctx: Context, threshold_ms: float | None = None, window: int = WINDOW,
    thresholds: Thresholds | None = None,
) -> list[Finding]:
    """Steps 1-3 of the module doc (the figures: :mod:`commscope.analyze.align.arrivals`);
    ``thresholds`` (default: the measured ones) with its lag replaced by ``threshold_ms``
    (``None``: :data:`~commscope.analyze.align.arrivals.STRAGGLER_MS`)."""
    th = replace(thresholds or DEFAULT_THRESHOLDS,
                 lag_ms=STRAGGLER_MS if threshold_ms is None else threshold_ms)
    findings = []
    known = ctx.arrivals if ctx.arrivals is not None and window == WINDOW else None
    for key, got in (known or group_arrivals(ctx.load, ctx.views, window)).items():
        if got.samples < th.min_timed or not got.last:
            continue
        hosts = {ctx.load.dumps[r].hostname for r in got.ranks} - {None}
        clock = " (on rank 0's clock)" if len(hosts) > 1 else ""
        slow_hosts, slow_ranks = got.stragglers(ctx.hosts.host, th)
        for h in slow_hosts:
            findings.append(_straggler(ctx, key, got, h.ranks, clock, h))
        for rank in slow_ranks:
            findings.append(_straggler(ctx, key, got, [rank], clock, None))
    return findings


def _straggler(ctx: Context, key: str, got: Arrivals, ranks: list[int], clock: str,
               host: HostLag | None) -> Finding:
    """One ``straggler`` finding: a rank, or a whole host (``host``)."""
    view = ctx.views[key]
    hi = got.hi
    lags = host.lags if host is not None else got.lags[ranks[0]]
    last = host.last if host is not None else got.last[ranks[0]]
    lag = statistics.median(lags)
    p90 = sorted(lags)[min(len(lags) - 1, int(0.9 * len(lags)))]
    rank = max(ranks, key=lambda r: (got.last.get(r, 0), -r))  # the one last most often
    who = f"Rank {rank}"
    whole = ""
    latest = "its latest"
    if host is not None:
        who = f"Host {host.host} (ranks {rank_list(host.ranks)})"
        whole = ", each of its ranks in turn: the whole host is slow, not one rank"
        latest = f"the latest of rank {rank} (last most often)"
    where = frame_text(ctx.frame_at(rank, key, hi))
    details: dict[str, object] = {"lag_ns": lag, "lag_p90_ns": p90, "samples": got.samples,
                                  "last": last, "lost_share": round(got.lost_share(), 4)}
    if host is not None:
        details["host"] = host.host
    return Finding(
        kind="straggler", group=view.group, collective_seq_id=hi,
        op=ctx.sig(rank, key, hi).op if ctx.sig(rank, key, hi) else None,
        culprit_ranks=list(ranks), waiting_ranks=[],
        message=(f"{who} arrived last at {last} of the {got.samples} newest finished "
                 f"collectives of {view.group.label()}, a median {ms(lag)} (p90 {ms(p90)}) "
                 f"after the first rank{clock}{whole}; the group's ranks lost "
                 f"{got.lost_share() * 100:.1f} % of their time waiting for late arrivals; "
                 f"{latest} is {ctx.op_at(rank, key, hi)} at {where}."),
        details=details,
    )


def stale_dumps(ctx: Context, stale_s: float = 30.0) -> dict[int, int]:
    """Rank → ns its dump is older than the others' median (see module doc)."""
    times = {r: d.dump_time_ns for r, d in ctx.load.dumps.items() if d.dump_time_ns}
    if len(times) < 3:
        return {}
    ordered = sorted(times.values())
    out = {}
    for r, t in times.items():
        gap = _median_without(ordered, t) - t
        if gap > stale_s * 1e9:
            out[r] = int(gap)
    return out


def _median_without(ordered: list[int], value: int) -> float:
    """The median of ``ordered`` (sorted) with one copy of ``value`` left out, in
    O(log n): thousands of ranks each compared with all the others stay linear."""
    i = bisect.bisect_left(ordered, value)
    m = len(ordered) - 1

    def at(k: int) -> int:
        return ordered[k] if k < i else ordered[k + 1]

    return at(m // 2) if m % 2 else (at(m // 2 - 1) + at(m // 2)) / 2


def stalled_findings(ctx: Context) -> list[Finding]:
    """Collectives everyone joined and nobody finished, with evidence of age."""
    findings = []
    for key in sorted(ctx.views):
        view = ctx.views[key]
        if view.nodump or view.unknown or not view.spans:
            continue
        ranks = sorted(view.spans)
        mismatched = {m.seq for m in view.mismatches}
        candidates = sorted({s for r in ranks for g, s, _ in open_work(ctx, r)
                             if g == key and 0 < s <= view.min_hi and s not in mismatched})
        for seq in candidates:
            tracks = [ctx.load.dumps[r].tracks[key] for r in ranks]
            if any(t.lo > seq for t in tracks):
                continue
            if any(t.status[seq - t.lo] & _DONE for t in tracks):
                continue
            oldest = min(t.created[seq - t.lo] for t in tracks)
            reasons = [ctx.load.dumps[r].dump_reason or "" for r in ranks]
            dumped = [ctx.load.dumps[r].dump_time_ns or 0 for r in ranks]
            aged = max(dumped) - oldest if max(dumped) and oldest > 0 else 0
            if not (any("timeout" in x for x in reasons) or aged > _OLD_NS):
                continue
            age = f" for {ms(aged)}" if aged > 0 else ""
            findings.append(Finding(
                kind="stalled_collective", group=view.group, collective_seq_id=seq,
                op=ctx.sig(ranks[0], key, seq).op if ctx.sig(ranks[0], key, seq) else None,
                culprit_ranks=[], waiting_ranks=ranks,
                message=(f"All of {view.group.label()} issued {ctx.op_at(ranks[0], key, seq)} "
                         f"with the same sizes and none finished it{age}: the program agrees, "
                         f"the transport is stuck (network, NCCL, a GPU); "
                         f"{ranks_phrase(ranks[:1])} called it at "
                         f"{frame_text(ctx.frame_at(ranks[0], key, seq))}."),
                blocking=True,
            ))
            break
    return findings


ON_DEMAND_REASONS = ("api", "request from commscope dump", "signal SIGUSR1")
"""Dump reasons that ask for a dump of a job that may well be running (no incident):
``flight.dump()``, ``commscope dump``, SIGUSR1."""

REASONS = ("on demand", "timeout", "signal", "exception", "thread exception", "other",
           "none")
"""What dumps are written for (:func:`reason_class`): the columns of the verdict table
(:data:`commscope.analyze.diagnose.findings.VERDICT_TABLE`)."""


def reason_class(reason: str | None) -> str:
    """The column of the verdict table for one dump's ``dump_reason``: ``on demand``
    (:data:`ON_DEMAND_REASONS`), ``timeout`` (the recorder's watchdog saw an op past its
    timeout or failing: ``timeout``, ``collective error``, and ``request from rank N``,
    the dumps that rank asked the others for), ``signal`` (any other signal: SIGTERM,
    SIGINT, ...), ``exception`` (the rank raised), ``thread exception`` (a thread of it
    died), ``other`` (a reason the program named, ``flight.dump(reason=...)``) or
    ``none`` (no reason: PyTorch's native dumps)."""
    if not reason:
        return "none"
    if reason in ON_DEMAND_REASONS:
        return "on demand"
    if reason in ("timeout", "collective error") or reason.startswith("request from rank"):
        return "timeout"
    if reason.startswith("signal"):
        return "signal"
    if reason == "exception":
        return "exception"
    if reason.startswith("exception in thread"):
        return "thread exception"
    return "other"


_PRECEDENCE = ("exception", "timeout", "signal", "other", "thread exception", "on demand",
               "none")


def job_reason(reasons: Iterable[str | None]) -> str:
    """What a job's dumps were written for, as one column: the incident when any dump
    answers one (an exception first, then a timeout, a signal, a reason the program
    named, a thread's death), ``on demand`` when every dump was asked for, ``none`` when
    no dump says (also for no dump at all)."""
    seen = {reason_class(r) for r in reasons}
    return next((c for c in _PRECEDENCE if c in seen), "none")


ON_DEMAND_STALL_S = 10.0
"""In dumps taken on demand, an op unfinished for less than this is caught mid-flight."""


_ROOTED = (BROADCAST, REDUCE, GATHER, SCATTER)


def posted_alike(ctx: Context, group: str, seq: int) -> bool:
    """Whether every member of ``group`` left a dump holding collective ``seq`` and they
    all issued it alike (the same op, sizes, dtypes, root, reduce op; a rooted op only
    where the records keep its root, as commscope's do: PyTorch's keep none): gloo
    finishes such a collective unless its transport is stuck (it runs no device queue,
    and a call it cannot match is a disagreement, never alike)."""
    g = ctx.groups.get(group)
    if seq < 0 or ctx.device or g is None or not g.ranks:
        return False
    keys = set()
    for r in g.ranks:
        d = ctx.load.dumps.get(r)
        t = d.tracks.get(group) if d is not None else None
        if t is None or t.mk is None or not t.lo <= seq <= t.hi or t.sig[seq - t.lo] == GAP:
            return False
        sig = ctx.load.sigs.sigs[t.sig[seq - t.lo]]
        if sig.op in _ROOTED and sig.root is None:
            return False  # alike sizes say too little of a rooted op without its root
        keys.add(t.mk[seq - t.lo])
    return len(keys) == 1


def open_work(ctx: Context, rank: int) -> list[tuple[str, int, int]]:
    """``rank``'s unfinished records (``(group, seq, index)``, oldest first), without the
    collectives that finished though their mark lags: every member of its group reached
    the same newest collective, every member issued this one alike
    (:func:`posted_alike`), and a later one, also issued alike by every member,
    finished on that rank (PyTorch's recorder retires a gloo collective just after the
    call returns, so a native dump taken right then can catch one unmarked while the
    next is marked; commscope's recorder marks an async collective when it is waited
    for). On a device
    backend the records are a device queue: :attr:`RankDump.pending` as it is."""
    d = ctx.load.dumps.get(rank)
    if d is None or not d.pending:
        return []
    if ctx.device:
        return list(d.pending)
    out = []
    for group, seq, index in d.pending:
        t = d.tracks.get(group) if seq >= 0 else None
        view = ctx.views.get(group)
        if view is None or view.frontier is not None:
            out.append((group, seq, index))  # members stopped apart: the waits tell
            continue
        if t is not None and t.lo <= seq <= t.hi and posted_alike(ctx, group, seq) and any(
                t.status[later - t.lo] & _DONE and posted_alike(ctx, group, later)
                for later in range(seq + 1, t.hi + 1)):
            continue
        out.append((group, seq, index))
    return out


def pending_age_ns(ctx: Context, rank: int, pending: list[tuple[str, int, int]] | None = None
                   ) -> int | None:
    """How long ``rank``'s oldest unfinished op (of ``pending``, default its dump's
    unfinished records) had been running when it dumped, on the rank's own clock (both
    times are its own: no host's clock is compared with another's); ``None`` without
    unfinished work or a dump time."""
    d = ctx.load.dumps.get(rank)
    work = d.pending if d is not None and pending is None else pending
    if d is None or not work or d.dump_time_ns is None:
        return None
    group, seq, index = work[0]
    if seq >= 0:
        t = d.tracks.get(group)
        if t is None or not t.lo <= seq <= t.hi:
            return None
        created = t.created[seq - t.lo]
    else:
        created = next((op.created for op in d.p2p if op.index == index), 0)
    return max(0, d.dump_time_ns - created) if created else None


def caught_running(ctx: Context, stall_s: float = ON_DEMAND_STALL_S) -> Finding | None:
    """A ``healthy`` finding when the job was running as it dumped: every rank has a
    dump, every dump was asked for on demand (:data:`ON_DEMAND_REASONS`: an API call,
    ``commscope dump``, SIGUSR1, not an incident), and no unfinished op was older than
    ``stall_s`` at its rank's dump time. Ranks are then caught mid-collective, not
    stuck; the finding says which and for how long (``details["caught_running"]``: rank
    → ns). ``None`` otherwise (also when no rank was inside a collective)."""
    dumps = ctx.load.dumps
    if not dumps or any(r not in dumps for r in ctx.expected):
        return None
    if any(reason_class(d.dump_reason) != "on demand" for d in dumps.values()):
        return None
    work = {r: open_work(ctx, r) for r in dumps}
    ages = {r: age for r in dumps if (age := pending_age_ns(ctx, r, work[r])) is not None}
    if any(work[r] for r in dumps if r not in ages):
        return None  # unfinished work of unknown age: cannot say it was fresh
    if not ages or max(ages.values()) >= stall_s * 1e9:
        return None
    ranks = sorted(ages)
    reasons = ", ".join(sorted({d.dump_reason or "" for d in dumps.values()}))
    return Finding(
        kind="healthy", group=None, collective_seq_id=None, op=None, culprit_ranks=[],
        waiting_ranks=[],
        message=(f"The dumps were asked for while the job ran ({reasons}), and "
                 f"{ranks_phrase(ranks)} {'was' if len(ranks) == 1 else 'were'} inside a "
                 f"collective for at most {ms(max(ages.values()))}, under the "
                 f"{stall_s:g} s stall threshold: caught mid-collective, not stuck."),
        details={"caught_running": {r: ages[r] for r in ranks}},
    )
