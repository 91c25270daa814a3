"""Regenerate ``tests/data/scenarios/<name>/``: the analyzer's scenario corpus, every
folder the dumps of one REAL multi-process gloo job.

Usage (from the repository root)::

    .venv/bin/python tests/data/make_scenarios.py                 # every scenario
    .venv/bin/python tests/data/make_scenarios.py pipeline_skip_recv p2p_deadlock_recv
    .venv/bin/python tests/data/make_scenarios.py --list

How a job runs (:func:`launch`, a small stand-in for ``torchrun``): the ranks are forked
from this process (torch is imported once), each calls ``commscope.flight.enable`` and
``init_process_group("gloo")`` over a FileStore, with PyTorch's own recorder on too
(``TORCH_FR_BUFFER_SIZE``). Every time commscope writes a dump, the rank also writes
PyTorch's native dump (``_dump_fr_trace``) next to it, so each folder holds
``ours/rank_<N>`` and ``native/rank_<N>``. An exception that leaves a rank's function
goes to ``sys.excepthook`` (commscope's hook dumps it, reason ``exception``, with the
exception) and the rank exits 1, as a Python script does. As torchrun does, once a
rank exits with an error or a signal the launcher sends SIGTERM to the others, which
dump on their way down (commscope's SIGTERM handler), and SIGKILL after a grace
period. A job that hangs is ended (SIGKILL) once every live rank has dumped: the
recorder's watchdog saw the stuck op after ``TIMEOUT_S`` and asked all ranks to dump.

Each scenario states what the analyzer must find (:class:`Expect`); that statement is
written to ``scenario.json`` beside the dumps and ``tests/unit/test_analyze_scenarios.py``
asserts it for ``ours`` (and for ``native`` where the scenario says what native dumps
allow: gloo's native recorder has no stacks of idle threads, no exception and no
dump-time field). The statement comes from the fault the job injected, never from the
analyzer's output.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.fsdp  # noqa: E402 (imported once here: forked ranks inherit it)

import commscope.flight as flight  # noqa: E402
from commscope.flight.out.dump import LATER_DIR, write_atomic  # noqa: E402

DATA = Path(__file__).resolve().parent / "scenarios"
TIMEOUT_S = 1.0
"""The recorder's watchdog dumps after an op is pending this long."""
JOB_LIMIT_S = 60.0
SETTLE_S = 0.8
"""After the last new dump file, how long the launcher waits before ending a hung job."""
NATIVE_WAIT_S = 5.0
"""How long a hung job may take to write PyTorch's native dumps after ours."""
TERM_GRACE_S = 4.0
"""torchrun's grace between SIGTERM and SIGKILL (its default is 30 s)."""


# --------------------------------------------------------------------------- what to find


@dataclass
class Expect:
    """What the analysis of a scenario's dumps must say."""

    verdict: str
    """``healthy`` / ``hang`` / ``crash`` / ``desync`` / ``incomplete``."""
    kind: str | None = None
    """Kind of the first finding (the root cause)."""
    culprits: list[int] = field(default_factory=list)
    """Culprit ranks of the first finding."""
    blamed: list[int] | None = None
    """Every rank any blocking finding names as a culprit (default: ``culprits``); a
    victim or a waiter is never blamed."""
    waiting: list[int] = field(default_factory=list)
    """Ranks the first finding must list as waiting (a subset of its waiters)."""
    also: list[tuple[str, list[int]]] = field(default_factory=list)
    """Other findings (kind, culprits) that must be there."""
    says: list[str] = field(default_factory=list)
    """Text the first finding's message must contain."""
    never_says: list[str] = field(default_factory=list)
    """Text no finding's message may contain (a torch frame named as the user's line)."""
    group: str | None = None
    """The description of the first finding's group (``None``: not checked)."""
    seq: int | None = None
    """The first finding's ``collective_seq_id`` (``None``: not checked)."""
    victims: list[int] | None = None
    """Ranks the first finding lists as victims (killed by it); ``None``: not checked."""
    ignored: int | None = None
    """How many files of other jobs the analysis sets aside (``None``: not checked)."""
    live_kind: str | None = None
    """The live view's root finding kind where it cannot be the dumps' (``None``: the
    same): a culprit that died before it published the call is seen as crashed."""
    caught: int = 0
    """The analysis must hold the note of a running job dumped on demand that names the
    ranks caught mid-collective, naming at least this many (0: not checked)."""
    threads_died: list[tuple[int, str]] = field(default_factory=list)
    """``(rank, thread)``: a ``thread_died`` finding must name that thread of that rank (a
    remark: the rank is alive and never blamed for it)."""
    unusable: list[int] = field(default_factory=list)
    """Ranks whose dump reads but holds no valid record: the analysis must set it aside
    as unusable (named, with why) and name that rank in no other finding."""


@dataclass
class Scenario:
    """One real gloo job with one (or two) injected faults."""

    name: str
    world: int
    run: Callable[..., None]
    expect: Expect
    native: Expect | None = None
    """What the native dumps allow (``None``: nothing is asserted beyond 'not
    healthy' when some rank stopped unfinished)."""
    buffer_size: int = 2000
    timing: bool = False
    timeout_s: float | None = None
    """The recorder's watchdog timeout (default :data:`TIMEOUT_S`)."""
    no_dump: list[int] = field(default_factory=list)
    """Ranks that cannot dump (never joined the job): the launcher does not wait for them."""
    signals: list[tuple[float, int, list[int] | None]] = field(default_factory=list)
    """``(after_s, signal, ranks)``: send ``signal`` to those ranks (``None``: every live
    rank) this long after the start. SIGTERM ends the job as a user's kill does: the
    launcher then waits for the ranks' dumps on their way down."""
    live: bool = True
    """Capture the live view (``live/``). Off where the fault leaves nothing for the live
    view to see yet (a silent desync that completes: issue 33's fingerprints)."""
    before: list[tuple[int, Callable[..., None]]] = field(default_factory=list)
    """Earlier attempts of the job, ``(world, run)``, run first into the same folder (a
    restarted job or a reused dump folder)."""
    damage: Callable[[Path], None] | None = None
    """Run on the scenario's folder once the job is over: what befell a dump after its
    rank wrote it (its docstring names the real event it stands for)."""


# --------------------------------------------------------------------------- rank helpers


_NO_INIT: set[Callable[..., None]] = set()
"""Scenario functions that call ``init_process_group`` (or skip it) themselves:
``run(rank, world, store_path)``."""


def hang() -> None:
    """Sit here until the launcher ends the job."""
    time.sleep(JOB_LIMIT_S)


def load_batch(step: int) -> torch.Tensor:
    """A data loader that stalls (a dead NFS mount, a stuck worker)."""
    time.sleep(JOB_LIMIT_S)
    return torch.ones(4) * step


def write_checkpoint(step: int) -> None:
    """A checkpoint write that never returns."""
    time.sleep(JOB_LIMIT_S)


def finish() -> None:
    """A job that ends well: dump on demand, let the others dump, leave."""
    flight.dump()
    time.sleep(0.3)


def dump_and_run_on() -> None:
    """A job that runs on after a bug it does not notice: dump on demand, then idle until
    the launcher ends it (the live view is read while it still runs)."""
    flight.dump()
    hang()


def _mesh(shape: tuple[int, ...], names: tuple[str, ...]) -> Any:
    from commscope.mesh import init_device_mesh

    return init_device_mesh("cpu", shape, mesh_dim_names=names)


# --------------------------------------------------------------------------- collectives


def healthy(rank: int, world: int) -> None:
    pair = dist.new_group([0, 1], group_desc="pair_01")
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)
        if rank in (0, 1):
            dist.all_reduce(t, group=pair)
        dist.broadcast(t, 0)
        dist.all_gather_into_tensor(torch.zeros(world * 4), t)
    dist.barrier()
    finish()


def missing_rank(rank: int, world: int) -> None:
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)
    if rank != 2:
        dist.all_reduce(t)  # 4: rank 2 never comes
    hang()


def missing_two_ranks(rank: int, world: int) -> None:
    t = torch.ones(4)
    for _ in range(2):
        dist.all_reduce(t)
    if rank not in (1, 3):
        dist.all_reduce(t)  # 3: ranks 1 and 3 never come
    hang()


def stall_in_data_loader(rank: int, world: int) -> None:
    t = torch.ones(4)
    for step in range(4):
        batch = load_batch(step) if (rank == 3 and step == 2) else t * step
        dist.all_reduce(batch)
    hang()


def stall_in_checkpoint(rank: int, world: int) -> None:
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)
    if rank == 0:
        write_checkpoint(3)  # rank 0 saves; the others go on to the next step
    dist.all_reduce(t)
    hang()


def straggler(rank: int, world: int) -> None:
    t = torch.ones(16)
    for _ in range(10):
        if rank == 2:
            time.sleep(0.12)  # a slow host
        dist.all_reduce(t)
    finish()


# ---- stragglers with ordinary jitter (issue 33 item 1): the jobs the default thresholds
# are measured on (bench/straggler_thresholds.py runs each with several seeds)

JITTER_STEPS = 48
"""Training steps of the jitter scenarios (the analyzer's window holds them all)."""


def _jitter_rng(rank: int) -> Any:
    """This rank's random numbers: ``STRAGGLER_SEED`` (default 0) and the rank."""
    import random

    return random.Random(int(os.environ.get("STRAGGLER_SEED", "0")) * 1000 + rank)


def _jitter(rng: Any) -> None:
    """A healthy rank's host-side work per step, the same distribution on every rank:
    2-12 ms (uniform), and one step in 20 a 30-60 ms hiccup (a GC pause, a page-cache
    miss)."""
    time.sleep(rng.uniform(0.002, 0.012))
    if rng.random() < 0.05:
        time.sleep(rng.uniform(0.03, 0.06))


def _matmuls(a: torch.Tensor, n: int) -> None:
    """``n`` matmuls of ``a`` (512 x 512: about 2 ms each on one core)."""
    for _ in range(n):
        torch.mm(a, a)


def straggler_data_loader(rank: int, world: int) -> None:
    """Every rank computes a little with ordinary jitter; rank 2's data loader sleeps
    another 30-80 ms (uniform) before every all_reduce."""
    rng = _jitter_rng(rank)
    t = torch.ones(1 << 10)
    for _ in range(JITTER_STEPS):
        _jitter(rng)
        if rank == 2:
            time.sleep(rng.uniform(0.03, 0.08))  # a slow data loader
        dist.all_reduce(t)
    finish()


def straggler_compute_heavy(rank: int, world: int) -> None:
    """Every rank runs 2 matmuls a step with ordinary jitter; rank 1 runs 20 (tens of ms
    more: a bigger shard, a slower CPU)."""
    rng = _jitter_rng(rank)
    a = torch.rand(512, 512)
    t = torch.ones(1 << 10)
    for _ in range(JITTER_STEPS):
        _jitter(rng)
        _matmuls(a, 20 if rank == 1 else 2)
        dist.all_reduce(t)
    finish()


def _jitter_steps(rank: int, pairs: list[list[int]]) -> None:
    """Healthy steps: the same jitter and 2 matmuls a step on every rank, an all_reduce
    of everyone, then one in the rank's pair (with more jitter), if it is in one."""
    rng = _jitter_rng(rank)
    groups = [dist.new_group(p, group_desc=f"pair_{p[0]}{p[1]}") for p in pairs]
    mine = next((g for p, g in zip(pairs, groups) if rank in p), None)
    a = torch.rand(512, 512)
    t = torch.ones(1 << 10)
    for _ in range(JITTER_STEPS):
        _jitter(rng)
        _matmuls(a, 2)
        dist.all_reduce(t)
        if mine is not None:
            _jitter(rng)
            dist.all_reduce(t, group=mine)
    finish()


def healthy_unwaited_async(rank: int, world: int) -> None:
    """A healthy job whose ranks issue async all_reduces (a metric, a logging barrier)
    and never wait on them: the first work is kept, the others dropped at once, while
    rank 3 is late to each, so they are unfinished when dropped. The recorder's timeout
    passes while the works sit unwaited; the job then ends well."""
    kept = []
    for i in range(3):
        if rank == 3:
            time.sleep(0.3)
        work = dist.all_reduce(torch.ones(1 << 12), async_op=True)
        if i == 0:
            kept.append(work)
    time.sleep(TIMEOUT_S * 2.5)
    dist.barrier()
    finish()


