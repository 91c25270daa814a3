"""The NCCL corpus: every folder of ``tests/data/nccl_scenarios`` is one real job on the
NCCL-semantics bed (``tests/ncclbed``: ops return at once and run in issue order on each
rank's device queue), a mixture-of-experts model shaped like Megatron-Core's on 16
ranks (two on 64), with what the analyzer must find written beside the dumps by
``tests/data/make_nccl_scenarios.py`` from the fault it injected. Each job's dumps come
in three forms, all asserted: PyTorch's full pickle with stacks (``full``), its
active-only pickle (``active``) and an NVRx-style active-only JSON without stacks
(``nvrx``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from commscope.analyze import analyze

DATA = Path(__file__).resolve().parents[1] / "data" / "nccl_scenarios"
SCENARIOS = sorted(p.name for p in DATA.iterdir() if (p / "scenario.json").exists())
CASES = [(name, form) for name in SCENARIOS
         for form in json.loads((DATA / name / "scenario.json").read_text())["forms"]]


def _meta(name: str) -> dict:
    return json.loads((DATA / name / "scenario.json").read_text())


def test_the_corpus_is_what_the_issue_asks_for():
    metas = [_meta(n) for n in SCENARIOS]
    sixteen = [m for m in metas if m["world_size"] == 16]
    assert len(sixteen) >= 10 and any(m["world_size"] == 64 for m in metas)
    kinds = {m["expect"]["kind"] for m in metas} | {k for m in metas
                                                    for k, _ in m["expect"]["also"]}
    assert {"device_stopped", "missing_rank", "p2p_unmatched", "crashed_rank"} <= kinds
    assert any(m["timing"] for m in metas) and not all(m["timing"] for m in metas)
    assert sum(len(m["expect"]["blamed"] or []) >= 2 for m in metas) >= 2  # two faulty ranks
    descs = {d for m in metas[:1] for d in
             _descs(DATA / m["name"] / "full")}
    assert {"TENSOR_MODEL_PARALLEL_GROUP", "PIPELINE_MODEL_PARALLEL_GROUP",
            "EXPERT_MODEL_PARALLEL_GROUP", "CONTEXT_PARALLEL_GROUP"} <= descs


def _descs(folder: Path) -> set[str]:
    return {g.desc for g in analyze(folder).groups.values()}


@pytest.mark.parametrize(("name", "form"), CASES)
def test_verdict_and_culprits(name, form):
    expect = _meta(name)["expect"]
    result = analyze(DATA / name / form)
    story = "\n".join(f"  [{f.kind}] {f.culprit_ranks} <- {f.waiting_ranks}: {f.message}"
                      for f in result.findings)
    root = result.findings[0]
    assert result.verdict == expect["verdict"], story
    if expect["kind"] is not None:
        assert root.kind == expect["kind"], story
    if expect["culprits"]:
        assert sorted(root.culprit_ranks) == sorted(expect["culprits"]), story
    blamed = sorted({r for f in result.findings if f.blocking for r in f.culprit_ranks})
    want = expect["blamed"] if expect["blamed"] is not None else expect["culprits"]
    assert blamed == sorted(want), ("blamed", story)
    for kind, culprits in expect["also"]:
        assert any(f.kind == kind and sorted(f.culprit_ranks) == sorted(culprits)
                   for f in result.findings), ((kind, culprits), story)
    for text in expect["says"]:
        assert text in root.message, (text, story)


@pytest.mark.parametrize(("name", "form"), CASES)
def test_the_model_reads_each_dump_for_what_it_is(name, form):
    meta = _meta(name)
    result = analyze(DATA / name / form)
    kinds = {d.kind for d in result.load.dumps.values()}
    assert {k.backend for k in kinds} == {"nccl"}
    # the form is told from the records alone (nothing in a dump says it)
    assert {k.active_only for k in kinds} == {form != "full"}, kinds
    if form == "full":
        assert {k.timing for k in kinds} == {meta["timing"]}, kinds
    # a gap in an active-only dump is never truncated history nor a collective never issued
    assert not any(f.kind == "truncated_history" for f in result.findings)
    assert not any(d.wrapped for d in result.load.dumps.values())
    for f in result.findings:
        assert "#1 " not in f.message or f.collective_seq_id in (None, 1), f.message


def test_a_device_that_stopped_is_told_with_its_evidence():
    f = analyze(DATA / "gpu_error_ep" / "nvrx").findings[0]
    assert f.kind == "device_stopped" and f.details["side"] == "device"
    assert "finished" in f.message and "its thread went on" in f.message.lower()
    assert f.details["finished_by"]


def test_a_thread_that_stopped_is_told_with_its_evidence():
    f = analyze(DATA / "gil_hold" / "active").findings[0]
    assert f.kind == "missing_rank" and f.details["side"] == "thread"
    assert "never issued" in f.message and "device finished everything" in f.message


def test_ops_queued_behind_a_stalled_one_never_make_a_culprit():
    # the pipeline's ranks have sends and recvs queued behind their blocked collectives
    # on both sides: none of them is blamed for "never posting" (the bug this fixes)
    for form in ("full", "active", "nvrx"):
        result = analyze(DATA / "gpu_error_ep" / form)
        assert not any(f.kind == "p2p_unmatched" for f in result.findings), form
