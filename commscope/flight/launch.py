"""``commscope run``: torchrun with the flight recorder switched on in every worker.

``commscope run [torchrun options] SCRIPT [ARGS]`` runs
``python -m torch.distributed.run [torchrun options] -m commscope.flight.bootstrap
SCRIPT [ARGS]``. torchrun's own parser splits the command line, so every torchrun option
works as usual, including ``-m MODULE`` to run a module instead of a script.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Sequence

__all__ = ["torchrun_command", "run", "watch_env"]

_USAGE = "usage: commscope run [torchrun options] SCRIPT [ARGS]"


def torchrun_command(argv: Sequence[str], python: str | None = None) -> list[str]:
    """The torchrun command line that runs ``argv``'s script under the recorder.

    Raises ``ValueError`` with a one-line explanation when ``argv`` names no script or
    uses an option we cannot honour (``--no-python``).
    """
    from torch.distributed.run import get_args_parser

    argv = list(argv)
    parser = get_args_parser()

    def _error(message: str) -> None:
        raise ValueError(message)

    parser.error = _error  # type: ignore[method-assign]
    try:
        parsed = parser.parse_args(argv)
    except ValueError as exc:
        if "training_script" in str(exc):
            raise ValueError(f"no script given; {_USAGE}") from None
        raise ValueError(f"{exc}; {_USAGE}") from None
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


def watch_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of the job: a fresh watch token (unless one is set; marked drawn,
    so the ranks of every host agree on one through the store: ``record/job.py``), where
    each host's first rank writes the watch file (``<dump folder>/watch.json``), and
    strict recording (a group the recorder cannot record stops the job instead of leaving
    empty dumps)."""
    out = dict(os.environ if env is None else env)
    if not out.get("COMMSCOPE_WATCH_TOKEN"):
        # each host draws its own; the ranks agree on one through the job's store
        out["COMMSCOPE_WATCH_TOKEN"] = secrets.token_urlsafe(18)
        out["COMMSCOPE_WATCH_TOKEN_DRAWN"] = "1"
    out.setdefault("COMMSCOPE_FR_STRICT", "1")  # a group the recorder misses stops the job
    out.setdefault("COMMSCOPE_RUN_BANNER", "1")  # rank 0 says recording is on, and where
    prefix = (out.get("TORCH_FR_DUMP_TEMP_FILE") or out.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
              or "./commscope_traces/rank_")
    out.setdefault("COMMSCOPE_WATCH_FILE",
                   os.path.join(os.path.dirname(os.path.abspath(prefix)), "watch.json"))
    return out


def run(argv: Sequence[str]) -> int:
    """Run torchrun for ``argv`` and return its exit code."""
    cmd = torchrun_command(argv)
    return subprocess.call(cmd, env=watch_env())