def healthy_jitter(rank: int, world: int) -> None:
    """No straggler: every rank has the same jitter and work; each step an all_reduce of
    everyone and one in pair_01 or pair_23 (in a pair, one of the two is last every
    time, by chance)."""
    _jitter_steps(rank, [[0, 1], [2, 3]])


def healthy_uneven_work(rank: int, world: int) -> None:
    """No straggler, though ranks 0 and 1 do a little more each step (an all_reduce in
    pair_01 and its jitter, 2-12 ms): between them they come last at the world's
    all_reduce nearly every time, each about half the time, 10-20 ms behind."""
    _jitter_steps(rank, [[0, 1]])


def size_mismatch_abort(rank: int, world: int) -> None:
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)
    dist.all_reduce(torch.ones(8) if rank == 1 else torch.ones(4))  # gloo aborts a peer
    hang()


def size_mismatch_kills_peer(rank: int, world: int) -> None:
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)
    big = torch.ones(1 << 16) if rank == 1 else torch.ones(4)  # gloo aborts a receiver
    dist.broadcast(big, 1)
    hang()


def dtype_mismatch(rank: int, world: int) -> None:
    t = torch.ones(4)
    dist.all_reduce(t)
    dist.all_reduce(torch.ones(4, dtype=torch.int32) if rank == 1 else torch.ones(4))
    dist.broadcast(t, 0)
    dist.barrier()
    finish()


def op_mismatch(rank: int, world: int) -> None:
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)
    if rank == 1:
        dist.broadcast(t, 0)  # the others all_reduce
    else:
        dist.all_reduce(t)
    hang()


def order_mismatch(rank: int, world: int) -> None:
    t, u = torch.ones(4), torch.ones(4)
    dist.all_reduce(t)
    if rank == 1:
        works = [dist.broadcast(u, 0, async_op=True), dist.all_reduce(t, async_op=True)]
    else:
        works = [dist.all_reduce(t, async_op=True), dist.broadcast(u, 0, async_op=True)]
    for w in works:
        w.wait()
    hang()


def cross_group_order(rank: int, world: int) -> None:
    grads = dist.new_group(list(range(world)), group_desc="grads")
    stats = dist.new_group(list(range(world)), group_desc="stats")
    t = torch.ones(4)
    for step in range(3):
        order = (grads, stats)
        if rank == 1 and step == 2:
            order = (stats, grads)  # rank 1 alone swaps the two
        for g in order:
            dist.all_reduce(t, group=g)
    hang()


def cross_group_cycle(rank: int, world: int) -> None:
    a = dist.new_group([0, 1], group_desc="group_A")
    b = dist.new_group([1, 2], group_desc="group_B")
    c = dist.new_group([0, 2], group_desc="group_C")
    t = torch.ones(4)
    for group, members in ((a, (0, 1)), (b, (1, 2)), (c, (0, 2))):
        if rank in members:
            dist.all_reduce(t, group=group)
    first, second = {0: (a, c), 1: (b, a), 2: (c, b)}[rank]
    dist.all_reduce(t, group=first)
    dist.all_reduce(t, group=second)
    hang()


def chain_through_subgroup(rank: int, world: int) -> None:
    sub = dist.new_group([1, 2], group_desc="pair_12")
    t = torch.ones(4)
    dist.all_reduce(t)
    if rank == 1:
        dist.all_reduce(t, group=sub)  # rank 2 never joins: it stalls in its loader
    if rank == 2:
        load_batch(1)
    dist.all_reduce(t)  # rank 0 waits here for rank 1, which waits for rank 2
    hang()


def wrapped_ring_missing(rank: int, world: int) -> None:
    pair = dist.new_group([0, 1], group_desc="pair_01")
    t = torch.ones(4)
    for _ in range(7):
        dist.all_reduce(t)
        if rank in (0, 1):
            dist.all_reduce(t, group=pair)
            dist.all_reduce(t, group=pair)
    if rank != 2:
        dist.all_reduce(t)  # 8: rank 2 never comes
    hang()


# --------------------------------------------------------------------------- meshes


def mesh2d_tp_missing(rank: int, world: int) -> None:
    mesh = _mesh((2, 2), ("dp", "tp"))
    tp, dp = mesh.get_group("tp"), mesh.get_group("dp")
    t = torch.ones(4)
    for step in range(3):
        if not (rank == 2 and step == 2):
            dist.all_reduce(t, group=tp)  # rank 2 skips its tp all_reduce at step 2
        dist.all_reduce(t, group=dp)
    hang()


def mesh2d_healthy(rank: int, world: int) -> None:
    mesh = _mesh((2, 2), ("dp", "tp"))
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t, group=mesh.get_group("tp"))
        dist.all_gather_into_tensor(torch.zeros(8), t, group=mesh.get_group("dp"))
    dist.all_reduce(t)
    finish()


def mesh3d_crash_raise(rank: int, world: int) -> None:
    mesh = _mesh((2, 2, 2), ("pp", "dp", "tp"))
    t = torch.ones(4)
    for step in range(3):
        dist.all_reduce(t, group=mesh.get_group("tp"))
        if rank == 5 and step == 2:
            raise ValueError("loss is NaN at step 2 (rank 5)")
        dist.all_reduce(t, group=mesh.get_group("dp"))
        dist.all_reduce(t)
    hang()


def mesh3d_missing(rank: int, world: int) -> None:
    mesh = _mesh((2, 2, 2), ("pp", "dp", "tp"))
    t = torch.ones(4)
    for step in range(3):
        dist.all_reduce(t, group=mesh.get_group("tp"))
        if not (rank == 6 and step == 2):
            dist.all_reduce(t, group=mesh.get_group("dp"))
    hang()


def hsdp_flatten_missing(rank: int, world: int) -> None:
    mesh = _mesh((2, 2), ("replicate", "shard"))
    flat = mesh["replicate", "shard"]._flatten("dp")
    t = torch.ones(4)
    for step in range(3):
        dist.all_gather_into_tensor(torch.zeros(8), t, group=mesh.get_group("shard"))
        if not (rank == 0 and step == 2):
            dist.all_reduce(t, group=flat.get_group())
    hang()


# --------------------------------------------------------------------------- crashes


def crash_raise(rank: int, world: int) -> None:
    t = torch.ones(4)
    for step in range(4):
        if rank == 1 and step == 3:
            raise RuntimeError("bad batch: label 1043 out of range")
        dist.all_reduce(t)
    hang()


def crash_os_exit(rank: int, world: int) -> None:
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)
    if rank == 1:
        os._exit(3)  # gone without a word
    dist.all_reduce(t)
    hang()


def crash_sigkill(rank: int, world: int) -> None:
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)
    if rank == 2:
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGKILL)  # the OOM killer
    dist.all_reduce(t)
    hang()


def crash_last_rank(rank: int, world: int) -> None:
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)
    if rank == world - 1:
        os._exit(1)
    dist.all_reduce(t)
    hang()


def crash_in_pipeline(rank: int, world: int) -> None:
    act = torch.ones(8)
    for step in range(3):
        if rank > 0:
            dist.recv(act, src=rank - 1)
        if rank == 2 and step == 1:
            raise RuntimeError("CUDA error: an illegal memory access (stage 2)")
        if rank < world - 1:
            dist.send(act, dst=rank + 1)
    hang()


# --------------------------------------------------------------------------- p2p


def _stage(rank: int, world: int, act: torch.Tensor, *, skip_recv: bool = False,
           skip_send: bool = False) -> None:
    if rank > 0 and not skip_recv:
        dist.recv(act, src=rank - 1)
    if rank < world - 1 and not skip_send:
        dist.send(act, dst=rank + 1)


def pipeline_healthy(rank: int, world: int) -> None:
    act = torch.ones(8)
    for _ in range(4):
        _stage(rank, world, act)
    dist.all_reduce(torch.ones(2))
    finish()


def pipeline_skip_recv(rank: int, world: int) -> None:
    act = torch.ones(8)
    for step in range(4):
        _stage(rank, world, act, skip_recv=rank == 2 and step == 2)
    hang()


def pipeline_skip_recv_then_sync(rank: int, world: int) -> None:
    act = torch.ones(8)
    for step in range(3):
        _stage(rank, world, act, skip_recv=rank == 2 and step == 1)
    dist.all_reduce(torch.ones(2))  # gradient sync: a cycle with rank 1's send
    hang()


def pipeline_drop_send(rank: int, world: int) -> None:
    act = torch.ones(8)
    for step in range(4):
        _stage(rank, world, act, skip_send=rank == 1 and step == 2)
    hang()


def pipeline_stage_stall(rank: int, world: int) -> None:
    act = torch.ones(8)
    for step in range(4):
        if rank == 2 and step == 2:
            load_batch(step)
        _stage(rank, world, act)
    hang()


def pipeline_1f1b_healthy(rank: int, world: int) -> None:
    fwd, grad = torch.ones(8), torch.ones(8)
    for _ in range(3):
        ops = []
        if rank > 0:
            ops.append(dist.P2POp(dist.irecv, fwd, rank - 1))
        if rank < world - 1:
            ops.append(dist.P2POp(dist.isend, fwd, rank + 1))
        for w in dist.batch_isend_irecv(ops) if ops else []:
            w.wait()
        ops = []
        if rank < world - 1:
            ops.append(dist.P2POp(dist.irecv, grad, rank + 1))
        if rank > 0:
            ops.append(dist.P2POp(dist.isend, grad, rank - 1))
        for w in dist.batch_isend_irecv(ops) if ops else []:
            w.wait()
    dist.all_reduce(torch.ones(2))
    finish()


def pipeline_1f1b_drop_grad(rank: int, world: int) -> None:
    fwd, grad = torch.ones(8), torch.ones(8)
    for step in range(3):
        if rank > 0:
            dist.recv(fwd, src=rank - 1)
        if rank < world - 1:
            dist.send(fwd, dst=rank + 1)
        ops = []
        if rank < world - 1:
            ops.append(dist.P2POp(dist.irecv, grad, rank + 1))
        if rank > 0 and not (rank == 3 and step == 1):  # the last stage drops a grad send
            ops.append(dist.P2POp(dist.isend, grad, rank - 1))
        for w in dist.batch_isend_irecv(ops) if ops else []:
            w.wait()
    hang()


def p2p_deadlock_recv(rank: int, world: int) -> None:
    t = torch.ones(6)
    dist.all_reduce(t)
    dist.recv(t, src=1 - rank)  # both wait to receive first
    dist.send(t, dst=1 - rank)
    hang()


def p2p_deadlock_send(rank: int, world: int) -> None:
    t = torch.ones(6)
    dist.all_reduce(t)
    dist.send(t, dst=1 - rank)  # gloo's send waits for the peer's recv: both send first
    dist.recv(t, src=1 - rank)
    hang()


def p2p_ring_deadlock(rank: int, world: int) -> None:
    t = torch.ones(6)
    dist.all_reduce(t)
    dist.send(t, dst=(rank + 1) % world)  # every rank sends first around a ring
    dist.recv(t, src=(rank - 1) % world)
    hang()


