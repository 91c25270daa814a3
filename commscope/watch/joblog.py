"""What a job's own log says when the job hangs or fails: ``commscope run``'s reporter.

``commscope run`` (:mod:`commscope.flight.launch`) starts this beside torchrun on every
host, as a child process (``python -m commscope job-log``, a hidden subcommand: flight may
not import the analyzer, and a child process is not an import). It only reads the job's
store, with short timeouts, from a process of its own: it cannot slow or block the job.
What it prints goes to the launcher's stderr, which is the job's log on that host; every
line starts with ``commscope:``, and the watch token is never printed.

Algorithm (:class:`Reporter`):

1. Wait for this host's watch file (written by the host's first rank once the default
   group exists, and newer than the launcher), looking twice a second; nothing heavy is
   imported before it appears.
2. Attach a store client (:class:`~commscope.watch.source.StoreSource`, 2 s timeouts).
   This host's ranks are the watch file's rank (the host's first) and the next ones, as
   many as the launcher starts here (torchrun numbers a host's ranks in a row); rank 0
   runs here when the job's description in the store names this host. A watch file
   written by another host (a dump folder the hosts share) says nothing of this host's
   ranks: then every rank's note is read, and this host's are those naming it.
3. Every ``poll_s`` (1 s) one store call asks how many keys the store holds; only when
   that number changed are this host's ranks' dump notes (``dumped/<r>``,
   :mod:`commscope.flight.out.progress`) looked for, and the notes found so far are read
   again in one call: a running job costs the store one or two calls a second per host.
   An *incident* starts when one of them notes a dump not reported yet whose reason is an
   incident's (:func:`is_incident`): a timeout, a collective error, an exception, a
   signal other than SIGUSR1 (which, like ``commscope dump``, only asks for a dump while
   the job goes on), or another rank's request.
4. Then, every 0.25 s, it waits for the notes of this host's ranks (on rank 0's host:
   of every rank of the job) for at most ``settle_s`` (5 s), or until the job ends.
5. It prints, in one write: this host's part, one line per folder (``hostB: ranks 2, 3
   dumped to hostB:/tmp/job/commscope_traces/ (request from rank 1)``) and the ranks of
   this host with no dump; on rank 0's host, whose log is the one the user reads first,
   also the whole-job verdict from every rank's live record, all hosts, and every dump as
   ``host:folder/  ranks ...`` (:func:`~commscope.watch.command.incident_summary`, what
   ``commscope dump`` prints). Those notes are then reported; a later dump for a new
   incident starts the next report.
6. When the store stops answering, the reporter attaches again (to this file, or to a
   newer one a restarted job writes) until the launcher says the job ended: ``end RC`` on
   this process's stdin once torchrun ended with a failure. Dumps this host's ranks wrote
   during the job that no report named (the store went with the job before they were
   seen) are then named from this host's disk, with one line saying the store is gone,
   so no whole-job verdict can come from it. The end of stdin (the launcher is gone) ends
   the reporter.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from commscope.analyze.text import rank_list
from commscope.watch.address import Address, WatchError, read_watch_file

__all__ = ["Reporter", "LauncherLink", "is_incident", "run_job_log", "PREFIX"]

PREFIX = "commscope: "
"""What every line the reporter writes starts with."""
_INCIDENT_REASONS = ("timeout", "collective error", "exception", "signal ", "request from rank")
_NOT_INCIDENTS = ("signal SIGUSR1",)
_FILE_POLL_S = 0.5
_INCIDENT_POLL_S = 0.25
_STORE_TIMEOUT_S = 2.0
_DUMP_SUFFIXES = ("", ".json", ".gz", ".json.gz")
"""What a dump file's name may end with (its format and compression)."""
_REPORT_STALL_S = 1.0
"""After an incident, an op unfinished this long counts as stuck in the verdict (the live
view's default, two publishing intervals, would call a hang that just timed out with a
short timeout merely slow)."""


def is_incident(reason: str) -> bool:
    """Whether a dump's reason is an incident's (see module doc, step 3)."""
    return reason.startswith(_INCIDENT_REASONS) and reason not in _NOT_INCIDENTS


