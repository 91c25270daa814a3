"""Prove, on the torch that is installed, that recording and tracing really work.

The flight recorder and ``CommDebugMode`` reach into ``torch.distributed`` internals
that can change in any release. Reading the code (:func:`commscope.flight.splice.selfcheck.
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

This module is the parent's side, below the recorder and the tracer (it imports neither);
the child job is :mod:`commscope.probe_job`, run by name.
:func:`commscope.flight.splice.selfcheck.require_flight` raises ``RecorderUnsupported``
and :func:`commscope.comm.capture.needs.require_comm` raises ``CommUnsupported``, each
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
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ProbeResult", "probe", "skipped", "SKIP_ENV", "CACHE_ENV", "TESTED"]

logger = logging.getLogger(__name__)

SKIP_ENV = "COMMSCOPE_SELFCHECK"
"""``COMMSCOPE_SELFCHECK=0`` skips the probe (set in the probe's own child)."""
CACHE_ENV = "COMMSCOPE_CACHE_DIR"
"""Where passing verdicts are kept (default ``$XDG_CACHE_HOME/commscope`` or
``~/.cache/commscope``)."""
_FORMAT = 1
JOB = "commscope.probe_job"
"""The module the child Python runs by name (imported only there: it imports the
recorder and the tracer, which import this module)."""
_TIMEOUT_S = 180.0
# Launcher variables a child must not inherit: it is a job of its own, not a rank.
_DROP_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
             "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "COMMSCOPE_WATCH_TOKEN",
             "COMMSCOPE_WATCH_FILE")
_SOURCES = ("probe.py", "probe_job.py", "flight/splice/install.py", "flight/splice/backend.py",
            "flight/record/recorder.py", "flight/record/work.py", "comm/capture/mode.py",
            "comm/capture/modules.py", "comm/capture/registry.py")


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
        proc = subprocess.run([sys.executable, "-m", JOB], env=_child_env(),
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


def skipped() -> bool:
    """Whether ``COMMSCOPE_SELFCHECK=0`` turns the probe off (the child sets it too)."""
    return os.environ.get(SKIP_ENV, "") == "0"


TESTED = "The tested versions are listed in docs/compat.md."
"""The sentence the refusals end with."""