def p2p_ring_healthy(rank: int, world: int) -> None:
    t = torch.ones(6)
    for _ in range(3):
        ops = [dist.P2POp(dist.isend, t, (rank + 1) % world),
               dist.P2POp(dist.irecv, torch.zeros(6), (rank - 1) % world)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
    finish()


def p2p_size_mismatch(rank: int, world: int) -> None:
    dist.all_reduce(torch.ones(2))
    if rank == 0:
        dist.send(torch.ones(8, 16), dst=1)
    elif rank == 1:
        dist.recv(torch.zeros(8, 32), src=0)  # gloo completes it: half the buffer is garbage
    finish()


def p2p_unmatched_send(rank: int, world: int) -> None:
    dist.all_reduce(torch.ones(2))
    if rank == 0:
        dist.send(torch.arange(6.0), dst=1)  # rank 1 never receives
    hang()


# --------------------------------------------------------------------------- two faults


def two_faults(rank: int, world: int) -> None:
    mesh = _mesh((2, 2), ("dp", "tp"))
    tp = mesh.get_group("tp")
    t = torch.ones(4)
    for step in range(3):
        if rank == 1 and step == 2:
            pass  # fault 1: rank 1 skips its tp all_reduce
        elif rank == 3 and step == 2:
            load_batch(step)  # fault 2: rank 3 stalls in its loader
        else:
            dist.all_reduce(t, group=tp)
    hang()


def crash_and_stall(rank: int, world: int) -> None:
    pair_a = dist.new_group([0, 1], group_desc="pair_01")
    pair_b = dist.new_group([2, 3], group_desc="pair_23")
    t = torch.ones(4)
    for step in range(3):
        if rank in (0, 1):
            if rank == 0 and step == 2:
                raise RuntimeError("checkpoint shard missing (rank 0)")
            dist.all_reduce(t, group=pair_a)
        else:
            if rank == 3 and step == 2:
                load_batch(step)
            dist.all_reduce(t, group=pair_b)
    hang()


# --------------------------------------------------------------------------- in the field


def skip_new_group(rank: int, world: int) -> None:
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)
    if rank != 3:
        experts = dist.new_group(list(range(world)), group_desc="experts")  # rank 3 skips it
        dist.all_reduce(t, group=experts)
    dist.all_reduce(t)  # rank 3 goes on and waits here for the others
    hang()


def skip_new_group_local(rank: int, world: int) -> None:
    t = torch.ones(4)
    dist.all_reduce(t)
    if rank in (1, 2):  # rank 3 skips its part of the group of 1-3
        tail = dist.new_group([1, 2, 3], use_local_synchronization=True, group_desc="tail")
        dist.all_reduce(t, group=tail)
    dist.all_reduce(t)
    hang()


def skip_mesh(rank: int, world: int) -> None:
    t = torch.ones(4)
    dist.all_reduce(t)
    if rank != 0:  # rank 0 builds no mesh (torch's: every rank creates every group)
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        dist.all_reduce(t, group=mesh.get_group("tp"))
    dist.barrier()
    hang()


def skip_init(rank: int, world: int, store_path: str) -> None:
    if rank == 3:
        hang()  # never joins the job (stuck before init_process_group)
    store = dist.FileStore(store_path, world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=30))
    dist.all_reduce(torch.ones(4))
    hang()


_NO_INIT.add(skip_init)


def _earlier_attempt(rank: int, world: int) -> None:
    """The first attempt of a restarted job: 8 ranks, rank 5 misses an all_reduce."""
    t = torch.ones(4)
    for _ in range(2):
        dist.all_reduce(t)
    if rank != 5:
        dist.all_reduce(t)
    hang()


def restarted_job(rank: int, world: int) -> None:
    t = torch.ones(4)
    for _ in range(5):
        dist.all_reduce(t)
    if rank != 2:
        dist.all_reduce(t)  # the new attempt, 4 ranks: rank 2 misses #6
    hang()


def restarted_job_killed_rank(rank: int, world: int) -> None:
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)
    if rank == 3:
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGKILL)  # its file is the earlier attempt's
    dist.all_reduce(t)
    hang()


def _earlier_attempt_same_size(rank: int, world: int) -> None:
    """The first attempt, same 4 ranks: rank 0 raises at step 2."""
    t = torch.ones(4)
    for step in range(3):
        if rank == 0 and step == 2:
            raise RuntimeError("out of memory (attempt 1)")
        dist.all_reduce(t)
    hang()


def dtype_mismatch_kills_peer(rank: int, world: int) -> None:
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)
    # rank 1 sends float64: twice the bytes each receiver posted; gloo aborts one
    x = torch.ones(1 << 15, dtype=torch.float64 if rank == 1 else torch.float32)
    dist.broadcast(x, 1)
    hang()


def fsdp2_stall(rank: int, world: int) -> None:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    for step in range(4):
        batch = load_batch(step) if (rank == 2 and step == 2) else torch.ones(4, 8)
        model(batch).sum().backward()  # the others wait in FSDP2's all-gather
    hang()


def loader_thread_deadlock(rank: int, world: int) -> None:
    import queue
    import threading

    t = torch.ones(4)
    for _ in range(2):
        dist.all_reduce(t)
    if rank == 3:
        batches: queue.Queue[torch.Tensor] = queue.Queue()
        lock = threading.Lock()

        def fill() -> None:
            with lock:
                lock.acquire()  # the loader takes a lock it already holds
                batches.put(torch.ones(4))

        threading.Thread(target=fill, name="loader", daemon=True).start()
        t = batches.get()  # the main thread waits for a batch that never comes
    dist.all_reduce(t)
    hang()


def healthy_dump_at_end(rank: int, world: int) -> None:
    t = torch.ones(1 << 12)
    for _ in range(5):
        dist.all_reduce(t)
    flight.dump()  # right after the job's last collective, as a user's exit hook does
    time.sleep(0.5)


def _unretired(snapshot: bytes) -> bool:
    """Whether the newest record of PyTorch's native dump ``snapshot`` (this process's
    own) is not marked retired."""
    import pickle

    entries = pickle.loads(snapshot)["entries"]
    return bool(entries) and not entries[-1].get("retired")


def _keep_native(rank: int, snapshot: bytes) -> None:
    """Make ``snapshot`` the rank's native dump (``native/rank_<N>``), in place of the one
    mirrored from its last commscope dump."""
    out = Path(flight.config().dump_prefix).parent.parent  # type: ignore[union-attr]
    write_atomic(str(out / "native" / f"rank_{rank}"), snapshot)


def healthy_native_dump_at_exit(rank: int, world: int) -> None:
    """A healthy loop of all_reduces whose ranks take PyTorch's native dump
    (``_dump_fr_trace``) right after each step's all_reduce returns, as an exit hook
    does after the last one. gloo's worker marks a collective retired just after the
    call returns, so a snapshot can hold the collective just finished unmarked. The job
    stops at the first step where some ranks' snapshots hold it so and the others' do
    not, and keeps those snapshots as its native dumps; it dumps ours at the end."""
    t = torch.ones(1 << 12)
    snapshot = b""
    for _ in range(200):
        dist.all_reduce(t)
        snapshot = _native_bytes()
        caught = torch.tensor([float(_unretired(snapshot))])
        dist.all_reduce(caught)
        if 0 < caught.item() < world:
            break
    flight.dump()
    _keep_native(rank, snapshot)
    time.sleep(0.3)


def pipeline_skip_recv_send_cycle(rank: int, world: int) -> None:
    act, grad = torch.ones(8), torch.ones(8)
    dist.all_reduce(torch.ones(2))
    if rank == 0:
        for _ in range(4):
            dist.send(act, dst=1)  # activations of 4 microbatches
        for _ in range(4):
            dist.recv(grad, src=1)
    else:
        for mb in range(4):
            if mb != 2:
                dist.recv(act, src=0)  # the last stage skips microbatch 2's recv
        for _ in range(4):
            dist.send(grad, dst=0)  # ...and sends gradients while stage 0 still sends
    hang()


def mesh2d_stall_one_rank(rank: int, world: int) -> None:
    mesh = _mesh((2, 2), ("dp", "tp"))
    tp, dp = mesh.get_group("tp"), mesh.get_group("dp")
    t = torch.ones(4)
    for step in range(3):
        if rank == 2 and step == 2:
            load_batch(step)  # rank 2 stalls: its tp peer and its dp peer both wait
        dist.all_reduce(t, group=tp)
        dist.all_reduce(t, group=dp)
    hang()


def _lightning_like_sigterm() -> None:
    """A trainer's SIGTERM handler that tells the other ranks (a collective), then hands
    over to the handler before it (commscope's: dump, then terminate)."""
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum: int, frame: Any) -> None:
        dist.broadcast(torch.ones(1), 0, async_op=True)  # Lightning's connector does this
        if callable(previous):
            previous(signum, frame)

    signal.signal(signal.SIGTERM, on_sigterm)


def sigterm_handler_after_timeout(rank: int, world: int) -> None:
    _lightning_like_sigterm()
    t = torch.ones(4)
    for step in range(3):
        batch = load_batch(step) if (rank == 3 and step == 2) else t
        dist.all_reduce(batch)
    hang()


def usr2_handler_collective(rank: int, world: int) -> None:
    def on_usr2(signum: int, frame: Any) -> None:
        dist.broadcast(torch.ones(1), 0)  # a handler's collective: the others never join

    signal.signal(signal.SIGUSR2, on_usr2)
    t = torch.ones(4)
    for step in range(3):
        batch = load_batch(step) if (rank == 3 and step == 2) else t
        dist.all_reduce(batch)
    hang()


# --------------------------------------------------------------------------- the corpus


# ---- what must agree: root, reduce op, all_to_all splits (issue 32 item 2)


def broadcast_wrong_root(rank: int, world: int) -> None:
    """Rank 1 broadcasts from itself, the others from rank 0: two ranks send and wait."""
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)
    dist.broadcast(t, 1 if rank == 1 else 0)
    hang()


def broadcast_object_wrong_src(rank: int, world: int) -> None:
    """A config broadcast with ``broadcast_object_list`` where rank 3 names itself as the
    source (it read a stale ``src`` from its own config)."""
    t = torch.ones(4)
    for _ in range(2):
        dist.all_reduce(t)
    cfg: list[Any] = [{"lr": 0.1, "step": rank}]
    dist.broadcast_object_list(cfg, src=3 if rank == 3 else 0)
    hang()


def reduce_op_mismatch(rank: int, world: int) -> None:
    """Rank 1 reduces the loss with MAX where the others SUM: it completes on gloo, with a
    different result on that rank, and the job runs on."""
    t = torch.ones(4)
    dist.all_reduce(t)
    loss = torch.full((1,), float(rank))
    dist.all_reduce(loss, op=dist.ReduceOp.MAX if rank == 1 else dist.ReduceOp.SUM)
    dist.all_reduce(t)
    dist.barrier()
    finish()


def reduce_op_mismatch_mesh(rank: int, world: int) -> None:
    """On a 2 x 4 mesh (dp, tp), rank 6 reduces its gradient norm over dp with MAX where
    its dp peer (rank 2) sums: a silent desync in one dp group, the job runs on."""
    mesh = _mesh((2, 4), ("dp", "tp"))
    dp, tp = mesh.get_group("dp"), mesh.get_group("tp")
    t = torch.ones(4)
    for _ in range(2):
        dist.all_reduce(t, group=tp)
        norm = torch.full((1,), float(rank))
        op = dist.ReduceOp.MAX if rank == 6 else dist.ReduceOp.SUM
        dist.all_reduce(norm, op=op, group=dp)
    dist.barrier()
    finish()


def silent_dtype_desync(rank: int, world: int) -> None:
    """Step 3 of a data-parallel loop: rank 2 all-reduces its gradients as int32 where the
    others pass float32 of the same byte count. Nothing hangs on gloo (or NCCL): rank 2's
    sum is garbage and the job runs on (issue 33: silent desyncs)."""
    grads = torch.ones(256)
    for step in range(6):
        t = grads.to(torch.int32) if (rank == 2 and step == 3) else grads.clone()
        dist.all_reduce(t)
        time.sleep(0.05)
    dist.barrier()
    dump_and_run_on()


def silent_shape_desync(rank: int, world: int) -> None:
    """A tensor-parallel block on a 2 x 2 mesh: rank 1 all-reduces its partial output as
    [32, 8] where its tp peer passes [8, 32] (a transposed layout, the same element
    count): it completes, the values land in the wrong places."""
    mesh = _mesh((2, 2), ("dp", "tp"))
    tp = mesh.get_group("tp")
    for step in range(5):
        out = torch.ones(32, 8) if (rank == 1 and step >= 2) else torch.ones(8, 32)
        dist.all_reduce(out, group=tp)
        time.sleep(0.05)
    dist.barrier()
    dump_and_run_on()


