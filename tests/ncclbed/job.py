"""Launch one job on the bed: forked hosts, each with its device, until the dumps are in.

:func:`run_job` is a small stand-in for ``torchrun`` plus the collector that gathers a
hung job's flight-recorder dumps:

1. fork ``world`` hosts from this process (torch is imported once, here); each makes its
   own process group (its device joins it), starts its device (:func:`.backend.start`),
   joins the job with ``init_process_group("fakenccl")`` over a ``FileStore`` and runs
   ``fn(rank, world)``. When ``fn`` returns, the host syncs its device, as a script's
   last ``.item()`` does; when it raises (a sticky CUDA error at a sync, say), the host
   tells its device, which raises the job's dump signal, as a fault-tolerance wrapper
   (NVRx's in-process restart) collects every rank's trace when one rank fails (unless
   ``dump_on_error`` is off: then only a watchdog's timeout does). Either way the host
   then stays (its device must live to dump) and notes how it ended.
2. watch: once any device raised the dump signal (its watchdog saw a timeout, its host
   failed, or ``fn`` asked for dumps), wait until every rank's dumps are written (or
   ``settle_s`` passed), then kill every process. A job that ends with no signal is
   killed once every host is done.
3. every process is killed and reaped before :func:`run_job` returns (the launcher is a
   child subreaper, so devices whose host died are reaped here too).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import tempfile
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from tests.ncclbed import backend
from tests.ncclbed.device import SIGNAL_KEY, VARIANTS, dump_path

__all__ = ["JobResult", "run_job"]

_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37


@dataclass
class JobResult:
    """How a bed job ended."""

    ended: dict[int, str] = field(default_factory=dict)
    """Rank → ``done`` or ``error: ...`` (ranks that never got there are absent)."""
    signal: str | None = None
    """Why the dump signal was raised (``None``: never)."""
    dumped: list[int] = field(default_factory=list)
    """Ranks whose every dump form was written."""
    elapsed_s: float = 0.0
    timed_out: bool = False


def _subreaper(on: bool) -> bool:
    """Make this process the subreaper of its descendants (``on``) or stop being one;
    returns whether it was one before. A host's device outlives a host that died: it is
    reparented here, not to init, and reaped with the job. The state is put back when
    the job ends: a test process that stayed a subreaper would inherit every orphan of
    later tests (simulated hosts' processes) and never reap them."""
    libc = ctypes.CDLL(None, use_errno=True)
    before = ctypes.c_int(0)
    try:
        libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(before), 0, 0, 0)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0)
    except (OSError, AttributeError):
        pass
    return bool(before.value)


def _host_main(rank: int, world: int, fn: Callable[[int, int], None], work: Path,
               dump_dir: Path, timeout_s: float, buffer_size: int, timing: bool,
               report: bool, record: bool) -> None:
    os.setpgid(0, 0)
    warnings.filterwarnings("ignore", category=FutureWarning)  # torch's renamed functions
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank % 8),
                      LOCAL_WORLD_SIZE=str(min(world, 8)), OMP_NUM_THREADS="1",
                      BED_TIMEOUT_S=str(timeout_s))
    backend.start(rank, world, str(work / "devices.store"), str(dump_dir),
                  timeout_s=timeout_s, buffer_size=buffer_size, timing=timing)
    if record:  # commscope's own recorder, as on a real NCCL job
        from commscope.flight import enable
        from commscope.flight.record.groups import DEVICE_BACKENDS_ENV

        os.environ[DEVICE_BACKENDS_ENV] = backend.BACKEND
        enable(dump_prefix=str(dump_dir / "ours" / "rank_"), buffer_size=buffer_size,
               poll_interval_s=0.1, watch_interval_s=0.2, timing=timing)
    status = "done"
    try:
        dist.init_process_group(backend.BACKEND, store=dist.FileStore(str(work / "hosts.store"),
                                                                       world),
                                rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout_s))
        fn(rank, world)
        backend.synchronize()
    except BaseException as exc:  # a rank's failure is data here
        status = f"error: {type(exc).__name__}: {exc}"
        traceback.print_exc()
        if report:
            try:
                backend.report_exception(status)
            except Exception:
                pass
    (work / f"ended_{rank}").write_text(status)
    while True:  # the device must live on to dump; the launcher ends us
        time.sleep(3600)


