"""Where in the user's own code a record (or a thread) was: the innermost user frame.

:func:`user_frame` picks the innermost frame that is the user's: not in torch, not in
commscope's recorder, not in the Python standard library, not a ``typing_extensions``
or ``c10d_logger`` wrapper. When every frame is library code, the innermost one is used.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Frame", "Place", "user_frame", "user_place"]

Frame = tuple[str, str, int]
"""(function name, file name, line)."""
Place = tuple[str, str, int, str]
"""(function name, file name, line, source line): where a thread is now."""

_LIBRARY_MARKERS = (
    "/torch/", "\\torch\\", "/commscope/flight/", "/commscope/comm/", "typing_extensions",
    "c10d_logger", "<frozen ",
)


def _is_library(filename: str) -> bool:
    if any(m in filename for m in _LIBRARY_MARKERS):
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
