"""What every rank of ``commscope demo`` does: mesh, traced TP step, training, a fault.

The model is the CommDebugMode tutorial's ``MLPModule`` (``net1`` column-wise and
``net2`` row-wise over the ``tp`` axis). Training averages gradients over the ``dp``
axis with one all_reduce of a flat buffer per step (what DDP's bucket does), then,
over the whole world, all_reduces the loss for the log and broadcasts rank 0's
learning rate (two async collectives, waited together). At :data:`FAULT_STEP` rank
:data:`FAULT_RANK` misbehaves as asked:

=========  ============================================================  ==================
fault      what rank 3 does                                               expected finding
=========  ============================================================  ==================
missing    skips the dp all_reduce                                        missing_rank
size       logs a loss tensor of 2 elements instead of 1                  size_mismatch
dtype      logs the loss as int32 instead of float32 (same byte size)     dtype_mismatch
order      swaps its two async logging collectives                        order_mismatch
crash      exits before the dp all_reduce                                crashed_rank
none       nothing                                                        healthy
=========  ============================================================  ==================
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from commscope.demo.faults import FAULT_RANK, FAULT_STEP, STEPS
from commscope.demo.launch import RankContext

__all__ = ["MLPModule", "enable_recorder", "story"]


def enable_recorder(traces: str, timeout_s: float, watch_interval_s: float | None = None
                    ) -> Any:
    """A ``setup`` for :class:`~commscope.demo.launch.LocalJob`: the recorder on, before
    ``init_process_group``, dumping to ``<traces>/rank_<N>`` (and publishing progress
    for ``commscope watch`` every ``watch_interval_s``)."""

    def setup(rank: int, world: int) -> None:
        import commscope.flight as flight

        flight.enable(dump_prefix=os.path.join(traces, "rank_"), timeout_s=timeout_s,
                      watch_interval_s=watch_interval_s)

    return setup


class MLPModule(torch.nn.Module):
    """The CommDebugMode tutorial's MLP: 10 → 16 → 10 (``net1``, ``relu``, ``net2``)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(5)
        self.net1 = torch.nn.Linear(10, 16)
        self.relu = torch.nn.ReLU()
        self.net2 = torch.nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``net2(relu(net1(x)))``."""
        return self.net2(self.relu(self.net1(x)))


def _step_mesh(ctx: RankContext) -> Any:
    from commscope.mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, ctx.world // 2), mesh_dim_names=("dp", "tp"))
    ctx.send(
        "mesh",
        {
            "coordinate": mesh.get_coordinate(),
            "groups": {n: mesh.group_ranks(n) for n in mesh.axis_names},
            "picture": mesh.describe() if ctx.rank == 0 else "",
        },
    )
    return mesh


def _step_comm(ctx: RankContext, mesh: Any, model: Any, out_dir: Path) -> None:
    import torch

    from commscope.comm import CommDebugMode, write_viewer

    x = torch.rand(4, 10, generator=torch.Generator().manual_seed(0))
    comm_mode = CommDebugMode(bandwidth_gbps=100.0)
    with comm_mode:
        model(x).sum().backward()
    model.zero_grad()
    if ctx.rank != 0:
        return
    json_path = out_dir / "comm_trace.json"
    html_path = out_dir / "comm_trace.html"
    comm_mode.generate_json_dump(file_name=str(json_path), noise_level=2)
    write_viewer(html_path, comm_mode.trace(), noise_level=2, title="commscope demo: TP MLP")
    ctx.send(
        "comm",
        {
            "table": comm_mode.generate_comm_debug_tracing_table(noise_level=0, color=False),
            "summary": comm_mode.summary(),
            "files": [str(json_path), str(html_path)],
        },
    )


def _train(ctx: RankContext, mesh: Any, model: Any, fault: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    dp = mesh.get_group("dp")
    dp_size = mesh.size("dp")
    dp_index = mesh.get_local_rank("dp")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    faulty = ctx.rank == FAULT_RANK
    for step in range(STEPS):
        gen = torch.Generator().manual_seed(1000 * step + dp_index)
        x = torch.rand(4, 10, generator=gen)
        loss = model(x).pow(2).mean()
        loss.backward()
        grads = [
            p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad for p in model.parameters()
        ]
        flat = torch.cat([g.reshape(-1) for g in grads])
        log = torch.tensor([loss.item()])
        at_fault = faulty and step == FAULT_STEP and fault != "none"
        if at_fault:
            ctx.send("fault", fault)
        if at_fault and fault == "crash":
            os._exit(17)
        if not (at_fault and fault == "missing"):
            dist.all_reduce(flat, group=dp)  # data parallel: average gradients
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g) / dp_size)
            offset += g.numel()
        opt.step()
        opt.zero_grad()
        if at_fault and fault == "size":
            log = torch.tensor([loss.item(), 0.0])
        elif at_fault and fault == "dtype":
            log = torch.tensor([int(loss.item() * 1000)], dtype=torch.int32)
        lr = torch.tensor([opt.param_groups[0]["lr"]])
        if at_fault and fault == "order":  # the same two collectives, the other way round
            works = [dist.broadcast(lr, src=0, async_op=True), dist.all_reduce(log, async_op=True)]
        else:
            works = [dist.all_reduce(log, async_op=True), dist.broadcast(lr, src=0, async_op=True)]
        for work in works:
            work.wait()
        ctx.send("step", (step, float(log.float().sum().item()) / ctx.world))


def story(ctx: RankContext, fault: str, out_dir: str) -> str:
    """Run every demo step on this rank; dump the flight recorder when done or failing."""
    import commscope.flight as flight

    out = Path(out_dir)
    try:
        mesh = _step_mesh(ctx)
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            parallelize_module,
        )

        model = parallelize_module(
            MLPModule(), mesh["tp"], {"net1": ColwiseParallel(), "net2": RowwiseParallel()}
        )
        _step_comm(ctx, mesh, model, out)
        _train(ctx, mesh, model, fault)
    except Exception as exc:
        path = flight.dump(reason=f"exception: {type(exc).__name__}")
        ctx.send("dumped", path)
        raise
    path = flight.dump(reason="end of demo")
    ctx.send("dumped", path)
    return path
