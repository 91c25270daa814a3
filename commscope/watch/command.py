"""``commscope watch`` and ``commscope dump``: attach, refresh, show; never touch the job.

Watching only reads keys of the job's store (``commscope dump`` also bumps one counter
that asks the ranks to dump, which is its purpose). Leaving (Ctrl-C) closes the client
and nothing else. Every failure (no store, wrong token, a store that goes away) ends
with one sentence, never a traceback, and exit status 1 for ``watch``;
``commscope dump`` exits with the verdict (:mod:`commscope.exitcodes`), 7 when it got no
dump to read.
"""

from __future__ import annotations

import glob
import json
import os
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

from commscope.analyze.diagnose.hosts import host_phrase
from commscope.analyze.read.load import LATER_DIR
from commscope.analyze.text import rank_list
from commscope.exitcodes import UNREADABLE, for_verdict
from commscope.watch.address import Address, WatchError, resolve_address
from commscope.watch.live import LiveCache, Thresholds, lost_hosts, silent_ranks, snapshot
from commscope.watch.source import Fetched, StoreSource

__all__ = ["resolve_address", "run_watch", "run_dump", "SnapshotMaker", "incident_summary"]

_REQUEST_SLUG = "request-from-commscope-dump"
"""How the recorder names a later dump made for ``commscope dump`` (its reason, as a
file name: ``commscope.flight.out.dump.later_path``)."""


class SnapshotMaker:
    """Fetch + analysis of one refresh, with the thresholds of this watch."""

    def __init__(self, source: StoreSource, stall_s: float | None = None,
                 interval_s: float | None = None) -> None:
        self.source = source
        self.stall_s = stall_s
        self.interval_s = interval_s
        self.cache = LiveCache()

    def __call__(self) -> dict[str, Any]:
        """One snapshot now (raises :class:`WatchError` when the store is gone)."""
        fetched = self.source.fetch()
        interval = self.interval_s or float(fetched.meta.get("interval_s") or 2.0)
        snap = snapshot(fetched, thresholds=Thresholds(interval, self.stall_s),
                        store=str(self.source.address), cache=self.cache)
        snap["dump_prefix"] = fetched.meta.get("dump_prefix")
        return snap


def _connect(address: Address) -> StoreSource:
    source = StoreSource(address)
    source.connect()
    return source