def silent_desync_rolled_out(rank: int, world: int) -> None:
    """Rank 1 reduces one step in float16 where the others use bfloat16 (same byte count),
    then the job runs 200 more collectives: the small ring (buffer 32) has long dropped
    the record of that step, only the running fingerprints still differ."""
    x = torch.ones(64)
    for _ in range(4):
        dist.all_reduce(x)
    bad = x.to(torch.float16 if rank == 1 else torch.bfloat16)
    dist.all_reduce(bad)
    for _ in range(200):
        dist.all_reduce(x)
    dist.barrier()
    dump_and_run_on()


def desync_then_hang(rank: int, world: int) -> None:
    """Rank 3 all-reduces a metric as int32 where the others pass float32 (a silent
    desync); two steps later its garbage loss makes it leave the loop early, so it
    never reaches the next gradient all_reduce and the others wait there."""
    x = torch.ones(128)
    for step in range(6):
        metric = torch.ones(16, dtype=torch.int32 if (rank == 3 and step == 1) else
                            torch.float32)
        dist.all_reduce(metric)
        if rank == 3 and step == 3:
            hang()  # its loss went NaN: it stops stepping, holding the others
        dist.all_reduce(x)
        time.sleep(0.05)
    hang()


def _moe_exchange(rank: int, world: int, splits: list[int], group: Any = None) -> None:
    n = len(splits)
    tokens = torch.ones(sum(splits), 8)
    recv = torch.empty(n, 8)  # one row from every rank expected
    dist.all_to_all_single(recv, tokens, [1] * n, splits, group=group)


def a2a_stale_splits(rank: int, world: int) -> None:
    """A mixture-of-experts layer: rank 2 routes with the previous step's token counts
    (2 rows to expert 0, none to itself) while every rank expects one row from each: gloo
    refuses rank 2's own splits (it keeps 0 rows but expects 1), the others wait."""
    for _ in range(2):
        _moe_exchange(rank, world, [1] * world)
    time.sleep(0.5)  # every rank publishes its progress (0.2 s) before the fault
    _moe_exchange(rank, world, [2, 1, 0, 1] if rank == 2 else [1] * world)
    hang()


def a2a_splits_kill_receiver(rank: int, world: int) -> None:
    """Rank 2 routes two tokens to expert 0 and none to expert 3 (its own count stays
    right): gloo aborts rank 0, which receives more than it posted, and rank 3 waits for
    a row that never comes."""
    for _ in range(2):
        _moe_exchange(rank, world, [1] * world)
    time.sleep(0.5)  # every rank publishes its progress (0.2 s) before the fault
    _moe_exchange(rank, world, [2, 1, 1, 0] if rank == 2 else [1] * world)
    hang()


def a2a_splits_ep_mesh(rank: int, world: int) -> None:
    """Expert parallelism on a 2 x 4 mesh (dp, ep): in the second dp replica, ep rank 1
    (global rank 5) routes with stale counts: two rows to its first expert, none to
    itself, so rank 4 receives more than it posted."""
    mesh = _mesh((2, 4), ("dp", "ep"))
    ep = mesh.get_group("ep")
    t = torch.ones(4)
    dist.all_reduce(t)
    for _ in range(2):
        _moe_exchange(rank, world, [1, 1, 1, 1], ep)
    time.sleep(0.5)  # every rank publishes its progress (0.2 s) before the fault
    _moe_exchange(rank, world, [2, 0, 1, 1] if rank == 5 else [1, 1, 1, 1], ep)
    hang()


def a2a_splits_kill_receiver_sync(rank: int, world: int) -> None:
    """Each step a mixture-of-experts exchange, then the loss all_reduce: at step 3 rank 2
    routes with stale counts (two rows to expert 0, one to each other; every rank
    expects one row from each): gloo aborts rank 0, which receives more than it
    posted. The survivors' own splits agree pair by pair and they stop in different
    collectives: the ranks whose exchange had gone through wait in the all_reduce, the
    others in the all_to_all."""
    for _ in range(2):
        _moe_exchange(rank, world, [1] * world)
    time.sleep(0.5)  # every rank publishes its progress (0.2 s) before the fault
    for step in range(2, 4):
        _moe_exchange(rank, world, [2, 1, 1, 1] if rank == 2 and step == 2 else [1] * world)
        dist.all_reduce(torch.ones(4))  # the step's loss
    hang()


def _moe_layer(rank: int, world: int, splits: list[int]) -> None:
    """A mixture-of-experts layer: dispatch (``splits[j]`` tokens to expert ``j``, one
    expected from every rank), then combine (the experts' outputs back the same way)."""
    n = len(splits)
    got = torch.empty(n, 8)
    dist.all_to_all_single(got, torch.ones(sum(splits), 8), [1] * n, splits)  # dispatch
    back = torch.empty(sum(splits), 8)
    dist.all_to_all_single(back, got * 2, splits, [1] * n)  # combine


def a2a_splits_kill_two_receivers(rank: int, world: int) -> None:
    """Six ranks, a MoE layer of two all_to_alls (dispatch, combine) per step: at step 3
    rank 2 dispatches with stale counts, two rows each to experts 0 and 5: gloo aborts
    both receivers. The four survivors' splits agree pair by pair; those whose dispatch
    went through wait in the combine all_to_all, the others in the dispatch."""
    for _ in range(2):
        _moe_layer(rank, world, [1] * world)
    time.sleep(0.5)  # every rank publishes its progress (0.2 s) before the fault
    for _ in range(2):
        _moe_layer(rank, world, [2, 1, 1, 1, 1, 2] if rank == 2 else [1] * world)
    hang()


# ---- on-demand dumps of running jobs (issue 32 item 3)


def _init_gloo(rank: int, world: int, store_path: str) -> None:
    store = dist.FileStore(store_path, world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=30))


def _commscope_dump_after(store_path: str, world: int, after_s: float) -> None:
    """Do what ``commscope dump`` does from another terminal, ``after_s`` from now: post
    a proven dump request in the job's store. Every rank answers at its next publishing
    round, from its watchdog thread, whatever its main thread is doing."""
    import threading

    from commscope.watch.address import Address
    from commscope.watch.source import StoreSource

    def ask() -> None:
        time.sleep(after_s)
        client = dist.FileStore(store_path, world + 1)  # a client of its own, as the CLI's
        StoreSource(Address("filestore", 0, world_size=world), store=client).request_dump()

    threading.Thread(target=ask, name="commscope-dump", daemon=True).start()


def _train_in_turn(rank: int, world: int, compute: Callable[[], object],
                   steps: int = 600, pair: Any = None) -> None:
    """Healthy training steps in which one rank computes while the others already wait
    inside the step's collectives (a different rank each step: no straggler), until
    every rank has written its dump (an all_reduce of who has: the job then idles, so
    the progress records the launcher saves show no op in flight)."""
    t = torch.ones(1 << 10)
    mine = f"{flight.config().dump_prefix}{rank}"  # type: ignore[union-attr]
    for step in range(steps):
        if step % world == rank:
            compute()  # this rank's compute; the others are in the all_reduce
        dist.all_reduce(t)
        t.div_(world)
        if pair is not None and rank in (0, 1):
            dist.broadcast(t, 0, group=pair)
        dumped = torch.tensor([float(os.path.exists(mine))])
        dist.all_reduce(dumped)
        if dumped.item() == world:
            break
    dist.barrier()
    hang()


def on_demand_request_running(rank: int, world: int, store_path: str) -> None:
    """A healthy job asked for its dumps by ``commscope dump`` while it trains: the
    ranks waiting for the one that computes are caught inside an all_reduce a few ms
    old, none stuck."""
    _init_gloo(rank, world, store_path)
    if rank == 0:
        _commscope_dump_after(store_path, world, 1.5)
    _train_in_turn(rank, world, lambda: time.sleep(0.05))


def on_demand_sigusr1_running(rank: int, world: int) -> None:
    """A healthy job, an all_reduce of everyone and a broadcast in pair_01 each step,
    signalled SIGUSR1 on every rank while it trains: each rank dumps where it is, at
    its own moment. The rank computing (one matmul) dumps between two steps; the others
    wait for it inside the next all_reduce while it writes its dump (here seconds: this
    generator mirrors every dump into PyTorch's native format), still under the stall
    threshold, and their dumps catch them there."""
    pair = dist.new_group([0, 1], group_desc="pair_01")
    a = torch.rand(700, 700)
    _train_in_turn(rank, world, lambda: torch.mm(a, a), pair=pair)


def on_demand_request_stuck(rank: int, world: int, store_path: str) -> None:
    """``commscope dump`` asked 14 s in, 12 s after rank 3 stalled in its data loader:
    ranks 0-2 have waited in all_reduce #3 longer than the stall threshold (10 s), so
    the dump asked for on demand is a hang, not a job caught running."""
    _init_gloo(rank, world, store_path)
    if rank == 0:
        _commscope_dump_after(store_path, world, 14.0)
    t = torch.ones(4)
    for step in range(3):
        batch = load_batch(step) if (rank == 3 and step == 2) else t
        dist.all_reduce(batch)
    hang()


def desync_running_dumped(rank: int, world: int, store_path: str) -> None:
    """A loop of alike all_reduces; at step 5 rank 1 passes its gradients as int32 where
    the others pass float32 (same byte count), and the job runs on. ``commscope dump``
    asks for the dumps 1.5 s in, while the ranks are a step apart: the analysis must call
    it a different dtype at #6, not an extra call (in a loop of alike calls a shift fits
    too)."""
    _init_gloo(rank, world, store_path)
    if rank == 0:
        _commscope_dump_after(store_path, world, 1.5)
    t = torch.ones(1 << 10)
    for step in range(250):
        dist.all_reduce(t.to(torch.int32) if (rank == 1 and step == 5) else t)
        time.sleep(0.01)
    dist.barrier()
    hang()


_NO_INIT.update({on_demand_request_running, on_demand_request_stuck, desync_running_dumped})


# ---- torch.compile (issue 32 item 6)


def _fresh_compile() -> None:
    """Compile from this file's source every time: inductor's compile caches hand back a
    graph made earlier from other source (the same ops) with that source's line map,
    and the recorder then names only the compiled function, at its first line."""
    import torch._functorch.config
    import torch._inductor.config

    torch._inductor.config.fx_graph_cache = False
    torch._functorch.config.enable_autograd_cache = False


def _at(fn: Callable[..., Any], text: str) -> str:
    """``make_scenarios.py:<line> in <fn>``: the line of ``fn`` holding ``text``, as a
    finding names it."""
    import inspect

    lines, first = inspect.getsourcelines(fn)
    line = next(first + i for i, src in enumerate(lines) if text in src)
    return f"make_scenarios.py:{line} in {fn.__name__}"


def _compiled_step(x: torch.Tensor) -> torch.Tensor:
    y = torch.tanh(x) * 2
    dist.all_reduce(y)  # dynamo puts it in the graph (a functional all_reduce)
    return y + 1


def compiled_step_stall(rank: int, world: int) -> None:
    """A torch.compile'd (inductor) step whose all_reduce is in the graph: rank 2 stalls
    in its data loader at step 2, the others wait inside the compiled step."""
    _fresh_compile()
    step = torch.compile(_compiled_step)
    for i in range(4):
        batch = load_batch(i) if (rank == 2 and i == 2) else torch.ones(4) * i
        step(batch)
    hang()


def _tp_block(x: torch.Tensor, group: Any) -> torch.Tensor:
    from torch.distributed import _functional_collectives as funcol

    y = x * 2
    torch._dynamo.graph_break()  # as a print or an .item() does: the rest is its own graph
    y = funcol.all_reduce(y, "sum", group)
    return y + 1


def compiled_graph_break_missing(rank: int, world: int) -> None:
    """A torch.compile'd (inductor) block on a 2x2 mesh whose functional all_reduce over
    tp runs in the part after a graph break: rank 3 skips the fourth block, rank 2 (its
    tp peer) waits in it."""
    _fresh_compile()
    tp = _mesh((2, 2), ("dp", "tp")).get_group("tp")
    block = torch.compile(_tp_block)
    t = torch.ones(4)
    for _ in range(3):
        t = block(t, tp)
    if rank != 3:
        block(t, tp)  # 4: rank 3 never comes
    hang()


