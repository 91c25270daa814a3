"""The job log's incident reporter (``commscope run`` → ``commscope job-log``), on a fake
store: what counts as an incident, what each host's log says, once per incident; and the
launcher's side (starting and ending the reporter). Real jobs: tests/dist/test_watch_jobs.py
(one host), tests/dist/test_flight_run.py (a crash), tests/hosts/test_job_log.py (2 hosts).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from commscope.flight.launch import local_world_size, start_reporter, stop_reporter
from commscope.watch.address import WatchError
from commscope.watch.joblog import LauncherLink, Reporter, is_incident

TRACES = "/tmp/job/commscope_traces"


def test_what_counts_as_an_incident():
    for reason in ("timeout", "collective error", "exception", "signal SIGTERM",
                   "request from rank 3"):
        assert is_incident(reason), reason
    for reason in ("request from commscope dump", "signal SIGUSR1", "api", "watch"):
        assert not is_incident(reason), reason


def test_the_launcher_link_reads_the_end_and_the_end_of_the_pipe():
    r, w = os.pipe()
    link = LauncherLink(r)
    start = time.monotonic()
    assert not link.wait(0.05) and time.monotonic() - start >= 0.04
    os.write(w, b"end 3\n")
    assert link.wait(5) and link.rc == 3
    os.close(w)
    os.close(r)
    r, w = os.pipe()
    os.close(w)  # the launcher is gone: no word, just the end
    gone = LauncherLink(r)
    assert gone.wait(5) and gone.rc is None
    os.close(r)


class FakeStore:
    """The calls the reporter makes of a StoreSource, scripted: ``events[n]`` runs before
    the n-th call (``key_count`` and ``dump_notes`` counted together) is answered."""

    def __init__(self, world: int, rank0_host: str, events: dict[int, Any]) -> None:
        self.world_size = world
        self.meta = {"host": rank0_host}
        self.notes: dict[int, dict[str, Any]] = {}
        self.keys = 10
        self.calls = 0
        self.events = events
        self.gone = False
        self.asked: list[list[int] | None] = []

    def connect(self) -> None:
        if self.gone:
            raise WatchError("nothing listens")

    def _call(self) -> None:
        self.calls += 1
        event = self.events.get(self.calls)
        if event is not None:
            event(self)
        if self.gone:
            raise WatchError("the job's store stopped answering")

    def key_count(self) -> int:
        self._call()
        return self.keys

    def dump_notes(self, ranks: list[int] | None = None) -> dict[int, dict[str, Any]]:
        self._call()
        self.asked.append(None if ranks is None else list(ranks))
        wanted = range(self.world_size) if ranks is None else ranks
        return {r: self.notes[r] for r in wanted if r in self.notes}


def _note(host: str, rank: int, reason: str, count: int = 1, folder: str = TRACES) -> dict:
    return {"host": host, "path": f"{folder}/rank_{rank}", "reason": reason, "count": count,
            "bytes": 100, "time_ns": time.time_ns()}


def _dump(store: FakeStore, notes: dict[int, dict[str, Any]]) -> None:
    store.keys += sum(r not in store.notes for r in notes)  # a first note adds a key
    store.notes.update(notes)


def _watch_file(tmp_path: Path, host: str, rank: int, world: int, **extra: Any) -> Path:
    path = tmp_path / "watch.json"
    data = {"store": "hostA:29500", "token": "secret-token", "world_size": world,
            "dump_prefix": f"{TRACES}/rank_", "host": host, "rank": rank,
            "written_ns": time.time_ns(), **extra}
    path.write_text(json.dumps(data))
    return path


def _run(tmp_path: Path, store: FakeStore, *, host: str, first: int, local: int,
         end_at: int, rc: int = 1, file_host: str | None = None,
         **file_extra: Any) -> tuple[list[str], Reporter]:
    """Run a reporter for ``host`` on ``store`` until the launcher says ``end RC`` (before
    the ``end_at``-th store call); return the lines it wrote."""
    r, w = os.pipe()
    before = store.events.get(end_at)

    def end(s: FakeStore) -> None:
        if before is not None:
            before(s)
        os.write(w, f"end {rc}\n".encode())
        os.close(w)

    store.events[end_at] = end
    out: list[str] = []
    path = _watch_file(tmp_path, file_host or host, first, store.world_size, **file_extra)
    reporter = Reporter(str(path), since_ns=time.time_ns() - 10**9, local_ranks=local,
                        settle_s=0.5, poll_s=0.001, write=out.append, host=host,
                        connect=lambda address: store)
    reporter._summary = lambda job, notes: [  # type: ignore[method-assign]
        f"WHOLE JOB: {sorted(notes)}"]
    try:
        assert reporter.run(LauncherLink(r)) == 0
    finally:
        os.close(r)
    return "".join(out).splitlines(), reporter


def test_a_host_without_rank_0_names_its_own_dumps_once(tmp_path):
    store = FakeStore(4, "hostA", {3: lambda s: _dump(s, {
        2: _note("hostB", 2, "timeout"), 3: _note("hostB", 3, "request from rank 2")})})
    lines, reporter = _run(tmp_path, store, host="hostB", first=2, local=2, end_at=12)
    assert lines == [f"commscope: hostB: ranks 2, 3 dumped to hostB:{TRACES}/ (timeout, "
                     "request from rank 2)"], lines
    assert reporter.reports == 1  # the same notes, read again, are not a new incident
    assert all(asked is not None and set(asked) <= {2, 3} for asked in store.asked)
    assert not any("secret-token" in line for line in lines)


def test_rank_0s_host_adds_the_whole_job_after_every_rank_noted(tmp_path):
    events = {
        3: lambda s: _dump(s, {0: _note("hostA", 0, "timeout")}),
        5: lambda s: _dump(s, {1: _note("hostA", 1, "timeout"),
                               2: _note("hostB", 2, "timeout")}),
        6: lambda s: _dump(s, {3: _note("hostB", 3, "request from rank 0")}),
        # a later incident: rank 0 dumps again (into commscope_later/), then is reported
        20: lambda s: _dump(s, {0: _note("hostA", 0, "signal SIGTERM", count=2,
                                         folder=f"{TRACES}/commscope_later")}),
    }
    lines, reporter = _run(tmp_path, FakeStore(4, "hostA", events), host="hostA", first=0,
                           local=2, end_at=30)
    assert lines[:3] == [
        f"commscope: hostA: ranks 0, 1 dumped to hostA:{TRACES}/ (timeout)",
        "commscope: incident (timeout on ranks 0-2): the whole job, all hosts, from every "
        "rank's live record:",
        "commscope: WHOLE JOB: [0, 1, 2, 3]"], lines
    assert reporter.reports == 2
    assert lines[3] == (f"commscope: hostA: rank 0 dumped to "
                        f"hostA:{TRACES}/commscope_later/ (signal SIGTERM)"), lines
    assert lines[4].startswith("commscope: hostA: rank 1 noted no dump within 0.5 s"), lines


def test_dumps_asked_for_by_the_user_are_no_incident(tmp_path):
    store = FakeStore(2, "hostA", {3: lambda s: _dump(s, {
        0: _note("hostA", 0, "request from commscope dump"),
        1: _note("hostA", 1, "signal SIGUSR1")})})
    lines, _ = _run(tmp_path, store, host="hostA", first=0, local=2, end_at=8, rc=0)
    assert lines == []


def test_a_store_gone_with_the_job_leaves_this_hosts_files_named(tmp_path):
    traces = tmp_path / "traces"
    traces.mkdir()
    (traces / "rank_2").write_bytes(b"x")
    store = FakeStore(4, "hostA", {4: lambda s: setattr(s, "gone", True)})
    lines, _ = _run(tmp_path, store, host="hostB", first=2, local=2, end_at=4, rc=1,
                    dump_prefix=str(traces / "rank_"))
    assert lines[0] == f"commscope: hostB: rank 2 dumped to hostB:{traces}/ (found on this " \
        "host's disk after the job ended)", lines
    assert lines[1] == "commscope: hostB: rank 3 left no dump here", lines
    assert lines[2].startswith("commscope: the job ended (exit code 1) and its store at "
                               "hostA:29500 with it: no whole-job verdict"), lines
    assert len(lines) == 3


def test_a_watch_file_written_by_another_host_is_not_taken_for_this_ones(tmp_path):
    # a dump folder shared by the hosts (NFS) holds one watch file, the last writer's:
    # this host's ranks are then told by the notes' host
    store = FakeStore(4, "hostA", {3: lambda s: _dump(s, {
        r: _note("hostB" if r >= 2 else "hostA", r, "timeout") for r in range(4)})})
    lines, _ = _run(tmp_path, store, host="hostB", first=0, local=2, end_at=10, rc=0,
                    file_host="hostC")
    assert store.asked[0] is None  # not told which ranks are here: every rank's note
    assert lines == [f"commscope: hostB: ranks 2, 3 dumped to hostB:{TRACES}/ (timeout)"], lines


def test_an_older_watch_file_waits_for_the_new_one(tmp_path):
    path = _watch_file(tmp_path, "hostB", 2, 4, written_ns=1)
    reporter = Reporter(str(path), since_ns=time.time_ns(), write=lambda text: None,
                        host="hostB")
    assert reporter._read_file(reporter.since_ns) is None
    fresh = _watch_file(tmp_path, "hostB", 2, 4)
    assert reporter._read_file(reporter.since_ns).first_rank == 2 and fresh == path


# ---------------------------------------------------------------------- the launcher


def test_the_launcher_knows_how_many_ranks_run_here(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    assert local_world_size(["--nproc-per-node", "4", str(script)]) == 4
    assert local_world_size([str(script)]) == 1  # torchrun's default
    assert local_world_size(["--nproc-per-node", "gpu", str(script)]) == 0  # torchrun counts


def test_the_reporter_is_off_when_asked_or_when_nothing_publishes():
    env = {"COMMSCOPE_WATCH_FILE": "/nowhere/watch.json"}
    assert start_reporter([], {**env, "COMMSCOPE_RUN_REPORT": "0"}, 0) is None
    assert start_reporter([], {**env, "COMMSCOPE_WATCH_INTERVAL_S": "0"}, 0) is None
    assert start_reporter([], {}, 0) is None


@pytest.mark.parametrize("rc", [0, 1])
def test_the_reporter_gets_its_last_word_after_a_failure_only(rc):
    # a stand-in that writes what it read on stdin, slowly
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; line = sys.stdin.readline(); "
         "time.sleep(0.3); print('got', line.strip(), flush=True)"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=False)
    start = time.monotonic()
    stop_reporter(child, rc, grace_s=20)
    assert child.poll() is not None and time.monotonic() - start < 10
    said = child.stdout.read() if child.stdout else b""
    child.stdout.close()
    assert said == (b"got end 1\n" if rc else b""), said
