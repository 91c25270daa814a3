"""Regenerate the analyzer's fixture folders from REAL gloo jobs and PyTorch's own recorder.

Usage (from the repository root)::

    .venv/bin/python tests/data/make_native_fixtures.py            # every scenario
    .venv/bin/python tests/data/make_native_fixtures.py op_mismatch

Each scenario forks a few gloo ranks with the test harness (``tests/harness.py``),
sets ``TORCH_FR_BUFFER_SIZE`` before ``init_process_group``, creates one failure and
has every rank write the bytes of ``torch._C._distributed_c10d._dump_fr_trace()``
(PyTorch's native pickle, exactly what its NCCL writer puts in files) to
``tests/data/<scenario>/rank_<N>``.

How a dump is taken while a rank is stuck: a blocked gloo collective releases the GIL,
so a watchdog thread started before the blocking call dumps after a short delay. A rank
that is not stuck dumps from its main thread. Every rank then waits until every expected
file exists before it leaves (``os._exit``): a rank that left earlier would close its
connections and turn its peers' pending collectives into errors (``retired=True``)
before they were dumped.

Scenarios (3 ranks unless said; "#k" is the collective_seq_id in the default group):

* ``healthy``: all_reduce, a subgroup all_reduce, broadcast, all_gather,
  reduce_scatter, barrier; everyone finishes and dumps.
* ``missing_rank``: rank 2 skips all_reduce #4 and dumps; ranks 0 and 1 wait in it.
* ``size_mismatch``: rank 1 all_reduces 8 floats where ranks 0 and 2 use 4. gloo
  aborts the rank that receives the larger message, so ranks 0 and 2 issue and dump
  first and rank 1 issues its collective only after their files exist.
* ``dtype_mismatch``: rank 1 all_reduces int32 where the others use float32 (same byte
  size: gloo completes silently); two more collectives, then everyone dumps.
* ``op_mismatch``: rank 1 calls broadcast where ranks 0 and 2 call all_reduce (#4): hang.
* ``order_mismatch``: ranks 0 and 2 issue all_reduce then broadcast (async); rank 1
  issues the same two in the opposite order: hang.
* ``crashed_rank``: rank 1 dies (``os._exit``) before all_reduce #4; ranks 0 and 2 get
  "Connection closed by peer" and dump from their exception handler.
* ``crashed_last_rank``: same, but the dead rank is the highest one (2), so only
  ``--world-size 3`` tells the analyzer it existed.
* ``cross_group_deadlock``: groups A=[0,1], B=[1,2], C=[0,2], each used once by all
  its members; then rank 0 calls A then C, rank 1 calls B then A, rank 2 calls C then
  B: each waits for the next, a 3-cycle.
* ``truncated_history``: ``TORCH_FR_BUFFER_SIZE=8``; ranks 0 and 1 run 12 extra
  all_reduces in a subgroup, so their rings hold fewer default-group entries than rank
  2's; then rank 2 skips the last default-group all_reduce (#8).
"""

from __future__ import annotations

import os
import pickle
import shutil
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from tests.harness import run_ranks  # noqa: E402

DATA = Path(__file__).resolve().parent
SETTLE_S = 1.5
"""How long a watchdog waits after its rank blocks before dumping."""
WAIT_FILES_S = 60.0


# --------------------------------------------------------------------------- dumping


def _dump_bytes() -> bytes:
    return bytes(torch._C._distributed_c10d._dump_fr_trace())


def _write(out: str, rank: int) -> None:
    data = _dump_bytes()
    pickle.loads(data)  # the file must be a readable native dump
    path = Path(out) / f"rank_{rank}"
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _leave(out: str, ranks: list[int]) -> None:
    """Wait until every expected rank has written its file, then end this process."""
    deadline = time.monotonic() + WAIT_FILES_S
    while time.monotonic() < deadline:
        if all((Path(out) / f"rank_{r}").exists() for r in ranks):
            break
        time.sleep(0.05)
    os._exit(0)


def _wait_files(out: str, ranks: list[int]) -> None:
    deadline = time.monotonic() + WAIT_FILES_S
    while not all((Path(out) / f"rank_{r}").exists() for r in ranks):
        if time.monotonic() > deadline:
            return
        time.sleep(0.05)


