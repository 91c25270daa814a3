"""Fork local CPU ranks into one gloo job and talk to them while they run.

The ranks are forked from this process (torch is imported first, so they start in
milliseconds) and meet through a ``FileStore`` in a work folder: no network, no GPU.
Each rank may send messages to the parent while it runs (``send(kind, payload)``);
the parent reads them with :meth:`LocalJob.messages`, and can wait, kill, or collect
exit codes. Used by ``commscope demo``.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

__all__ = ["LocalJob", "Message", "RankContext"]

RANKS_PER_SIMULATED_HOST = 4


@dataclass(frozen=True, slots=True)
class Message:
    """One message from a rank."""

    rank: int
    kind: str
    payload: Any


@dataclass
class RankContext:
    """What a rank's function gets besides ``rank`` and ``world``."""

    rank: int
    world: int
    workdir: Path
    _conn: Any

    def send(self, kind: str, payload: Any = None) -> None:
        """Send a message to the parent (payload must pickle)."""
        self._conn.send_bytes(pickle.dumps((kind, payload)))


def _rank_main(
    fn: Callable[..., Any],
    setup: Callable[[int, int], None] | None,
    rank: int,
    world: int,
    workdir: Path,
    store_path: str,
    pg_timeout_s: float,
    args: tuple,
    conn: Any,
) -> None:
    os.environ.update(
        {
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(rank % RANKS_PER_SIMULATED_HOST),
            "LOCAL_WORLD_SIZE": str(min(world, RANKS_PER_SIMULATED_HOST)),
            "OMP_NUM_THREADS": "1",
        }
    )
    ctx = RankContext(rank, world, workdir, conn)
    code = 0
    # A rank reports through ``conn``; what torch itself prints on stdout (gloo's
    # "[Gloo] Rank N is connected to ... peer ranks" on some releases) is not the demo's.
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.close(null)
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        if setup is not None:
            setup(rank, world)
        dist.init_process_group(
            "gloo",
            store=dist.FileStore(store_path, world),
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=pg_timeout_s),
        )
        ctx.send("result", fn(ctx, *args))
    except BaseException:
        ctx.send("error", traceback.format_exc())
        code = 1
    conn.close()
    os._exit(code)


class LocalJob:
    """``world`` forked gloo ranks running ``fn(ctx, *args)``.

    ``setup(rank, world)`` runs in each rank before ``init_process_group`` (where the
    flight recorder must be enabled). Use as a context manager: leaving it kills any
    rank still running and removes the store file.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        world: int,
        workdir: Path,
        *args: Any,
        setup: Callable[[int, int], None] | None = None,
        pg_timeout_s: float = 60.0,
    ) -> None:
        import torch  # noqa: F401 - imported before fork so the ranks inherit it

        self.world = world
        self.workdir = workdir
        self._store = str(workdir / f".store-{os.getpid()}-{time.monotonic_ns()}")
        ctx = mp.get_context("fork")
        self._procs: list[Any] = []
        self._conns: list[Any] = []
        for rank in range(world):
            parent, child = ctx.Pipe(duplex=False)
            proc = ctx.Process(
                target=_rank_main,
                args=(fn, setup, rank, world, workdir, self._store, pg_timeout_s, args, child),
            )
            proc.start()
            child.close()
            self._procs.append(proc)
            self._conns.append(parent)
        self._open = set(range(world))

    def messages(self, timeout: float) -> Iterator[Message]:
        """Messages as they arrive, until every rank closed its pipe or ``timeout`` passes.

        A rank that dies without a word yields ``Message(rank, "died", exitcode)``.
        """
        deadline = time.monotonic() + timeout
        while self._open:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            ready = mp.connection.wait(
                [self._conns[r] for r in self._open], timeout=min(remaining, 0.2)
            )
            if not ready:
                yield Message(-1, "tick", None)
                continue
            for rank in sorted(self._open):
                conn = self._conns[rank]
                if conn not in ready:
                    continue
                try:
                    kind, payload = pickle.loads(conn.recv_bytes())
                except (EOFError, OSError):
                    self._open.discard(rank)
                    self._procs[rank].join(timeout=1)
                    code = self._procs[rank].exitcode
                    if code not in (0, 1):  # 0/1: it said goodbye through "result"/"error"
                        yield Message(rank, "died", code)
                    continue
                yield Message(rank, kind, payload)

    @property
    def store_path(self) -> str:
        """The job's FileStore (``commscope watch`` reads the ranks' records there)."""
        return self._store

    def alive(self) -> list[int]:
        """Ranks whose process is still running."""
        return [r for r, p in enumerate(self._procs) if p.is_alive()]

    def exitcodes(self) -> list[int | None]:
        """Each rank's exit code (``None`` while running, negative for a signal)."""
        return [p.exitcode for p in self._procs]

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to every rank still running, then reap them."""
        for proc in self._procs:
            if proc.is_alive():
                try:
                    os.kill(proc.pid, sig)
                except ProcessLookupError:
                    pass
        for proc in self._procs:
            proc.join(timeout=5)
            if proc.is_alive():
                os.kill(proc.pid, signal.SIGKILL)
                proc.join()

    def __enter__(self) -> LocalJob:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
        for conn in self._conns:
            conn.close()
        Path(self._store).unlink(missing_ok=True)
