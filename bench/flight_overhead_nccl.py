"""What recording costs on NCCL: no recorder, PyTorch's NCCL recorder, commscope's (one GPU).

Each mode runs in a fresh one-rank NCCL job (NCCL refuses two ranks on one GPU, so the
collectives do no cross-GPU transfer: what is measured is the host-side cost of issuing
a collective, which is where a recorder adds its time). Modes:

* ``none``: ``TORCH_FR_BUFFER_SIZE=0``;
* ``native``: PyTorch's recorder, ``TORCH_FR_BUFFER_SIZE=2000``;
* ``ours``: ``commscope.flight.enable(buffer_size=2000)`` with the native one off.

Per mode and round: ``--iters`` synchronous ``all_reduce`` calls of ``--numel`` floats
(NCCL returns no work for these; commscope records a device event to learn when each
completes), then as many ``async_op=True`` calls whose works are waited on. The figure
is the median host time per call; rounds interleave the modes and the median over rounds
is printed with the differences to ``none``.

    python bench/flight_overhead_nccl.py [--iters 5000] [--rounds 5] [--numel 16]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, os, statistics, sys, time
mode, iters, numel, depth = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
import torch, torch.distributed as dist
if mode == "ours":
    import commscope.flight as flight
    flight.enable(buffer_size=2000, handle_signals=False, dump_on_exception=False)
dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
t = torch.ones(numel, device="cuda")
clock = time.perf_counter_ns

def nested(n, fn):
    return fn() if n <= 0 else nested(n - 1, fn)

def run(async_op):
    samples = []
    keep = samples.append
    for _ in range(iters):
        s = clock()
        w = dist.all_reduce(t, async_op=async_op)
        if w is not None:
            w.wait()
        keep(clock() - s)
    torch.cuda.synchronize()
    return statistics.median(samples) / 1e3

nested(depth, lambda: run(False))  # warm-up
out = {"sync_us": nested(depth, lambda: run(False)), "async_us": nested(depth, lambda: run(True))}
print("RESULT " + json.dumps(out), flush=True)
dist.destroy_process_group()
"""

MODES = ("none", "native", "ours")


def one(mode: str, iters: int, numel: int, depth: int, port: int) -> dict[str, float]:
    """Run one fresh job in ``mode``; its median host time per call, sync and async."""
    env = dict(
        os.environ,
        TORCH_FR_BUFFER_SIZE="2000" if mode == "native" else "0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK="0",
        WORLD_SIZE="1",
        LOCAL_RANK="0",
        OMP_NUM_THREADS="1",
        PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    done = subprocess.run(
        [sys.executable, "-c", CHILD, mode, str(iters), str(numel), str(depth)],
        env=env, capture_output=True, text=True, timeout=600,
    )
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{mode} job failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")


def main() -> None:
    """Interleave the modes for ``--rounds`` rounds and print the medians and ratios."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=5000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--numel", type=int, default=16)
    p.add_argument("--depth", type=int, default=20, help="Python frames above each call")
    args = p.parse_args()
    results: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    port = 29600
    for r in range(args.rounds):
        for mode in MODES:
            port += 1
            results[mode].append(one(mode, args.iters, args.numel, args.depth, port))
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(
            f"{m} sync {results[m][-1]['sync_us']:.1f} async {results[m][-1]['async_us']:.1f} us"
            for m in MODES), flush=True)
    med = {m: {k: statistics.median(x[k] for x in results[m]) for k in ("sync_us", "async_us")}
           for m in MODES}
    print("\nmedian host time per all_reduce call (us), one-rank NCCL job:")
    print(f"{'':8}{'none':>10}{'native':>10}{'ours':>10}{'native+':>10}{'ours+':>10}")
    for k in ("sync_us", "async_us"):
        n, nat, ours = med["none"][k], med["native"][k], med["ours"][k]
        print(f"{k[:-3]:8}{n:10.1f}{nat:10.1f}{ours:10.1f}{nat - n:+10.1f}{ours - n:+10.1f}")
    print(json.dumps({"medians": med, "rounds": results}))


if __name__ == "__main__":
    main()