def _watchdog(out: str, rank: int, ranks: list[int], delay: float = SETTLE_S) -> None:
    """Dump from a thread ``delay`` seconds from now (the main thread will be stuck)."""

    def _run() -> None:
        time.sleep(delay)
        _write(out, rank)
        _leave(out, ranks)

    threading.Thread(target=_run, name="fr-watchdog", daemon=True).start()


def _warm_up(world_size: int) -> None:
    """One collective and one throw-away dump: the first dump symbolizes for seconds."""
    t = torch.ones(4)
    dist.all_reduce(t)
    _dump_bytes()


# --------------------------------------------------------------------------- scenarios


def healthy(rank: int, world_size: int, out: str) -> None:
    pair = dist.new_group([0, 1], group_desc="pair_01")
    _warm_up(world_size)
    t = torch.ones(4)
    if rank in (0, 1):
        dist.all_reduce(t, group=pair)
    dist.broadcast(t, 0)
    gathered = torch.zeros(world_size * 4)
    dist.all_gather_into_tensor(gathered, t)
    dist.reduce_scatter_tensor(torch.zeros(2), torch.ones(2 * world_size))
    dist.barrier()
    _write(out, rank)
    _leave(out, list(range(world_size)))


def missing_rank(rank: int, world_size: int, out: str) -> None:
    _warm_up(world_size)
    t = torch.ones(4)
    dist.all_reduce(t)  # 2
    dist.broadcast(t, 0)  # 3
    if rank == 2:
        time.sleep(SETTLE_S)  # "busy elsewhere": it never calls all_reduce #4
        _write(out, rank)
        _leave(out, list(range(world_size)))
    _watchdog(out, rank, list(range(world_size)))
    dist.all_reduce(t)  # 4: ranks 0 and 1 wait here forever
    time.sleep(600)


def size_mismatch(rank: int, world_size: int, out: str) -> None:
    _warm_up(world_size)
    t = torch.ones(4)
    dist.all_reduce(t)  # 2
    everyone = list(range(world_size))
    if rank == 1:
        _wait_files(out, [r for r in everyone if r != 1])
        dist.all_reduce(torch.ones(8), async_op=True)  # 3: twice the others' size
        _write(out, rank)
        _leave(out, everyone)
    dist.all_reduce(t, async_op=True)  # 3
    _write(out, rank)
    _leave(out, everyone)


def dtype_mismatch(rank: int, world_size: int, out: str) -> None:
    _warm_up(world_size)
    t = torch.ones(4)
    dist.all_reduce(t)  # 2
    bad = torch.ones(4, dtype=torch.int32) if rank == 1 else torch.ones(4)
    dist.all_reduce(bad)  # 3: same byte size, completes with garbage
    dist.broadcast(t, 0)  # 4
    dist.all_reduce(t)  # 5
    dist.barrier()  # 6
    _write(out, rank)
    _leave(out, list(range(world_size)))


def op_mismatch(rank: int, world_size: int, out: str) -> None:
    _warm_up(world_size)
    t = torch.ones(4)
    dist.all_reduce(t)  # 2
    dist.broadcast(t, 0)  # 3
    everyone = list(range(world_size))
    if rank == 1:
        # gloo may abort a peer once mismatched data flows: join after they dumped.
        _wait_files(out, [r for r in everyone if r != 1])
        dist.broadcast(t, 0, async_op=True)  # 4: the others call all_reduce
    else:
        dist.all_reduce(t, async_op=True)  # 4
    time.sleep(0.2)
    _write(out, rank)
    _leave(out, everyone)


def order_mismatch(rank: int, world_size: int, out: str) -> None:
    _warm_up(world_size)
    a, b = torch.ones(4), torch.ones(4)
    dist.all_reduce(a)  # 2
    everyone = list(range(world_size))
    if rank == 1:
        _wait_files(out, [r for r in everyone if r != 1])
        dist.broadcast(b, 0, async_op=True)  # 3
        dist.all_reduce(a, async_op=True)  # 4
    else:
        dist.all_reduce(a, async_op=True)  # 3
        dist.broadcast(b, 0, async_op=True)  # 4
    time.sleep(0.2)
    _write(out, rank)
    _leave(out, everyone)


