"""The scenario corpus: every folder of ``tests/data/scenarios`` is one real multi-process
gloo job made by ``tests/data/make_scenarios.py``, with what the analyzer must find
written beside the dumps (``scenario.json``) by the generator, from the fault it
injected. Each is analyzed as recorded by commscope (``ours/``) and, where the job
wrote them, by PyTorch's native recorder (``native/``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from commscope.analyze import analyze
from commscope.analyze.read.load import read_dump_file

DATA = Path(__file__).resolve().parents[1] / "data" / "scenarios"
SCENARIOS = sorted(p.name for p in DATA.iterdir() if (p / "scenario.json").exists())


def _meta(name: str) -> dict:
    return json.loads((DATA / name / "scenario.json").read_text())


def _check(result, expect: dict) -> None:
    root = result.findings[0]
    story = "\n".join(f"  [{f.kind}] {f.culprit_ranks} <- {f.waiting_ranks}: {f.message}"
                      for f in result.findings)
    assert result.verdict == expect["verdict"], story
    assert root.kind == expect["kind"], story
    if expect["verdict"] != "healthy":
        assert sorted(root.culprit_ranks) == sorted(expect["culprits"]), story
    assert set(expect["waiting"]) <= set(root.waiting_ranks), story
    for text in expect["says"]:
        assert text in root.message, (text, story)
    blamed = sorted({r for f in result.findings if f.blocking for r in f.culprit_ranks})
    want = expect["blamed"] if expect["blamed"] is not None else (
        expect["culprits"] if any(f.blocking for f in result.findings) else blamed)
    assert blamed == sorted(want), ("blamed", story)
    for kind, culprits in expect["also"]:
        assert any(f.kind == kind and sorted(f.culprit_ranks) == sorted(culprits)
                   for f in result.findings), ((kind, culprits), story)


def test_the_corpus_is_big_and_varied():
    assert len(SCENARIOS) >= 30
    worlds = {_meta(n)["world_size"] for n in SCENARIOS}
    assert min(worlds) == 2 and max(worlds) == 8
    verdicts = {_meta(n)["expect"]["verdict"] for n in SCENARIOS}
    assert {"healthy", "hang", "crash", "desync"} <= verdicts
    kinds = {_meta(n)["expect"]["kind"] for n in SCENARIOS}
    assert {"p2p_unmatched", "p2p_deadlock", "crashed_rank", "missing_rank",
            "cross_group_deadlock"} <= kinds
    assert sum((DATA / n / "native").is_dir() for n in SCENARIOS) >= 20


@pytest.mark.parametrize("name", SCENARIOS)
def test_ours(name):
    meta = _meta(name)
    _check(analyze(DATA / name / "ours"), meta["expect"])


@pytest.mark.parametrize("name", [n for n in SCENARIOS if (DATA / n / "native").is_dir()])
def test_native(name):
    meta = _meta(name)
    result = analyze(DATA / name / "native", world_size=meta["world_size"])
    if meta["native_expect"] is not None:
        _check(result, meta["native_expect"])
    unfinished = any(not e.get("retired") for d in result.load.dumps.values()
                     for e in read_dump_file(d.path)["entries"])
    if unfinished or result.missing:
        assert result.verdict != "healthy", [f.message for f in result.findings]


def test_every_group_has_its_description_also_when_it_recorded_nothing():
    result = analyze(DATA / "mesh3d_crash_raise" / "ours")
    idle = [v.group for v in result.views.values() if v.max_hi == 0]
    assert idle and all(g.desc == "mesh_pp" for g in idle)  # the pp axis saw no collective
    assert all(v.group.desc for v in result.views.values())


def test_a_chain_of_waits_is_listed_transitively():
    # rank 0 waits in the default group for rank 1, which waits in pair_12 for rank 2
    root = analyze(DATA / "chain_through_subgroup" / "ours").findings[0]
    assert (root.culprit_ranks, root.waiting_ranks) == ([2], [0, 1])
    assert "rank 2 is alive and in no collective" in root.message


def test_native_dumps_say_they_cannot_tell_where_a_rank_is_now():
    root = analyze(DATA / "stall_in_data_loader" / "native").findings[0]
    assert root.culprit_ranks == [3]
    assert "PyTorch-native dump carries no thread stacks" in root.message


@pytest.mark.parametrize("name", ["pipeline_1f1b_healthy", "pipeline_drop_send"])
def test_perfetto_joins_every_send_to_its_recv_on_real_pipelines(name, tmp_path):
    # Real 4-stage gloo pipelines: activations flow down the stages, gradients (1F1B)
    # back up. Every arrow leaves a send slice of its rank and lands on the matching
    # recv slice of the peer; an unfinished send has no arrow to a recv it never met.
    from commscope.analyze.present.export import perfetto_trace

    trace = perfetto_trace(analyze(DATA / name / "ours"))
    events = trace["traceEvents"]
    slices = [e for e in events if e["ph"] == "X" and e.get("cat") == "p2p"]
    starts = {e["id"]: e for e in events if e["ph"] == "s" and e["cat"] == "p2p"}
    ends = {e["id"]: e for e in events if e["ph"] == "f" and e["cat"] == "p2p"}
    assert starts and set(starts) == set(ends)

    def slice_at(pid: int, ts: float) -> dict:
        [found] = [e for e in slices if e["pid"] == pid and e["ts"] <= ts <= e["ts"] + e["dur"]]
        return found

    hops = set()
    for i, s in starts.items():
        f = ends[i]
        src, dst = slice_at(s["pid"], s["ts"]), slice_at(f["pid"], f["ts"])
        assert src["name"].removeprefix("STUCK ") == f"send → {f['pid']}"
        assert dst["name"].removeprefix("STUCK ") == f"recv ← {s['pid']}"
        assert src["args"]["sizes"] == dst["args"]["sizes"]
        hops.add((s["pid"], f["pid"]))
    sends = sum(1 for e in slices if e["name"].removeprefix("STUCK ").startswith("send"))
    recvs = sum(1 for e in slices if e["name"].removeprefix("STUCK ").startswith("recv"))
    assert len(starts) <= min(sends, recvs)  # each op is joined at most once
    assert {(0, 1), (1, 2), (2, 3)} <= hops  # activations, stage by stage
    if name == "pipeline_1f1b_healthy":
        assert {(3, 2), (2, 1), (1, 0)} <= hops  # gradients back up
        assert len(starts) == sends == recvs  # every op paired in a healthy job