class LauncherLink:
    """What the launcher says on this process's stdin: ``end RC`` once torchrun ended;
    the end of the file once the launcher is gone."""

    def __init__(self, fd: int | None) -> None:
        self.fd = fd
        self.ended = False
        self.rc: int | None = None
        """torchrun's exit code, once the launcher said it."""
        self._buffer = b""

    def wait(self, seconds: float) -> bool:
        """Sleep ``seconds``, or less when the launcher speaks; whether the job ended."""
        deadline = time.monotonic() + max(0.0, seconds)
        while not self.ended:
            left = deadline - time.monotonic()
            if self.fd is None:
                time.sleep(max(0.0, left))
                break
            try:
                ready, _, _ = select.select([self.fd], [], [], max(0.0, left))
                data = os.read(self.fd, 256) if ready else None
            except (OSError, ValueError):
                data = b""
            if data is None:
                break
            if not data:
                self.ended = True
                break
            self._buffer += data
            while b"\n" in self._buffer:
                line, self._buffer = self._buffer.split(b"\n", 1)
                word, _, code = line.decode("ascii", "replace").partition(" ")
                if word == "end":
                    self.ended = True
                    self.rc = int(code) if code.strip().lstrip("-").isdigit() else None
        return self.ended


@dataclass
class _Job:
    """What this host's watch file says about the job, and the store client."""

    address: Address
    written_ns: int
    first_rank: int | None
    """This host's first rank (``None`` when another host wrote the file: a dump folder
    shared by the hosts has one watch file for all)."""
    world_size: int
    dump_prefix: str
    own: list[int] | None
    """This host's ranks (``None`` when the launcher could not say how many, or the file
    is another host's)."""
    source: Any = None
    """The :class:`~commscope.watch.source.StoreSource`, once attached."""
    rank0_here: bool = False
    """Whether rank 0 runs on this host (its log is the job's log): the job's description
    in the store names rank 0's host."""


def _ident(note: dict[str, Any]) -> tuple[Any, ...]:
    return (note.get("host"), note.get("path"), note.get("count"), note.get("time_ns"))


