"""A bounded, thread-safe ring of :class:`~commscope.flight.record.entry.Entry` records.

The ring is a preallocated list and a write counter: appending never allocates beyond
the entry itself, and memory stays flat however many collectives a job issues. The
oldest entry is overwritten once ``capacity`` entries have been written. Entries hold
no tensors (see :mod:`commscope.flight.record.entry`), so neither does the ring.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Generic, TypeVar

__all__ = ["Ring"]

T = TypeVar("T")


class Ring(Generic[T]):
    """Keep the last ``capacity`` items appended, oldest first on read.

    ``append`` and ``snapshot`` are safe to call from any thread. A capacity of 0 keeps
    nothing (appends are counted but dropped).
    """

    __slots__ = ("_capacity", "_items", "_lock", "_written")

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"ring capacity must be >= 0, got {capacity}")
        self._capacity = capacity
        self._items: list[T | None] = [None] * capacity
        self._written = 0
        self._lock = threading.Lock()

    @property
    def capacity(self) -> int:
        """How many items the ring keeps."""
        return self._capacity

    @property
    def lock(self) -> threading.Lock:
        """The lock ``append`` takes; the recorder holds it to number entries in order."""
        return self._lock

    @property
    def written(self) -> int:
        """How many items were ever appended (kept or overwritten)."""
        return self._written

    def __len__(self) -> int:
        return min(self._written, self._capacity)

    def append_locked(self, item: T) -> None:
        """Append while the caller already holds :attr:`lock`."""
        if self._capacity:
            self._items[self._written % self._capacity] = item
        self._written += 1

    def append(self, item: T) -> None:
        """Append one item, overwriting the oldest when full."""
        with self._lock:
            self.append_locked(item)

    def snapshot(self) -> list[T]:
        """The kept items, oldest first (a new list; the items themselves are shared)."""
        with self._lock:
            n, cap = self._written, self._capacity
            if cap == 0 or n == 0:
                return []
            if n <= cap:
                return list(self._items[:n])  # type: ignore[arg-type]
            start = n % cap
            return self._items[start:] + self._items[:start]  # type: ignore[return-value]

    def clear(self) -> None:
        """Forget every item (the write counter restarts too)."""
        with self._lock:
            self._items = [None] * self._capacity
            self._written = 0

    def __iter__(self) -> Iterator[T]:
        return iter(self.snapshot())
