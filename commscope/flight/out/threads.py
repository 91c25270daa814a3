"""Where every thread of this process is at dump time, and the exception behind a dump.

A dump says what each rank's collectives did; when a rank is stuck *outside* any
collective (its data loader, a checkpoint write, a slow host) its records only say
what it did last. So every commscope dump also carries:

* ``commscope_threads``: each live thread's current Python stack, innermost first,
  at most ``max_frames`` frames (and, when those are all torch's, the innermost user
  frames beyond them) and :data:`MAX_THREADS` threads (the main thread first). Read
  from :func:`sys._current_frames` under the GIL: the process is never stopped or
  signalled, and a thread blocked in C (a gloo wait, ``time.sleep``) shows
  the Python line that called it. commscope's own watchdog threads are left out.
* ``commscope_exception``: when the dump was triggered by an exception (an uncaught
  one, or ``flight.dump(exception=e)`` from an ``except`` block), its type, message
  and traceback frames.

Each frame is ``{"filename", "line", "name", "code"}``; ``code`` is the stripped
source line (what the thread is calling), at most :data:`MAX_CODE_CHARS` characters.
Under ``torch.compile``, a frame of inductor's generated code is preceded by the user's
lines it was compiled from, marked ``"compiled": True``
(:func:`commscope.flight.record.stack.with_compiled_source`).
"""

from __future__ import annotations

import linecache
import os
import sys
import threading
import traceback
from types import FrameType, TracebackType
from typing import Any

from commscope.flight.record.stack import (
    USER_FRAMES,
    is_generated,
    is_library,
    with_compiled_source,
)

__all__ = ["thread_stacks", "exception_record", "walk_stack", "MAX_THREADS", "MAX_CODE_CHARS",
           "MAX_MESSAGE_CHARS", "OWN_THREAD_PREFIX"]

MAX_THREADS = 64
"""Threads kept per dump (the main thread always among them)."""
MAX_CODE_CHARS = 160
MAX_MESSAGE_CHARS = 2000
OWN_THREAD_PREFIX = "commscope-"
"""Names of commscope's own threads, which are not the user's program."""


def _frame_dict(filename: str, line: int, name: str) -> dict[str, Any]:
    code = linecache.getline(filename, line).strip()[:MAX_CODE_CHARS] if line > 0 else ""
    return {"filename": filename, "line": line, "name": name, "code": code}


_OWN_DIR = os.path.dirname(os.path.abspath(__file__))


def walk_stack(frame: FrameType | None, limit: int) -> list[dict[str, Any]]:
    """``frame`` and its callers as frame dicts, innermost first, at most ``limit``."""
    # The dumping code itself (a signal handler or an API call on this thread) is not
    # where the program is: skip commscope.flight's frames at the top of the stack.
    while frame is not None and os.path.dirname(frame.f_code.co_filename) == _OWN_DIR:
        frame = frame.f_back
    out = []
    user = False
    while frame is not None and len(out) < limit:
        code = frame.f_code
        out.append(_frame_dict(code.co_filename, frame.f_lineno or 0, code.co_name))
        user = user or not is_library(code)
        frame = frame.f_back
    if frame is not None and not user:
        # deep inside torch (a collective of FSDP2 or DTensor): walk on to the user's
        # own lines, as the recorder's records do (commscope.flight.record.stack)
        kept = walked = 0
        while frame is not None and kept < USER_FRAMES and walked < 256:
            code = frame.f_code
            if not is_library(code):
                out.append(_frame_dict(code.co_filename, frame.f_lineno or 0, code.co_name))
                kept += 1
            elif is_generated(code):  # torch.compile's: the user's line is worked out from it
                out.append(_frame_dict(code.co_filename, frame.f_lineno or 0, code.co_name))
            frame = frame.f_back
            walked += 1
    return with_compiled_source(out)


def thread_stacks(max_frames: int) -> list[dict[str, Any]]:
    """Every live thread's stack now, main thread first (see module doc)."""
    frames = sys._current_frames()
    by_ident = {t.ident: t for t in threading.enumerate()}
    main = threading.main_thread().ident
    out = []
    for ident in sorted(frames, key=lambda i: (i != main, i)):
        thread = by_ident.get(ident)
        name = thread.name if thread is not None else f"thread-{ident}"
        if name.startswith(OWN_THREAD_PREFIX):
            continue
        out.append({
            "name": name,
            "ident": ident,
            "main": ident == main,
            "daemon": bool(thread.daemon) if thread is not None else None,
            "frames": walk_stack(frames[ident], max(1, max_frames)),
        })
        if len(out) >= MAX_THREADS:
            break
    return out


def exception_record(exc: BaseException | None, max_frames: int) -> dict[str, Any] | None:
    """``{"type", "message", "frames"}`` of ``exc`` (innermost frame first), or ``None``."""
    if exc is None:
        return None
    tb: TracebackType | None = exc.__traceback__
    summary = traceback.extract_tb(tb)[-max(1, max_frames):] if tb is not None else []
    frames = with_compiled_source(
        [_frame_dict(fs.filename, fs.lineno or 0, fs.name) for fs in reversed(summary)])
    try:
        message = str(exc)
    except Exception as err:  # a hostile __str__ must not stop the dump
        message = f"<str() failed: {type(err).__name__}>"
    return {
        "type": f"{type(exc).__module__}.{type(exc).__qualname__}".removeprefix("builtins."),
        "message": message[:MAX_MESSAGE_CHARS],
        "frames": frames,
    }