# ---- one root cause, one finding (issue 32 item 5)


def skip_then_size_abort(rank: int, world: int) -> None:
    """Rank 1 skips the third gradient all_reduce (4 floats) and goes on to the loss
    all_reduce (8 floats), which the others have not reached: gloo meets 8 floats against
    4 in one call and aborts a rank over it, a consequence of the skip."""
    t = torch.ones(4)
    for _ in range(2):
        dist.all_reduce(t)
    if rank != 1:
        dist.all_reduce(t)
    dist.all_reduce(torch.ones(8))
    hang()


def skip_tp_broadcast_tie(rank: int, world: int) -> None:
    """On a 2x2 mesh (dp, tp), each step a tp broadcast, a tp all_gather and a dp
    all_reduce: at step 1 rank 3 skips the broadcast and calls the all_gather while its tp
    peer (rank 2) broadcasts: a group of two that disagrees, no majority. Ranks 0 and 1
    finish their own tp step and wait in the dp all_reduce for ranks 2 and 3."""
    mesh = _mesh((2, 2), ("dp", "tp"))
    tp, dp = mesh.get_group("tp"), mesh.get_group("dp")
    for step in range(3):
        if not (rank == 3 and step == 1):
            dist.broadcast(torch.ones(4), dist.get_global_rank(tp, 0), group=tp)
        dist.all_gather_into_tensor(torch.zeros(8), torch.ones(4), group=tp)
        dist.all_reduce(torch.ones(4), group=dp)
    hang()


def skip_own_desc_pairs(rank: int, world: int) -> None:
    """Eight ranks in four pairs, each pair's group named for itself (``stage_0`` ..
    ``stage_3``), each step an all_reduce in the pair, then one of everyone: at step 1 rank
    5 skips its pair's all_reduce and waits in everyone's for rank 4, which waits for it
    in the pair."""
    pairs = [dist.new_group([2 * k, 2 * k + 1], group_desc=f"stage_{k}") for k in range(4)]
    mine = pairs[rank // 2]
    for step in range(3):
        if not (rank == 5 and step == 1):
            dist.all_reduce(torch.ones(4), group=mine)
        dist.all_reduce(torch.ones(2))
    hang()


def skip_tp_then_broadcast_root(rank: int, world: int) -> None:
    """On a 2x2 mesh (dp, tp), each step a tp all_reduce, a dp all_gather and a broadcast
    of everyone from rank 0: at step 1 rank 2 skips its tp all_reduce and runs ahead into
    the broadcast, which it receives from rank 0 and finishes, while rank 0 (the root)
    still waits in it for ranks 1 and 3, held behind rank 2's skip."""
    mesh = _mesh((2, 2), ("dp", "tp"))
    tp, dp = mesh.get_group("tp"), mesh.get_group("dp")
    t = torch.ones(4)
    for step in range(3):
        if not (rank == 2 and step == 1):
            dist.all_reduce(t, group=tp)
        dist.all_gather_into_tensor(torch.zeros(8), t, group=dp)
        dist.broadcast(torch.ones(16), 0)
    hang()


def skip_then_size_abort_tp(rank: int, world: int) -> None:
    """On a 2x2 mesh (dp, tp), each step a tp all_reduce of 4 floats, one of 8, then a dp
    all_reduce: at step 1 rank 3 skips the one of 4 and calls the one of 8, which meets
    its tp peer's call of 4: gloo aborts rank 2 (it receives more than it posted), and
    rank 0 waits for rank 2 in the dp all_reduce."""
    mesh = _mesh((2, 2), ("dp", "tp"))
    tp, dp = mesh.get_group("tp"), mesh.get_group("dp")
    for step in range(3):
        if not (rank == 3 and step == 1):
            dist.all_reduce(torch.ones(4), group=tp)
        dist.all_reduce(torch.ones(8), group=tp)
        dist.all_reduce(torch.ones(4), group=dp)
    hang()


# ---- evidence-weighed mismatches: the rank gloo kills can be the culprit (issue 32 item 1)


def small_buffer_killed(rank: int, world: int) -> None:
    """Rank 3 posts a 2-float buffer for the weights rank 0 broadcasts (16 384 floats): gloo
    aborts rank 3, the one that was wrong; ranks 0-2 agree, finish the broadcast, and wait
    in the next all_reduce until the launcher stops them."""
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)
    weights = torch.ones(2 if rank == 3 else 1 << 14)
    dist.broadcast(weights, 0)
    dist.all_reduce(t)
    hang()


def small_buffer_killed_tp(rank: int, world: int) -> None:
    """On a 2 x 4 mesh (dp, tp), tp rank 1 of the second replica (global rank 5) posts a
    buffer too small for its tp group's broadcast from rank 4: gloo aborts rank 5; ranks 4,
    6, 7 agree and go on to the tp all_reduce, and the first replica waits in dp."""
    mesh = _mesh((2, 4), ("dp", "tp"))
    tp, dp = mesh.get_group("tp"), mesh.get_group("dp")
    t = torch.ones(4)
    for _ in range(2):
        dist.all_reduce(t, group=tp)
        dist.all_reduce(t, group=dp)
    time.sleep(0.5)  # every rank publishes its progress (0.2 s) before the fault
    shard = torch.ones(2 if rank == 5 else 1 << 14)
    dist.broadcast(shard, dist.get_global_rank(tp, 0), group=tp)
    dist.all_reduce(t, group=tp)
    dist.all_reduce(t, group=dp)
    hang()


# ---- pipelines and threads (issue 32 items 7, 9)


def _gpipe_step(prev: int | None, nxt: int | None, group: Any = None,
                skip_recv: int | None = None, skip_send: int | None = None) -> None:
    """One GPipe step of a pipeline stage: the activations of 4 microbatches forward
    (recv from stage ``prev``, send to stage ``nxt``, global ranks), then their gradients
    back; ``skip_recv`` / ``skip_send``: the microbatch whose recv / send the stage leaves
    out (both: it drops that microbatch)."""
    act, grad = torch.ones(8), torch.ones(8)
    for mb in range(4):
        if prev is not None and mb != skip_recv:
            dist.recv(act, src=prev, group=group)
        if nxt is not None and mb != skip_send:
            dist.send(act, dst=nxt, group=group)
    for _ in range(4):
        if nxt is not None:
            dist.recv(grad, src=nxt, group=group)
        if prev is not None:
            dist.send(grad, dst=prev, group=group)


def _neighbours(stage: int, rank: int, stages: int) -> tuple[int | None, int | None]:
    return (rank - 1 if stage > 0 else None), (rank + 1 if stage < stages - 1 else None)


def pipeline_gpipe_skip_recv(rank: int, world: int) -> None:
    """A 4-stage GPipe pipeline: in its second step stage 2 leaves out microbatch 2's recv
    from stage 1 (it reuses the activation it holds), sends all 4 activations on to stage
    3 and, once stage 3 returns the first gradient, blocks in its send of that gradient to
    stage 1, which still blocks in its 4th activation send to stage 2 (on gloo a send waits
    for its recv): a send/send cycle; stage 3 waits in its second gradient send, stage 0
    in its first gradient recv."""
    prev, nxt = _neighbours(rank, rank, world)
    grads = torch.ones(4)
    for step in range(2):
        _gpipe_step(prev, nxt, skip_recv=2 if (rank == 2 and step == 1) else None)
        dist.all_reduce(grads)  # the step's loss, summed over the stages
    hang()


def pipeline_gpipe_drop_microbatch(rank: int, world: int) -> None:
    """A 4-stage GPipe pipeline whose stage 2 drops microbatch 2 in the first step (an
    empty batch filtered out on that stage alone): it posts neither the recv from stage 1
    nor the send to stage 3, goes on to the backward pass and waits in a gradient recv
    from stage 3, which waits in its 4th activation recv from it: a recv/recv cycle; stage
    1 blocks in its 4th activation send, stage 0 in its first gradient recv. (In the first
    step: a progress record keeps a rank's newest 12 send/recv records, fewer than a
    stage's 16 of one step, so a whole microbatch dropped in a later step is a
    p2p_deadlock to ``commscope watch``.)"""
    prev, nxt = _neighbours(rank, rank, world)
    grads = torch.ones(4)
    dist.all_reduce(grads)  # the parameters' checksum, before training
    drop = 2 if rank == 2 else None
    _gpipe_step(prev, nxt, skip_recv=drop, skip_send=drop)
    dist.all_reduce(grads)
    hang()


