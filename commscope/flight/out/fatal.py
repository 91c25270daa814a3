"""Last words of a rank that dies without running Python again (SIGABRT, SIGSEGV).

gloo aborts a rank that receives a message of another size than it posted (a C++
``EnforceNotMet`` that reaches ``std::terminate``); a segfault in an extension kills a
rank the same way. No Python code runs after that, so no dump is written and the ring
is lost. Python's :mod:`faulthandler` writes every thread's Python stack from a C
signal handler, async-signal-safe, at no cost while nothing goes wrong: armed here into
``.commscope-fatal-<rank>.log`` beside the dumps (``commscope_traces/
.commscope-fatal-3.log``), opened when recording starts. The name holds neither the dump
prefix nor a trailing number, so PyTorch's ``fr_trace``, which reads every file whose
name contains the prefix as a rank's dump, passes it by. The analyzer reads it beside
the dumps and says where the dead rank was (and, when a surviving rank waits in the same
call with a size of its own, that the dead rank is the victim of a mismatch).

The file is removed again when the process ends normally or recording stops, when it is
still empty. A user's own ``faulthandler.enable`` is never replaced.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import logging
import os
from typing import IO

__all__ = ["arm", "disarm", "fatal_path", "SUFFIX"]

logger = logging.getLogger(__name__)

SUFFIX = ".log"
_armed: dict[str, IO[bytes] | str | None] = {"file": None, "path": None}


def fatal_path(prefix: str, rank: int) -> str:
    """``<dir>/.commscope-fatal-<rank>.log`` for ``dump_prefix`` ``<dir>/<name>``: hidden,
    so a rank killed by a signal (no chance to remove the empty file) leaves no visible
    clutter beside the dumps."""
    directory = os.path.dirname(prefix)
    return os.path.join(directory, f".commscope-fatal-{rank}{SUFFIX}")


def arm(prefix: str, rank: int) -> str | None:
    """Have :mod:`faulthandler` write into this rank's fatal file; return its path, or
    ``None`` when faulthandler is already someone else's or the file cannot be made."""
    if _armed["file"] is not None:
        return _armed["path"]  # type: ignore[return-value]
    if faulthandler.is_enabled():
        return None  # the user's (or python -X faulthandler): leave it alone
    path = os.path.abspath(fatal_path(prefix, rank))
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        f = open(path, "wb")  # noqa: SIM115 - faulthandler keeps writing to it
        faulthandler.enable(file=f, all_threads=True)
    except (OSError, ValueError, RuntimeError) as exc:
        logger.debug("commscope flight: no fatal log (%r)", exc)
        return None
    _armed.update(file=f, path=path)
    atexit.register(disarm)
    return path


def disarm(in_child: bool = False) -> None:
    """Stop writing the fatal file; remove it when nothing was written."""
    f, path = _armed["file"], _armed["path"]
    if f is None:
        return
    _armed.update(file=None, path=None)
    with contextlib.suppress(Exception):
        faulthandler.disable()
    with contextlib.suppress(Exception):
        f.close()  # type: ignore[union-attr]
    if in_child:
        return  # a forked child: the file is the parent's
    with contextlib.suppress(OSError):
        if isinstance(path, str) and os.path.getsize(path) == 0:
            os.remove(path)
