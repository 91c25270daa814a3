"""The recorder's stack capture: a flat ``[code, offset, code, offset, ...]`` list.

Each entry keeps the code object and instruction offset of the frames that issued
its collective, innermost first; source lines are worked out only when a dump is
written (:func:`commscope.flight.record.entry.line_of`). :func:`capture_stack` is the
small C walk of ``commscope.flight.record._stack`` when it was built with the package (a
C compiler and Python 3.11+), else :func:`capture_stack_py`, which returns the same list.
Set ``COMMSCOPE_NO_C_STACK=1`` to use the Python walk.

A collective issued deep inside FSDP2, DTensor or DDP has only library frames among its
innermost ``max_frames``: :func:`capture_to_user` walks on past them and appends the
innermost :data:`USER_FRAMES` frames that are the user's own (not torch's, not
commscope's, not the standard library's; :func:`is_library`), so every record names the
user's line.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any

__all__ = ["capture_stack", "capture_stack_py", "capture_to_user", "is_library",
           "library_file", "trim_to_user", "C_STACK", "USER_FRAMES"]

USER_FRAMES = 2
"""User frames kept beyond ``max_frames`` when none was among them."""
_MAX_WALK = 256
"""How far past ``max_frames`` the walk looks for a user frame."""


def capture_stack_py(frame: FrameType | None, limit: int) -> list[Any]:
    """``frame`` and its callers, at most ``limit`` of them, as ``[code, offset, ...]``."""
    frames: list[Any] = []
    push = frames.append
    f = frame
    while f is not None and limit > 0:
        push(f.f_code)
        push(f.f_lasti)
        f = f.f_back
        limit -= 1
    return frames


def _load_c() -> Callable[[FrameType | None, int], list[Any]] | None:
    if os.environ.get("COMMSCOPE_NO_C_STACK"):
        return None
    try:
        from commscope.flight.record import _stack
    except ImportError:
        return None
    return _stack.capture  # type: ignore[no-any-return]


_c_capture = _load_c()

C_STACK = _c_capture is not None
"""Whether the C stack walk is in use."""

capture_stack: Callable[[FrameType | None, int], list[Any]] = _c_capture or capture_stack_py
"""The stack walk in use: the C one when built, else :func:`capture_stack_py`."""


def _library_roots() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(torch's and commscope's folders, the standard library's)."""
    here = os.path.abspath(__file__)
    packages = [os.path.dirname(os.path.dirname(os.path.dirname(here))) + os.sep]
    torch = sys.modules.get("torch")
    torch_file = getattr(torch, "__file__", None)
    if torch_file:
        packages.append(os.path.dirname(os.path.abspath(torch_file)) + os.sep)
    paths = sysconfig.get_paths()
    stdlib = [os.path.abspath(paths[k]) + os.sep for k in ("stdlib", "platstdlib") if k in paths]
    return tuple(dict.fromkeys(packages)), tuple(dict.fromkeys(stdlib))


_ROOTS: tuple[tuple[str, ...], tuple[str, ...]] | None = None
_MARKERS = ("<frozen ", "typing_extensions", "c10d_logger")


def library_file(filename: str) -> bool:
    """Whether ``filename`` is torch's, commscope's or the standard library's (not the
    user's program). Other installed packages count as the user's: a Lightning or
    accelerate line is closer to the user than torch's."""
    global _ROOTS
    if _ROOTS is None:
        _ROOTS = _library_roots()
    if any(m in filename for m in _MARKERS):
        return True
    packages, stdlib = _ROOTS
    path = filename if os.path.isabs(filename) else os.path.abspath(filename)
    if path.startswith(packages):
        return True
    if "site-packages" in path or "dist-packages" in path:
        return False
    return path.startswith(stdlib)


_LIBRARY_CODE: dict[int, tuple[CodeType, bool]] = {}


def is_library(code: CodeType) -> bool:
    """:func:`library_file` of a code object's file, remembered per code object."""
    hit = _LIBRARY_CODE.get(id(code))
    if hit is not None and hit[0] is code:
        return hit[1]
    flag = library_file(code.co_filename)
    if len(_LIBRARY_CODE) > 65536:
        _LIBRARY_CODE.clear()
    _LIBRARY_CODE[id(code)] = (code, flag)  # keeps the code alive: its id stays its own
    return flag


def capture_to_user(frame: FrameType | None, limit: int) -> list[Any]:
    """:func:`capture_stack`, plus the innermost user frames beyond ``limit`` when the
    first ``limit`` frames are all library code (see module doc)."""
    frames = capture_stack(frame, limit)
    if len(frames) < 2 * limit or limit <= 0:
        return frames  # the whole stack is there
    for i in range(0, len(frames), 2):
        if not is_library(frames[i]):
            return frames
    f = frame
    for _ in range(limit):
        f = f.f_back if f is not None else None
    extra: list[Any] = []
    walked = 0
    while f is not None and walked < _MAX_WALK:
        code = f.f_code
        if not is_library(code):
            extra.append(code)
            extra.append(f.f_lasti)
            if len(extra) >= 2 * USER_FRAMES:
                break
        f = f.f_back
        walked += 1
    return frames + extra if extra else frames


def trim_to_user(frames: Any, n: int) -> list[Any]:
    """The innermost ``n`` frames of a flat ``[code, offset, ...]`` stack, plus its
    innermost :data:`USER_FRAMES` user frames when none of those ``n`` is the user's."""
    head = list(frames[: 2 * n])
    if any(not is_library(head[i]) for i in range(0, len(head), 2)):
        return head
    extra: list[Any] = []
    for i in range(2 * n, len(frames) - 1, 2):
        if not is_library(frames[i]):
            extra += [frames[i], frames[i + 1]]
            if len(extra) >= 2 * USER_FRAMES:
                break
    return head + extra
