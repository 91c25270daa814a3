"""Where in the user's own code a record (or a thread) was: the innermost user frame.

:func:`user_frame` picks the innermost frame that is the user's: not in torch, not in
commscope's recorder, not in the Python standard library, not a ``typing_extensions``
or ``c10d_logger`` wrapper, not code ``torch.compile`` generated (inductor's
``c<hash>.py`` output modules, FX's ``<eval_with_key>.N``). When every frame is library
code, the innermost one is used. Under ``torch.compile`` the user frame is then the line
the recorder recovered from inductor's line map (a frame marked ``compiled``), else the
compiled function itself, at its first line (the frame dynamo took over).
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["Frame", "Place", "user_frame", "user_place", "blocked_call", "split_at_handler"]

Frame = tuple[str, str, int]
"""(function name, file name, line)."""
Place = tuple[str, str, int, str]
"""(function name, file name, line, source line): where a thread is now."""

_LIBRARY_MARKERS = (
    "/torch/", "\\torch\\", "/commscope/flight/", "/commscope/comm/", "typing_extensions",
    "c10d_logger", "<frozen ", "<eval_with_key", "torchinductor_",
)
_INDUCTOR_OUTPUT = re.compile(r"[/\\][a-z0-9]{2}[/\\]c[a-z0-9]{51}\.py$")
"""Inductor's output modules (in a cache folder of any name)."""


def _is_library(filename: str) -> bool:
    if any(m in filename for m in _LIBRARY_MARKERS) or _INDUCTOR_OUTPUT.search(filename):
        return True
    norm = filename.replace("\\", "/")
    return "/lib/python3" in norm and "site-packages" not in norm and "dist-packages" not in norm


def _as_frame(item: Any) -> Frame | None:
    if not isinstance(item, dict):
        return None
    name, filename, line = item.get("name"), item.get("filename"), item.get("line")
    if type(name) is not str or type(filename) is not str:
        return None
    return (name, filename, line if type(line) is int else 0)


def user_frame(frames: Any) -> Frame | None:
    """The innermost user frame of a record's ``frames`` list (see module doc)."""
    if not isinstance(frames, list):
        return None
    parsed = [f for f in map(_as_frame, frames[:256]) if f is not None]
    for frame in parsed:
        if not _is_library(frame[1]):
            return frame
    return parsed[0] if parsed else None


def user_place(frames: Any) -> Place | None:
    """The innermost user frame of a thread's stack (``commscope_threads``), with its
    source line when the dump has it."""
    if not isinstance(frames, list):
        return None
    items = [f for f in frames[:256] if _as_frame(f) is not None]
    if not items:
        return None
    pick = next((f for f in items if not _is_library(f["filename"])), items[0])
    name, filename, line = _as_frame(pick)  # type: ignore[misc]
    code = pick.get("code")
    return (name, filename, line, code if type(code) is str else "")


_WAIT_FILES = ("threading.py", "queue.py", "_base.py", "connection.py", "selectors.py",
               "socket.py", "synchronize.py", "pool.py")
_WAIT_CALL = re.compile(r"\.(acquire|get|join|wait|result|recv|put)\(|\bwait\(|\bjoin\(")


def blocked_call(frames: Any) -> bool:
    """Whether a thread's stack ends in a blocking call: a lock, a queue, a join, a
    future, a pipe (its innermost frame is in one of those stdlib modules, or its own
    line calls one)."""
    if not isinstance(frames, list) or not frames:
        return False
    top = frames[0]
    if not isinstance(top, dict):
        return False
    name = str(top.get("filename", "")).replace("\\", "/").rsplit("/", 1)[-1]
    if name in _WAIT_FILES:
        return True
    code = top.get("code")
    return type(code) is str and bool(_WAIT_CALL.search(code))


def split_at_handler(frames: Any, handlers: set[tuple[str, str]]) -> tuple[Any, Any, int]:
    """``(handler part, the interrupted program's part, where)`` of a stack that passes
    through a signal handler (``(name, file)`` pairs); ``where`` is -1 when it does not."""
    if not isinstance(frames, list) or not handlers:
        return [], frames, -1
    for i, f in enumerate(frames[:256]):
        if isinstance(f, dict) and (f.get("name"), f.get("filename")) in handlers:
            return frames[:i + 1], frames[i + 1:], i
    return [], frames, -1
