"""Run a function on N real gloo ranks, or pretend to be one rank of thousands.

``run_ranks(fn, world_size, tmp_path)`` forks ``world_size`` processes (fork start
method: ~0.2 s for four ranks where spawn costs ~12 s), joins them into one gloo job
through a ``FileStore`` under ``tmp_path`` (no ports), runs ``fn(rank, world_size,
*args)`` in each and returns what every rank returned, in rank order. A rank that
raises makes the parent raise :class:`RankFailure` with that rank's traceback; a job
that outlives ``timeout`` is killed and reported with the ranks that had not finished.
Every child is reaped before ``run_ranks`` returns.

``fake_world(rank, world_size)`` initialises torch's fake process group in this
process: collectives do nothing, and a rank of a 16 384-rank job can be simulated
for scale tests.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pickle
import signal
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

# Imported in the parent so that forked ranks inherit a warm torch (importing it in
# every child costs seconds on two cores).
import torch
import torch.distributed as dist

__all__ = ["RankFailure", "RankResult", "run_ranks", "fake_world"]

_REPORTED = "harness/reported"
_RELEASE = "harness/release"
_LEAVE_MAX_S = 120.0


class RankFailure(AssertionError):
    """A rank of a multi-rank test failed, crashed or timed out."""


@dataclass
class RankResult:
    """What one rank of :func:`run_ranks` ended with."""

    rank: int
    value: Any = None
    """The function's return value (must pickle)."""
    error: str | None = None
    """The child's formatted traceback when it raised."""
    exitcode: int | None = None
    """The process exit code; negative for a signal, ``None`` if it was still running."""
    timed_out: bool = False
    """True when the rank had not finished at the deadline and was killed."""
    extra: dict[str, Any] = field(default_factory=dict)


def _child(
    fn: Callable[..., Any],
    rank: int,
    world_size: int,
    args: Sequence[Any],
    store_path: str,
    backend: str,
    init: bool,
    env: dict[str, str],
    pg_timeout_s: float,
    conn: Any,
    exit_path: str,
) -> None:
    os.environ.update(env)
    os.environ.update(
        {
            "RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": env.get("LOCAL_WORLD_SIZE", str(world_size)),
            "OMP_NUM_THREADS": "1",
        }
    )
    code = 0
    try:
        torch.set_num_threads(1)
        if init:
            store = dist.FileStore(store_path, world_size)
            dist.init_process_group(
                backend,
                store=store,
                rank=rank,
                world_size=world_size,
                timeout=timedelta(seconds=pg_timeout_s),
            )
        value = fn(rank, world_size, *args)
        payload = ("ok", value)
    except BaseException:
        payload = ("error", traceback.format_exc())
        code = 1
    try:
        conn.send_bytes(pickle.dumps(payload))
    except Exception:
        conn.send_bytes(pickle.dumps(("error", traceback.format_exc())))
        code = 1
    conn.close()
    _leave_together(exit_path, world_size)
    # The process groups die with the process (the kernel closes their sockets). No
    # destroy_process_group: on torch 2.6 it can block for good in ~ProcessGroupGloo
    # (the main thread holds the GIL while gloo's worker threads wait for it). Skip
    # atexit handlers and pytest's inherited state too: the parent owns those.
    os._exit(code)


def _leave_together(exit_path: str, world_size: int) -> None:
    """Wait until every rank has reported, or the parent releases us (it gave up on the
    others), before leaving.

    A rank that leaves while a peer is still inside init or a collective with it closes
    their socket with unread bytes in it: the kernel resets the connection and the peer
    fails with "Connection reset by peer" (seen: a rank that raised at once made another
    fail in init_process_group). Bounded, in case the parent itself is gone.
    """
    try:
        store = dist.FileStore(exit_path, world_size + 1)
        store.add(_REPORTED, 1)
        deadline = time.monotonic() + _LEAVE_MAX_S
        while time.monotonic() < deadline:
            if store.add(_REPORTED, 0) >= world_size or store.check([_RELEASE]):
                return
            time.sleep(0.01)
    except Exception:
        return