def pipeline_dp2_skip_send(rank: int, world: int) -> None:
    """Two 4-stage GPipe pipelines side by side (data-parallel 2 x pipeline 4: ranks 0-3
    and 4-7, each stage's gradients all_reduced with its replica in the other pipeline):
    in the second step stage 1 of the second pipeline (rank 5) leaves out microbatch 2's
    send to rank 6, goes on to the backward pass and waits in a gradient recv from rank 6,
    which waits in its 4th activation recv from rank 5: a recv/recv cycle. The first
    pipeline finishes the step and waits in the data-parallel all_reduce."""
    pps = [dist.new_group(list(range(s, s + 4)), group_desc=f"pp_{s // 4}") for s in (0, 4)]
    dps = [dist.new_group([s, s + 4], group_desc=f"dp_{s}") for s in range(4)]
    pp, dp = pps[rank // 4], dps[rank % 4]
    prev, nxt = _neighbours(rank % 4, rank, 4)
    grads = torch.ones(4)
    for step in range(2):
        _gpipe_step(prev, nxt, pp, skip_send=2 if (rank == 5 and step == 1) else None)
        dist.all_reduce(grads, group=dp)
    hang()


def _p2p_batch(ops: list[Any]) -> None:
    """Post ``ops`` together (``batch_isend_irecv``) and wait for all of them."""
    for w in dist.batch_isend_irecv(ops) if ops else []:
        w.wait()


def _one_f_one_b_step(stage: int, stages: int, microbatches: int, prev: int | None,
                      nxt: int | None, skip_recv: int | None = None) -> None:
    """One training step of Megatron's non-interleaved 1F1B schedule on a pipeline stage:
    ``stages - stage - 1`` warm-up forwards, then one forward and one backward in turn
    (the activation sent on with the next gradient received, the gradient sent back with
    the next activation received: batched, as Megatron does), then the cool-down
    backwards; ``skip_recv``: the microbatch whose activation recv the stage leaves out
    (it reuses the activation it holds)."""
    act, grad = torch.ones(8), torch.ones(8)

    def recv_fwd(mb: int) -> list[Any]:
        return [dist.P2POp(dist.irecv, act, prev)] if prev is not None and mb != skip_recv \
            else []

    send_fwd = [dist.P2POp(dist.isend, act, nxt)] if nxt is not None else []
    recv_bwd = [dist.P2POp(dist.irecv, grad, nxt)] if nxt is not None else []
    send_bwd = [dist.P2POp(dist.isend, grad, prev)] if prev is not None else []
    warmup = min(stages - stage - 1, microbatches)
    steady = microbatches - warmup
    for mb in range(warmup):
        _p2p_batch(recv_fwd(mb))
        _p2p_batch(send_fwd)
    if steady:
        _p2p_batch(recv_fwd(warmup))
    for i in range(steady):
        _p2p_batch(send_fwd + recv_bwd)
        last = i == steady - 1
        _p2p_batch(send_bwd + ([] if last else recv_fwd(warmup + i + 1)))
    for _ in range(warmup):
        _p2p_batch(recv_bwd)
        _p2p_batch(send_bwd)


def _one_f_one_b(rank: int, world: int, microbatches: int, skipper: int, skip_recv: int,
                 skip_step: int = 1) -> None:
    """Two 1F1B steps of a ``world``-stage pipeline, each ending in the loss all_reduce;
    in step ``skip_step``, stage ``skipper`` leaves out microbatch ``skip_recv``'s recv."""
    prev, nxt = _neighbours(rank, rank, world)
    for step in range(2):
        skip = skip_recv if (rank == skipper and step == skip_step) else None
        _one_f_one_b_step(rank, world, microbatches, prev, nxt, skip)
        dist.all_reduce(torch.ones(2))
    hang()


def pipeline_1f1b_skip_warmup_recv(rank: int, world: int) -> None:
    """A 4-stage 1F1B pipeline of 8 microbatches (forward and backward sends and recvs
    interleave in the steady state): in the second step stage 1 leaves out microbatch
    1's activation recv, in its warm-up. The schedule goes on one recv short until stage
    0's last activation send finds no recv: stage 0 and stage 1 both wait in a send."""
    _one_f_one_b(rank, world, 8, skipper=1, skip_recv=1)


def pipeline_1f1b_skip_last_recv(rank: int, world: int) -> None:
    """A 4-stage 1F1B pipeline of 8 microbatches: in the second step stage 2 leaves out
    the activation recv of the last microbatch (batched with its gradient send in the
    steady state) and goes on to its cool-down: stage 1 blocks in that activation send,
    stage 2 in its last gradient send to stage 1."""
    _one_f_one_b(rank, world, 8, skipper=2, skip_recv=7)


def pipeline_1f1b_skip_first_step_recv(rank: int, world: int) -> None:
    """A 4-stage 1F1B pipeline of 8 microbatches: in the very first step (no step before
    it to compare with) stage 1 leaves out microbatch 1's activation recv, in its warm-up.
    The schedule goes on one recv short until stage 0's last activation send finds no
    recv."""
    _one_f_one_b(rank, world, 8, skipper=1, skip_recv=1, skip_step=0)


def _read_sample(rank: int, step: int) -> torch.Tensor:
    """A data loader's read of one sample: on rank 1 the 4th one is corrupt."""
    if rank == 1 and step == 3:
        raise ValueError(f"corrupt sample {step}: unexpected end of shard-0007.tar")
    return torch.ones(4) * step


def loader_thread_dies(rank: int, world: int) -> None:
    """Each rank reads its batches in a loader thread; rank 1's loader raises on a corrupt
    sample (its process goes on), so rank 1's main thread waits forever on the loader's
    queue for batch 3 while ranks 0, 2, 3 wait in all_reduce #4."""
    import queue
    import threading

    batches: queue.Queue[torch.Tensor] = queue.Queue()

    def load() -> None:
        for step in range(8):
            batches.put(_read_sample(rank, step))

    threading.Thread(target=load, name="loader", daemon=True).start()
    for _ in range(8):
        dist.all_reduce(batches.get())  # rank 1 waits on the queue after batch 2
    hang()


def _save_shard(rank: int, step: int) -> None:
    """A checkpoint writer's save of this rank's shard: rank 2's disk is full."""
    if rank == 2:
        raise OSError(28, "No space left on device", f"/ckpt/step_{step}/shard_{rank}.pt")


def checkpoint_thread_dies(rank: int, world: int) -> None:
    """A 2x2 mesh (dp, tp) that saves a checkpoint in a writer thread after step 1 while
    it trains on: rank 2's writer dies of a full disk (OSError), the training itself is
    unaffected and the job ends well (every rank dumps at the end)."""
    import threading

    mesh = _mesh((2, 2), ("dp", "tp"))
    t = torch.ones(4)
    writer = None
    for step in range(4):
        dist.all_reduce(t, group=mesh.get_group("tp"))
        dist.all_reduce(t, group=mesh.get_group("dp"))
        if step == 1:
            writer = threading.Thread(target=_save_shard, args=(rank, step),
                                      name="ckpt-writer", daemon=True)
            writer.start()
    if writer is not None:
        writer.join()  # the job waits for its last save before it ends
    dist.barrier()
    finish()


def crash_beside_rewritten_dump(rank: int, world: int) -> None:
    """Rank 1 raises at step 3 (a bad batch), the others are stopped by the launcher and
    dump on their way down; afterwards rank 3's file is rewritten by a foreign tool
    (:func:`_records_as_text`), so it still reads but none of its records does."""
    t = torch.ones(4)
    for step in range(4):
        if rank == 1 and step == 3:
            raise RuntimeError("bad batch: label 7 out of range at step 3")
        dist.all_reduce(t)
    hang()


def _records_as_text(out: Path, rank: int = 3) -> None:
    """The real event: a log-collection step that gathered the job's dumps into a table
    (every number of a record becomes a numpy integer there) and wrote each file back in
    place as JSON with ``json.dumps(..., default=str)``, which turns those numbers into
    text. The file keeps its name and shape and still reads, but no record of it has a
    usable sequence number, group id or record id."""
    import pickle

    path = out / "ours" / f"rank_{rank}"
    with open(path, "rb") as fh:
        data = pickle.load(fh)  # the generator's own file
    data["entries"] = [
        {k: str(v) if isinstance(v, int) and not isinstance(v, bool) else v
         for k, v in e.items()}
        for e in data["entries"]]
    path.write_text(json.dumps(data, default=str))


SCENARIOS: dict[str, Scenario] = {s.name: s for s in [
    Scenario("healthy", 3, healthy, Expect("healthy", "healthy"), Expect("healthy", "healthy")),
    Scenario("mesh2d_healthy", 4, mesh2d_healthy, Expect("healthy", "healthy"),
             Expect("healthy", "healthy")),
    Scenario("pipeline_healthy", 4, pipeline_healthy, Expect("healthy", "healthy")),
    Scenario("pipeline_1f1b_healthy", 4, pipeline_1f1b_healthy, Expect("healthy", "healthy")),
    Scenario("p2p_ring_healthy", 3, p2p_ring_healthy, Expect("healthy", "healthy")),
    Scenario("straggler", 3, straggler, Expect("healthy", "straggler", [2]), timing=True),
    # ---- stragglers with ordinary jitter (issue 33 item 1)
    Scenario("straggler_data_loader", 4, straggler_data_loader,
             Expect("healthy", "straggler", [2], says=["Rank 2 arrived last"]),
             timing=True),
    Scenario("straggler_compute_heavy", 4, straggler_compute_heavy,
             Expect("healthy", "straggler", [1], says=["Rank 1 arrived last"]),
             timing=True),
    Scenario("healthy_unwaited_async", 4, healthy_unwaited_async,
             Expect("healthy", "healthy"), Expect("healthy", "healthy")),
    Scenario("healthy_jitter", 4, healthy_jitter, Expect("healthy", "healthy"),
             timing=True),
    Scenario("healthy_uneven_work", 4, healthy_uneven_work, Expect("healthy", "healthy"),
             timing=True),
    Scenario("missing_rank", 3, missing_rank,
             Expect("hang", "missing_rank", [2], waiting=[0, 1], says=["in hang"]),
             Expect("hang", "missing_rank", [2], waiting=[0, 1])),
    Scenario("missing_two_ranks", 4, missing_two_ranks,
             Expect("hang", "missing_rank", [1, 3], waiting=[0, 2],
                    says=["Ranks 1, 3 never joined"]),
             Expect("hang", "missing_rank", [1, 3], waiting=[0, 2])),
    Scenario("stall_in_data_loader", 4, stall_in_data_loader,
             Expect("hang", "missing_rank", [3], waiting=[0, 1, 2],
                    says=["alive and in no collective", "load_batch", "time.sleep"]),
             Expect("hang", "missing_rank", [3], waiting=[0, 1, 2])),
    Scenario("stall_in_checkpoint", 3, stall_in_checkpoint,
             Expect("hang", "missing_rank", [0], waiting=[1, 2],
                    says=["write_checkpoint"]),
             Expect("hang", "missing_rank", [0], waiting=[1, 2])),
    Scenario("chain_through_subgroup", 3, chain_through_subgroup,
             Expect("hang", "missing_rank", [2], waiting=[0, 1], says=["load_batch"])),
    Scenario("size_mismatch_abort", 4, size_mismatch_abort,
             Expect("hang", "size_mismatch", [1])),
    Scenario("size_mismatch_kills_peer", 3, size_mismatch_kills_peer,
             Expect("crash", "size_mismatch", [1], blamed=[1], victims=[0, 2])),
    Scenario("dtype_mismatch", 3, dtype_mismatch, Expect("desync", "dtype_mismatch", [1]),
             Expect("desync", "dtype_mismatch", [1])),
    Scenario("op_mismatch", 3, op_mismatch, Expect("hang", "op_mismatch", [1]),
             Expect("hang", "op_mismatch", [1])),
    Scenario("order_mismatch", 3, order_mismatch, Expect("hang", "order_mismatch", [1]),
             Expect("hang", "order_mismatch", [1])),
    Scenario("cross_group_order", 4, cross_group_order,
             Expect("hang", "cross_group_deadlock", [1], waiting=[0, 2, 3],
                    says=["out of order"]),
             Expect("hang", "cross_group_deadlock", [1], waiting=[0, 2, 3])),
    Scenario("cross_group_cycle", 3, cross_group_cycle,
             Expect("hang", "cross_group_deadlock", [0, 1, 2]),
             Expect("hang", "cross_group_deadlock", [0, 1, 2])),
    Scenario("wrapped_ring_missing", 3, wrapped_ring_missing,
             Expect("hang", "missing_rank", [2], waiting=[0, 1],
                    also=[("truncated_history", [0, 1])]),
             buffer_size=8),
    Scenario("mesh2d_tp_missing", 4, mesh2d_tp_missing,
             Expect("hang", "missing_rank", [2], waiting=[3]),
             Expect("hang", "missing_rank", [2], waiting=[3])),
    Scenario("mesh3d_missing", 8, mesh3d_missing,
             Expect("hang", "missing_rank", [6], waiting=[4])),
    Scenario("hsdp_flatten_missing", 4, hsdp_flatten_missing,
             Expect("hang", "missing_rank", [0], waiting=[1, 2, 3])),
    Scenario("mesh3d_crash_raise", 8, mesh3d_crash_raise,
             Expect("crash", "crashed_rank", [5], says=["ValueError", "loss is NaN"])),
    Scenario("crash_raise", 3, crash_raise,
             Expect("crash", "crashed_rank", [1], waiting=[0, 2],
                    says=["RuntimeError", "bad batch"])),
    Scenario("crash_os_exit", 3, crash_os_exit,
             Expect("crash", "crashed_rank", [1], says=["left no dump"])),
    Scenario("crash_sigkill", 4, crash_sigkill,
             Expect("crash", "crashed_rank", [2], waiting=[0, 1, 3], seq=4,
                    says=["left no dump"])),
    Scenario("crash_last_rank", 3, crash_last_rank,
             Expect("crash", "crashed_rank", [2], says=["left no dump"])),
    Scenario("crash_in_pipeline", 4, crash_in_pipeline,
             Expect("crash", "crashed_rank", [2], says=["illegal memory access"])),
    Scenario("pipeline_skip_recv", 4, pipeline_skip_recv,
             Expect("hang", "p2p_unmatched", [2], waiting=[1], says=["never posted"])),
    Scenario("pipeline_skip_recv_then_sync", 4, pipeline_skip_recv_then_sync,
             Expect("hang", "p2p_unmatched", [2], waiting=[0, 1, 3], says=["never posted"])),
    Scenario("pipeline_drop_send", 4, pipeline_drop_send,
             Expect("hang", "p2p_unmatched", [1], waiting=[2, 3], says=["never posted"])),
    Scenario("pipeline_stage_stall", 4, pipeline_stage_stall,
             Expect("hang", "p2p_unmatched", [2], waiting=[0, 1, 3],
                    says=["alive and in no collective", "load_batch"])),
    Scenario("pipeline_1f1b_drop_grad", 4, pipeline_1f1b_drop_grad,
             Expect("hang", "p2p_unmatched", [3], waiting=[2], says=["never posted"])),
    Scenario("p2p_deadlock_recv", 2, p2p_deadlock_recv,
             Expect("hang", "p2p_deadlock", [0, 1])),
    Scenario("p2p_deadlock_send", 2, p2p_deadlock_send,
             Expect("hang", "p2p_deadlock", [0, 1])),
    Scenario("p2p_ring_deadlock", 4, p2p_ring_deadlock,
             Expect("hang", "p2p_deadlock", [0, 1, 2, 3])),
    Scenario("p2p_size_mismatch", 2, p2p_size_mismatch,
             Expect("desync", "size_mismatch", [0, 1])),
    Scenario("p2p_unmatched_send", 3, p2p_unmatched_send,
             Expect("hang", "p2p_unmatched", [1], waiting=[0], says=["never posted"])),
    Scenario("two_faults", 4, two_faults,
             Expect("hang", "missing_rank", [1], blamed=[1, 3], waiting=[0],
                    also=[("missing_rank", [3])])),
    # ---- in the field (issue 26)
    Scenario("skip_new_group", 4, skip_new_group,
             Expect("hang", "missing_rank", [3], waiting=[0, 1, 2], group="experts",
                    says=["never created", "skip_new_group"]),
             Expect("hang", "missing_rank", [0, 1, 2], waiting=[3],
                    says=["creating a process group"])),
    Scenario("skip_new_group_local", 4, skip_new_group_local,
             Expect("hang", "missing_rank", [3], waiting=[0, 1, 2], group="tail",
                    says=["never created"])),
    Scenario("skip_mesh", 4, skip_mesh,
             Expect("hang", "missing_rank", [0], waiting=[1, 2, 3], says=["never created"])),
    Scenario("skip_init", 4, skip_init,
             Expect("hang", "missing_rank", [3], waiting=[0, 1, 2], group="default_pg",
                    says=["init_process_group", "left no dump"]),
             no_dump=[3]),
    Scenario("restarted_job", 4, restarted_job,
             Expect("hang", "missing_rank", [2], waiting=[0, 1, 3], seq=6, ignored=4),
             Expect("hang", "missing_rank", [2], waiting=[0, 1, 3], seq=6, ignored=4),
             before=[(8, _earlier_attempt)]),
    Scenario("restarted_job_killed_rank", 4, restarted_job_killed_rank,
             Expect("crash", "crashed_rank", [3], waiting=[0, 1, 2], seq=4, ignored=1,
                    says=["left no dump"]),
             Expect("crash", "crashed_rank", [3], waiting=[0, 1, 2], seq=4, ignored=1),
             before=[(4, _earlier_attempt_same_size)]),
    Scenario("dtype_mismatch_kills_peer", 3, dtype_mismatch_kills_peer,
             Expect("crash", "size_mismatch", [1], blamed=[1], victims=[0, 2],
                    says=["victims"])),
    Scenario("fsdp2_stall", 4, fsdp2_stall,
             Expect("hang", "missing_rank", [2], waiting=[0, 1, 3],
                    says=["load_batch", "in fsdp2_stall"],
                    never_says=["distributed_c10d.py", "_ops.py"]),
             timeout_s=3.0),
    Scenario("loader_thread_deadlock", 4, loader_thread_deadlock,
             Expect("hang", "missing_rank", [3], waiting=[0, 1, 2],
                    says=["batches.get()", "thread loader", "lock.acquire()"])),
    Scenario("healthy_dump_at_end", 3, healthy_dump_at_end, Expect("healthy", "healthy"),
             Expect("healthy", "healthy")),
    # issue 37 item 3: a finished collective whose native record is not yet retired
    Scenario("healthy_native_dump_at_exit", 4, healthy_native_dump_at_exit,
             Expect("healthy", "healthy"),
             Expect("healthy", "stalled_collective", says=["caught it finishing: not a hang"])),
    Scenario("pipeline_skip_recv_send_cycle", 2, pipeline_skip_recv_send_cycle,
             Expect("hang", "p2p_unmatched", [1], waiting=[0], says=["recv fewer"])),
    Scenario("mesh2d_stall_one_rank", 4, mesh2d_stall_one_rank,
             Expect("hang", "missing_rank", [2], waiting=[0, 3], says=["load_batch"])),
    Scenario("sigterm_handler_after_timeout", 4, sigterm_handler_after_timeout,
             Expect("hang", "missing_rank", [3], waiting=[0, 1, 2], says=["load_batch"]),
             signals=[(4.0, signal.SIGTERM, None)]),
    Scenario("usr2_handler_collective", 4, usr2_handler_collective,
             Expect("hang", "missing_rank", [3], waiting=[0, 1, 2],
                    says=["load_batch", "SIGUSR2"]),
             timeout_s=2.0, signals=[(1.0, signal.SIGUSR2, [3])]),
    Scenario("crash_and_stall", 4, crash_and_stall,
             Expect("crash", "crashed_rank", [0], blamed=[0, 3], says=["checkpoint shard"],
                    also=[("missing_rank", [3])])),
    # ---- what must agree (issue 32 item 2)
    Scenario("broadcast_wrong_root", 4, broadcast_wrong_root,
             Expect("hang", "root_mismatch", [1], says=["root 1", "root 0"])),
    Scenario("broadcast_object_wrong_src", 4, broadcast_object_wrong_src,
             Expect("hang", "root_mismatch", [3], says=["root 3", "root 0"])),
    Scenario("reduce_op_mismatch", 3, reduce_op_mismatch,
             Expect("desync", "reduce_op_mismatch", [1], says=["MAX", "SUM"]), live=False),
    Scenario("reduce_op_mismatch_mesh", 8, reduce_op_mismatch_mesh,
             # two ranks per dp group: no majority, both sides named (a tie)
             Expect("desync", "reduce_op_mismatch", [2, 6], group="mesh_dp",
                    says=["MAX", "SUM", "no side has a majority"]), live=False),
    Scenario("a2a_stale_splits", 4, a2a_stale_splits,
             Expect("hang", "split_mismatch", [2], says=["split sizes", "for itself"],
                    live_kind="crashed_rank")),
    Scenario("a2a_splits_ep_mesh", 8, a2a_splits_ep_mesh,
             Expect("hang", "split_mismatch", [5], group="mesh_ep",
                    says=["split sizes", "rank 5 sends rank 4 2 row(s)"],
                    live_kind="crashed_rank")),
    Scenario("a2a_splits_kill_receiver", 4, a2a_splits_kill_receiver,
             Expect("crash", "split_mismatch", [2], victims=[0],
                    says=["rank 2 sends rank 3 0 row(s), rank 3 expects 1"]),
             # torchrun stops the survivors at once: their last published records (0.2 s
             # apart) predate the call, so a watcher sees only rank 0 die; the dumps decide
             live=False),
    # ---- issue 37 item 3: the receivers gloo aborts leave no splits, the survivors
    # stop in different collectives
    Scenario("a2a_splits_kill_receiver_sync", 4, a2a_splits_kill_receiver_sync,
             Expect("crash", "split_mismatch", [2], victims=[0], seq=3,
                    says=["rank 2 sends rank 0, which gloo aborted, 2 row(s)"]),
             live=False),  # as a2a_splits_kill_receiver: the records predate the call
    Scenario("a2a_splits_kill_two_receivers", 6, a2a_splits_kill_two_receivers,
             # rank 5 may be stopped by torchrun before its message comes: not asserted
             Expect("crash", "split_mismatch", [2], seq=5,
                    says=["rank 2 sends rank 0, which gloo aborted, 2 row(s)"]),
             live=False),
    # ---- on-demand dumps of running jobs (issue 32 item 3)
    Scenario("on_demand_request_running", 4, on_demand_request_running,
             Expect("healthy", "healthy", caught=1,
                    says=["request from commscope dump", "caught mid-collective"]),
             timeout_s=30.0),
    Scenario("on_demand_sigusr1_running", 3, on_demand_sigusr1_running,
             Expect("healthy", "healthy", caught=1,
                    says=["signal SIGUSR1", "caught mid-collective"]),
             timeout_s=30.0, signals=[(2.5, signal.SIGUSR1, None)]),
    Scenario("on_demand_request_stuck", 4, on_demand_request_stuck,
             Expect("hang", "missing_rank", [3], waiting=[0, 1, 2], seq=3,
                    says=["load_batch"]),
             timeout_s=60.0),
    # torch.compile (issue 32 item 6): the user's compiled line, never torch's generated code
    Scenario("compiled_step_stall", 4, compiled_step_stall,
             Expect("hang", "missing_rank", [2], waiting=[0, 1, 3], seq=3,
                    says=["load_batch", _at(_compiled_step, "dist.all_reduce(")],
                    never_says=["_ops.py", "eval_frame.py", "output_code.py", "aot_autograd",
                                "eval_with_key", " in call.", " in call ("]),
             Expect("hang", "missing_rank", [2], waiting=[0, 1, 3], seq=3,
                    says=[_at(_compiled_step, "dist.all_reduce(")]),
             timeout_s=5.0),
    Scenario("compiled_graph_break_missing", 4, compiled_graph_break_missing,
             Expect("hang", "missing_rank", [3], waiting=[2], group="mesh_tp", seq=4,
                    says=["in hang", _at(_tp_block, "funcol.all_reduce(")],
                    never_says=["_ops.py", "eval_frame.py", "output_code.py", "aot_autograd",
                                "torch_dynamo_resume", "_functional_collectives.py",
                                " in call.", " in call ("]),
             timeout_s=5.0),
    # ---- the rank gloo kills can be the culprit (issue 32 item 1)
    Scenario("small_buffer_killed", 4, small_buffer_killed,
             Expect("crash", "size_mismatch", [3], victims=[], says=["agree"])),
    Scenario("small_buffer_killed_tp", 8, small_buffer_killed_tp,
             Expect("crash", "size_mismatch", [5], victims=[], group="mesh_tp",
                    says=["agree"], live_kind="crashed_rank")),
    # ---- one root cause, one finding (issue 32 item 5)
    Scenario("skip_then_size_abort", 4, skip_then_size_abort,
             Expect("hang", "missing_rank", [1], waiting=[0, 2, 3], says=["skipped"])),
    # issue 37 item 3: a skip's consequence is no second fault of an innocent rank
    Scenario("skip_tp_broadcast_tie", 4, skip_tp_broadcast_tie,
             Expect("hang", "missing_rank", [3], waiting=[0, 1, 2], group="mesh_tp", seq=3,
                    says=["skipped broadcast", "in their own mesh_tp group"]),
             Expect("hang", "missing_rank", [3], waiting=[0, 1, 2], group="mesh_tp", seq=3)),
    Scenario("skip_own_desc_pairs", 8, skip_own_desc_pairs,
             Expect("hang", "missing_rank", [5], waiting=[0, 1, 2, 3, 4, 6, 7],
                    group="stage_2", seq=2, says=["issued their own all_reduce #2"]),
             Expect("hang", "missing_rank", [5], waiting=[0, 1, 2, 3, 4, 6, 7],
                    group="stage_2", seq=2)),
    Scenario("skip_tp_then_broadcast_root", 4, skip_tp_then_broadcast_root,
             # alike steps: its later tp calls pair with its peer's one step behind, so
             # the skip shows at the last one, #3
             Expect("hang", "missing_rank", [2], waiting=[0, 1, 3], group="mesh_tp", seq=3)),
    Scenario("skip_then_size_abort_tp", 4, skip_then_size_abort_tp,
             Expect("crash", "size_mismatch", [3], waiting=[0, 1], victims=[2],
                    group="mesh_tp", seq=3, says=["in a call other than the one rank 3"])),
    # ---- pipelines and threads (issue 32 items 7, 9)
    Scenario("pipeline_gpipe_skip_recv", 4, pipeline_gpipe_skip_recv,
             Expect("hang", "p2p_unmatched", [2], waiting=[0, 1, 3],
                    says=["rank 2 posted 7 recvs from rank 1, 1 recv fewer",
                          "skipped that op"])),
    Scenario("pipeline_gpipe_drop_microbatch", 4, pipeline_gpipe_drop_microbatch,
             Expect("hang", "p2p_unmatched", [2], waiting=[0, 1, 3],
                    says=["rank 2 posted 3 sends to rank 3, 1 send fewer"])),
    Scenario("pipeline_dp2_skip_send", 8, pipeline_dp2_skip_send,
             Expect("hang", "p2p_unmatched", [5], waiting=[0, 1, 2, 3, 4, 6, 7],
                    group="pp_1", says=["rank 5 posted 7 sends to rank 6, 1 send fewer"])),
    # issue 37 item 3: 1F1B (forward and backward interleave: no short period)
    Scenario("pipeline_1f1b_skip_warmup_recv", 4, pipeline_1f1b_skip_warmup_recv,
             Expect("hang", "p2p_unmatched", [1], waiting=[0, 2, 3],
                    says=["rank 1 posted 15 recvs from rank 0, 1 recv fewer"]),
             # a progress record keeps a rank's newest 12 send/recv records, fewer than
             # the steps (32) the skip is seen against: commscope watch sees a deadlock
             live=False),
    Scenario("pipeline_1f1b_skip_last_recv", 4, pipeline_1f1b_skip_last_recv,
             Expect("hang", "p2p_unmatched", [2], waiting=[0, 1, 3],
                    says=["rank 2 posted 15 recvs from rank 1, 1 recv fewer"])),
    Scenario("pipeline_1f1b_skip_first_step_recv", 4, pipeline_1f1b_skip_first_step_recv,
             Expect("hang", "p2p_unmatched", [1], waiting=[0, 2, 3],
                    says=["rank 1 posted 7 recvs from rank 0, 1 recv fewer"]),
             live=False),
    Scenario("loader_thread_dies", 4, loader_thread_dies,
             Expect("hang", "missing_rank", [1], waiting=[0, 2, 3],
                    says=["thread loader died", "ValueError", "corrupt sample 3",
                          "batches.get()"],
                    threads_died=[(1, "loader")]),
             Expect("hang", "missing_rank", [1], waiting=[0, 2, 3])),
    Scenario("checkpoint_thread_dies", 4, checkpoint_thread_dies,
             Expect("healthy", "thread_died",
                    says=["Rank 2's thread ckpt-writer died of OSError", "No space left",
                          _at(_save_shard, "raise OSError("), "the process went on"],
                    threads_died=[(2, "ckpt-writer")]),
             Expect("healthy", "healthy")),
    Scenario("crash_beside_rewritten_dump", 4, crash_beside_rewritten_dump,
             Expect("crash", "crashed_rank", [1], waiting=[0, 2],
                    says=["RuntimeError", "bad batch"], unusable=[3]),
             damage=_records_as_text),
    # ---- silent desyncs (issue 33 item 3): the running fingerprints
    Scenario("desync_running_dumped", 4, desync_running_dumped,
             Expect("desync", "dtype_mismatch", [1], seq=6, says=["Int", "Float"]),
             # its records are read while ranks are mid-step, a moment the test's fixed
             # clock cannot age (the live path: silent_* and tests/dist/test_watch_running)
             timeout_s=30.0, live=False),
    Scenario("silent_dtype_desync", 4, silent_dtype_desync,
             Expect("desync", "dtype_mismatch", [2], says=["Int", "Float"])),
    Scenario("silent_shape_desync", 4, silent_shape_desync,
             Expect("desync", "size_mismatch", [1], group="mesh_tp", seq=3,
                    says=["[32, 8]", "[8, 32]"])),
    Scenario("silent_desync_rolled_out", 3, silent_desync_rolled_out,
             Expect("desync", "fingerprint_mismatch", [1],
                    says=["at or before", "fingerprints"]),
             buffer_size=32),
    Scenario("desync_then_hang", 4, desync_then_hang,
             Expect("hang", "missing_rank", [3], waiting=[0, 1, 2],
                    also=[("dtype_mismatch", [3])])),
]}


# --------------------------------------------------------------------------- the launcher


def _native_bytes() -> bytes:
    return bytes(torch._C._distributed_c10d._dump_fr_trace())


def _also_native(native_dir: Path, rank: int) -> None:
    """Every commscope dump of this rank also writes PyTorch's native dump."""
    dump_module = sys.modules["commscope.flight.out.dump"]
    original = dump_module.Dumper.dump
    written: list[str] = []

    def dump(self: Any, reason: str, *args: Any, **kwargs: Any) -> str:
        path = original(self, reason, *args, **kwargs)
        if LATER_DIR in str(path) and written:
            return path  # a later dump set beside the incident's: the native one stays
        # (a signal that cut the first mirror short mirrors its own dump instead: the
        # native recorder's state on the rank's way down)
        try:
            write_atomic(str(native_dir / f"rank_{rank}"), _native_bytes())
            written.append(path)
        except Exception as exc:  # the native recorder is a bonus, never the point
            print(f"rank {rank}: native dump failed: {exc!r}", file=sys.stderr)
        return path

    dump_module.Dumper.dump = dump  # type: ignore[method-assign]


def _rank_main(sc: Scenario, rank: int, out: Path, store_path: str, world: int,
               run: Callable[..., None]) -> None:
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world),
                       "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world),
                       "OMP_NUM_THREADS": "1", "TORCH_FR_BUFFER_SIZE": str(sc.buffer_size),
                       "TORCH_FR_CPP_STACK": "0"})
    torch.set_num_threads(1)
    try:
        flight.enable(dump_prefix=str(out / "ours" / "rank_"),
                      timeout_s=sc.timeout_s or TIMEOUT_S, poll_interval_s=0.2,
                      buffer_size=sc.buffer_size, timing=sc.timing, watch_interval_s=0.2)
        _also_native(out / "native", rank)
        if run in _NO_INIT:  # the scenario makes (or skips) the default group itself
            run(rank, world, store_path)
        else:
            store = dist.FileStore(store_path, world)
            dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                                    timeout=timedelta(seconds=30))
            run(rank, world)
    except BaseException:
        sys.excepthook(*sys.exc_info())  # what the interpreter does with an uncaught one
        sys.stderr.flush()
        os._exit(1)
    os._exit(0)


