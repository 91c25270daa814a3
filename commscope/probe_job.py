"""The throw-away one-rank job of the self-check, run as ``python -m commscope.probe_job``.

:mod:`commscope.probe` starts it in a child Python (same interpreter, same environment)
and reads the one JSON line it prints: which recorder calls were not recorded, which
collectives ``CommDebugMode`` did not count. It imports the recorder and the tracer,
which is why it is a module of its own, on top: nothing imports it.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable
from typing import Any

__all__: list[str] = []

def _flight_part(dist: Any, funcol: Any, torch: Any, tmp: str) -> tuple[list[str], Any]:
    """Steps 1 of the module doc; returns what was not recorded and the second group."""
    from commscope import flight

    flight.enable(buffer_size=64, dump_prefix=os.path.join(tmp, "rank_"), watchdog=False,
                  handle_signals=False, dump_on_exception=False, watch_interval_s=0)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    sub = dist.new_group([0])
    t = torch.ones(4)
    steps: list[tuple[str, Any, Callable[[], Any]]] = [
        ("dist.all_reduce", None, lambda: dist.all_reduce(t)),
        ("dist.broadcast", None, lambda: dist.broadcast(t, 0)),
        ("dist.all_gather", None, lambda: dist.all_gather([torch.empty(4)], t)),
        ("dist.barrier", None, lambda: dist.barrier()),
        ("dist.all_reduce on a new_group", sub, lambda: dist.all_reduce(t, group=sub)),
        ("functional all_reduce", sub, lambda: funcol.wait_tensor(
            funcol.all_reduce(t, "sum", sub))),
    ]
    missing = []
    for name, group, call in steps:
        before = len(flight.snapshot(include_stack_traces=False)["entries"])
        call()
        entries = flight.snapshot(include_stack_traces=False)["entries"]
        want = (group or dist.group.WORLD).group_name
        if len(entries) <= before:
            missing.append(name)
        elif str(entries[-1].get("process_group", ("",))[0]) != str(want):
            missing.append(f"{name} (recorded on the wrong group)")
    return missing, sub


def _comm_part(dist: Any, funcol: Any, torch: Any, group: Any) -> list[str]:
    """Step 2 of the module doc: what ``CommDebugMode`` did not count where it ran."""
    from commscope.comm import CommDebugMode

    class Probe(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            y = funcol.wait_tensor(funcol.all_reduce(x, "sum", group))
            dist.all_reduce(y, group=group)
            return y

    with CommDebugMode() as mode:
        Probe()(torch.ones(4))
    counts = {str(k): v for k, v in mode.get_comm_counts().items()}
    missing = []
    if counts.get("c10d_functional.all_reduce", 0) != 1:
        missing.append("functional all_reduce")
    if counts.get("c10d.allreduce_", 0) != 1:
        missing.append("dist.all_reduce")
    fwd = mode.comm_module_counts.get("Probe", {}).get("forward", {})
    if not missing and sum(fwd.values()) != 2:
        missing.append("the collectives of a module's forward (counted, but not under it)")
    return missing


def _main() -> None:
    """The child: run the throw-away job and print one JSON verdict."""
    import torch

    out: dict[str, Any] = {"torch_version": str(torch.__version__)}
    try:
        import torch.distributed as dist
        import torch.distributed._functional_collectives as funcol

    except Exception as exc:  # no torch.distributed at all: nothing to prove
        out["error"] = f"{type(exc).__name__}: {exc}"
        print(json.dumps(out), flush=True)
        return
    group = None
    with tempfile.TemporaryDirectory(prefix="commscope-probe-") as tmp:
        try:
            out["flight_missing"], group = _flight_part(dist, funcol, torch, tmp)
        except Exception as exc:  # the recorder broke the job: that is its failure
            out["flight_missing"] = [f"the job itself ({type(exc).__name__}: {exc})"]
        if group is None:  # the recorder broke the job; trace on a plain one instead
            with contextlib.suppress(Exception):
                from commscope import flight

                flight.disable()
                if not dist.is_initialized():
                    dist.init_process_group("gloo", store=dist.HashStore(), rank=0,
                                            world_size=1)
                group = dist.group.WORLD
        if group is not None:
            try:
                out["comm_missing"] = _comm_part(dist, funcol, torch, group)
            except Exception as exc:
                out["comm_missing"] = [f"the traced block ({type(exc).__name__}: {exc})"]
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    _main()
