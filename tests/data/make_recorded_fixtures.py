"""Regenerate ``tests/data/recorded/<failure>/``: the failures recorded by commscope's own
flight recorder (``commscope.flight``) on REAL gloo ranks.

Usage (from the repository root)::

    .venv/bin/python tests/data/make_recorded_fixtures.py            # every scenario
    .venv/bin/python tests/data/make_recorded_fixtures.py straggler

Every rank calls ``commscope.flight.enable(...)`` before ``init_process_group``. In the
hangs the recorder's own watchdog notices the stuck collective after ``timeout_s``,
dumps, and asks every other rank (through the store) to dump too; the scenarios that do
not hang call ``commscope.flight.out.dump()``. A rank leaves (``os._exit``) once every
expected file exists. Unlike PyTorch's gloo recorder, ours records p2p ops and timings,
so ``p2p_unmatched`` and ``straggler`` come from real jobs here.

Scenarios (3 ranks; "#k" is the collective_seq_id in the default group):

* ``healthy``: all_reduce, subgroup all_reduce, broadcast, all_gather, barrier.
* ``missing_rank``: rank 2 skips all_reduce #4; ranks 0 and 1 wait in it.
* ``size_mismatch``: rank 1 all_reduces 8 floats where the others use 4 (it joins after
  their dumps: gloo aborts the rank that receives the larger message).
* ``dtype_mismatch``: rank 1 all_reduces int32 where the others use float32; completes.
* ``op_mismatch``: rank 1 broadcasts where the others all_reduce (#4), after their dumps.
* ``crashed_rank``: rank 1 dies before all_reduce #4; ranks 0, 2 dump on the error.
* ``cross_group_deadlock``: groups A=[0,1], B=[1,2], C=[0,2] used once each, then
  rank 0 calls A then C, rank 1 B then A, rank 2 C then B.
* ``truncated_history``: ``buffer_size=8``; ranks 0, 1 run 12 extra subgroup all_reduces;
  rank 2 skips the last default-group all_reduce (#8).
* ``p2p_unmatched``: after an all_reduce, rank 0 sends to rank 1, which never receives.
* ``straggler``: 12 all_reduces with timing on; rank 2 sleeps 120 ms before each.

On 4 ranks:

* ``skipped_then_blocked`` (``commscope demo``'s story): a (2, 2) mesh (dp, tp) from
  ``commscope.mesh`` (hash-named groups); each step one dp all_reduce, then an async
  all_reduce and broadcast over the world. At the third step rank 3 skips its dp
  all_reduce (#3 of mesh_dp [1, 3]) and waits in world all_reduce #5 for rank 1, which
  waits for it in mesh_dp #3: a cycle whose cause is the skip (ranks 0, 2 did their
  mesh_dp #3 before world #5).
* ``dtype_mismatch_repeated``: the same [1] float all_reduce four times; rank 3 sends
  int32 at the third (#3); everything completes.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import commscope.flight as flight  # noqa: E402
from tests.harness import run_ranks  # noqa: E402

DATA = Path(__file__).resolve().parent / "recorded"
TIMEOUT_S = 1.5
WAIT_FILES_S = 60.0


def _init(rank: int, world_size: int, out: str, **kwargs) -> None:
    opts = {"dump_prefix": os.path.join(out, "rank_"), "timeout_s": TIMEOUT_S,
            "poll_interval_s": 0.25, **kwargs}
    flight.enable(**opts)
    store = dist.FileStore(os.environ["COMMSCOPE_TEST_STORE"], world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=60))


def _files_exist(out: str, ranks: list[int]) -> bool:
    return all(os.path.exists(os.path.join(out, f"rank_{r}")) for r in ranks)


def _wait_files(out: str, ranks: list[int]) -> None:
    deadline = time.monotonic() + WAIT_FILES_S
    while not _files_exist(out, ranks) and time.monotonic() < deadline:
        time.sleep(0.05)


def _leave_when_dumped(out: str, ranks: list[int]) -> None:
    """From a thread: end the process once every expected rank has written its file."""

    def watch() -> None:
        _wait_files(out, ranks)
        time.sleep(0.2)
        os._exit(0)

    threading.Thread(target=watch, daemon=True).start()


def healthy(rank: int, world_size: int, out: str) -> None:
    _init(rank, world_size, out)
    pair = dist.new_group([0, 1], group_desc="pair_01")
    t = torch.ones(4)
    dist.all_reduce(t)
    if rank in (0, 1):
        dist.all_reduce(t, group=pair)
    dist.broadcast(t, 0)
    dist.all_gather_into_tensor(torch.zeros(world_size * 4), t)
    dist.barrier()
    flight.dump()
    _wait_files(out, list(range(world_size)))
    os._exit(0)


def missing_rank(rank: int, world_size: int, out: str) -> None:
    _init(rank, world_size, out)
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)
    _leave_when_dumped(out, list(range(world_size)))
    if rank != 2:
        dist.all_reduce(t)  # 4: rank 2 never comes
    time.sleep(60)


def _after_others(rank: int, world_size: int, out: str, culprit: int,
                  mine: Callable[[], None], theirs: Callable[[], None]) -> None:
    """Others issue ``theirs`` and dump; the culprit issues ``mine`` after their files
    exist (gloo aborts a peer once mismatched data flows), then dumps."""
    everyone = list(range(world_size))
    if rank == culprit:
        _wait_files(out, [r for r in everyone if r != culprit])
        mine()
    else:
        theirs()
    time.sleep(0.2)
    flight.dump()
    _wait_files(out, everyone)
    os._exit(0)


def size_mismatch(rank: int, world_size: int, out: str) -> None:
    _init(rank, world_size, out, timeout_s=60)
    dist.all_reduce(torch.ones(4))
    _after_others(rank, world_size, out, 1,
                  lambda: dist.all_reduce(torch.ones(8), async_op=True),
                  lambda: dist.all_reduce(torch.ones(4), async_op=True))


def dtype_mismatch(rank: int, world_size: int, out: str) -> None:
    _init(rank, world_size, out)
    t = torch.ones(4)
    dist.all_reduce(t)
    dist.all_reduce(torch.ones(4, dtype=torch.int32) if rank == 1 else torch.ones(4))
    dist.broadcast(t, 0)
    dist.barrier()
    flight.dump()
    _wait_files(out, list(range(world_size)))
    os._exit(0)


def op_mismatch(rank: int, world_size: int, out: str) -> None:
    _init(rank, world_size, out, timeout_s=60)
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)
    _after_others(rank, world_size, out, 1,
                  lambda: dist.broadcast(t, 0, async_op=True),
                  lambda: dist.all_reduce(t, async_op=True))


def crashed_rank(rank: int, world_size: int, out: str) -> None:
    _init(rank, world_size, out, timeout_s=60)
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)
    if rank == 1:
        time.sleep(0.3)
        os._exit(1)
    try:
        dist.all_reduce(t)  # 4: fails once rank 1 is gone
    except Exception:
        flight.dump(reason="exception")
    _wait_files(out, [0, 2])
    os._exit(0)


def cross_group_deadlock(rank: int, world_size: int, out: str) -> None:
    _init(rank, world_size, out)
    a = dist.new_group([0, 1], group_desc="group_A")
    b = dist.new_group([1, 2], group_desc="group_B")
    c = dist.new_group([0, 2], group_desc="group_C")
    t = torch.ones(4)
    for group, members in ((a, (0, 1)), (b, (1, 2)), (c, (0, 2))):
        if rank in members:
            dist.all_reduce(t, group=group)
    _leave_when_dumped(out, list(range(world_size)))
    first, second = {0: (a, c), 1: (b, a), 2: (c, b)}[rank]
    dist.all_reduce(t, group=first)
    dist.all_reduce(t, group=second)
    time.sleep(60)


def truncated_history(rank: int, world_size: int, out: str) -> None:
    _init(rank, world_size, out, buffer_size=8)
    pair = dist.new_group([0, 1], group_desc="pair_01")
    t = torch.ones(4)
    for _ in range(7):
        dist.all_reduce(t)
        if rank in (0, 1):
            dist.all_reduce(t, group=pair)
            dist.all_reduce(t, group=pair)
    _leave_when_dumped(out, list(range(world_size)))
    if rank != 2:
        dist.all_reduce(t)  # 8: rank 2 never comes
    time.sleep(60)


def p2p_unmatched(rank: int, world_size: int, out: str) -> None:
    _init(rank, world_size, out)
    dist.all_reduce(torch.ones(2))
    _leave_when_dumped(out, list(range(world_size)))
    if rank == 0:
        dist.send(torch.arange(6.0), dst=1)  # rank 1 never receives
    time.sleep(60)


def straggler(rank: int, world_size: int, out: str) -> None:
    _init(rank, world_size, out, timing=True, timeout_s=60)
    t = torch.ones(16)
    for _ in range(12):
        if rank == 2:
            time.sleep(0.12)  # a slow data loader
        dist.all_reduce(t)
    flight.dump()
    _wait_files(out, list(range(world_size)))
    os._exit(0)


def skipped_then_blocked(rank: int, world_size: int, out: str) -> None:
    _init(rank, world_size, out)
    from commscope.mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    dp = mesh.get_group("dp")
    grads, loss, lr = torch.ones(6), torch.ones(1), torch.ones(1)
    for step in range(3):
        if step == 2:
            _leave_when_dumped(out, list(range(world_size)))
        if not (rank == 3 and step == 2):
            dist.all_reduce(grads, group=dp)  # dp #3: rank 3 skips it and goes on
        works = [dist.all_reduce(loss, async_op=True), dist.broadcast(lr, 0, async_op=True)]
        for work in works:
            work.wait()
    time.sleep(60)


def dtype_mismatch_repeated(rank: int, world_size: int, out: str) -> None:
    _init(rank, world_size, out)
    for step in range(4):  # the same loss all_reduce every step; rank 3 sends int32 once
        wrong = rank == 3 and step == 2
        dist.all_reduce(torch.ones(1, dtype=torch.int32) if wrong else torch.ones(1))
    flight.dump()
    _wait_files(out, list(range(world_size)))
    os._exit(0)


SCENARIOS: dict[str, Callable[..., None]] = {
    "healthy": healthy,
    "missing_rank": missing_rank,
    "size_mismatch": size_mismatch,
    "dtype_mismatch": dtype_mismatch,
    "op_mismatch": op_mismatch,
    "crashed_rank": crashed_rank,
    "cross_group_deadlock": cross_group_deadlock,
    "truncated_history": truncated_history,
    "p2p_unmatched": p2p_unmatched,
    "straggler": straggler,
    "skipped_then_blocked": skipped_then_blocked,
    "dtype_mismatch_repeated": dtype_mismatch_repeated,
}
WORLD_SIZES = {"skipped_then_blocked": 4, "dtype_mismatch_repeated": 4}
"""Scenarios that need more than the default 3 ranks."""


def generate(name: str, scratch: Path, out: Path | None = None,
             world_size: int | None = None) -> Path:
    """Run scenario ``name`` on real gloo ranks recorded by commscope.flight."""
    out = DATA / name if out is None else Path(out)
    world_size = world_size or WORLD_SIZES.get(name, 3)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    results = run_ranks(SCENARIOS[name], world_size, scratch / name, str(out), timeout=90,
                        check=False, init=False)
    written = {p.name for p in out.iterdir()}
    for r in results:
        if r.error and f"rank_{r.rank}" not in written:
            raise RuntimeError(f"{name}: rank {r.rank} raised before dumping\n{r.error}")
    for tmp in out.glob("*.tmp*"):
        tmp.unlink()
    return out


def main(argv: list[str]) -> int:
    names = argv or list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        print(f"unknown scenario(s) {unknown}; known: {', '.join(SCENARIOS)}", file=sys.stderr)
        return 2
    scratch = Path(os.environ.get("TMPDIR", "/tmp")) / f"commscope-recorded-{os.getpid()}"
    try:
        for name in names:
            start = time.monotonic()
            out = generate(name, scratch)
            print(f"{name}: {sorted(p.name for p in out.iterdir())} "
                  f"in {time.monotonic() - start:.1f}s")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
