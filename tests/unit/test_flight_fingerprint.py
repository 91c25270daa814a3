"""The running fingerprints: recorded per group, equal across processes for equal calls,
different for a different dtype, shape, root or reduce op; read back and compared."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

import commscope.flight as flight
from commscope.analyze.align.prints import compare_prints
from commscope.analyze.model import Group, LoadResult, RankDump, SigTable
from commscope.analyze.read.prints import read_prints
from commscope.flight.record.agree.fingerprint import WINDOW

_PROGRAM = r"""
import json, sys, torch, torch.distributed as dist
import commscope.flight as flight
from tests.harness import fake_world as fake
flight.enable(dump_prefix=sys.argv[1], watchdog=False, handle_signals=False,
              dump_on_exception=False)
with fake(int(sys.argv[2]), 4):
    t = torch.ones(4, 8)
    for step in range(5):
        dist.all_reduce(t)
        dist.broadcast(t, 1)
    dist.all_reduce(t.to(torch.int32) if sys.argv[3] == "int" else t)
    snap = flight.snapshot()
print(json.dumps(snap["commscope_fingerprints"]))
"""


@contextlib.contextmanager
def recording(tmp_path, **kwargs):
    flight.enable(dump_prefix=str(tmp_path / "rank_"), watchdog=False, handle_signals=False,
                  dump_on_exception=False, **kwargs)
    try:
        yield
    finally:
        flight.disable()


def _prints(snap: dict, rank: int) -> RankDump:
    d = RankDump(rank=rank, path=f"rank_{rank}", source="commscope", version="2.10")
    problems: list[str] = []
    read_prints(snap, d, problems)
    assert problems == []
    return d


def test_every_collective_is_folded_per_group_and_p2p_is_not(tmp_path, fake_pg):
    with recording(tmp_path), fake_pg(0, 4):
        pair = dist.new_group([0, 1])
        t = torch.ones(4)
        dist.all_reduce(t)
        dist.all_reduce(t, group=pair)
        dist.broadcast(t, 2)
        dist.scatter(torch.empty(4), [torch.ones(4)] * 4, src=0)
        snap = flight.snapshot()
    prints = snap["commscope_fingerprints"]
    assert prints["bits"] == 64
    groups = prints["groups"]
    assert sorted(len(rows) for rows in groups.values()) == [1, 3]
    world = max(groups.values(), key=len)
    assert [row[0] for row in world] == [1, 2, 3]  # sequence numbers
    what = [prints["table"][row[2]] for row in world]
    assert what == [["all_reduce", [[4]], ["Float"], None, "SUM"],
                    ["broadcast", [[4]], ["Float"], 2, None],
                    ["scatter", [[4]], ["Float"], 0, None]]  # a scatter's outputs


def test_the_window_keeps_the_newest_folds(tmp_path, fake_pg):
    with recording(tmp_path), fake_pg(0, 2):
        t = torch.ones(2)
        for _ in range(WINDOW + 10):
            dist.all_reduce(t)
        rows = next(iter(flight.snapshot()["commscope_fingerprints"]["groups"].values()))
    assert len(rows) == WINDOW and rows[-1][0] == WINDOW + 10 and rows[0][0] == 11


def test_off_when_asked(tmp_path, fake_pg, monkeypatch):
    monkeypatch.setenv("COMMSCOPE_FR_FINGERPRINT", "0")
    with recording(tmp_path), fake_pg(0, 2):
        dist.all_reduce(torch.ones(2))
        assert "commscope_fingerprints" not in flight.snapshot()


def _run(tmp_path, rank: int, dtype: str, seed: str) -> dict:
    env = {**os.environ, "PYTHONHASHSEED": seed, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", _PROGRAM, str(tmp_path / f"r{rank}_"),
                          str(rank), dtype], capture_output=True, text=True, env=env,
                         timeout=120, cwd=os.path.dirname(os.path.dirname(
                             os.path.dirname(os.path.abspath(__file__)))))
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(240)
def test_equal_calls_in_separate_processes_fold_alike_and_a_cast_does_not(tmp_path):
    # separate interpreters with different string hash seeds (and, before Python 3.12,
    # None at different addresses): the fingerprints must not depend on either
    got = {r: _run(tmp_path, r, "int" if r == 2 else "float", str(r * 7 + 1))
           for r in range(3)}
    dumps = {r: _prints({"commscope_fingerprints": p}, r) for r, p in got.items()}
    name = next(iter(dumps[0].prints))
    assert [d.prints[name].cums[:-1] for d in dumps.values()].count(
        dumps[0].prints[name].cums[:-1]) == 3  # ten equal calls: equal on all three
    load = LoadResult(dumps=dumps, unreadable=[], sigs=SigTable())
    splits = compare_prints(load, {name: Group(key=name, name=name, desc="", ranks=(0, 1, 2),
                                               membership="entries")})
    assert len(splits) == 1
    split = splits[0]
    assert (split.seq, split.exact, split.tie) == (11, True, False)
    assert [ranks for ranks, _ in split.sides] == [[0, 1], [2]]
    assert [w.text() for _, w in split.sides] == ["all_reduce Float[4, 8], SUM",
                                                   "all_reduce Int[4, 8], SUM"]


def test_hostile_fingerprints_are_left_out_with_a_problem():
    d = RankDump(rank=0, path="x", source="commscope", version="2.10")
    problems: list[str] = []
    read_prints({"commscope_fingerprints": {"bits": 64, "t0": 5, "table": [["x"] * 5],
                                            "groups": {"g": [[1, -3, 0, 0], "no",
                                                             [2, 7, 99, 1]],
                                                       "h": "nope"}}}, d, problems)
    assert d.prints["g"].seqs == [2] and d.prints["g"].what == [-1]
    assert problems and "malformed" in problems[0]
    read_prints({"commscope_fingerprints": [1, 2]}, d, problems)
    assert "ignored" in problems[-1]
