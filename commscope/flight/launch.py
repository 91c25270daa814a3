"""``commscope run``: torchrun with the flight recorder switched on in every worker.

``commscope run [torchrun options] SCRIPT [ARGS]`` runs
``python -m torch.distributed.run [torchrun options] -m commscope.flight.bootstrap
SCRIPT [ARGS]``. torchrun's own parser splits the command line, so every torchrun option
works as usual, including ``-m MODULE`` to run a module instead of a script.

Beside torchrun, on every host, the launcher starts the job log's incident reporter
(``python -m commscope job-log``, :mod:`commscope.watch.joblog`, a child process: flight
may not import the analyzer): when the job hangs or fails, each host's log says where its
ranks' dumps went, and the log of rank 0's host carries the whole-job verdict from every
rank's live record with every dump as ``host:folder``. ``COMMSCOPE_RUN_REPORT=0`` turns it
off; so does ``COMMSCOPE_WATCH_INTERVAL_S=0`` (no records, no notes to read).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from commscope.flight.config import prefix_from_env

__all__ = ["draw_token", "torchrun_command", "run", "watch_env", "local_world_size",
           "start_reporter", "stop_reporter", "REPORT_ENV"]

_USAGE = "usage: commscope run [torchrun options] SCRIPT [ARGS]"
REPORT_ENV = "COMMSCOPE_RUN_REPORT"
"""``0`` turns the job log's incident reporter off."""
_REPORT_GRACE_S = 10.0
"""How long a failed job's launcher waits for the reporter's last words."""


def torchrun_command(argv: Sequence[str], python: str | None = None) -> list[str]:
    """The torchrun command line that runs ``argv``'s script under the recorder.

    Raises ``ValueError`` with a one-line explanation when ``argv`` names no script or
    uses an option we cannot honour (``--no-python``).
    """
    argv = list(argv)
    parsed = _parse(argv)
    if not getattr(parsed, "training_script", None):
        raise ValueError(f"no script given; {_USAGE}")
    if getattr(parsed, "no_python", False):
        raise ValueError("--no-python cannot be recorded: commscope run needs a Python script")
    if not getattr(parsed, "module", False) and not os.path.isfile(parsed.training_script):
        raise ValueError(f"no such script: {parsed.training_script}")
    script_args = list(parsed.training_script_args)
    split = len(argv) - len(script_args) - 1
    options = [a for a in argv[:split] if a not in ("-m", "--module", "--run-path")]
    boot = ["-m", "commscope.flight.bootstrap"]
    if getattr(parsed, "module", False):
        boot.append("--module")
    return [
        python or sys.executable,
        "-m",
        "torch.distributed.run",
        *options,
        *boot,
        parsed.training_script,
        *script_args,
    ]


def _parse(argv: list[str]) -> Any:
    """The parse of ``argv`` by torchrun's own parser; ``ValueError`` with a one-line
    explanation."""
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()

    def _error(message: str) -> None:
        raise ValueError(message)

    parser.error = _error  # type: ignore[method-assign]
    try:
        return parser.parse_args(argv)
    except ValueError as exc:
        if "training_script" in str(exc):
            raise ValueError(f"no script given; {_USAGE}") from None
        raise ValueError(f"{exc}; {_USAGE}") from None


def local_world_size(argv: Sequence[str]) -> int:
    """How many ranks torchrun starts on this host when ``--nproc-per-node`` is a number
    (torchrun's default is 1); 0 for ``gpu``, ``auto`` and the like, which torchrun counts
    itself (counting here would start CUDA in the launcher)."""
    try:
        text = str(getattr(_parse(list(argv)), "nproc_per_node", None) or "1").strip()
    except ValueError:
        return 0
    return int(text) if text.isdigit() else 0


