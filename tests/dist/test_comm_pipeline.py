"""CommDebugMode on a real 2-stage pipeline (torch.distributed.pipelining, gloo, CPU).

Stage 0 sends activations and receives gradients, stage 1 the other way round. Every
one of those sends and recvs must be charged to ``pipeline stage N`` in the phase of the
schedule's action (forward for activations, backward for gradients), never to
``after_backward``, on GPipe and on 1F1B (whose steady state fuses a forward send with a
backward recv in one batch), and on interleaved 1F1B with two stages per rank.
"""

from __future__ import annotations

import json
import os
import warnings
from collections import Counter

import pytest

from commscope import compat
from commscope.comm import load_json
from tests.needs import torch_has

pytestmark = [pytest.mark.dist, torch_has("pipelining_on_gloo")]

MICROBATCHES = 4
BATCH, WIDTH, OUT = 8, 8, 4
ACTIVATION_BYTES = (BATCH // MICROBATCHES) * WIDTH * 4  # one float32 microbatch: 64 B


def _mse(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The schedules' loss: mean squared error."""
    return ((out - target) ** 2).mean()


def _stepper(sched, rank: int, x: torch.Tensor, target: torch.Tensor):
    """One schedule step: the first stage feeds ``x``, the last one the target."""

    def step() -> None:
        if rank == 0:
            sched.step(x)
        else:
            sched.step(target=target)

    return step


def _pipeline(rank: int, schedule: str):
    """This rank's stage of an MLP cut in two, its schedule and a ``step()``."""
    import torch
    from torch import nn
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    torch.manual_seed(0)
    if rank == 0:
        submodule = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU())
    else:
        submodule = nn.Sequential(nn.Linear(WIDTH, OUT))
    stage = PipelineStage(submodule, rank, 2, torch.device("cpu"))
    cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
    sched = cls(stage, MICROBATCHES, loss_fn=_mse)
    x, target = torch.randn(BATCH, WIDTH), torch.randn(BATCH, OUT)

    step = _stepper(sched, rank, x, target)

    return stage, step


def _wrapped_methods() -> dict[str, object]:
    from torch.distributed.pipelining import stage as stage_module

    base = stage_module._PipelineStageBase
    names = ("get_fwd_recv_ops", "get_fwd_send_ops", "get_bwd_recv_ops", "get_bwd_send_ops")
    return {name: base.__dict__[name] for name in names}


def _summary(cm) -> dict:
    return {
        "records": [r.to_json() for r in cm.records],
        "module_counts": {
            fqn: {phase: {str(k): v for k, v in c.items() if v} for phase, c in phases.items()}
            for fqn, phases in cm.comm_module_counts.items()
        },
    }


def _schedule_rank(rank: int, world_size: int, schedule: str, out_dir: str) -> dict:
    warnings.simplefilter("ignore")
    from commscope.comm import CommDebugMode
    from commscope.comm.capture import pipeline

    stage, step = _pipeline(rank, schedule)
    before = _wrapped_methods()
    step()  # the first step also exchanges shapes: keep it out of the exact counts
    with CommDebugMode() as cm:
        wrapped_inside = _wrapped_methods() != before
        step()
    cm.generate_json_dump(os.path.join(out_dir, f"{schedule}_{{rank}}.json"), noise_level=0)
    with CommDebugMode(ops=False) as collectives_only:
        step()
    # The first step in a block: warm-up vote and metadata exchange are the stage's too.
    _, cold_step = _pipeline(rank, schedule)
    with CommDebugMode() as cold:
        cold_step()
    # A raising block unwraps too.
    try:
        with CommDebugMode():
            step()
            raise KeyError("boom")
    except KeyError:
        pass
    return {
        "warm": _summary(cm),
        "cold": _summary(cold),
        "collectives_only": _summary(collectives_only),
        "table": cm.generate_comm_debug_tracing_table(noise_level=0, color=False),
        "wrapped_inside": wrapped_inside,
        "restored": _wrapped_methods() == before,
        "tags_left": len(pipeline._TAGS),
        "stage_index": stage.stage_index,
    }


def _directions(records: list[dict]) -> Counter:
    return Counter((r["collective"], r["phase"], r["module"], r["stage"]) for r in records)


def _schedule_setup(rank: int) -> Counter:
    """What the schedule itself sends on a 2-rank pipeline's first step, outside every
    stage (torch 2.15+, ``pipeline_schedule_preconnects``): the all_reduce that agrees on
    the metadata mode, one 4-byte message from rank 0 to rank 1 and the all_reduce that
    ends that round. They belong to the rank, not to a stage, so they stay with
    ``Global``; before 2.15 there is nothing outside the stages."""
    if not compat.has("pipeline_schedule_preconnects"):
        return Counter()
    p2p = "send" if rank == 0 else "recv"
    return Counter({("all_reduce", "forward", "Global", None): 2,
                    (p2p, "forward", "Global", None): 1})


@pytest.mark.parametrize("schedule", [
    "gpipe", pytest.param("1f1b", marks=torch_has("pipeline_1f1b_on_gloo"))])
def test_pipeline_p2p_phase_and_stage(ranks, tmp_path, schedule):
    results = ranks(_schedule_rank, 2, schedule, str(tmp_path), timeout=120)
    n = MICROBATCHES
    expected = {
        0: {
            ("send", "forward", "pipeline stage 0", 0): n,
            ("recv", "backward", "pipeline stage 0", 0): n,
        },
        1: {
            ("recv", "forward", "pipeline stage 1", 1): n,
            ("send", "backward", "pipeline stage 1", 1): n,
        },
    }
    for rank, res in enumerate(results):
        warm = res["warm"]
        assert _directions(warm["records"]) == expected[rank], (rank, warm["records"])
        assert all(r["bytes"] == ACTIVATION_BYTES for r in warm["records"])
        assert _directions(res["collectives_only"]["records"]) == expected[rank]
        fqn = f"pipeline stage {rank}"
        counts = warm["module_counts"]
        send, recv = ("forward", "backward") if rank == 0 else ("backward", "forward")
        assert counts[fqn][send] == {"c10d.send": n} and counts[fqn][recv] == {"c10d.recv_": n}
        assert counts["Global"][send] == {"c10d.send": n}
        assert counts["Global"][recv] == {"c10d.recv_": n}
        assert "after_backward" not in counts["Global"]
        assert fqn in res["table"] and "AFTER BACKWARD" not in res["table"]

        # Cold step: the stage's set-up messages are charged to the stage by direction as
        # well; the schedule's own (2.15+) stay with Global, 4 bytes each.
        cold = _directions(res["cold"]["records"])
        unstaged = [r for r in res["cold"]["records"] if r["stage"] is None]
        assert _directions(unstaged) == _schedule_setup(rank), (rank, cold)
        assert all(r["bytes"] == 4 for r in unstaged), (rank, unstaged)
        assert set(cold) - set(_directions(unstaged)) == set(expected[rank]), (rank, cold)
        for key in expected[rank]:
            assert cold[key] >= n
        cold_activations = [r for r in res["cold"]["records"] if r["bytes"] == ACTIVATION_BYTES]
        assert _directions(cold_activations) == expected[rank]

        path = tmp_path / f"{schedule}_{rank}.json"
        dump = json.loads(path.read_text())
        records = dump["commscope"]["records"]
        assert {r["stage"] for r in records} == {rank}
        assert [c["fqn"] for c in dump["children"]].count(fqn) == 1
        assert {r.stage for r in load_json(path).records} == {rank}

        assert res["wrapped_inside"] and res["restored"] and res["tags_left"] == 0


def _batch_rank(rank: int, world_size: int) -> dict:
    """``_c10d_functional.batch_p2p_ops`` (``batch_isend_irecv`` under ``torch.compile``)
    with one tensor built by the stage (tagged) and one of the user's (untagged)."""
    warnings.simplefilter("ignore")
    import torch
    import torch.distributed as dist

    from commscope.comm import CommDebugMode

    stage, step = _pipeline(rank, "gpipe")
    step()
    peer = 1 - rank
    with CommDebugMode() as cm:
        # Stage 0 waits for a gradient, stage 1 for an activation: the stage's buffers.
        (recv_op,) = stage.get_bwd_recv_ops(0) if rank == 0 else stage.get_fwd_recv_ops(0)
        outs = torch.ops._c10d_functional.batch_p2p_ops(
            ["isend", "irecv"],
            [peer, peer],
            [0, 0],
            [torch.ones(recv_op.tensor.shape), recv_op.tensor],
            dist.group.WORLD.group_name,
        )
        for out in outs:
            torch.ops._c10d_functional.wait_tensor(out)
    return [r.to_json() for r in cm.records]


@torch_has("functional_batch_p2p")
def test_functional_batch_p2p_uses_the_tags(ranks):
    results = ranks(_batch_rank, 2, timeout=120)
    for rank, records in enumerate(results):
        got = [(r["collective"], r["module"], r["phase"], r["stage"]) for r in records]
        recv_phase = "backward" if rank == 0 else "forward"
        assert got == [
            ("send", "Global", "forward", None),
            ("recv", f"pipeline stage {rank}", recv_phase, rank),
        ], (rank, got)


def _interleaved_rank(rank: int, world_size: int) -> list[dict]:
    """Two stages per rank (``rank`` and ``rank + 2`` of 4), ScheduleInterleaved1F1B."""
    warnings.simplefilter("ignore")
    import torch
    from torch import nn
    from torch.distributed.pipelining import PipelineStage, ScheduleInterleaved1F1B

    from commscope.comm import CommDebugMode

    torch.manual_seed(0)
    stages = [
        PipelineStage(nn.Sequential(nn.Linear(WIDTH, WIDTH)), index, 4, torch.device("cpu"))
        for index in (rank, rank + 2)
    ]
    sched = ScheduleInterleaved1F1B(stages, MICROBATCHES, loss_fn=_mse)
    x, target = torch.randn(BATCH, WIDTH), torch.randn(BATCH, WIDTH)

    step = _stepper(sched, rank, x, target)
    step()
    with CommDebugMode() as cm:
        step()
    return [r.to_json() for r in cm.records]


@torch_has("pipeline_1f1b_on_gloo")
def test_interleaved_stages_on_one_rank_stay_apart(ranks):
    results = ranks(_interleaved_rank, 2, timeout=120)
    n = MICROBATCHES
    for rank, records in enumerate(results):
        got = _directions(records)
        expected: Counter = Counter()
        for stage in (rank, rank + 2):
            fqn = f"pipeline stage {stage}"
            if stage > 0:  # activations in, gradients out
                expected[("recv", "forward", fqn, stage)] = n
                expected[("send", "backward", fqn, stage)] = n
            if stage < 3:  # activations out, gradients in
                expected[("send", "forward", fqn, stage)] = n
                expected[("recv", "backward", fqn, stage)] = n
        assert got == expected, (rank, got)
