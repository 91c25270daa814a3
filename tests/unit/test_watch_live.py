"""The watcher's reading and reasoning, on records in an in-process store (HashStore).

The records are made by the real publisher (:class:`commscope.flight.out.publish.Publisher`)
on a real recorder where the story needs it, and by hand where a record must be broken.
"""

from __future__ import annotations

import json
import time

import pytest
import torch.distributed as dist

from commscope.flight.out import progress
from commscope.watch.live import Thresholds, snapshot
from commscope.watch.source import Address, StoreSource, WatchError
from commscope.watch.view import rank_table, render

T0 = 1_800_000_000_000_000_000


def _entry(seq: int, state: str, created: int, group: str = "0", op: str = "all_reduce"
           ) -> list:
    """A published record, in progress.ENTRY_FIELDS order (frame 0 of the table)."""
    done = state == "completed"
    return [seq, 0, group, "default_pg", seq, 0, f"gloo:{op}", created, [[4]], ["Float"],
            None, None, state, done, False, None, False, [0]]


def _record(rank: int, world: int, seqs: list[tuple[int, str]], now: int, *,
            main: tuple[str, str, int, str] = ("step", "/home/u/train.py", 42, "x()"),
            age_s: float = 0.1, step: int | None = None) -> dict:
    created = now - int(5e9)
    entries = [_entry(s, st, created + s * 1000) for s, st in seqs]
    table = [{"name": "step", "filename": "/home/u/train.py", "line": 42}]
    last = seqs[-1][0] if seqs else 0
    completed = max((s for s, st in seqs if st == "completed"), default=0)
    return {"commscope_watch": 1, "rank": rank, "world_size": world,
            "dump_time_ns": now - int(age_s * 1e9), "interval_s": 0.5,
            "progress": {"0": ["default_pg", last, completed]}, "entries": entries,
            "frame_table": table,
            "commscope_threads": [{"name": "MainThread", "main": True, "frames": [
                {"name": main[0], "filename": main[1], "line": main[2], "code": main[3]}]}],
            "commscope_step": step}


def _store(records: dict[int, dict], world: int, token: str = "t", raw: dict | None = None):
    store = dist.HashStore()
    tid = progress.token_id(token)
    store.add(progress.JOBS_KEY, 1)
    store.set(progress.meta_key(tid), json.dumps({"world_size": world, "interval_s": 0.5}))
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(world)))}}
    for r, rec in records.items():
        rec = dict(rec)
        t = rec.pop("dump_time_ns")
        store.set(progress.rank_key(tid, r), progress.encode(rec))
        store.set(progress.beat_key(tid, r), progress.encode_beat(3, 1, t))
        store.set(progress.config_key(tid, r), json.dumps(config))
    for r, value in (raw or {}).items():
        store.set(progress.rank_key(tid, r), value)
        store.set(progress.beat_key(tid, r), progress.encode_beat(3, 1, time.time_ns()))
    return store


def _source(store, token: str = "t") -> StoreSource:
    src = StoreSource(Address("store", 1, token), store=store)
    src.connect()
    return src


def test_a_stall_is_named_from_the_same_analysis():
    assert len(_entry(1, "completed", 0)) == len(progress.ENTRY_FIELDS)
    now = time.time_ns()
    done = [(s, "completed") for s in range(1, 5)]
    records = {r: _record(r, 4, [*done, (5, "started")], now) for r in range(3)}
    records[3] = _record(3, 4, done, now, main=("load_batch", "/home/u/loader.py", 7,
                                                "time.sleep(60)"))
    snap = snapshot(_source(_store(records, 4)).fetch(), thresholds=Thresholds(0.5), now_ns=now)
    assert snap["state"] == "stuck"
    root = snap["findings"][0]
    assert (root["kind"], root["culprit_ranks"], root["waiting_ranks"]) == (
        "missing_rank", [3], [0, 1, 2])
    assert "rank 3 in loader.py:7 in load_batch (time.sleep(60))" in snap["headline"]
    assert "ranks 0-2 wait in all_reduce #5" in snap["headline"]
    render(snap)  # the terminal view draws it


def test_healthy_and_behind_and_lag_needs_a_record_at_least_as_new():
    now = time.time_ns()
    fresh = [(s, "completed") for s in range(1, 9)]
    records = {r: _record(r, 3, fresh, now, step=8) for r in range(3)}
    assert snapshot(_source(_store(records, 3)).fetch(), now_ns=now)["state"] == "healthy"
    # rank 2 has three collectives fewer, in a record newer than the leader's: behind
    records[2] = _record(2, 3, fresh[:5], now, age_s=0.0, step=5)
    snap = snapshot(_source(_store(records, 3)).fetch(), now_ns=now)
    assert snap["state"] == "behind"
    assert snap["headline"] == "rank 2 behind by 3 collectives on default_pg"
    # the same counts in an older record only say it published earlier: not behind
    records[2] = _record(2, 3, fresh[:5], now, age_s=1.0, step=5)
    assert snapshot(_source(_store(records, 3)).fetch(), now_ns=now)["state"] == "healthy"


