"""Group creations: when this rank began and finished creating each process group.

Creating a group is a rendezvous of its members (gloo connects every pair, NCCL sets up
a communicator), and it blocks until every member comes. A rank that never creates a
group leaves the others blocked *outside* every collective, where the ring has nothing
to say. So the recorder notes each creation this rank takes part in (the default group
of ``init_process_group`` included): its name, description and members, when it
started and ended, and the user's line that asked for it. A creation still unfinished
is what the watchdog's timeout sees, what a dump lists and what ``commscope watch``
shows.

Creations are kept in a small bounded ring of their own, beside the collectives' ring:
PyTorch's dump format has no such record, and its ``fr_trace`` must keep reading our
files. They are dumped as ``commscope_group_creations`` (``docs/formats.md``).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

from commscope.flight.record.entry import FrameCache, frame_dicts

__all__ = ["Creation", "Creations", "CAPACITY"]

CAPACITY = 256
"""Creations kept (the newest); a job creates a few groups per mesh axis."""


class Creation:
    """One group creation this rank took part in."""

    __slots__ = ("desc", "end_ns", "failed", "frames", "name", "ranks", "seq", "start_ns",
                 "thread", "timeout_ns")

    def __init__(self, seq: int, name: str, desc: str, ranks: Sequence[int],
                 frames: Sequence[Any], thread: str, timeout_ns: int) -> None:
        self.seq = seq
        """This rank's creation count (1 for its first group)."""
        self.name = name
        self.desc = desc
        self.ranks = list(ranks)
        """Global ranks of the members."""
        self.frames = frames
        """Flat ``[code, offset, ...]`` of the call that created it (the user's line)."""
        self.thread = thread
        self.timeout_ns = timeout_ns
        """The group's timeout: a creation pending longer is a hang."""
        self.start_ns = time.time_ns()
        self.end_ns: int | None = None
        self.failed = False

    @property
    def pending(self) -> bool:
        """Still being created."""
        return self.end_ns is None

    def to_dict(self, cache: FrameCache, include_stack: bool = True) -> dict[str, Any]:
        """The plain dict a dump holds."""
        return {
            "seq": self.seq,
            "name": self.name,
            "desc": self.desc,
            "ranks": list(self.ranks),
            "state": "started" if self.end_ns is None else (
                "failed" if self.failed else "completed"),
            "time_started_ns": self.start_ns,
            "time_ended_ns": self.end_ns,
            "timeout_ms": self.timeout_ns // 1_000_000,
            "thread_name": self.thread,
            "frames": frame_dicts(self.frames, cache) if include_stack else [],
        }


class Creations:
    """The ring of creations (thread-safe: groups are made from any thread)."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self._items: deque[Creation] = deque(maxlen=capacity)
        self._lock = threading.Lock()
        self._count = 0

    def started(self, name: str, desc: str, ranks: Sequence[int], frames: Sequence[Any],
                timeout_ns: int) -> Creation:
        """Note that this rank began creating a group; returns its record."""
        with self._lock:
            self._count += 1
            c = Creation(self._count, name, desc, ranks, frames,
                         threading.current_thread().name, timeout_ns)
            self._items.append(c)
        return c

    @staticmethod
    def ended(c: Creation, failed: bool = False) -> None:
        """The creation returned (or raised: ``failed``)."""
        c.failed = failed
        c.end_ns = time.time_ns()

    def snapshot(self) -> list[Creation]:
        """The creations kept, oldest first."""
        with self._lock:
            return list(self._items)

    def pending(self) -> list[Creation]:
        """The creations not finished yet."""
        return [c for c in self.snapshot() if c.end_ns is None]
