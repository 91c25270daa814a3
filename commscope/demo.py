"""``commscope demo``: the end-to-end job the README starts, on local CPU ranks.

The ranks are forked from this process (torch already imported, so they start in
milliseconds) and join one gloo job through a ``FileStore`` in the output folder: no
network, no GPU. Each step of the demo is a function run on every rank; rank results
come back to this process, which prints them in rank order.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

__all__ = ["run_demo", "launch_local"]

SIMULATED_RANKS_PER_HOST = 4


class DemoError(RuntimeError):
    """A demo step failed on some rank; the message holds that rank's traceback."""


def _rank_main(
    fn: Callable[..., Any], rank: int, world: int, store_path: str, args: tuple, conn: Any
) -> None:
    os.environ.update(
        {
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(rank % SIMULATED_RANKS_PER_HOST),
            "LOCAL_WORLD_SIZE": str(min(world, SIMULATED_RANKS_PER_HOST)),
            "OMP_NUM_THREADS": "1",
        }
    )
    code = 0
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        dist.init_process_group(
            "gloo",
            store=dist.FileStore(store_path, world),
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=60),
        )
        payload: tuple[str, Any] = ("ok", fn(rank, world, *args))
        dist.destroy_process_group()
    except BaseException:
        payload, code = ("error", traceback.format_exc()), 1
    conn.send_bytes(pickle.dumps(payload))
    conn.close()
    os._exit(code)


def launch_local(
    fn: Callable[..., Any], world: int, workdir: Path, *args: Any, timeout: float = 120.0
) -> list[Any]:
    """Run ``fn(rank, world, *args)`` on ``world`` forked gloo ranks; return their results.

    Raises :class:`DemoError` with the first failing rank's traceback; kills every rank
    still running at ``timeout``.
    """
    import torch  # noqa: F401 - imported before fork so the ranks inherit it

    ctx = mp.get_context("fork")
    store = str(workdir / f".store-{os.getpid()}-{time.monotonic_ns()}")
    procs, conns = [], []
    for rank in range(world):
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_rank_main, args=(fn, rank, world, store, args, child))
        proc.start()
        child.close()
        procs.append(proc)
        conns.append(parent)
    results: list[Any] = [None] * world
    deadline = time.monotonic() + timeout
    try:
        for rank, conn in enumerate(conns):
            remaining = max(0.0, deadline - time.monotonic())
            if not conn.poll(remaining):
                raise DemoError(f"rank {rank} did not finish within {timeout:.0f} s")
            try:
                status, value = pickle.loads(conn.recv_bytes())
            except EOFError:
                raise DemoError(f"rank {rank} died without a result") from None
            if status != "ok":
                raise DemoError(f"rank {rank} failed:\n{value}")
            results[rank] = value
    finally:
        for proc in procs:
            proc.join(timeout=2)
            if proc.is_alive():
                os.kill(proc.pid, signal.SIGKILL)
                proc.join()
        for conn in conns:
            conn.close()
        Path(store).unlink(missing_ok=True)
    return results


# ------------------------------------------------------------------ step 1: mesh


def _mesh_step(rank: int, world: int, shape: tuple[int, ...], names: tuple[str, ...]) -> dict:
    import torch
    import torch.distributed as dist

    from commscope.mesh import init_device_mesh

    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    groups = {}
    for name in names:
        pg = mesh.get_group(name)
        total = torch.tensor([float(rank)])
        dist.all_reduce(total, group=pg)  # prove the group works: sum of its ranks
        groups[name] = (mesh.group_ranks(name), int(total.item()))
    return {
        "coordinate": mesh.get_coordinate(),
        "groups": groups,
        "picture": mesh.describe() if rank == 0 else "",
    }


def _print_mesh_step(results: list[dict], names: tuple[str, ...], out: Any) -> bool:
    from commscope.mesh.plan import format_ranks

    print(results[0]["picture"], file=out)
    rows = [["rank", "(" + ", ".join(names) + ")", *(f"{n} group" for n in names)]]
    ok = True
    for rank, res in enumerate(results):
        cells = [str(rank), "(" + ", ".join(map(str, res["coordinate"])) + ")"]
        for name in names:
            ranks, total = res["groups"][name]
            ok &= total == sum(ranks)
            cells.append(format_ranks(ranks))
        rows.append(cells)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip(), file=out)
    verdict = "ok" if ok else "WRONG"
    print(f"\nevery group checked with an all_reduce of its ranks' ids: {verdict}", file=out)
    return ok


def run_demo(ranks: int = 8, out: Any = None, workdir: Path | None = None) -> int:
    """Run the demo on ``ranks`` local CPU ranks; return 0 when every check passed."""
    out = out or sys.stdout
    if ranks < 2 or ranks % 2:
        print("commscope demo: --ranks must be an even number >= 2", file=sys.stderr)
        return 2
    shape, names = (2, ranks // 2), ("dp", "tp")
    tmp = Path(tempfile.mkdtemp(prefix="commscope-demo-")) if workdir is None else workdir
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        per_host = min(ranks, SIMULATED_RANKS_PER_HOST)
        print(
            f"commscope demo: {ranks} local CPU ranks (gloo), simulated as "
            f"{-(-ranks // per_host)} hosts of {per_host} ranks\n",
            file=out,
        )
        print(f"== step 1: init_device_mesh('cpu', {shape}, mesh_dim_names={names})\n", file=out)
        start = time.monotonic()
        results = launch_local(_mesh_step, ranks, tmp, shape, names)
        ok = _print_mesh_step(results, names, out)
        print(f"({time.monotonic() - start:.1f} s)", file=out)
        return 0 if ok else 1
    except DemoError as exc:
        print(f"commscope demo failed: {exc}", file=sys.stderr)
        return 1
    finally:
        if workdir is None:
            shutil.rmtree(tmp, ignore_errors=True)
