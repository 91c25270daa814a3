"""``commscope watch`` and ``commscope dump`` on a real 4-rank gloo job under `commscope run`.

One job for the module (starting one costs seconds on two cores): it trains until the
tests make rank 3 stall in its data loader; then the watch must name rank 3 within two
publishing intervals past the stall threshold, ``commscope dump`` must get every rank's
dump while the job keeps running, and once the job is gone the watcher must say so in
one sentence.
"""

from __future__ import annotations

import json
import time

import pytest

from commscope.cli import main
from commscope.watch.command import SnapshotMaker, resolve_address
from commscope.watch.source import StoreSource
from tests.jobs.launch import start

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
    first = _snap(job, capsys)
    time.sleep(3 * INTERVAL_S)
    second = _snap(job, capsys)
    assert first["world_size"] == second["world_size"] == 4
    assert second["state"] in ("healthy", "behind"), second["headline"]
    steps = lambda s: [r["step"] for r in s["ranks"]]  # noqa: E731
    assert all(isinstance(x, int) for x in steps(second))
    assert min(steps(second)) > max(steps(first))  # everyone moved on
    group = second["groups"][0]
    assert group["desc"] == "default_pg" and group["enqueued_max"] > first["groups"][0][
        "enqueued_max"]


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
    assert main(["dump", "--file", str(job.watch_file), "--wait-s", "30"]) == 0
    out = capsys.readouterr().out
    assert "verdict: HANG" in out and "[missing_rank] Rank 3 never joined" in out
    traces = job.folder / "commscope_traces"
    assert sorted(p.name for p in traces.glob("rank_*")) == [f"rank_{r}" for r in range(4)]
    assert job.proc.poll() is None  # still running
    assert _snap(job, capsys)["state"] == "stuck"  # and still publishing


def test_a_store_that_vanishes_is_one_sentence(job, capsys):
    job.stop()
    assert main(["watch", "--once", "--file", str(job.watch_file)]) == 1
    err = capsys.readouterr().err
    assert "commscope watch:" in err and "Traceback" not in err
    assert "has the job ended" in err or "stopped answering" in err