def run_watch(address: Address, *, once: bool = False, as_json: bool = False,
              web: bool = False, host: str = "127.0.0.1", port: int = 0,
              stall_s: float | None = None, refresh_s: float | None = None,
              out: Callable[[str], None] | None = None) -> int:
    """The ``commscope watch`` command; returns the exit status."""
    write = out or (lambda text: print(text, flush=True))
    try:
        source = _connect(address)
        make = SnapshotMaker(source, stall_s=stall_s)
        if once:
            snap = make()
            if as_json:
                write(json.dumps(snap, indent=1))
            else:
                from rich.console import Console

                from commscope.watch.view import render

                Console().print(render(snap))
            return 0
        if web:
            from commscope.watch.web import serve

            return serve(make, host=host, port=port, token=address.token, write=write,
                         refresh_s=refresh_s or float(source.meta.get("interval_s") or 2.0))
        return _live_terminal(make, refresh_s or float(source.meta.get("interval_s") or 2.0))
    except WatchError as exc:
        print(f"commscope watch: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0


def _live_terminal(make: SnapshotMaker, refresh_s: float) -> int:
    from rich.console import Console
    from rich.live import Live

    from commscope.watch.view import render

    console = Console()
    snap = make()
    with Live(render(snap), console=console, refresh_per_second=4, screen=False) as live:
        while True:
            time.sleep(max(0.2, refresh_s))
            try:
                snap = make()
            except WatchError as exc:
                live.stop()
                print(f"commscope watch: {exc}", file=sys.stderr)
                return 1
            live.update(render(snap))


def run_dump(address: Address, *, wait_s: float = 60.0,
             out: Callable[[str], None] | None = None) -> int:
    """``commscope dump``: ask every rank of a running job, on every host, to dump; say at
    once what every rank's live record shows (all hosts), list every dump as
    ``host:path``, and analyze the files where this machine can read them all (one host,
    or a shared folder). The job keeps running. Returns the exit status: the verdict of
    the files' analysis (:func:`commscope.exitcodes.for_verdict`), or of the live records
    when some files are on other hosts; 7 (``UNREADABLE``) when no dump could be got or
    read.

    Each rank notes through the store where it wrote its dump (``dumped/<rank>``), so
    the wait ends as soon as every rank has written, wherever its file lies; it never
    waits out ``wait_s`` for files on other hosts' disks. A rank that has published
    nothing for the live view's silent threshold (frozen, or gone with its host) cannot
    answer: once every other rank has written, the wait ends, and those ranks are named
    by host (``hostB: ranks 2-3 did not answer: no record since 12:03:10 ...``)."""
    write = out or (lambda text: print(text, flush=True))
    try:
        source = _connect(address)
        world = source.world_size or 0
        prefix = address.dump_prefix or source.meta.get("dump_prefix")
        if not prefix:
            raise WatchError("the job does not say where its dumps go (no dump_prefix)")
        later_dir = os.path.join(os.path.dirname(prefix), LATER_DIR)
        before = {r: _mtime(f"{prefix}{r}") for r in range(world)}
        before_later = {r: _later_mtime(later_dir, r) for r in range(world)}
        counts = {r: note["count"] for r, note in source.dump_notes().items()}
        n = source.request_dump()
        write(f"asked the {world} ranks of the job at {address} for their dumps "
              f"(request {n}); waiting up to {wait_s:g} s")
        deadline = time.monotonic() + wait_s
        fresh: set[int] = set()
        notes: dict[int, dict[str, Any]] = {}
        aside: set[int] = set()
        ended = ""
        silent: dict[int, float] = {}
        last: Fetched | None = None
        next_look = time.monotonic() + 1.0
        while time.monotonic() < deadline and len(fresh) < world:
            notes = {r: note for r, note in source.dump_notes().items()
                     if note["count"] > counts.get(r, 0)}
            # a rank that already dumped for an incident (a hang) keeps that file and
            # writes this one beside it, into commscope_later/ (older ranks write no note:
            # their files are looked for here)
            aside = {r for r in range(world) if _later_mtime(later_dir, r) > before_later[r]}
            fresh = set(notes) | aside | {r for r in range(world)
                                          if _mtime(f"{prefix}{r}") > before[r]}
            if len(fresh) < world and time.monotonic() >= next_look:
                # a dead job never answers, nor does a silent rank: do not wait them out
                ended, silent, last = _job_state(source)
                if ended or set(range(world)) - fresh <= set(silent):
                    break
                next_look = time.monotonic() + 1.0
            time.sleep(0.2)
        if not fresh:
            if ended:
                raise WatchError(f"{ended}; no rank wrote a dump")
            raise WatchError(f"no rank wrote a dump within {wait_s:g} s (are they publishing? "
                             "a rank sees the request when it next publishes)")
        if ended:
            write(ended)
        aside |= {r for r, note in notes.items()
                  if os.path.basename(os.path.dirname(note["path"])) == LATER_DIR}
        if len(fresh) < world:
            late = sorted(set(range(world)) - fresh)
            for line in _unanswered(last, late, silent):
                write(line)
        live = _live_verdict(source, write)
        _list_dumps(notes, write)
        if aside:
            write(f"{len(aside)} rank(s) had already dumped for an incident: their dumps of "
                  f"this request are in {LATER_DIR}/ beside them, and an analysis of the "
                  "files reads each rank's first dump of the incident (the state when it "
                  "began)")
        folders, away = _reachable(notes, fresh, prefix)
        if away:
            hosts = sorted({notes[r]["host"] for r in away if r in notes})
            write(f"the files of {len(away)} rank(s) are on other hosts ({', '.join(hosts)}), "
                  "not readable from here: the verdict above comes from every rank's live "
                  "record; for the full analysis, copy those folders here (or pack them) and "
                  "run `commscope analyze` with every folder or archive")
            return for_verdict(live)
        return _analyze_files(source, folders, prefix, world, write)
    except WatchError as exc:
        print(f"commscope dump: {exc}", file=sys.stderr)
        return UNREADABLE


def _analyze_files(source: StoreSource, folders: list[str], prefix: str, world: int,
                   write: Callable[[str], None]) -> int:
    """``commscope analyze``'s report of the dumps this machine can read; the exit
    status of its verdict, 7 when no file could be read."""
    from commscope.analyze import analyze, format_report

    target: Any = folders[0] if len(folders) == 1 else folders
    # the live view's stall threshold: an op younger than that was caught in flight
    stall = Thresholds(float(source.meta.get("interval_s") or 2.0)).stall
    try:
        result = analyze(target, prefix=os.path.basename(prefix), world_size=world,
                         stall_s=stall)
    except (FileNotFoundError, NotADirectoryError, ValueError) as exc:
        print(f"commscope dump: cannot read the dumps: {exc}", file=sys.stderr)
        return UNREADABLE
    write(format_report(result, ", ".join(folders)))
    return UNREADABLE if not result.load.dumps else for_verdict(result.verdict)


_LIVE_VERDICT = {"stuck": "hang", "desync": "desync", "healthy": "healthy",
                 "behind": "healthy", "slow": "healthy"}
"""The live view's state as the analyzer's verdict (a crashed rank among the findings
of a stuck job makes it ``crash``); ``gone``, ``waiting`` and no snapshot:
``incomplete``."""


def _live_verdict(source: StoreSource, write: Callable[[str], None],
                  stall_s: float | None = None) -> str:
    """What every rank's progress record says right now, all hosts (the live view's
    analysis): printed before any file is read. Returns it as the analyzer's verdict
    (:data:`_LIVE_VERDICT`)."""
    try:
        snap = SnapshotMaker(source, stall_s=stall_s)()
    except WatchError as exc:
        write(f"no live verdict: {exc}")
        return "incomplete"
    state = str(snap.get("state", "?"))
    write(f"live verdict (every rank's record, all hosts): {state.upper()}: "
          f"{snap.get('headline', '')}")
    for f in snap.get("findings", [])[:4]:
        write(f"  [{f['kind']}] {f['message']}")
    for f in snap.get("desyncs", [])[:4]:  # told by the ranks' running fingerprints
        write(f"  [{f['kind']}] {f['message']}")
    if state == "stuck" and any(f.get("kind") == "crashed_rank"
                                for f in snap.get("findings", [])):
        return "crash"
    return _LIVE_VERDICT.get(state, "incomplete")


def incident_summary(source: StoreSource, notes: dict[int, dict[str, Any]],
                     write: Callable[[str], None], *, stall_s: float | None = None) -> None:
    """The whole-job answer a job's own log carries after an incident (``commscope run``'s
    reporter, :mod:`commscope.watch.joblog`): the verdict of every rank's live record, all
    hosts, as ``commscope dump`` prints it; every dump of the incident as ``host:folder``;
    the ranks that noted none; and how to get the full analysis of the files.

    ``notes`` are the ranks' notes of this incident (rank → host, path, reason);
    ``stall_s`` is when an unfinished op counts as stuck (default: the live view's)."""
    _live_verdict(source, write, stall_s=stall_s)
    _list_dumps(notes, write)
    world = source.world_size or 0
    missing = sorted(set(range(world)) - set(notes))
    if missing:
        write(f"no dump noted by {len(missing)} rank(s): {rank_list(missing)} (crashed, "
              "frozen, or not written yet)")
    folders = sorted({_analysis_folder(n["path"]) for n in notes.values()})
    if len({n["host"] for n in notes.values()}) > 1:
        write("for the full analysis of the files, copy every host's folder (or an "
              "archive of it) to one machine and run `commscope analyze` with all of them")
    elif folders:
        write(f"for the full analysis of the files: commscope analyze {' '.join(folders)}")


def _analysis_folder(path: str) -> str:
    """The dump folder ``commscope analyze`` reads for a dump at ``path`` (a later dump of
    an incident lies in ``commscope_later/`` inside it)."""
    folder = os.path.dirname(path)
    return os.path.dirname(folder) if os.path.basename(folder) == LATER_DIR else folder


def _list_dumps(notes: dict[int, dict[str, Any]], write: Callable[[str], None]) -> None:
    """Every dump of this request as ``host:folder`` with its ranks, one line per host
    and folder."""
    if not notes:
        return
    by_place: dict[tuple[str, str], list[int]] = {}
    for r, note in sorted(notes.items()):
        by_place.setdefault((note["host"], os.path.dirname(note["path"])), []).append(r)
    write(f"dumps ({len(notes)} ranks, {len({h for h, _ in by_place})} host(s)):")
    for (host, folder), ranks in by_place.items():
        write(f"  {host}:{folder}/  ranks {rank_list(ranks)}")


def _reachable(notes: dict[int, dict[str, Any]], fresh: set[int],
               prefix: str) -> tuple[list[str], list[int]]:
    """(folders to analyze, ranks whose files this machine cannot read). A file counts
    as readable when it was written on this host, or it is here with the size its rank
    noted (a shared folder); a rank without a note (an older recorder) wrote into this
    host's dump folder."""
    me = socket.gethostname()
    folders: list[str] = []
    away: list[int] = []
    for r in sorted(fresh):
        note = notes.get(r)
        if note is None:
            folder = os.path.dirname(prefix) or "."
        else:
            path = note["path"]
            size = note.get("bytes")
            here = note["host"] == me or (os.path.exists(path) and (
                size is None or os.path.getsize(path) == size))
            if not here:
                away.append(r)
                continue
            folder = os.path.dirname(path)
            if os.path.basename(folder) == LATER_DIR:
                folder = os.path.dirname(folder)
        if folder not in folders:
            folders.append(folder)
    return folders, away


def _job_state(source: StoreSource) -> tuple[str, dict[int, float], Fetched | None]:
    """Why the job cannot answer a dump request any more (its store is gone, or no rank
    has published for the silent threshold), or ``""`` while it still can; the ranks
    that are silent (rank → seconds since their newest record); the refresh itself."""
    try:
        fetched = source.fetch()
    except WatchError as exc:
        return f"the job ended while waiting for its dumps ({exc})", {}, None
    interval = float(fetched.meta.get("interval_s") or 2.0)
    silent = silent_ranks(fetched, Thresholds(interval))
    if fetched.records and len(silent) == len(fetched.records):
        return (f"no rank has published for {min(silent.values()):.0f} s: the job has ended, "
                "or every process is frozen"), silent, fetched
    return "", silent, fetched


def _unanswered(fetched: Fetched | None, late: list[int], silent: dict[int, float]) -> list[str]:
    """The ranks that wrote no dump for this request, in one line per host whose every
    rank is silent (``hostB: ranks 2-3 did not answer: no record since 12:03:10 (9 s:
    frozen, or gone with their host); no dump of theirs``), one for the other silent
    ones, one for the rest (still publishing, but late)."""
    lines = []
    quiet = [r for r in late if r in silent]
    lost = lost_hosts(fetched, quiet) if fetched is not None else []
    for host in lost:
        lines.append(f"{host_phrase(host['host'], host['ranks'])} did not answer: no record "
                     f"since {host['since']} ({host['silent_s']:.0f} s: frozen, or gone with "
                     "their host); no dump of theirs")
    told = {r for host in lost for r in host["ranks"]}
    alone = [r for r in quiet if r not in told]
    if alone:
        lines.append(f"{len(alone)} rank(s) did not answer: {rank_list(alone)}, no record for "
                     f"{max(silent[r] for r in alone):.0f} s (frozen, or gone); no dump of "
                     "theirs")
    rest = [r for r in late if r not in silent]
    if rest:
        lines.append(f"{len(rest)} rank(s) did not dump in time: {rest[:16]}")
    return lines


def _later_mtime(later_dir: str, rank: int) -> float:
    """When rank ``rank`` last wrote a dump on request into ``commscope_later/``."""
    names = glob.glob(os.path.join(glob.escape(later_dir), f"{rank}.{_REQUEST_SLUG}.*"))
    return max((_mtime(n) for n in names), default=0.0)


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0
