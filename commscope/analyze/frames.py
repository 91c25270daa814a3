"""The user's own stack frame of a record, read back from the dump only when needed.

Loading keeps no stacks (they are most of a dump's bytes and almost never needed). A
finding asks :class:`FrameSource` for one record's frames by (rank, record index); the
file is read again through the same safe loader, at most a few files are kept.

:func:`user_frame` picks the innermost frame that is the user's: not in torch, not in
commscope's recorder, not in the Python standard library, not a ``typing_extensions``
or ``c10d_logger`` wrapper. When every frame is library code, the innermost one is used.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any

from commscope.analyze.model import LoadResult

__all__ = ["Frame", "Place", "user_frame", "user_place", "FrameSource"]

logger = logging.getLogger(__name__)

Frame = tuple[str, str, int]
"""(function name, file name, line)."""
Place = tuple[str, str, int, str]
"""(function name, file name, line, source line): where a thread is now."""

_LIBRARY_MARKERS = (
    "/torch/", "\\torch\\", "/commscope/flight/", "/commscope/comm/", "typing_extensions",
    "c10d_logger", "<frozen ",
)
_CACHE_FILES = 8


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


class FrameSource:
    """Reads records back from the dump files (frames; completion times when they were
    not kept while loading), small cache."""

    def __init__(self, load: LoadResult, in_memory: dict[str, list[Any]] | None = None) -> None:
        self._load = load
        self._cache: OrderedDict[str, list[Any]] = OrderedDict()
        self._memory = in_memory or {}
        """Records of dumps that are not files (``commscope watch``'s progress records)."""

    def _entries(self, path: str) -> list[Any]:
        if path in self._memory:
            return self._memory[path]
        if path in self._cache:
            self._cache.move_to_end(path)
            return self._cache[path]
        from commscope.analyze.load import read_dump_file

        try:
            data = read_dump_file(path)
        except Exception as exc:  # the file changed or vanished since loading
            logger.debug("cannot re-read %s for stacks: %s", path, exc)
            data = None
        if isinstance(data, list):
            entries = data
        elif isinstance(data, dict) and isinstance(data.get("entries"), list):
            entries = data["entries"]
        else:
            entries = []
        self._cache[path] = entries
        if len(self._cache) > _CACHE_FILES:
            self._cache.popitem(last=False)
        return entries

    def entries(self, rank: int) -> list[Any]:
        """The raw records of ``rank``'s dump, read again (``[]`` when unavailable)."""
        dump = self._load.dumps.get(rank)
        return self._entries(dump.path) if dump is not None else []

    def frame(self, rank: int, index: int | None) -> Frame | None:
        """The user frame of record ``index`` of ``rank``'s dump, or ``None``."""
        dump = self._load.dumps.get(rank)
        if dump is None or index is None or index < 0:
            return None
        entries = self._entries(dump.path)
        if not entries:
            return None
        if index >= len(entries) or not isinstance(entries[index], dict):
            return None
        return user_frame(entries[index].get("frames"))

    def has_threads(self, rank: int) -> bool:
        """Whether ``rank``'s dump carries every thread's stack (commscope dumps do)."""
        dump = self._load.dumps.get(rank)
        return bool(dump and dump.threads)

    def main_place(self, rank: int) -> Place | None:
        """Where ``rank``'s main thread was when it dumped (its innermost user frame)."""
        dump = self._load.dumps.get(rank)
        return dump.main_place if dump else None

    def exception(self, rank: int) -> tuple[str, str, Place | None] | None:
        """(type, message, where it was raised) of the exception that made ``rank`` dump."""
        dump = self._load.dumps.get(rank)
        return dump.exception if dump else None
