"""``commscope watch`` and ``commscope dump`` on a real 4-rank gloo job under `commscope run`.

One job for the module (starting one costs seconds on two cores): it trains until the
tests make rank 3 stall in its data loader; then the watch must name rank 3 within two
publishing intervals past the stall threshold, ``commscope dump`` must get every rank's
dump while the job keeps running, and once the job is gone the watcher must say so in
one sentence.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from commscope import exitcodes
from commscope.cli import main
from commscope.watch.command import SnapshotMaker, resolve_address
from commscope.watch.source import StoreSource, WatchError
from tests.jobs.launch import REPO, descendants, start

pytestmark = [pytest.mark.dist, pytest.mark.timeout(180)]

INTERVAL_S = 0.5


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    j = start(tmp_path_factory.mktemp("watchjob"), interval_s=INTERVAL_S)
    try:
        j.info = j.watch_info()
        yield j
    finally:
        j.stop()


def _source(job) -> StoreSource:
    source = StoreSource(resolve_address(None, None, str(job.watch_file)))
    source.connect()
    return source


def _snap(job, capsys, *extra: str) -> dict:
    code = main(["watch", "--once", "--json", "--file", str(job.watch_file), *extra])
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out)


def test_a_wrong_token_is_refused_and_a_bad_address_is_one_sentence(job, capsys):
    assert main(["watch", "--once", "--file", str(job.watch_file), "--token", "nope"]) == 1
    err = capsys.readouterr().err
    assert "refused" in err and "token" in err and "Traceback" not in err
    assert main(["watch", "--once", "--store", "localhost"]) == 2
    assert "HOST:PORT" in capsys.readouterr().err
    assert main(["watch", "--once", "--file", str(job.folder / "nothing.json")]) == 1
    assert "no watch file" in capsys.readouterr().err


def test_watch_sees_the_job_progress(job, capsys):
    # the watch file appears when rank 0 publishes; on two busy cores the other ranks
    # may not have marked a step yet: wait until every rank has (a step of None is
    # "not yet", which `max` cannot compare)
    deadline = time.monotonic() + 60
    while True:
        first = _snap(job, capsys)
        if all(isinstance(r["step"], int) for r in first["ranks"]) and len(first["ranks"]) == 4:
            break
        assert time.monotonic() < deadline, json.dumps(first)[:3000]
        time.sleep(INTERVAL_S)
    time.sleep(3 * INTERVAL_S)
    second = _snap(job, capsys)
    assert first["world_size"] == second["world_size"] == 4
    assert second["state"] in ("healthy", "behind"), second["headline"]
    steps = lambda s: [r["step"] for r in s["ranks"]]  # noqa: E731
    assert all(isinstance(x, int) for x in steps(second)), json.dumps(second)[:3000]
    assert min(steps(second)) > max(steps(first))  # everyone moved on
    group = second["groups"][0]
    assert group["desc"] == "default_pg" and group["enqueued_max"] > first["groups"][0][
        "enqueued_max"]


def test_dump_of_a_healthy_running_job_never_says_hang(job, capsys):
    # the ranks are 0-50 ms into ordinary all_reduces when they dump: caught in flight
    assert main(["dump", "--file", str(job.watch_file), "--wait-s", "30"]) == 0
    out = capsys.readouterr().out
    assert "live verdict (every rank's record, all hosts): HEALTHY" in out, out
    assert "verdict: HEALTHY" in out and "HANG" not in out, out
    # for the right reason: the ranks inside a collective are named as caught in flight
    # (or none was inside one), never a wait
    # (the report wraps its lines, possibly at the hyphen)
    assert re.search(r"caught mid-\s*collective|none has\s+unfinished\s+work", out), out
    assert f"{socket.gethostname()}:{job.folder / 'commscope_traces'}/  ranks 0-3" in out, out


def test_a_stalled_rank_is_named_within_two_intervals(job, capsys):
    # one attached watcher, as `commscope watch` keeps (each --once connects anew)
    make = SnapshotMaker(_source(job))
    assert make()["state"] in ("healthy", "behind")
    job.stall_file.write_text("now")
    at_file = job.stall_file.with_name("stall.at")
    deadline = time.monotonic() + 60
    while not at_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    stalled_at = float(at_file.read_text())
    while time.monotonic() < deadline:
        snap = make()
        if snap["state"] == "stuck":
            break
        time.sleep(0.1)
    named_after = time.time() - stalled_at
    assert snap["state"] == "stuck", snap
    root = snap["findings"][0]
    story = json.dumps(snap, indent=1)[:4000]
    assert (root["kind"], root["culprit_ranks"], root["waiting_ranks"]) == (
        "missing_rank", [3], [0, 1, 2]), story
    assert "load_batch" in snap["headline"] and "rank 3" in snap["headline"]
    assert "alive and in no collective" in root["message"]
    assert named_after <= snap["stall_s"] + 2 * INTERVAL_S + 1.0, named_after


def test_dump_of_the_running_job_and_the_job_goes_on(job, capsys):
    assert main(["dump", "--file", str(job.watch_file), "--wait-s", "30"]) == exitcodes.HANG
    out = capsys.readouterr().out
    assert "verdict: HANG" in out and "[missing_rank] Rank 3 never joined" in out
    traces = job.folder / "commscope_traces"
    assert sorted(p.name for p in traces.glob("rank_*")) == [f"rank_{r}" for r in range(4)]
    assert job.proc.poll() is None  # still running
    assert _snap(job, capsys)["state"] == "stuck"  # and still publishing


def _workers(job) -> list[int]:
    out = []
    for pid in descendants(job.proc.pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
                if (b"commscope.flight.bootstrap" in cmdline
                        and b"torch.distributed.run" not in cmdline):
                    out.append(pid)
        except OSError:
            continue
    return out


def test_dump_notices_a_job_that_stopped_publishing(job, capsys):
    # every rank frozen (the store, in torchrun's agent, still answers): nobody can dump,
    # and `commscope dump` says so within seconds instead of waiting its full minute
    workers = _workers(job)
    assert len(workers) == 4
    for pid in workers:
        os.kill(pid, signal.SIGSTOP)
    try:
        start = time.monotonic()
        assert main(["dump", "--file", str(job.watch_file), "--wait-s", "60"]) == (
            exitcodes.UNREADABLE)  # no dump to read
        took = time.monotonic() - start
    finally:
        for pid in workers:
            os.kill(pid, signal.SIGCONT)
    err = capsys.readouterr().err
    assert "no rank has published for" in err and "no rank wrote a dump" in err, err
    assert took < 20, took


def test_a_job_that_ended_is_told_at_once_without_torch_noise(job, capsys):
    job.stop()
    for command in ("watch", "dump"):
        start = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "commscope", command, "--file", str(job.watch_file)],
            capture_output=True, text=True, timeout=60,
            env={**os.environ, "PYTHONPATH": str(REPO)})
        took = time.monotonic() - start
        # watch: 1; dump gives the verdict table's "no dump could be read"
        assert proc.returncode == (1 if command == "watch" else exitcodes.UNREADABLE), (
            proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, proc.stderr  # one sentence, none of torch's retries
        assert lines[0].startswith(f"commscope {command}: the job at ")
        assert "has ended" in lines[0] and "was written" in lines[0]
        assert took < 5, took  # no torch import, no store client: one refused connect
    # the watcher already attached when the job ended says it in one sentence too
    assert main(["watch", "--once", "--file", str(job.watch_file)]) == 1
    err = capsys.readouterr().err
    assert "commscope watch:" in err and "Traceback" not in err and "has ended" in err


def test_a_store_that_vanishes_under_an_attached_watcher_is_one_sentence(tmp_path, capsys):
    job = start(tmp_path / "vanish", interval_s=INTERVAL_S)
    try:
        job.watch_info()
        make = SnapshotMaker(_source(job))
        make()
    finally:
        job.stop()
    with pytest.raises(WatchError) as err:
        make()
    assert "stopped answering" in str(err.value) and "ended" in str(err.value)


def test_dump_after_a_hang_was_dumped_reads_the_incident_and_says_where_the_new_ones_are(
        tmp_path, capsys):
    # the job hangs, every rank dumps for the incident (timeout 2 s); a later `commscope
    # dump` must not wait for files that will never change: the answers go beside them.
    # First, the job's own log (`commscope run`'s reporter) carries the verdict, seconds
    # after the first dump, with no command typed
    job = start(tmp_path / "hung", interval_s=INTERVAL_S, COMMSCOPE_FR_TIMEOUT_S="2")
    try:
        job.watch_info()
        job.stall_file.write_text("now")
        traces = job.folder / "commscope_traces"
        deadline = time.monotonic() + 60
        while len(list(traces.glob("rank_*"))) < 4:
            assert time.monotonic() < deadline, job.log()
            time.sleep(0.05)
        logged_after = _verdict_in_the_log(job, traces)
        time.sleep(max(0.0, 1.0 - logged_after))
        start_s = time.monotonic()
        assert main(["dump", "--file", str(job.watch_file), "--wait-s", "30"]) == (
            exitcodes.HANG)
        took = time.monotonic() - start_s
        out = capsys.readouterr().out
    finally:
        job.stop()
    assert "4 rank(s) had already dumped for an incident" in out, out
    assert "verdict: HANG" in out and "[missing_rank] Rank 3 never joined" in out
    later = sorted(p.name for p in (traces / "commscope_later").iterdir())
    assert later == [f"{r}.request-from-commscope-dump.pkl" for r in range(4)], later
    assert took < 15, took
    # the job's log: one report, the verdict naming rank 3 where it stalls, every dump
    log = (job.folder / "job.log").read_text()
    ours = [line for line in log.splitlines() if line.startswith("commscope: ")]
    host = socket.gethostname()
    verdict = next(line for line in ours if _LOG_VERDICT in line)
    assert "STUCK" in verdict and "rank 3" in verdict and "load_batch" in verdict, verdict
    assert f"commscope:   {host}:{traces}/  ranks 0-3" in ours, log
    assert f"commscope: for the full analysis of the files: commscope analyze {traces}" in ours
    assert sum(_LOG_VERDICT in line for line in ours) == 1, log  # not again for the request
    assert job.watch_info()["token"] not in log
    print(f"first dump -> verdict in the job's log: {logged_after:.2f} s")
    assert logged_after < 10, (logged_after, log)


_LOG_VERDICT = "live verdict (every rank's record, all hosts):"


def _verdict_in_the_log(job, traces) -> float:
    """Seconds from the first dump (its own time) to the verdict in the job's log."""
    import pickle

    deadline = time.monotonic() + 30
    while _LOG_VERDICT not in (job.folder / "job.log").read_text():
        assert time.monotonic() < deadline, job.log()
        time.sleep(0.02)
    seen = time.time()
    first = min(pickle.loads(p.read_bytes())["dump_time_ns"] for p in traces.glob("rank_*"))
    return seen - first / 1e9


