"""Cheap capture of the Python stack at the moment a collective is issued.

Recording must cost microseconds, so nothing is formatted at record time: the stack is
walked with ``sys._getframe`` and kept as ``(code object, line)`` pairs, innermost
first. Code objects are shared, immutable and hold no local variables, so no tensor is
kept alive through them. Names and file names are read at dump time
(:func:`commscope.flight.entry.entry_to_dict`).
"""

from __future__ import annotations

import sys
from types import CodeType

__all__ = ["capture_frames"]

_getframe = sys._getframe


def capture_frames(skip: int, limit: int) -> tuple[tuple[CodeType, int], ...]:
    """The caller's stack, ``skip`` frames above this call, at most ``limit`` frames.

    ``skip=1`` starts at the function that called ``capture_frames``. Returns ``()``
    when ``limit`` is 0 or the stack is shallower than ``skip``.
    """
    if limit <= 0:
        return ()
    try:
        frame = _getframe(skip)
    except ValueError:
        return ()
    out = []
    append = out.append
    while frame is not None:
        append((frame.f_code, frame.f_lineno))
        if len(out) >= limit:
            break
        frame = frame.f_back
    return tuple(out)
