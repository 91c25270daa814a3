"""Records read back from the dump files only when a finding needs them (their frames).

Loading keeps no stacks (they are most of a dump's bytes and almost never needed). A
finding asks :class:`FrameSource` for one record's frames by (rank, record index); the
file is read again through the same safe loader, at most a few files are kept.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any

from commscope.analyze.model import LoadResult
from commscope.analyze.read.load import read_dump_file
from commscope.analyze.read.places import Frame, Place, user_frame

__all__ = ["FrameSource"]

logger = logging.getLogger(__name__)

_CACHE_FILES = 8


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