def run_ranks(
    fn: Callable[..., Any],
    world_size: int,
    tmp_path: Path | str,
    *args: Any,
    backend: str = "gloo",
    timeout: float = 60.0,
    pg_timeout: float = 30.0,
    init: bool = True,
    env: dict[str, str] | None = None,
    check: bool = True,
    failure_grace: float = 3.0,
) -> list[Any] | list[RankResult]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` forked gloo ranks.

    Returns the ranks' return values in rank order. With ``check=False`` it returns a
    :class:`RankResult` per rank instead and never raises for a rank's failure, which is
    what tests of hangs and crashes want. ``init=False`` leaves process-group set-up to
    ``fn`` (the store path is then in ``os.environ["COMMSCOPE_TEST_STORE"]``).
    ``timeout`` bounds the whole job; ``pg_timeout`` is the process group's own timeout.
    Once a rank has raised, the others get ``failure_grace`` seconds before they are
    killed, so one failure does not turn into a long wait.
    """
    tmp = Path(tmp_path)
    tmp.mkdir(parents=True, exist_ok=True)
    store_path = str(tmp / f"store-{os.getpid()}-{time.monotonic_ns()}")
    exit_path = store_path + ".exit"
    exit_store = dist.FileStore(exit_path, world_size + 1)
    child_env = dict(env or {})
    child_env["COMMSCOPE_TEST_STORE"] = store_path
    ctx = mp.get_context("fork")
    procs: list[Any] = []
    conns: list[Any] = []
    for rank in range(world_size):
        parent_conn, child_conn = ctx.Pipe(duplex=False)
        proc = ctx.Process(
            target=_child,
            args=(fn, rank, world_size, args, store_path, backend, init, child_env,
                  pg_timeout, child_conn, exit_path),
            daemon=True,
        )
        proc.start()
        child_conn.close()
        procs.append(proc)
        conns.append(parent_conn)

    results = [RankResult(rank=r) for r in range(world_size)]
    deadline = time.monotonic() + timeout
    pending = set(range(world_size))
    try:
        while pending and time.monotonic() < deadline:
            for rank in sorted(pending):
                conn = conns[rank]
                if conn.poll(0):
                    try:
                        status, value = pickle.loads(conn.recv_bytes())
                    except EOFError:
                        status, value = "dead", None
                    if status == "ok":
                        results[rank].value = value
                    elif status == "error":
                        results[rank].error = value
                        # The others are likely stuck waiting for this rank: give them
                        # a moment to report their own error, then stop the job.
                        deadline = min(deadline, time.monotonic() + failure_grace)
                    pending.discard(rank)
                elif not procs[rank].is_alive():
                    # Died without a word (os._exit, a signal, a C++ abort).
                    if conn.poll(0):
                        continue
                    pending.discard(rank)
            if pending:
                time.sleep(0.005)
        for rank in pending:
            results[rank].timed_out = True
    finally:
        # The ranks that reported wait for the others before leaving; release them now
        # (the rest are killed: they are late or hung).
        with contextlib.suppress(Exception):
            exit_store.set(_RELEASE, "1")
        for rank, proc in enumerate(procs):
            proc.join(timeout=0 if rank in pending else 30)
            if proc.is_alive():
                _kill(proc)
            results[rank].exitcode = proc.exitcode
            conns[rank].close()

    if not check:
        return results
    failures = [r for r in results if r.error or r.timed_out or r.exitcode not in (0, None)]
    if failures:
        raise RankFailure(_describe(failures, world_size, timeout))
    return [r.value for r in results]


def _kill(proc: Any) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGKILL)
    proc.join(timeout=5)


def _describe(failures: list[RankResult], world_size: int, timeout: float) -> str:
    lines = [f"{len(failures)} of {world_size} ranks failed:"]
    for r in failures:
        if r.error:
            lines.append(f"--- rank {r.rank} raised:\n{r.error.rstrip()}")
        elif r.timed_out:
            lines.append(f"--- rank {r.rank} did not finish within {timeout:.0f} s (killed)")
        else:
            lines.append(f"--- rank {r.rank} exited with code {r.exitcode} and no result")
    return "\n".join(lines)


@contextlib.contextmanager
def fake_world(rank: int, world_size: int) -> Iterator[None]:
    """Make this process rank ``rank`` of a ``world_size``-rank fake job.

    Collectives complete at once and move no data; group creation costs what torch's
    Python bookkeeping costs, which is what scale tests measure. The default group is
    destroyed on exit, so tests can use different sizes one after another.
    """
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()
