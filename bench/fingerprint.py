"""What the running fingerprints cost (issue 33, item 3), against PyTorch's DETAIL mode.

Every recording rank folds each collective into its group's running fingerprint
(:mod:`commscope.flight.record.agree.fingerprint`) so that silent desyncs show while the job
runs. PyTorch's way to catch them, ``TORCH_DISTRIBUTED_DEBUG=DETAIL``, checks every
collective with an extra one. Two parts, one run:

1. **The fold alone**, on torch's fake backend (no communication, so the recorder's
   own cost shows): per ``all_reduce`` and ``broadcast``, no recorder (the reference),
   then in one recording job the fingerprints switched off and on block by block
   (paired), medians reported.
2. **The same loop on real gloo ranks** (2 processes, a small all_reduce): no recorder,
   the recorder without fingerprints, with them, and PyTorch's DETAIL mode, each a
   fresh job (DETAIL is set when groups are made), rounds interleaved; medians and the
   ratios to the plain loop. Fresh jobs on a shared 2-core box move by more than a
   fingerprint costs, so one more job switches the fingerprints off and on every 100
   all_reduces on both ranks (paired): the median difference is the steadier figure.

    python bench/fingerprint.py [--iters 2000] [--rounds 30] [--gloo-iters 2000] [--gloo-rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import commscope.flight as flight
from commscope.flight.record.agree.fingerprint import Fingerprint
from commscope.flight.record.recorder import SLOT
from tests.harness import fake_world

WORLD = 8
MODES = ("none", "recorder", "fingerprint", "detail")


def _ops() -> dict[str, object]:
    t = torch.ones(16)
    return {"all_reduce": lambda: dist.all_reduce(t), "broadcast": lambda: dist.broadcast(t, 3)}


def _per_op_us(fn: object, iters: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(iters):
        fn()  # type: ignore[operator]
    return (time.perf_counter_ns() - start) / iters / 1000


def _set_prints(on: bool) -> None:
    rec = SLOT.rec
    assert rec is not None
    for g in rec.groups:
        g.fp = Fingerprint() if on else None


def fold_alone(iters: int, rounds: int) -> dict[tuple[str, str], float]:
    """Part 1: median us per op, (op, mode) with mode none / recorder / fingerprint."""
    results: dict[tuple[str, str], list[float]] = {}
    with fake_world(0, WORLD):
        for _ in range(max(3, rounds // 8)):
            for name, fn in _ops().items():
                results.setdefault((name, "none"), []).append(_per_op_us(fn, iters))
    folder = tempfile.mkdtemp()
    flight.enable(dump_prefix=os.path.join(folder, "rank_"), watchdog=False,
                  handle_signals=False, dump_on_exception=False)
    try:
        with fake_world(0, WORLD):
            ops = _ops()
            for _ in range(rounds):
                for mode in ("recorder", "fingerprint"):
                    _set_prints(mode == "fingerprint")
                    for name, fn in ops.items():
                        results.setdefault((name, mode), []).append(_per_op_us(fn, iters))
    finally:
        flight.disable()
    return {k: statistics.median(v) for k, v in results.items()}


def _gloo_rank(rank: int, mode: str, iters: int, port: int, out: object) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    if mode == "detail":
        os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
        dist.set_debug_level_from_env()
    elif mode != "none":
        flight.enable(dump_prefix=os.path.join(tempfile.mkdtemp(), "rank_"), watchdog=False,
                      handle_signals=False, dump_on_exception=False,
                      fingerprint=mode != "recorder")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    t = torch.ones(64)
    for _ in range(200):  # warm up
        dist.all_reduce(t)
    dist.barrier()
    if mode == "paired":  # one job, fingerprints off and on block by block, both ranks
        block = 100
        diffs = []
        for _ in range(max(1, iters // (2 * block))):
            _set_prints(False)
            off = _per_op_us(lambda: dist.all_reduce(t), block)
            _set_prints(True)
            on = _per_op_us(lambda: dist.all_reduce(t), block)
            diffs.append(on - off)
        us = statistics.median(diffs)
    else:
        us = _per_op_us(lambda: dist.all_reduce(t), iters)
    if rank == 0:
        out.put(us)  # type: ignore[attr-defined]
    dist.barrier()
    dist.destroy_process_group()


def gloo_loop(iters: int, rounds: int) -> dict[str, float]:
    """Part 2: median us per all_reduce of a 2-rank gloo job, by mode."""
    ctx = mp.get_context("spawn")
    got: dict[str, list[float]] = {m: [] for m in (*MODES, "paired")}
    port = 29600 + os.getpid() % 1000
    for r in range(rounds):
        for mode in (*MODES, "paired"):
            q = ctx.Queue()
            port += 1
            procs = [ctx.Process(target=_gloo_rank, args=(rank, mode, iters, port, q))
                     for rank in range(2)]
            for p in procs:
                p.start()
            got[mode].append(q.get(timeout=300))
            for p in procs:
                p.join(60)
        print(f"  gloo round {r + 1}/{rounds}: " + ", ".join(
            f"{m} {got[m][-1]:.1f}" for m in (*MODES, "paired")), flush=True)
    return {m: statistics.median(v) for m, v in got.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=2000, help="ops per block (part 1)")
    ap.add_argument("--rounds", type=int, default=30, help="paired rounds (part 1)")
    ap.add_argument("--gloo-iters", type=int, default=2000, help="all_reduces per job")
    ap.add_argument("--gloo-rounds", type=int, default=3, help="jobs per mode")
    args = ap.parse_args()
    print(f"torch {torch.__version__}, python {sys.version.split()[0]}, "
          f"{os.cpu_count()} cpus")
    print(f"1. the fold alone: fake backend, {WORLD} ranks, blocks of {args.iters} ops, "
          f"{args.rounds} paired rounds; median us per op")
    fold = fold_alone(args.iters, args.rounds)
    print(f"{'op':12} {'no recorder':>12} {'recorder':>10} {'+ fingerprint':>14} {'cost':>8}")
    for name in _ops():
        none, plain, full = (fold[(name, m)] for m in ("none", "recorder", "fingerprint"))
        print(f"{name:12} {none:12.2f} {plain:10.2f} {full:14.2f} {full - plain:+8.2f}")
    print(f"2. the same loop on gloo: 2 ranks, all_reduce of 64 floats, {args.gloo_iters} per "
          f"job, {args.gloo_rounds} job(s) per mode; median us per all_reduce")
    loop = gloo_loop(args.gloo_iters, args.gloo_rounds)
    base = loop["none"]
    print(f"{'mode':12} {'us/op':>8} {'ratio':>7}")
    for m in MODES:
        print(f"{m:12} {loop[m]:8.1f} {loop[m] / base:7.2f}")
    print(f"paired, in one recording job (fingerprints off/on every 100 all_reduces): "
          f"{loop['paired']:+.2f} us per all_reduce for the fingerprint")
    return 0


if __name__ == "__main__":
    sys.exit(main())