def test_a_silent_rank_is_gone_and_others_waiting_for_it_are_stuck():
    now = time.time_ns()
    done = [(s, "completed") for s in range(1, 4)]
    records = {r: _record(r, 3, [*done, (4, "started")], now) for r in range(2)}
    records[2] = _record(2, 3, done, now, age_s=60)
    snap = snapshot(_source(_store(records, 3)).fetch(), thresholds=Thresholds(0.5),
                    now_ns=now)
    assert snap["silent"] == [2] and snap["state"] == "stuck"
    assert snap["findings"][0]["kind"] == "crashed_rank"
    assert snap["findings"][0]["culprit_ranks"] == [2]


def test_bad_records_are_named_and_skipped_and_missing_ranks_found():
    now = time.time_ns()
    done = [(s, "completed") for s in range(1, 3)]
    records = {0: _record(0, 6, done, now), 2: _record(2, 6, done, now),
               5: _record(5, 6, done, now)}
    raw = {1: b"\xff not json", 3: json.dumps({"commscope_watch": 99}).encode()}
    fetched = _source(_store(records, 6, raw=raw)).fetch()
    assert sorted(fetched.records) == [0, 2, 5]
    assert fetched.missing == [4]  # found by bisection without waiting on a missing key
    why = dict(fetched.bad)
    assert "not JSON" in why[1] and "version" in why[3]
    snap = snapshot(fetched, now_ns=now)
    assert {b["rank"] for b in snap["bad_records"]} == {1, 3}
    assert "rank 4 not publishing yet" in snap["headline"]


def test_wrong_token_and_nothing_publishing_are_told_apart():
    store = _store({}, 2, token="right")
    with pytest.raises(WatchError, match="refused"):
        _source(store, token="wrong")
    with pytest.raises(WatchError, match="no commscope job publishes"):
        _source(dist.HashStore(), token="right")


def test_a_record_from_the_real_publisher_round_trips():
    from types import SimpleNamespace

    from commscope.flight.config import resolve_config
    from commscope.flight.out.publish import Publisher, set_step
    from commscope.flight.record.recorder import Recorder

    rec = Recorder(resolve_config(watch_interval_s=0.5))
    rec.global_rank, rec.world_size = 0, 1
    store = dist.HashStore()
    rec.store = SimpleNamespace(underlying_store=store)
    set_step(12)
    try:
        pub = Publisher(rec, 0.5)
        assert pub.tick(now=100.0) and not pub.tick(now=100.1)  # once per interval
    finally:
        set_step(None)
    fetched = _source(store, token="").fetch()
    record = fetched.records[0]
    assert record["commscope_step"] == 12 and record["rank"] == 0
    assert record["commscope_threads"][0]["main"] is True
    snap = snapshot(fetched)
    assert snap["state"] == "healthy" and snap["ranks"][0]["step"] == 12


def test_p2p_channel_counts_are_kept_only_while_no_record_went_by_unseen():
    from types import SimpleNamespace

    from commscope.flight.out.publish import P2PChannels

    def entry(rid: int, op: str = "send", peer: int = 1, p2p: bool = True):
        return SimpleNamespace(record_id=rid, is_p2p=p2p, peer=peer, pg_name="0",
                               profiling_name=f"gloo:{op} 0->{peer}")

    ring = [entry(0), entry(1, p2p=False), entry(2), entry(3, "recv")]
    ch = P2PChannels()
    ch.update(ring)
    ch.update([*ring[2:], entry(4)])  # the ring moved on; nothing was missed
    fields = ch.fields([ring[3], entry(4)])
    assert fields["commscope_p2p_channels"] == [["0", "recv", 1, 1], ["0", "send", 1, 3]]
    assert fields["commscope_p2p_ordinals"] == {"3": 0, "4": 2}
    ch.update([entry(9)])  # records 5-8 went by between two looks: counts are not whole
    assert ch.fields([entry(9)]) == {}


