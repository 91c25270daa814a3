"""Prove, on the torch that is installed, that recording and tracing really work.

The flight recorder and ``CommDebugMode`` reach into ``torch.distributed`` internals
that can change in any release. Reading the code (:func:`commscope.flight.selfcheck.
check_torch`) catches a renamed function; it cannot catch a torch that still has every
name but routes a collective past the recording group or past the dispatch mode. So
the first :func:`commscope.flight.enable` and the first ``CommDebugMode`` of a torch
install run a throw-away job and look at what it recorded:

1. A child Python (same interpreter, same environment, so the same torch and the same
   ``sitecustomize``) starts the recorder, makes a one-rank gloo job on a private
   ``HashStore`` (no port, no file), creates a second group with ``new_group``, and
   issues ``all_reduce``, ``broadcast``, ``all_gather``, ``barrier`` on the default
   group, ``all_reduce`` on the new group and a functional ``all_reduce``. Each call
   must add a record to the ring, on the right group.
2. In the same child, under ``CommDebugMode``, a module whose forward issues a
   functional ``all_reduce`` and a ``dist.all_reduce``: both must be counted, under
   that module's forward.
3. The child prints one JSON verdict; the parent keeps it. A passing verdict is cached
   on disk under a key made of the interpreter, the torch build and commscope's own
   sources, so later jobs (and every rank of this one: a file lock makes them wait for
   the first) pay nothing. A failing verdict is never cached.

:func:`require_flight` raises :class:`~commscope.flight.selfcheck.RecorderUnsupported`
and :func:`require_comm` raises :class:`~commscope.comm.capture.needs.CommUnsupported`, each
naming the torch version and what was not seen. A probe that could not run at all
(no gloo, a child that died) is logged as an error and does not stop the job: it proves
nothing either way. ``COMMSCOPE_SELFCHECK=0`` skips the probe.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["ProbeResult", "probe", "require_flight", "require_comm", "SKIP_ENV", "CACHE_ENV"]

logger = logging.getLogger(__name__)

SKIP_ENV = "COMMSCOPE_SELFCHECK"
"""``COMMSCOPE_SELFCHECK=0`` skips the probe (set in the probe's own child)."""
CACHE_ENV = "COMMSCOPE_CACHE_DIR"
"""Where passing verdicts are kept (default ``$XDG_CACHE_HOME/commscope`` or
``~/.cache/commscope``)."""
_FORMAT = 1
_TIMEOUT_S = 180.0
# Launcher variables a child must not inherit: it is a job of its own, not a rank.
_DROP_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
             "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "COMMSCOPE_WATCH_TOKEN",
             "COMMSCOPE_WATCH_FILE")
_SOURCES = ("probe.py", "flight/install.py", "flight/backend.py", "flight/recorder.py",
            "flight/work.py", "comm/capture/mode.py", "comm/capture/modules.py",
            "comm/capture/registry.py")


@dataclass(frozen=True)
class ProbeResult:
    """What the throw-away job showed."""

    torch_version: str
    """``torch.__version__`` of the probed install."""
    flight_missing: tuple[str, ...] = ()
    """Calls whose record never reached the flight recorder's ring."""
    comm_missing: tuple[str, ...] = ()
    """Collectives ``CommDebugMode`` did not count (or charged to the wrong place)."""
    error: str | None = None
    """Why the probe could not run at all; then it proves nothing either way."""
    cached: bool = field(default=False, compare=False)
    """True when read back from the on-disk cache."""

    @property
    def flight_ok(self) -> bool:
        """The recorder recorded every probe call (or the probe could not run)."""
        return not self.flight_missing

    @property
    def comm_ok(self) -> bool:
        """``CommDebugMode`` counted every probe collective (or the probe could not run)."""
        return not self.comm_missing


_memo: ProbeResult | None = None


def _cache_dir() -> Path:
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "commscope"