def _capture_live(store_path: str, world: int, out: Path, alive: set[int]) -> None:
    """Save every rank's newest progress record (what ``commscope watch`` reads from the
    job's store) as ``live/record_<N>.json``, its group config as ``live/config_<N>.json``,
    and which ranks were alive then as ``live/alive.json`` (a watcher sees the others'
    records stop changing)."""
    from commscope.flight.out import progress

    try:
        store = dist.FileStore(store_path, world + 1)
    except Exception:
        return
    (out / "live").mkdir(exist_ok=True)
    (out / "live" / "alive.json").write_text(json.dumps(sorted(alive)) + "\n")
    tid = progress.token_id("")
    for r in range(world):
        for key, name in ((progress.rank_key(tid, r), f"record_{r}.json"),
                          (progress.config_key(tid, r), f"config_{r}.json")):
            try:
                if store.check([key]):
                    (out / "live" / name).write_bytes(bytes(store.get(key)))
            except Exception:
                continue


def launch(sc: Scenario, out: Path, scratch: Path, world: int | None = None,
           run: Callable[..., None] | None = None, live: bool = True) -> dict[int, int | None]:
    """Run one scenario (or one earlier attempt of it: ``world``, ``run``) as torchrun
    would; return each rank's exit code."""
    import multiprocessing as mp

    world = sc.world if world is None else world
    run = sc.run if run is None else run
    for sub in ("ours", "native"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    scratch.mkdir(parents=True, exist_ok=True)
    store_path = str(scratch / f"store-{sc.name}-{time.monotonic_ns()}")
    ctx = mp.get_context("fork")
    procs = {r: ctx.Process(target=_rank_main, args=(sc, r, out, store_path, world, run),
                            daemon=True)
             for r in range(world)}
    started = time.monotonic()
    wall_start = time.time()
    pending_signals = list(sc.signals) if run is sc.run else []
    ends_by_sigterm = any(sig == signal.SIGTERM for _, sig, _ in pending_signals)
    for p in procs.values():
        p.start()
    deadline = time.monotonic() + JOB_LIMIT_S
    term_at: float | None = None
    seen, last_new = 0, time.monotonic()
    try:
        while time.monotonic() < deadline:
            alive = {r for r, p in procs.items() if p.is_alive()}
            if not alive:
                break
            failed = [r for r, p in procs.items() if p.exitcode not in (None, 0)]
            user_term = False
            for item in list(pending_signals):
                after, signum, ranks = item
                if time.monotonic() - started < after:
                    continue
                pending_signals.remove(item)
                if signum == signal.SIGTERM:
                    user_term = True
                    continue
                for r in (ranks if ranks is not None else sorted(alive)):
                    if r in alive:
                        os.kill(procs[r].pid, signum)
            if (failed or user_term) and term_at is None:  # torchrun: stop the rest
                term_at = time.monotonic()
                if live:
                    _capture_live(store_path, world, out, alive)
                for r in alive:
                    os.kill(procs[r].pid, signal.SIGTERM)
            if term_at is not None and time.monotonic() - term_at > TERM_GRACE_S:
                break
            fresh = {p for p in out.glob("*/rank_*") if p.stat().st_mtime >= wall_start}
            files = len(fresh)  # this attempt's (an earlier one's files may lie there)
            if files != seen:
                seen, last_new = files, time.monotonic()
            waited = alive - set(sc.no_dump)
            dumped = all(out / sub / f"rank_{r}" in fresh for r in waited
                         for sub in ("ours", "native"))
            if time.monotonic() - last_new > NATIVE_WAIT_S:
                dumped = all(out / "ours" / f"rank_{r}" in fresh for r in waited)
            if (term_at is None and not ends_by_sigterm and files and dumped
                    and time.monotonic() - last_new > SETTLE_S):
                if live:
                    _capture_live(store_path, world, out, alive)
                break  # a hung job, every live rank dumped: end it
            time.sleep(0.05)
    finally:
        # Freeze every rank before killing any: a rank that saw a peer's sockets close
        # would otherwise dump again ("Connection closed by peer") on its way out.
        alive = [p for p in procs.values() if p.is_alive()]
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for p in alive:
                try:
                    os.kill(p.pid, sig)
                except ProcessLookupError:
                    pass
        for p in procs.values():
            p.join(5)
    for d in ("ours", "native"):
        for tmp in (out / d).glob(".*.tmp"):
            tmp.unlink()
        for pattern in (".*.fatal", ".commscope-fatal-*.log"):
            for empty in (out / d).glob(pattern):
                if empty.stat().st_size == 0:
                    empty.unlink()  # armed, never written (the rank did not die in C)
    return {r: p.exitcode for r, p in procs.items()}


def generate(name: str, scratch: Path, out: Path | None = None) -> Path:
    """Run scenario ``name`` and write its folder (dumps and ``scenario.json``)."""
    sc = SCENARIOS[name]
    out = DATA / name if out is None else Path(out)
    if out.exists():
        shutil.rmtree(out)
    for world, run in sc.before:  # earlier attempts leave their files in the same folder
        launch(sc, out, scratch, world, run, live=False)
        time.sleep(1.0)  # the next attempt starts later, as a restart does
    codes = launch(sc, out, scratch, live=sc.live)
    for tmp in out.rglob(".commscope-*.tmp"):
        tmp.unlink()  # a dump cut short when the job was killed: no dump, never kept
    if sc.damage is not None:
        sc.damage(out)
    if not any((out / "native").iterdir()):
        (out / "native").rmdir()
    meta = {
        "name": sc.name,
        "world_size": sc.world,
        "story": (sc.run.__doc__ or "").strip() or None,
        "exit_codes": {str(r): c for r, c in codes.items()},
        "expect": asdict(sc.expect),
        "native_expect": asdict(sc.native) if sc.native else None,
        "damage": ((sc.damage.__doc__ or "").strip() or None) if sc.damage else None,
        "made_by": "tests/data/make_scenarios.py",
        "torch": torch.__version__,
    }
    (out / "scenario.json").write_text(json.dumps(meta, indent=1) + "\n")
    return out


def main(argv: list[str]) -> int:
    if argv[:1] == ["--list"]:
        for sc in SCENARIOS.values():
            print(f"{sc.name:32} {sc.world} ranks  {sc.expect.verdict:8} {sc.expect.kind}")
        return 0
    names = argv or list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        print(f"unknown scenario(s) {unknown}; known: {', '.join(SCENARIOS)}", file=sys.stderr)
        return 2
    scratch = Path(os.environ.get("TMPDIR", "/tmp")) / f"commscope-scenarios-{os.getpid()}"
    try:
        for name in names:
            start = time.monotonic()
            out = generate(name, scratch)
            files = sorted(str(p.relative_to(out)) for p in out.rglob("rank_*"))
            print(f"{name}: {files} in {time.monotonic() - start:.1f}s", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
