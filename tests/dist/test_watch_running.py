"""What ``commscope watch`` shows of a real 4-rank gloo job that runs on: a slow rank and
a silent desync, with no code change in the job.

First rank 2's data loader turns slow (80 ms a step): the "slowest ranks" panel, timed
from the arrival times the records' fingerprints carry, must name it as a straggler, and
nobody before. Then rank 1 all-reduces one batch as int32 where the others pass float32
of the same byte count: nothing hangs. The watcher must name the group, the collective,
rank 1 and the dtypes within two publishing intervals, while the job keeps stepping.
"""

from __future__ import annotations

import re
import time

import pytest

from commscope.cli import main
from commscope.watch.command import SnapshotMaker, resolve_address
from commscope.watch.source import StoreSource
from tests.jobs.launch import start

pytestmark = [pytest.mark.dist, pytest.mark.timeout(180)]

INTERVAL_S = 0.5


def test_a_slow_rank_and_a_silent_desync_are_named_while_the_job_runs_on(tmp_path, capsys):
    desync, slow = tmp_path / "desync", tmp_path / "slow"
    job = start(tmp_path, interval_s=INTERVAL_S, DESYNC_FILE=str(desync),
                SLOW_FILE=str(slow))
    try:
        job.watch_info()
        source = StoreSource(resolve_address(None, None, str(job.watch_file)))
        source.connect()
        make = SnapshotMaker(source)
        deadline = time.monotonic() + 90
        while True:  # every rank publishes and steps, nothing differs yet
            snap = make()
            if len(snap["ranks"]) == 4 and all(isinstance(r["step"], int) and r["step"] > 2
                                               for r in snap["ranks"]):
                break
            assert time.monotonic() < deadline, snap["headline"]
            time.sleep(INTERVAL_S)
        assert snap["state"] in ("healthy", "behind") and snap["desyncs"] == [], (
            snap["headline"], snap["desyncs"])
        # a healthy job: the panel has figures, and no straggler
        while not snap["slowest"]:
            assert time.monotonic() < deadline, snap["headline"]
            time.sleep(INTERVAL_S)
            snap = make()
        assert not any(x["straggler"] for row in snap["slowest"] for x in row["ranks"]), (
            snap["slowest"])
        slow.write_text("now")  # rank 2's loader turns slow
        while True:
            snap = make()
            named = [x["rank"] for row in snap["slowest"] for x in row["ranks"]
                     if x["straggler"]]
            if named:
                break
            assert time.monotonic() < deadline, snap["slowest"]
            time.sleep(INTERVAL_S)
        assert named == [2], snap["slowest"]
        row = snap["slowest"][0]
        assert row["group"] == "default_pg" and row["ranks"][0]["lag_median_ms"] >= 30, row
        assert "rank 2 arrives last" in snap["headline"], snap["headline"]
        slow.unlink()
        # a second watcher that looks only now and then: between its two looks more
        # steps pass than a record carries folds, so it cannot place the split exactly,
        # but narrows it to the steps since it last saw the ranks agree
        lazy_source = StoreSource(resolve_address(None, None, str(job.watch_file)))
        lazy_source.connect()
        lazy = SnapshotMaker(lazy_source)
        assert lazy()["desyncs"] == []
        desync.write_text("now")
        at = desync.with_name("desync.at")
        while not at.exists():
            assert time.monotonic() < deadline, "rank 1 never desynced"
            time.sleep(0.05)
        desynced_at = float(at.read_text())
        while True:
            snap = make()
            if snap["state"] == "desync":
                break
            assert time.monotonic() < deadline, snap["headline"]
            time.sleep(0.1)
        seen_after = time.time() - desynced_at
        root = snap["desyncs"][0]
        assert (root["kind"], root["culprit_ranks"]) == ("dtype_mismatch", [1]), root
        assert "Int" in root["message"] and "Float" in root["message"], root["message"]
        assert root["group"]["desc"] == "default_pg"
        assert "rank 1" in snap["headline"] and "dtype_mismatch" in snap["headline"]
        assert seen_after <= 2 * INTERVAL_S + 1.0, seen_after
        steps = [r["step"] for r in snap["ranks"]]
        time.sleep(3 * INTERVAL_S)
        later = make()
        assert later["state"] == "desync"  # it stays told, and told exactly: the records
        # no longer reach back to it (16 folds, 20 steps a second), the watcher does
        assert later["desyncs"][0]["kind"] == "dtype_mismatch", later["desyncs"]
        assert min(r["step"] for r in later["ranks"]) > max(steps)  # and the job runs on
        exact = root["collective_seq_id"]
        while make()["groups"][0]["completed_min"] <= exact + 20:  # past a record's folds
            assert time.monotonic() < deadline, "the job stopped stepping"
            time.sleep(INTERVAL_S)
        seen = lazy()["desyncs"][0]
        assert seen["kind"] == "fingerprint_mismatch", seen
        agreed = re.search(r"agree up to #(\d+): the first collective they differ at is one "
                           r"of #(\d+)-#(\d+)", seen["message"])
        assert agreed, seen["message"]
        assert int(agreed[2]) <= exact <= int(agreed[3]), (exact, seen["message"])
        # `commscope dump` says it too: first from the records, then from the files
        assert main(["dump", "--file", str(job.watch_file), "--wait-s", "30"]) == 4  # desync
        out = capsys.readouterr().out
        assert "live verdict (every rank's record, all hosts): DESYNC" in out, out
        assert "[dtype_mismatch]" in out and "verdict: DESYNC" in out, out
    finally:
        job.stop()
