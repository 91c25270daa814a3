"""CommDebugMode on real gloo ranks: the tutorial's table, and every eager collective.

Each rank runs PyTorch's CommDebugMode and ours on the same calls and returns what both
counted; the parent compares.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest

from commscope import compat

pytestmark = pytest.mark.dist

DATA = Path(__file__).resolve().parents[1] / "data" / "comm"


def _seed_rank(rank: int, world_size: int, out_dir: str) -> dict:
    warnings.simplefilter("ignore")
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.debug import CommDebugMode as TorchCommDebugMode

    from commscope.comm import CommDebugMode
    from commscope.comm.examples import mlp_input, tp_mlp

    mesh = init_device_mesh("cpu", (world_size,))
    model = tp_mlp(mesh)
    inp = mlp_input()
    with TorchCommDebugMode() as theirs:
        model(inp)
    comm_mode = CommDebugMode()
    with comm_mode:
        output = model(inp)
    comm_mode.log_comm_debug_tracing_table_to_file(
        file_name=os.path.join(out_dir, "log_{rank}.txt"), noise_level=0
    )
    comm_mode.generate_json_dump(file_name=os.path.join(out_dir, "comm_{rank}.json"), noise_level=2)
    # A training loop in one block: PyTorch raises IndexError here.
    with CommDebugMode() as loop:
        for _ in range(2):
            model(inp).sum().backward()
    return {
        "plain": comm_mode.generate_comm_debug_tracing_table(noise_level=0, color=False),
        "ansi": comm_mode.generate_comm_debug_tracing_table(noise_level=0, color=True),
        "theirs": theirs.generate_comm_debug_tracing_table(noise_level=0),
        "records": [r.to_json() for r in comm_mode.records],
        "loop": {str(k): v for k, v in loop.get_comm_counts().items()},
        "shape": tuple(output.shape),
        "same_output": bool(torch.equal(output, model(inp))),
    }


def test_seed_example_on_four_gloo_ranks(ranks, tmp_path):
    results = ranks(_seed_rank, 4, str(tmp_path), timeout=90)
    seed = (DATA / "seed_mlp_noise0.txt").read_text()
    for rank, res in enumerate(results):
        assert res["plain"] == seed, rank
        assert res["ansi"] == res["theirs"], rank
        assert (tmp_path / f"log_{rank}.txt").read_text() == seed
        dump = json.loads((tmp_path / f"comm_{rank}.json").read_text())
        assert dump["commscope"]["rank"] == rank and dump["commscope"]["world_size"] == 4
        (record,) = res["records"]
        assert (record["key"], record["module"], record["phase"]) == (
            "c10d_functional.all_reduce",
            "MLPModule.net2",
            "forward",
        )
        assert record["bytes"] == 8 * 10 * 4 and record["group_size"] == 4
        assert record["group_desc"] == "default_pg" and record["axis"] == "dim_0"
        assert res["loop"] == {"c10d_functional.all_reduce": 2}
        assert res["shape"] == (8, 10) and res["same_output"]


def _calls(rank: int, world_size: int):
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    group = dist.group.WORLD
    t = torch.ones(4)

    def p2p():
        if rank == 0:
            dist.send(torch.ones(4), 1)
        elif rank == 1:
            dist.recv(t, 0)

    def batch_p2p():
        ops = [
            dist.P2POp(dist.isend, torch.ones(4), (rank + 1) % world_size),
            dist.P2POp(dist.irecv, torch.zeros(4), (rank - 1) % world_size),
        ]
        for work in dist.batch_isend_irecv(ops):
            work.wait()

    def functional_batch_p2p():  # what batch_isend_irecv becomes under torch.compile
        outs = torch.ops._c10d_functional.batch_p2p_ops(
            ["isend", "irecv"],
            [(rank + 1) % world_size, (rank - 1) % world_size],
            [0, 0],
            [torch.ones(4, dtype=torch.float64), torch.zeros(4, dtype=torch.float64)],
            group.group_name,
        )
        for out in outs:
            torch.ops._c10d_functional.wait_tensor(out)

    calls = {
        "all_reduce": lambda: dist.all_reduce(t),
        "all_reduce async": lambda: dist.all_reduce(t, async_op=True).wait(),
        "all_gather list": lambda: dist.all_gather([torch.zeros(4) for _ in range(world_size)], t),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(
            torch.zeros(4 * world_size), t
        ),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(
            torch.zeros(4), torch.ones(4 * world_size)
        ),
        "broadcast": lambda: dist.broadcast(t, 0),
        "reduce": lambda: dist.reduce(t, 0),
        "gather": lambda: dist.gather(
            t, [torch.zeros(4) for _ in range(world_size)] if rank == 0 else None, 0
        ),
        "scatter": lambda: dist.scatter(
            t, [torch.ones(4) for _ in range(world_size)] if rank == 0 else None, 0
        ),
        "all_to_all_single": lambda: dist.all_to_all_single(
            torch.zeros(4 * world_size), torch.ones(4 * world_size)
        ),
        "all_gather_object": lambda: dist.all_gather_object([None] * world_size, {"r": rank}),
        "funcol.all_reduce": lambda: funcol.all_reduce(t, "sum", group).wait(),
        "funcol.all_gather_tensor": lambda: funcol.all_gather_tensor(t, 0, group).wait(),
        "funcol.all_reduce_coalesced": lambda: [
            x.wait() for x in funcol.all_reduce_coalesced([t, t], "sum", group)
        ],
        "barrier": lambda: dist.barrier(),
        "send/recv": p2p,
        "batch_isend_irecv": batch_p2p,
        "in-place all_reduce_": lambda: torch.ops._c10d_functional.wait_tensor(
            torch.ops._c10d_functional.all_reduce_(t, "sum", group.group_name)
        ),
    }
    if compat.has("functional_batch_p2p"):  # torch 2.12+
        calls["functional batch_p2p_ops"] = functional_batch_p2p
    return calls


def _same_capture(full, hooked) -> str | None:
    """None when ops=False captured exactly what the dispatch mode did, else the difference."""
    a = (full.get_comm_counts(), full.comm_module_counts, full.records)
    b = (hooked.get_comm_counts(), hooked.comm_module_counts, hooked.records)
    return None if a == b else f"dispatch mode {a} != ops=False {b}"


def _probe_rank(rank: int, world_size: int) -> dict:
    warnings.simplefilter("ignore")
    from torch.distributed.tensor.debug import CommDebugMode as TorchCommDebugMode

    from commscope.comm import CommDebugMode

    out = {}
    for name, call in _calls(rank, world_size).items():
        with TorchCommDebugMode() as theirs:
            call()
        with CommDebugMode() as ours:
            call()
        with CommDebugMode(ops=False) as hooked:  # no dispatch mode: hooks at the entry
            call()
        out[name] = {
            "hooked": _same_capture(ours, hooked),
            "theirs": {str(k): v for k, v in theirs.get_comm_counts().items() if v},
            "ours": {str(k): v for k, v in ours.get_comm_counts().items() if v},
            "bytes": [r.bytes for r in ours.records],
            "collectives": [r.collective for r in ours.records],
        }
    return out


def test_eager_and_functional_collectives_on_gloo(ranks):
    results = ranks(_probe_rank, 2, timeout=90)
    not_counted_by_pytorch = {
        "barrier": {"c10d.barrier": 1},
        "in-place all_reduce_": {"_c10d_functional.all_reduce_": 1},
        "batch_isend_irecv": {"c10d.send": 1, "c10d.recv_": 1},
        "functional batch_p2p_ops": {"c10d_functional.isend": 1, "c10d_functional.irecv": 1},
    }
    for rank, res in enumerate(results):
        for name, got in res.items():
            assert got["hooked"] is None, (rank, name, got["hooked"])
            if name in not_counted_by_pytorch:
                assert got["theirs"] == {}, name
                assert got["ours"] == not_counted_by_pytorch[name], name
            elif name == "send/recv":
                assert got["theirs"] == {}
                assert got["ours"] == ({"c10d.send": 1} if rank == 0 else {"c10d.recv_": 1})
                assert got["bytes"] == [16] and got["collectives"] == [["send", "recv"][rank]]
            else:
                assert got["ours"] == got["theirs"] != {}, (rank, name, got)
        assert res["all_reduce async"]["ours"] == {"c10d.allreduce_": 1}
        # sizes, then the pickled bytes: all_gather (c10d.allgather_) before torch 2.15,
        # all_gather_single (c10d._allgather_base_) since; the same collective and bytes
        gathered_by = ("c10d._allgather_base_" if compat.has("all_gather_object_single")
                       else "c10d.allgather_")
        assert res["all_gather_object"]["ours"] == {gathered_by: 2}
        assert res["all_gather_object"]["collectives"] == ["all_gather", "all_gather"]
        assert res["all_gather_object"]["bytes"][0] == 8 * 2  # one int64 size per rank
        assert res["all_reduce"]["bytes"] == [16]
        assert res["all_gather_into_tensor"]["bytes"] == [32]
        assert res["reduce_scatter_tensor"]["bytes"] == [32]
        assert res["funcol.all_gather_tensor"]["bytes"] == [32]
        assert res["scatter"]["bytes"] == [16] and res["gather"]["bytes"] == [16]
        if compat.has("functional_batch_p2p"):
            assert res["functional batch_p2p_ops"]["bytes"] == [32, 32]
            assert res["functional batch_p2p_ops"]["collectives"] == ["send", "recv"]
        else:
            assert "functional batch_p2p_ops" not in res


def _probe_recorded_rank(rank: int, world_size: int, dump_dir: str) -> dict:
    """The same calls on groups the flight recorder made (Python subclasses of
    ``ProcessGroup`` whose methods hand every call to a plain twin)."""
    import os

    import torch.distributed as dist

    import commscope.flight as flight
    from commscope.comm import CommDebugMode

    warnings.simplefilter("ignore")
    flight.enable(watchdog=False, handle_signals=False, dump_on_exception=False,
                  dump_prefix=os.path.join(dump_dir, "rank_"), watch_interval_s=0)
    store = dist.FileStore(os.environ["COMMSCOPE_TEST_STORE"], world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    out = {"recording": type(dist.group.WORLD).__name__}
    for name, call in _calls(rank, world_size).items():
        with CommDebugMode() as full:
            call()
        with CommDebugMode(ops=False) as hooked:
            call()
        out[name] = (full.get_total_counts(), _same_capture(full, hooked))
    out["recorded"] = len(flight.snapshot(include_stack_traces=False)["entries"])
    # No destroy_process_group: on torch 2.6-2.7 tearing down these groups can block for
    # good in ~ProcessGroupGloo; the harness ends the rank once it has reported.
    flight.disable()
    return out


def test_collectives_only_capture_on_flight_recording_groups(ranks, tmp_path):
    results = ranks(_probe_recorded_rank, 2, str(tmp_path), init=False, timeout=90)
    for rank, res in enumerate(results):
        assert res.pop("recording") == "RecordingProcessGroup"
        assert res.pop("recorded") > 0
        for name, (total, difference) in res.items():
            assert difference is None, (rank, name, difference)
            assert total > 0, (rank, name)