def crashed_rank(rank: int, world_size: int, out: str, victim: int = 1) -> None:
    _warm_up(world_size)
    t = torch.ones(4)
    dist.all_reduce(t)  # 2
    dist.broadcast(t, 0)  # 3
    survivors = [r for r in range(world_size) if r != victim]
    if rank == victim:
        time.sleep(0.5)
        os._exit(1)  # a crash: no dump, no goodbye
    try:
        dist.all_reduce(t)  # 4: fails once the peer is gone
        dist.barrier()
    except Exception:
        pass
    _write(out, rank)
    _leave(out, survivors)


def crashed_last_rank(rank: int, world_size: int, out: str) -> None:
    crashed_rank(rank, world_size, out, victim=world_size - 1)


def cross_group_deadlock(rank: int, world_size: int, out: str) -> None:
    a = dist.new_group([0, 1], group_desc="group_A")
    b = dist.new_group([1, 2], group_desc="group_B")
    c = dist.new_group([0, 2], group_desc="group_C")
    _warm_up(world_size)
    t = torch.ones(4)
    # One healthy round in every group first (the same order everywhere), so the
    # dumps show who belongs to which group: gloo's pg_config does not.
    for group, members in ((a, (0, 1)), (b, (1, 2)), (c, (0, 2))):
        if rank in members:
            dist.all_reduce(t, group=group)
    first, second = {0: (a, c), 1: (b, a), 2: (c, b)}[rank]
    _watchdog(out, rank, list(range(world_size)))
    dist.all_reduce(t, group=first)
    dist.all_reduce(t, group=second)
    time.sleep(600)


def truncated_history(rank: int, world_size: int, out: str) -> None:
    pair = dist.new_group([0, 1], group_desc="pair_01")
    _warm_up(world_size)
    t = torch.ones(4)
    for _ in range(6):
        dist.all_reduce(t)  # 2..7
        if rank in (0, 1):
            dist.all_reduce(t, group=pair)
            dist.all_reduce(t, group=pair)
    if rank == 2:
        time.sleep(SETTLE_S)
        _write(out, rank)
        _leave(out, list(range(world_size)))
    _watchdog(out, rank, list(range(world_size)))
    dist.all_reduce(t)  # 8: rank 2 never comes
    time.sleep(600)


SCENARIOS: dict[str, tuple[Callable[..., None], int, dict[str, str]]] = {
    "healthy": (healthy, 3, {}),
    "missing_rank": (missing_rank, 3, {}),
    "size_mismatch": (size_mismatch, 3, {}),
    "dtype_mismatch": (dtype_mismatch, 3, {}),
    "op_mismatch": (op_mismatch, 3, {}),
    "order_mismatch": (order_mismatch, 3, {}),
    "crashed_rank": (crashed_rank, 3, {}),
    "crashed_last_rank": (crashed_last_rank, 3, {}),
    "cross_group_deadlock": (cross_group_deadlock, 3, {}),
    "truncated_history": (truncated_history, 3, {"TORCH_FR_BUFFER_SIZE": "8"}),
}


def generate(name: str, scratch: Path, out: Path | None = None) -> Path:
    """Run scenario ``name`` on real gloo ranks; return the folder of its dumps
    (``tests/data/<name>`` unless ``out`` is given)."""
    fn, world_size, extra_env = SCENARIOS[name]
    out = DATA / name if out is None else Path(out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    env = {"TORCH_FR_BUFFER_SIZE": "2000", **extra_env}
    results = run_ranks(
        fn, world_size, scratch / name, str(out), env=env, timeout=90, check=False
    )
    written = {p.name for p in out.iterdir()}
    for r in results:
        # A rank may fail after its dump (gloo aborts peers on mismatched data): only
        # a rank that should have written a file and did not is an error.
        if r.error and f"rank_{r.rank}" not in written:
            raise RuntimeError(f"{name}: rank {r.rank} raised before dumping\n{r.error}")
    for tmp in out.glob("*.tmp"):
        tmp.unlink()
    return out


def main(argv: list[str]) -> int:
    names = argv or list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        print(f"unknown scenario(s) {unknown}; known: {', '.join(SCENARIOS)}", file=sys.stderr)
        return 2
    scratch = Path(os.environ.get("TMPDIR", "/tmp")) / f"commscope-fixtures-{os.getpid()}"
    try:
        for name in names:
            start = time.monotonic()
            out = generate(name, scratch)
            files = sorted(p.name for p in out.iterdir())
            print(f"{name}: {files} in {time.monotonic() - start:.1f}s")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