class Reporter:
    """Watches one host's part of a ``commscope run`` job for incidents (module doc)."""

    def __init__(self, watch_file: str, *, since_ns: int = 0, local_ranks: int = 0,
                 settle_s: float = 5.0, poll_s: float = 1.0,
                 write: Callable[[str], None] | None = None, host: str | None = None,
                 connect: Callable[[Address], Any] | None = None) -> None:
        self.watch_file = watch_file
        self.since_ns = since_ns
        self.local_ranks = local_ranks
        self.settle_s = settle_s
        self.poll_s = poll_s
        self.host = host or socket.gethostname()
        self._write = write or _to_stderr
        self._source = connect or _store_source
        self.reported: set[tuple[Any, ...]] = set()
        """The notes already named in a report."""
        self.reported_paths: set[str] = set()
        self.reports = 0
        self._said_gone = False

    # ------------------------------------------------------------------ the loop

    def run(self, link: LauncherLink) -> int:
        """Report every incident of the job until it ends (module doc); returns 0."""
        newer_than = self.since_ns
        job: _Job | None = None
        while not link.ended:
            found = self._wait_for_file(link, newer_than)
            if found is None:
                break
            job = found
            if self._attach(job, link):
                self._watch(job, link)
            # the store stopped answering: a slow moment (attach again), the job's end
            # (the launcher says so) or a restart (it writes a newer file)
            newer_than = job.written_ns
            link.wait(self.poll_s)
        if job is not None and link.rc not in (None, 0):
            self._after_the_end(job, link.rc)
        return 0

    def _wait_for_file(self, link: LauncherLink, newer_than: int) -> _Job | None:
        while True:
            job = self._read_file(newer_than)
            if job is not None:
                return job
            if link.wait(_FILE_POLL_S):
                return None

    def _read_file(self, newer_than: int) -> _Job | None:
        try:
            with open(self.watch_file, encoding="utf-8") as f:
                data = json.load(f)
            written = data.get("written_ns")
            if type(written) is not int:
                written = os.stat(self.watch_file).st_mtime_ns
            if written < newer_than:
                return None  # a file left by an earlier job (or attempt)
            address = read_watch_file(self.watch_file)
        except (OSError, ValueError, AttributeError, WatchError):
            return None
        first = data.get("rank")
        world = address.world_size or 0
        if type(first) is not int or first < 0 or world <= 0:
            return None
        if data.get("host", self.host) != self.host:
            first = None  # a shared dump folder: the last host to write it wrote it
        own = (list(range(first, min(world, first + self.local_ranks)))
               if first is not None and self.local_ranks > 0 else None)
        prefix = address.dump_prefix or os.path.join(
            os.path.dirname(os.path.abspath(self.watch_file)), "rank_")
        return _Job(address, written, first, world, prefix, own)

    def _attach(self, job: _Job, link: LauncherLink) -> bool:
        from commscope.watch.source import quiet_native_stderr

        while True:
            source = self._source(job.address)
            try:
                with quiet_native_stderr():
                    source.connect()
                job.source = source
                host = source.meta.get("host") if isinstance(source.meta, dict) else None
                job.rank0_here = host == self.host if host else job.first_rank == 0
                return True
            except WatchError:
                pass  # not announced yet, or already gone: look again
            if link.wait(self.poll_s):
                return False
            if self._read_file(job.written_ns + 1) is not None:
                return False  # a newer attempt of the job wrote its own file

    def _watch(self, job: _Job, link: LauncherLink) -> None:
        """Step 3 until the store goes away or the job ends."""
        from commscope.watch.source import quiet_native_stderr

        source = job.source
        # this host's ranks; its first only when the launcher did not say how many; every
        # rank (None) when the watch file does not say which is this host's first
        looked_for = (job.own if job.own is not None else
                      None if job.first_rank is None else [job.first_rank])
        known: set[int] = set()
        """Ranks of this host whose note exists: read again every round, in one call."""
        count: int | None = None
        while not link.wait(self.poll_s):
            try:
                with quiet_native_stderr():
                    keys = source.key_count()
                    if keys != count:
                        notes = source.dump_notes(looked_for)
                    else:
                        notes = source.dump_notes(sorted(known)) if known else {}
                count = keys
            except WatchError:
                return
            known.update(r for r, note in notes.items()
                         if looked_for is not None or note.get("host") == self.host)
            if any(self._fresh(note) for note in notes.values()):
                self._incident(job, link)

    def _fresh(self, note: dict[str, Any]) -> bool:
        """A note of an incident that no report has named yet (one of this host's, from
        before this launcher started, belongs to an earlier job)."""
        if not is_incident(str(note.get("reason", ""))) or _ident(note) in self.reported:
            return False
        if note.get("host") == self.host:
            return int(note.get("time_ns") or 0) >= self.since_ns
        return True

    # ------------------------------------------------------------------ an incident

    def _incident(self, job: _Job, link: LauncherLink) -> None:
        """Steps 4-5: wait for the notes (bounded), then one report."""
        from commscope.watch.source import quiet_native_stderr

        source = job.source
        whole = job.rank0_here or job.own is None
        started = time.monotonic()
        notes: dict[int, dict[str, Any]] = {}
        gone = ""
        while True:
            try:
                with quiet_native_stderr():
                    seen = source.dump_notes(None if whole else job.own)
            except WatchError as exc:
                gone = str(exc)
                break
            notes = {r: n for r, n in seen.items() if self._fresh(n)}
            mine = self._own_ranks(job, notes)
            waiting = (len(notes) < job.world_size if job.rank0_here
                       else not set(mine) <= set(notes))
            if not waiting or time.monotonic() - started >= self.settle_s:
                break
            if link.wait(_INCIDENT_POLL_S):
                break
        lines = self._own_lines(job, notes)
        if gone:
            lines.append(self._gone_line(job, link.rc))
        elif job.rank0_here:
            lines.append(f"incident ({_origin(notes)}): the whole job, all hosts, from "
                         "every rank's live record:")
            lines += self._summary(job, notes)
        self._emit(lines)
        self.reported.update(_ident(n) for n in notes.values())
        self.reported_paths.update(str(n.get("path")) for n in notes.values())

    def _own_ranks(self, job: _Job, notes: dict[int, dict[str, Any]]) -> list[int]:
        if job.own is not None:
            return job.own
        first = set() if job.first_rank is None else {job.first_rank}
        return sorted(first | {r for r, n in notes.items() if n.get("host") == self.host})

    def _own_lines(self, job: _Job, notes: dict[int, dict[str, Any]]) -> list[str]:
        """Where the dumps of this host's ranks went, one line per folder."""
        mine = self._own_ranks(job, notes)
        by_folder: dict[str, list[int]] = {}
        reasons: dict[str, list[str]] = {}
        for r in mine:
            note = notes.get(r)
            if note is None:
                continue
            folder = os.path.dirname(str(note.get("path")))
            by_folder.setdefault(folder, []).append(r)
            why = str(note.get("reason", "?"))
            if why not in reasons.setdefault(folder, []):
                reasons[folder].append(why)
        lines = [f"{self.host}: {_ranks(ranks)} dumped to {self.host}:{folder}/ "
                 f"({', '.join(reasons[folder])})" for folder, ranks in by_folder.items()]
        missing = [r for r in mine if r not in notes]
        if missing:
            lines.append(f"{self.host}: {_ranks(missing)} noted no dump within "
                         f"{self.settle_s:g} s (crashed, frozen, or still writing)")
        return lines

    def _summary(self, job: _Job, notes: dict[int, dict[str, Any]]) -> list[str]:
        from commscope.watch.command import incident_summary
        from commscope.watch.source import quiet_native_stderr

        lines: list[str] = []
        with quiet_native_stderr():
            incident_summary(job.source, notes, lines.append, stall_s=_REPORT_STALL_S)
        return lines

    def _gone_line(self, job: _Job, rc: int | None) -> str:
        self._said_gone = True
        ended = "the job ended" if rc is None else f"the job ended (exit code {rc})"
        place = (f"commscope analyze {os.path.dirname(job.dump_prefix)}"
                 if job.own is not None and len(job.own) == job.world_size else
                 "`commscope analyze` with every host's dump folder (each host's log "
                 "names its own)")
        return (f"{ended} and its store at {job.address} with it: no whole-job verdict "
                f"from the live records; the verdict from the files: {place}")

    # ------------------------------------------------------------------ the end

    def _after_the_end(self, job: _Job, rc: int) -> None:
        """Step 6: name this host's dumps that no report named, from this host's disk."""
        mine = (job.own if job.own is not None else
                [] if job.first_rank is None else [job.first_rank])
        found = []
        for r in mine:
            for path in (f"{job.dump_prefix}{r}{ext}" for ext in _DUMP_SUFFIXES):
                try:
                    written = os.stat(path).st_mtime_ns
                except OSError:
                    continue
                if written >= self.since_ns and path not in self.reported_paths:
                    found.append(r)
                break
        if not found:
            return
        folder = os.path.dirname(job.dump_prefix)
        lines = [f"{self.host}: {_ranks(found)} dumped to {self.host}:{folder}/ (found on "
                 "this host's disk after the job ended)"]
        missing = [r for r in mine if r not in found]
        if job.own is not None and missing:
            lines.append(f"{self.host}: {_ranks(missing)} left no dump here")
        if not self._said_gone:
            lines.append(self._gone_line(job, rc))
        self._emit(lines)

    def _emit(self, lines: Sequence[str]) -> None:
        text = "".join(f"{PREFIX}{part}\n" for line in lines for part in line.splitlines())
        self._write(text)
        self.reports += 1


