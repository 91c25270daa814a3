"""``commscope watch`` and ``commscope dump``: attach, refresh, show; never touch the job.

Watching only reads keys of the job's store (``commscope dump`` also bumps one counter
that asks the ranks to dump, which is its purpose). Leaving (Ctrl-C) closes the client
and nothing else. Every failure (no store, wrong token, a store that goes away) ends
with one sentence and exit status 1, never a traceback.
"""

from __future__ import annotations

import glob
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from commscope.analyze.read.load import LATER_DIR
from commscope.watch.address import Address, WatchError, resolve_address
from commscope.watch.live import LiveCache, Thresholds, snapshot
from commscope.watch.source import StoreSource

__all__ = ["resolve_address", "run_watch", "run_dump", "SnapshotMaker"]

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
    """``commscope dump``: ask every rank of a running job to dump, wait for the files,
    run the analysis; the job keeps running."""
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
        n = source.request_dump()
        write(f"asked the {world} ranks of the job at {address} for their dumps "
              f"(request {n}); waiting up to {wait_s:g} s")
        deadline = time.monotonic() + wait_s
        fresh: set[int] = set()
        ended = ""
        next_look = time.monotonic() + 1.0
        while time.monotonic() < deadline and len(fresh) < world:
            # a rank that already dumped for an incident (a hang) keeps that file and
            # writes this one beside it, into commscope_later/
            aside = {r for r in range(world) if _later_mtime(later_dir, r) > before_later[r]}
            fresh = aside | {r for r in range(world) if _mtime(f"{prefix}{r}") > before[r]}
            if len(fresh) < world and time.monotonic() >= next_look:
                ended = _job_ended(source)  # a dead job never answers: do not wait it out
                if ended:
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
        if aside:
            write(f"{len(aside)} rank(s) had already dumped for an incident: their dumps of "
                  f"this request are in {later_dir}, and the analysis below reads each "
                  "rank's first dump of the incident (the state when it began)")
        if len(fresh) < world:
            late = sorted(set(range(world)) - fresh)
            write(f"{len(late)} rank(s) did not dump in time: {late[:16]}; analyzing the rest")
        from commscope.analyze import analyze, format_report

        folder = os.path.dirname(prefix) or "."
        result = analyze(folder, prefix=os.path.basename(prefix), world_size=world)
        write(format_report(result, folder))
        return 0
    except WatchError as exc:
        print(f"commscope dump: {exc}", file=sys.stderr)
        return 1


def _job_ended(source: StoreSource) -> str:
    """Why the job cannot answer a dump request any more (its store is gone, or no rank
    has published for a while), or ``""`` while it still can."""
    try:
        fetched = source.fetch()
    except WatchError as exc:
        return f"the job ended while waiting for its dumps ({exc})"
    interval = float(fetched.meta.get("interval_s") or 2.0)
    silent = Thresholds(interval).silent
    quiet = [b.quiet_s for b in fetched.beats.values()]
    if quiet and min(quiet) > silent:
        return (f"no rank has published for {min(quiet):.0f} s: the job has ended, or every "
                "process is frozen")
    return ""


def _later_mtime(later_dir: str, rank: int) -> float:
    """When rank ``rank`` last wrote a dump on request into ``commscope_later/``."""
    names = glob.glob(os.path.join(glob.escape(later_dir), f"{rank}.{_REQUEST_SLUG}.*"))
    return max((_mtime(n) for n in names), default=0.0)


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0