def _text(snap: dict, width: int = 160) -> str:
    from rich.console import Console

    console = Console(width=width, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(render(snap))
    return console.export_text()


def test_two_hosts_get_a_host_and_pid_column_one_host_none():
    now = time.time_ns()
    done = [(s, "completed") for s in range(1, 5)]
    records = {r: _record(r, 4, [*done, (5, "started")], now) for r in range(3)}
    records[3] = _record(3, 4, done, now, main=("load_batch", "/home/u/loader.py", 7,
                                                "time.sleep(60)"))
    for r, rec in records.items():
        rec.update(hostname="hostA" if r < 2 else "hostB", pid=4000 + r)
    snap = snapshot(_source(_store(records, 4)).fetch(), thresholds=Thresholds(0.5), now_ns=now)
    assert [(row["rank"], row["host"], row["pid"]) for row in snap["ranks"]] == [
        (0, "hostA", 4000), (1, "hostA", 4001), (2, "hostB", 4002), (3, "hostB", 4003)]
    assert "Rank 3 (hostB, pid 4003) never joined" in snap["findings"][0]["message"]
    text = _text(snap)
    assert "4 ranks on 2 hosts" in text
    header = next(line for line in text.splitlines() if "record age" in line)
    assert header.split()[1:4] == ["host", "┃", "pid"]
    row3 = [line for line in text.splitlines() if "load_batch (time.sleep(60))" in line][-1]
    assert row3.split()[1:6] == ["hostB", "│", "4003", "│", "3"]
    table = rank_table(snap)
    assert [row["_class"] for row in table["rows"]] == ["", "", "", "culprit"]
    for rec in records.values():
        rec["hostname"] = "hostA"
    one = snapshot(_source(_store(records, 4)).fetch(), thresholds=Thresholds(0.5), now_ns=now)
    assert [c for c, _ in rank_table(one)["columns"]][:2] == ["rank", "step"]
    assert "hostA" not in _text(one) and " on 1 hosts" not in _text(one)


def _scale_snapshot(state: str, world: int = 4096, per: int = 8, silent: int = 41) -> dict:
    rows = []
    for r in range(world):
        stuck = state == "stuck"
        rows.append({
            "rank": r, "host": f"node{r // per:03d}", "pid": 5000 + r,
            "age_s": 14.2 if r == silent else 0.3 + (r % 7) / 10, "silent": r == silent,
            "step": 812 + r % 2,
            "published": 3, "where_now": None if stuck else f"train.py:{40 + r % 3} in step",
            "oldest_unfinished": None if r == silent or not stuck else {
                "op": "all_reduce #813" if r % per == 1 else "all_reduce #812",
                "group": "dp" if r % per == 1 else "tp", "age_s": 30.0 + r % 5,
                "where": "train.py:42 in step"}})
    return {"state": state, "headline": "", "store": "x:1", "world_size": world,
            "interval_s": 2.0, "stall_s": 4.0, "ranks": rows, "groups": [], "missing": [],
            "bad_records": [], "findings": [{"kind": "crashed_rank", "culprit_ranks": [silent],
                                             "waiting_ranks": [], "message": "m"}]}


def test_4096_ranks_on_512_hosts_fold_by_host_in_the_ranks_table():
    snap = _scale_snapshot("stuck")
    start = time.perf_counter()
    table = rank_table(snap)
    assert time.perf_counter() - start < 1.0
    rows = [(row["host"], row["rank"], row["op"], row["_class"]) for row in table["rows"]]
    assert rows[0] == ("node005", "41", "-", "culprit")
    assert table["rows"][0]["age"] == "silent 14 s"
    everyone = "511 hosts: node[000-004,006-511]"
    assert (everyone, "local 1", "all_reduce #813 of dp", "") in rows
    assert (everyone, "local 0, 2-7", "all_reduce #812 of tp", "") in rows
    assert ("node005", "40, 42-47", "all_reduce #812 of tp", "") in rows
    assert len(rows) == 4 and table["caption"] == "" and table["hosts"] == 512
    assert rank_table(snap, 2)["caption"].startswith("2 more lines, ")
    text = _text(snap, 200)
    assert "4096 ranks on 512 hosts" in text and everyone in text
    # a running job: hosts whose ranks all move fold into one line, however they differ
    running = _scale_snapshot("healthy", silent=-1)
    running["findings"] = []
    table = rank_table(running)
    assert len(table["rows"]) == 1
    row = table["rows"][0]
    assert (row["host"], row["rank"], row["step"], row["age"], row["where"]) == (
        "512 hosts: node[000-511]", "0-4095", "812-813", "0.3-0.9 s", "various")


def _on_hosts(records: dict[int, dict], hosts: dict[int, str]) -> dict[int, dict]:
    for r, rec in records.items():
        rec["hostname"] = hosts[r]
    return records


def _clock(ns: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ns / 1e9))