def _store_source(address: Address) -> Any:
    """A store client for ``address`` (imports torch: only once a watch file is there)."""
    from commscope.watch.source import StoreSource

    return StoreSource(address, timeout_s=_STORE_TIMEOUT_S)


def _ranks(ranks: Sequence[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {rank_list(ranks)}"


def _origin(notes: dict[int, dict[str, Any]]) -> str:
    """What started the incident: the reasons other than a request from another rank, or
    the request when only requests were noted."""
    by_reason: dict[str, list[int]] = {}
    for r, note in sorted(notes.items()):
        by_reason.setdefault(str(note.get("reason", "?")), []).append(r)
    first = {why: rs for why, rs in by_reason.items() if not why.startswith("request from")}
    shown = first or by_reason
    return "; ".join(f"{why} on {_ranks(rs)}" for why, rs in shown.items()) or "no dump noted"


def _to_stderr(text: str) -> None:
    sys.stderr.write(text)
    sys.stderr.flush()


def run_job_log(watch_file: str, *, since_ns: int = 0, local_ranks: int = 0,
                settle_s: float = 5.0, poll_s: float = 1.0) -> int:
    """The hidden ``commscope job-log`` command ``commscope run`` starts beside torchrun
    (module doc); reads the launcher's word on stdin. Never a traceback in the job's log:
    a failure of its own is one line."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the launcher, which ends us
    try:
        fd: int | None = sys.stdin.fileno()
    except (OSError, ValueError, AttributeError):
        fd = None
    reporter = Reporter(watch_file, since_ns=since_ns, local_ranks=local_ranks,
                        settle_s=settle_s, poll_s=poll_s)
    try:
        return reporter.run(LauncherLink(fd))
    except Exception as exc:  # a bug of ours must not fill the job's log
        _to_stderr(f"{PREFIX}the job log's incident reporter stopped: {exc!r}\n")
        return 1
