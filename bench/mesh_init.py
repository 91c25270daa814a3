"""commscope's init_device_mesh against PyTorch's, side by side in one process.

Part 1, fake backend (one process pretends to be one rank of W; group creation costs
what the Python bookkeeping costs): W = 512, 4 096, 16 384 and shapes (W/8, 8),
(W/64, 8, 8), (2, W/16, 8); the two implementations are interleaved round-robin and
the medians compared. Goal: ours/torch <= 0.1 at 16 384 ranks.

Part 2, 8 real gloo ranks (forked, FileStore): (2, 4) and (2, 2, 2), interleaved; each
round's time is the slowest rank's.

    OMP_NUM_THREADS=1 python bench/mesh_init.py [--rounds 5]
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

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh as torch_init
from torch.testing._internal.distributed.fake_pg import FakeStore

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from commscope.mesh import init_device_mesh as ours_init


def _shapes(world: int) -> list[tuple[tuple[int, ...], tuple[str, ...]]]:
    return [
        ((world // 8, 8), ("dp", "tp")),
        ((world // 64, 8, 8), ("dp", "cp", "tp")),
        ((2, world // 16, 8), ("pp", "dp", "tp")),
    ]


def _one_fake(which: str, world: int, rank: int, shape, names) -> float:
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        start = time.perf_counter()
        (torch_init if which == "torch" else ours_init)("cpu", shape, mesh_dim_names=names)
        return time.perf_counter() - start
    finally:
        dist.destroy_process_group()


def fake_part(rounds: int) -> list[tuple[str, float, float]]:
    print("fake backend, one rank of W (ms, median of", rounds, "interleaved rounds)")
    print(f"  {'world':>6}  {'shape':<16} {'torch':>9} {'commscope':>10} {'ratio':>7}")
    rows = []
    for world in (512, 4096, 16384):
        for shape, names in _shapes(world):
            rank = world // 2 + 3
            _one_fake("torch", world, rank, shape, names)  # warm-up both
            _one_fake("ours", world, rank, shape, names)
            t, o = [], []
            for _ in range(rounds):
                t.append(_one_fake("torch", world, rank, shape, names))
                o.append(_one_fake("ours", world, rank, shape, names))
            tm, om = statistics.median(t), statistics.median(o)
            rows.append((f"{world} {shape}", tm, om))
            print(f"  {world:>6}  {shape!s:<16} {tm * 1e3:>9.2f} {om * 1e3:>10.2f} {om / tm:>7.3f}")
    return rows


def _gloo_rank(rank: int, world: int, store_spec: str, rounds: int, conn) -> None:
    torch.set_num_threads(1)
    if store_spec.startswith("tcp:"):
        store = dist.TCPStore("127.0.0.1", int(store_spec[4:]), world, is_master=False)
    else:
        store = dist.FileStore(store_spec, world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    out = []
    for shape, names in (((2, 4), ("dp", "tp")), ((2, 2, 2), ("dp", "pp", "tp"))):
        for _ in range(rounds):
            for which, fn in (("torch", torch_init), ("ours", ours_init)):
                dist.barrier()
                start = time.perf_counter()
                fn("cpu", shape, mesh_dim_names=names)
                out.append((str(shape), which, time.perf_counter() - start))
    conn.send(out)
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


def gloo_part(rounds: int, store_kind: str) -> None:
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    world = 8
    with tempfile.TemporaryDirectory() as tmp:
        if store_kind == "tcp":
            # The parent hosts the TCPStore, as torchrun's agent does.
            master = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False)
            store = f"tcp:{master.port}"
        else:
            store = str(Path(tmp) / "store")
        pipes, procs = [], []
        for rank in range(world):
            parent, child = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_gloo_rank, args=(rank, world, store, rounds, child))
            p.start()
            pipes.append(parent)
            procs.append(p)
        results = [p.recv() for p in pipes]
        for p in procs:
            p.join(timeout=30)
    print(
        f"\n8 real gloo ranks, {store_kind} store (ms; per round the slowest rank; "
        f"median of {rounds})"
    )
    print(f"  {'shape':<12} {'torch':>9} {'commscope':>10} {'ratio':>7}")
    n = len(results[0])
    slowest: dict[tuple[str, str], list[float]] = {}
    for i in range(n):
        shape, which, _ = results[0][i]
        slowest.setdefault((shape, which), []).append(max(r[i][2] for r in results))
    for shape in ("(2, 4)", "(2, 2, 2)"):
        tm = statistics.median(slowest[(shape, "torch")])
        om = statistics.median(slowest[(shape, "ours")])
        print(f"  {shape:<12} {tm * 1e3:>9.2f} {om * 1e3:>10.2f} {om / tm:>7.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    fake_part(args.rounds)
    gloo_part(args.rounds, "tcp")
    gloo_part(args.rounds, "file")


if __name__ == "__main__":
    main()