def test_a_host_whose_every_rank_is_silent_is_told_once_as_a_host():
    now = time.time_ns()
    done = [(s, "completed") for s in range(1, 4)]
    records = {r: _record(r, 4, [*done, (4, "started")], now) for r in range(2)}
    records.update({r: _record(r, 4, done, now, age_s=9) for r in (2, 3)})
    _on_hosts(records, {0: "hostA", 1: "hostA", 2: "hostB", 3: "hostB"})
    source = _source(_store(records, 4))
    snap = snapshot(source.fetch(), thresholds=Thresholds(0.5), now_ns=now)
    since = _clock(now - 9e9)
    assert snap["state"] == "stuck" and snap["silent"] == [2, 3]
    assert snap["headline"].startswith(f"stuck 9 s: [crashed_rank] hostB: ranks 2-3 silent "
                                       f"since {since}; ranks 0, 1 wait in all_reduce #4"), snap
    root = snap["findings"][0]
    assert root["culprit_ranks"] == [2, 3]
    assert root["message"].startswith(
        f"hostB: ranks 2-3 silent since {since} (no record for 9 s: frozen, or gone) while "
        "ranks 0, 1 reached all_reduce #4"), root["message"]
    assert [(h["host"], h["ranks"], h["how"]) for h in snap["lost_hosts"]] == [
        ("hostB", [2, 3], "silent")]
    render(snap)
    # silent when the watcher attached, still silent on its next refresh (no flicker)
    again = snapshot(source.fetch(), thresholds=Thresholds(0.5))
    assert again["silent"] == [2, 3] and "hostB: ranks 2-3 silent since" in again["headline"]


def test_a_host_gone_with_its_peers_work_failed_is_named_gone():
    now = time.time_ns()
    done = [(s, "completed") for s in range(1, 4)]
    records = {r: _record(r, 4, done, now) for r in range(4)}
    for r in (0, 1):  # their all_reduce #4 failed: the peer closed the connection
        failed = _entry(4, "started", now - int(8e9))
        failed[13], failed[16] = True, True  # retired, failed
        records[r]["entries"].append(failed)
        records[r]["progress"] = {"0": ["default_pg", 4, 3]}
    records.update({r: _record(r, 4, done, now, age_s=8) for r in (2, 3)})
    _on_hosts(records, {0: "hostA", 1: "hostA", 2: "hostB", 3: "hostB"})
    snap = snapshot(_source(_store(records, 4)).fetch(), thresholds=Thresholds(0.5),
                    now_ns=now)
    assert snap["state"] == "stuck", snap["headline"]  # nobody waits, yet ranks are gone
    assert "[crashed_rank] hostB: ranks 2-3 gone since " in snap["headline"], snap["headline"]
    assert "; ranks 0, 1 failed in all_reduce #4 of group 0" in snap["headline"]
    assert snap["findings"][0]["message"].startswith("hostB: ranks 2-3 gone since ")
    assert snap["lost_hosts"][0]["how"] == "gone"


def test_one_silent_rank_of_a_host_is_told_as_a_rank():
    now = time.time_ns()
    done = [(s, "completed") for s in range(1, 4)]
    records = {r: _record(r, 4, [*done, (4, "started")], now) for r in range(3)}
    records[3] = _record(3, 4, done, now, age_s=9)
    _on_hosts(records, {0: "hostA", 1: "hostA", 2: "hostB", 3: "hostB"})
    snap = snapshot(_source(_store(records, 4)).fetch(), thresholds=Thresholds(0.5),
                    now_ns=now)
    assert snap["lost_hosts"] == [] and snap["silent"] == [3]
    assert snap["headline"].startswith("stuck 5 s: [crashed_rank] rank 3 silent for 9 s "
                                       "(frozen, or gone); ranks 0-2 wait in"), snap["headline"]


def test_dump_names_the_silent_hosts_that_cannot_answer():
    from commscope.watch.command import _unanswered
    from commscope.watch.live import silent_ranks

    now = time.time_ns()
    done = [(s, "completed") for s in range(1, 3)]
    records = {r: _record(r, 6, done, now, age_s=9 if r in (2, 3, 5) else 0.1)
               for r in range(6)}
    _on_hosts(records, {0: "hostA", 1: "hostA", 2: "hostB", 3: "hostB", 4: "hostC",
                        5: "hostC"})
    fetched = _source(_store(records, 6)).fetch()
    silent = silent_ranks(fetched, Thresholds(0.5))
    assert sorted(silent) == [2, 3, 5]
    lines = _unanswered(fetched, [1, 2, 3, 5], silent)
    assert lines == [
        f"hostB: ranks 2-3 did not answer: no record since {_clock(now - 9e9)} (9 s: frozen, "
        "or gone with their host); no dump of theirs",
        "1 rank(s) did not answer: 5, no record for 9 s (frozen, or gone); no dump of theirs",
        "1 rank(s) did not dump in time: [1]"]