def _cache_key() -> str:
    """A name that changes with the interpreter, the torch build or our own sources."""
    import torch

    import commscope

    parts = [str(_FORMAT), sys.executable, sys.version, str(torch.__version__),
             os.path.dirname(torch.__file__), commscope.__version__]
    here = Path(__file__).resolve().parent
    for path in [Path(torch.__file__).with_name("version.py")] + [here / s for s in _SOURCES]:
        try:
            st = path.stat()
            parts.append(f"{path}:{st.st_mtime_ns}:{st.st_size}")
        except OSError:
            parts.append(f"{path}:absent")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """Hold ``folder/probe.lock`` so concurrent ranks run one probe, not one each."""
    try:
        import fcntl
    except ImportError:  # not POSIX: every process probes for itself
        yield
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock = open(folder / "probe.lock", "a")  # noqa: SIM115 (closed below)
    except OSError as exc:  # a read-only home: probe without the lock (and no cache)
        logger.debug("cannot lock %s: %s", folder, exc)
        yield
        return
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _read_cached(path: Path) -> ProbeResult | None:
    try:
        data = json.loads(path.read_text())
        if data.get("format") != _FORMAT:
            return None
        return ProbeResult(str(data["torch_version"]), cached=True)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _write_cached(path: Path, result: ProbeResult) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps({"format": _FORMAT, "torch_version": result.torch_version}))
        os.replace(tmp, path)
    except OSError as exc:  # a read-only home only costs the next job one probe
        logger.debug("cannot cache the self-check verdict in %s: %s", path, exc)
        with contextlib.suppress(OSError):
            tmp.unlink()


def _child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _DROP_ENV}
    env[SKIP_ENV] = "0"
    env["OMP_NUM_THREADS"] = "1"
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