def _master_port(job, timeout: float = 60.0) -> int:
    """The job's store port, read from a worker's environment as soon as one exists."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in _workers(job):
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = dict(item.split(b"=", 1) for item in f.read().split(b"\0")
                               if b"=" in item)
            except OSError:
                continue
            if b"MASTER_PORT" in env:
                return int(env[b"MASTER_PORT"])
        time.sleep(0.01)
    raise TimeoutError(f"no worker with MASTER_PORT: {job.log()}")


def _files(folder) -> list[str]:
    """The files and folders in ``folder``, hidden ones (the armed fatal logs) left out."""
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))


def test_an_outsider_on_the_store_reads_but_cannot_make_the_job_dump(tmp_path, capsys):
    # Someone on the cluster network, with torch's own store client and no token.
    from datetime import timedelta

    from torch.distributed import TCPStore

    from commscope.flight.out import progress, requests
    from commscope.flight.out.watchdog import REQUEST_COUNT_KEY, request_key, request_value
    from commscope.flight.record.job import TOKEN_KEY

    job = start(tmp_path / "outsider", interval_s=INTERVAL_S)
    try:
        outsider = TCPStore("127.0.0.1", _master_port(job), is_master=False,
                            timeout=timedelta(seconds=10), wait_for_workers=False)
        # 1. the drawn token the ranks agree on is in the store only until all have it
        token_key = f"default_pg/{TOKEN_KEY}"
        seen_at = gone_at = None
        deadline = time.monotonic() + 60
        while gone_at is None and time.monotonic() < deadline:
            there = outsider.check([token_key])
            now = time.monotonic()
            if there and seen_at is None:
                seen_at = now
            elif not there and seen_at is not None:
                gone_at = now
            time.sleep(0.002)
        assert seen_at is not None and gone_at is not None, job.log()
        with capsys.disabled():  # the exposure window, seen with `pytest -s`
            print(f"\nthe agreed token was readable in the store for {gone_at - seen_at:.3f} s")
        token = job.watch_info()["token"]
        tid = progress.token_id(token)
        deadline = time.monotonic() + 60
        while not outsider.check([progress.beat_key(tid, r) for r in range(4)]):
            assert time.monotonic() < deadline, job.log()
            time.sleep(0.1)
        time.sleep(2 * INTERVAL_S)  # every rank has looked at the dump counter once

        # 2. what it sees: every key, every rank's record; never the token
        keys = outsider.list_keys()
        assert progress.rank_key(tid, 3) in keys and token_key not in keys
        values = outsider.multi_get(keys)
        assert not any(token.encode() in bytes(v) for v in values)
        record = json.loads(outsider.get(progress.rank_key(tid, 0)))
        assert record["hostname"] == socket.gethostname() and record["pid"] > 0
        assert record["commscope_threads"][0]["frames"][0]["filename"].startswith("/")

        # 3. what it asks for: nothing happens
        dump_key = progress.dump_key(tid)
        for proof in (None, progress.dump_proof("a guess", tid, 1), "0" * 64):
            n = outsider.add(dump_key, 1)
            if proof is not None:
                outsider.set(progress.dump_proof_key(tid, n), proof)
            time.sleep(INTERVAL_S)
        count_key = f"default_pg/{REQUEST_COUNT_KEY}"
        for forge in ("0|timeout", "0|timeout|" + "0" * 64, None):
            n = outsider.add(count_key, 1)
            outsider.set(f"default_pg/{request_key(n)}",
                         forge or request_value("a guess", n, 0, "timeout"))
            time.sleep(INTERVAL_S)
        time.sleep(requests.PROOF_GRACE_S + 4 * INTERVAL_S)
        traces = job.folder / "commscope_traces"
        assert _files(traces) == ["watch.json"]  # no rank dumped
        log = (job.folder / "job.log").read_text()
        assert log.count("ignored a `commscope dump` request at ") == 4, log[-3000:]
        assert log.count("ignored a dump request of another rank at ") == 4, log[-3000:]
        assert token not in log

        # 4. the token's holder: `commscope dump` works, and a burst is answered once
        assert main(["dump", "--file", str(job.watch_file), "--wait-s", "30"]) == 0
        assert "verdict: HEALTHY" in capsys.readouterr().out
        dumps = sorted(p.name for p in traces.glob("rank_*"))
        assert dumps == [f"rank_{r}" for r in range(4)]
        source = _source(job)
        before = {r: n["count"] for r, n in source.dump_notes().items()}
        assert before == {r: 1 for r in range(4)}
        for _ in range(20):
            source.request_dump()
        time.sleep(progress.DUMP_REQUEST_EVERY_S + 6 * INTERVAL_S)
        after = {r: n["count"] for r, n in source.dump_notes().items()}
        assert after == {r: 2 for r in range(4)}, after  # 20 requests, one dump each
        assert _files(traces) == [*dumps, "watch.json"]
        assert job.proc.poll() is None
    finally:
        job.stop()
