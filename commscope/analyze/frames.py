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

__all__ = ["Frame", "user_frame", "FrameSource"]

logger = logging.getLogger(__name__)

Frame = tuple[str, str, int]
"""(function name, file name, line)."""

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


class FrameSource:
    """Reads records back from the dump files (frames; completion times when they were
    not kept while loading), small cache."""

    def __init__(self, load: LoadResult) -> None:
        self._load = load
        self._cache: OrderedDict[str, list[Any]] = OrderedDict()

    def _entries(self, path: str) -> list[Any]:
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
