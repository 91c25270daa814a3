"""The recorder's stack capture: a flat ``[code, offset, code, offset, ...]`` list.

Each entry keeps the code object and instruction offset of the frames that issued
its collective, innermost first; source lines are worked out only when a dump is
written (:func:`commscope.flight.record.entry.line_of`). :func:`capture_stack` is the small C
walk of ``commscope.flight.record._stack`` when it was built with the package (a C compiler
and Python 3.11+), else :func:`capture_stack_py`, which returns the same list. Set
``COMMSCOPE_NO_C_STACK=1`` to use the Python walk.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import FrameType
from typing import Any

__all__ = ["capture_stack", "capture_stack_py", "C_STACK"]


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