def run_job(fn: Callable[[int, int], None], world: int, dump_dir: Path, *,
            timeout_s: float = 5.0, buffer_size: int = 2000, timing: bool = False,
            limit_s: float = 180.0, settle_s: float = 20.0,
            dump_on_error: bool = True, record: bool = False,
            live: Callable[[Path], None] | None = None,
            observe: Callable[[Path, threading.Event], None] | None = None) -> JobResult:
    """Run ``fn(rank, world)`` on ``world`` bed ranks; dumps land in ``dump_dir`` (see
    module doc). ``dump_on_error=False``: a rank that raises does not raise the dump
    signal (it stays, as a wrapper that caught the error would); the dumps come from a
    watchdog's timeout (several faults can then all happen first). ``record``: commscope's
    recorder runs in every host too (its dumps in ``ours/``, its progress records in the
    hosts' store); ``live(store_path)`` is called once the job stopped, before any
    process is killed (to read what ``commscope watch`` would); ``observe(store_path,
    ended)`` runs in a thread of this process for as long as the job does (a watcher)."""
    was_subreaper = _subreaper(True)
    dump_dir.mkdir(parents=True, exist_ok=True)
    result = JobResult()
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ncclbed-") as tmp:
        work = Path(tmp)
        pids: dict[int, int] = {}
        sys.stdout.flush()
        sys.stderr.flush()
        for rank in range(world):
            pid = os.fork()
            if pid == 0:
                try:
                    _host_main(rank, world, fn, work, dump_dir, timeout_s, buffer_size,
                               timing, dump_on_error, record)
                finally:
                    os._exit(1)
            pids[rank] = pid
        store = dist.FileStore(str(work / "devices.store"), -1)
        signalled_at: float | None = None
        ended = threading.Event()
        watcher = None
        if observe is not None:
            watcher = threading.Thread(target=observe, args=(work / "hosts.store", ended),
                                       name="observer", daemon=True)
            watcher.start()
        try:
            while True:
                time.sleep(0.1)
                now = time.monotonic()
                result.ended = {r: (work / f"ended_{r}").read_text() for r in range(world)
                                if (work / f"ended_{r}").exists()}
                result.dumped = [r for r in range(world) if all(
                    os.path.exists(dump_path(str(dump_dir), v, r)) for v in VARIANTS)]
                if signalled_at is None and store.check([SIGNAL_KEY]):
                    signalled_at = now
                    result.signal = store.get(SIGNAL_KEY).decode()
                if signalled_at is not None:
                    if len(result.dumped) == world or now - signalled_at > settle_s:
                        time.sleep(0.3)
                        break
                elif len(result.ended) == world:
                    break
                if now - start > limit_s:
                    result.timed_out = True
                    break
        finally:
            ended.set()
            if watcher is not None:
                watcher.join(30)
            if live is not None:
                try:
                    live(work / "hosts.store")
                except Exception:
                    traceback.print_exc()
            for pid in pids.values():
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            _reap_all(list(pids.values()))
            _subreaper(was_subreaper)
    result.elapsed_s = time.monotonic() - start
    return result


def _reap_all(groups: list[int], grace_s: float = 10.0) -> None:
    """Reap every process of the job: the hosts and their devices, each host's process
    group (a device whose host died was reparented here, the subreaper), and no other
    child of this process."""
    deadline = time.monotonic() + grace_s
    todo = set(groups)
    while todo and time.monotonic() < deadline:
        for pgid in list(todo):
            try:
                pid, _ = os.waitpid(-pgid, os.WNOHANG)
            except ChildProcessError:
                todo.discard(pgid)  # nothing of that group is left
                continue
            if pid == 0:
                time.sleep(0.02)