def draw_token() -> str:
    """A fresh watch token: 24 URL-safe characters (144 random bits), never starting
    with ``-``, which a command line would read as an option (``--token -Evl...``: one
    drawn token in 64 did)."""
    while True:
        token = secrets.token_urlsafe(18)
        if not token.startswith("-"):
            return token


def watch_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of the job: a fresh watch token (unless one is set; marked drawn,
    so the ranks of every host agree on one through the store: ``record/job.py``), where
    each host's first rank writes the watch file (``<dump folder>/watch.json``), and
    strict recording (a group the recorder cannot record stops the job instead of leaving
    empty dumps)."""
    out = dict(os.environ if env is None else env)
    if not out.get("COMMSCOPE_WATCH_TOKEN"):
        # each host draws its own; the ranks agree on one through the job's store
        out["COMMSCOPE_WATCH_TOKEN"] = draw_token()
        out["COMMSCOPE_WATCH_TOKEN_DRAWN"] = "1"
    out.setdefault("COMMSCOPE_FR_STRICT", "1")  # a group the recorder misses stops the job
    out.setdefault("COMMSCOPE_RUN_BANNER", "1")  # rank 0 says recording is on, and where
    prefix = prefix_from_env(out)
    out.setdefault("COMMSCOPE_WATCH_FILE",
                   os.path.join(os.path.dirname(os.path.abspath(prefix)), "watch.json"))
    return out


def start_reporter(argv: Sequence[str], env: Mapping[str, str],
                   since_ns: int) -> subprocess.Popen[bytes] | None:
    """Start the job log's incident reporter beside torchrun (module doc), or ``None``
    when it is turned off or cannot start (the job runs all the same).

    It writes to this launcher's stderr, the job's log, and reads torchrun's end from its
    stdin (:func:`stop_reporter`). It gets the job's environment without the watch
    token: it reads the token from this host's watch file."""
    from commscope.flight.config import resolve_config

    if env.get(REPORT_ENV, "").strip() == "0" or not env.get("COMMSCOPE_WATCH_FILE"):
        return None
    try:
        if resolve_config(env=env).watch_interval_s <= 0:
            return None
    except ValueError:
        return None  # a bad setting: the ranks say so themselves
    cmd = [sys.executable, "-m", "commscope", "job-log", "--file",
           env["COMMSCOPE_WATCH_FILE"], "--since-ns", str(since_ns),
           "--local-ranks", str(local_world_size(argv))]
    child = {k: v for k, v in env.items()
             if k not in ("COMMSCOPE_WATCH_TOKEN", "COMMSCOPE_WATCH_TOKEN_DRAWN")}
    child.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # no C++ warnings in the job's log
    try:
        return subprocess.Popen(cmd, env=child, stdin=subprocess.PIPE)
    except (OSError, ValueError):
        return None


def stop_reporter(proc: subprocess.Popen[bytes] | None, rc: int | None,
                  grace_s: float = _REPORT_GRACE_S) -> None:
    """End the reporter once torchrun has ended with ``rc`` (``None``: the launcher was
    interrupted). After a failure it is told ``end RC`` and given up to ``grace_s``
    seconds to finish its report (a store gone with the job makes that fast); after a
    success or an interruption it is ended at once."""
    if proc is None:
        return
    if rc not in (None, 0) and proc.stdin is not None:
        with contextlib.suppress(OSError, ValueError):
            proc.stdin.write(f"end {rc}\n".encode())
            proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace_s)
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(2)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    if proc.stdin is not None:
        with contextlib.suppress(OSError, ValueError):
            proc.stdin.close()


def run(argv: Sequence[str]) -> int:
    """Run torchrun for ``argv`` with the job log's incident reporter beside it, and
    return torchrun's exit code."""
    cmd = torchrun_command(argv)
    env = watch_env()
    reporter = start_reporter(argv, env, time.time_ns())
    rc: int | None = None
    try:
        rc = subprocess.call(cmd, env=env)
        return rc
    finally:
        stop_reporter(reporter, rc)