def _run_child(timeout_s: float) -> ProbeResult:
    import torch

    version = str(torch.__version__)
    try:
        proc = subprocess.run([sys.executable, "-m", "commscope.probe"], env=_child_env(),
                              capture_output=True, text=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return ProbeResult(version, error=f"the probe job did not finish: {exc}")
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            try:
                data = json.loads(line)
                return ProbeResult(
                    str(data.get("torch_version", version)),
                    tuple(data.get("flight_missing", ())),
                    tuple(data.get("comm_missing", ())),
                    data.get("error"),
                )
            except (ValueError, TypeError):
                break
    tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
    return ProbeResult(version, error=f"the probe job exited with status {proc.returncode}: "
                                      f"{tail}")


def probe(*, timeout_s: float = _TIMEOUT_S, use_cache: bool = True) -> ProbeResult:
    """Run the throw-away job of the module doc (once per process; cached on success)."""
    global _memo
    if _memo is not None and use_cache:
        return _memo
    folder = _cache_dir()
    path = folder / f"selfcheck-{_cache_key()}.json"
    with _locked(folder):
        result = _read_cached(path) if use_cache else None
        if result is None:
            result = _run_child(timeout_s)
            if result.error is None and result.flight_ok and result.comm_ok:
                _write_cached(path, result)
    if result.error is not None:
        logger.error("commscope self-check could not run, so it proves nothing about torch "
                     "%s: %s (set %s=0 to skip it)", result.torch_version, result.error,
                     SKIP_ENV)
    _memo = result
    return result


def _skipped() -> bool:
    return os.environ.get(SKIP_ENV, "") == "0"


def _tested_versions() -> str:
    return "The tested versions are listed in docs/compat.md."


_proven: set[str] = set()
"""The parts a passing probe has cleared in this process (checked once each)."""


def require_flight() -> None:
    """Raise ``RecorderUnsupported`` unless the probe saw every call recorded."""
    if "flight" in _proven or _skipped():
        return
    result = probe()
    if not result.flight_ok:
        from commscope.flight.selfcheck import RecorderUnsupported

        raise RecorderUnsupported(
            f"commscope flight cannot record on torch {result.torch_version}: a throw-away "
            f"one-rank job recorded nothing for {'; '.join(result.flight_missing)}. "
            f"Nothing would be recorded, so recording was not started. {_tested_versions()}")
    _proven.add("flight")


def require_comm() -> None:
    """Raise ``CommUnsupported`` unless the probe saw every collective counted."""
    if "comm" in _proven or _skipped():
        return
    result = probe()
    if not result.comm_ok:
        from commscope.comm.capture.needs import CommUnsupported

        raise CommUnsupported(
            f"commscope.comm cannot trace on torch {result.torch_version}: a throw-away "
            f"one-rank job's CommDebugMode missed {'; '.join(result.comm_missing)}. "
            f"{_tested_versions()}")
    _proven.add("comm")


# ---------------------------------------------------------------------- the child's side


def _flight_part(dist: Any, funcol: Any, torch: Any, tmp: str) -> tuple[list[str], Any]:
    """Steps 1 of the module doc; returns what was not recorded and the second group."""
    from commscope import flight

    flight.enable(buffer_size=64, dump_prefix=os.path.join(tmp, "rank_"), watchdog=False,
                  handle_signals=False, dump_on_exception=False, watch_interval_s=0)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    sub = dist.new_group([0])
    t = torch.ones(4)
    steps: list[tuple[str, Any, Callable[[], Any]]] = [
        ("dist.all_reduce", None, lambda: dist.all_reduce(t)),
        ("dist.broadcast", None, lambda: dist.broadcast(t, 0)),
        ("dist.all_gather", None, lambda: dist.all_gather([torch.empty(4)], t)),
        ("dist.barrier", None, lambda: dist.barrier()),
        ("dist.all_reduce on a new_group", sub, lambda: dist.all_reduce(t, group=sub)),
        ("functional all_reduce", sub, lambda: funcol.wait_tensor(
            funcol.all_reduce(t, "sum", sub))),
    ]
    missing = []
    for name, group, call in steps:
        before = len(flight.snapshot(include_stack_traces=False)["entries"])
        call()
        entries = flight.snapshot(include_stack_traces=False)["entries"]
        want = (group or dist.group.WORLD).group_name
        if len(entries) <= before:
            missing.append(name)
        elif str(entries[-1].get("process_group", ("",))[0]) != str(want):
            missing.append(f"{name} (recorded on the wrong group)")
    return missing, sub


def _comm_part(dist: Any, funcol: Any, torch: Any, group: Any) -> list[str]:
    """Step 2 of the module doc: what ``CommDebugMode`` did not count where it ran."""
    from commscope.comm import CommDebugMode

    class Probe(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            y = funcol.wait_tensor(funcol.all_reduce(x, "sum", group))
            dist.all_reduce(y, group=group)
            return y

    with CommDebugMode() as mode:
        Probe()(torch.ones(4))
    counts = {str(k): v for k, v in mode.get_comm_counts().items()}
    missing = []
    if counts.get("c10d_functional.all_reduce", 0) != 1:
        missing.append("functional all_reduce")
    if counts.get("c10d.allreduce_", 0) != 1:
        missing.append("dist.all_reduce")
    fwd = mode.comm_module_counts.get("Probe", {}).get("forward", {})
    if not missing and sum(fwd.values()) != 2:
        missing.append("the collectives of a module's forward (counted, but not under it)")
    return missing


def _main() -> None:
    """The child: run the throw-away job and print one JSON verdict."""
    import torch

    out: dict[str, Any] = {"torch_version": str(torch.__version__)}
    try:
        import torch.distributed as dist
        import torch.distributed._functional_collectives as funcol

    except Exception as exc:  # no torch.distributed at all: nothing to prove
        out["error"] = f"{type(exc).__name__}: {exc}"
        print(json.dumps(out), flush=True)
        return
    group = None
    with tempfile.TemporaryDirectory(prefix="commscope-probe-") as tmp:
        try:
            out["flight_missing"], group = _flight_part(dist, funcol, torch, tmp)
        except Exception as exc:  # the recorder broke the job: that is its failure
            out["flight_missing"] = [f"the job itself ({type(exc).__name__}: {exc})"]
        if group is None:  # the recorder broke the job; trace on a plain one instead
            with contextlib.suppress(Exception):
                from commscope import flight

                flight.disable()
                if not dist.is_initialized():
                    dist.init_process_group("gloo", store=dist.HashStore(), rank=0,
                                            world_size=1)
                group = dist.group.WORLD
        if group is not None:
            try:
                out["comm_missing"] = _comm_part(dist, funcol, torch, group)
            except Exception as exc:
                out["comm_missing"] = [f"the traced block ({type(exc).__name__}: {exc})"]
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    _main()
