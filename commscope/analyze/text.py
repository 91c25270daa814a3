"""Small wording helpers shared by the findings and the reports."""

from __future__ import annotations

import os
from collections.abc import Iterable

__all__ = ["rank_list", "ranks_phrase", "plural", "frame_text", "place_text", "ms",
           "UNKNOWN_LINE"]

UNKNOWN_LINE = "an unknown line (no stack recorded)"
"""Where a record without a stack is: read after "at" (PyTorch's dumps without stack
traces, records whose frames were dropped)."""


def rank_list(ranks: Iterable[int], limit: int = 12) -> str:
    """``0-3, 6, 9-11``: sorted, runs collapsed, long lists cut with a count."""
    values = sorted(set(ranks))
    if not values:
        return "none"
    runs: list[str] = []
    start = prev = values[0]
    for r in [*values[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        runs.append(str(start) if start == prev else (
            f"{start}, {prev}" if prev == start + 1 else f"{start}-{prev}"))
        if r is not None:
            start = prev = r
    if len(runs) > limit:
        shown = ", ".join(runs[:limit])
        return f"{shown}, ... ({len(values)} ranks)"
    return ", ".join(runs)


def ranks_phrase(ranks: Iterable[int]) -> str:
    """``rank 3`` or ``ranks 0, 1``."""
    values = sorted(set(ranks))
    return f"rank {values[0]}" if len(values) == 1 else f"ranks {rank_list(values)}"


def plural(n: int, word: str) -> str:
    """``1 rank``, ``2 ranks``."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def frame_text(frame: tuple[str, str, int] | None) -> str:
    """``train.py:42 in step`` for a (name, filename, line) frame; ``an unknown line (no
    stack recorded)`` without one (it reads after "at" like a place)."""
    if frame is None:
        return UNKNOWN_LINE
    name, filename, line = frame
    return f"{os.path.basename(filename) or filename}:{line} in {name}"


def place_text(place: tuple[str, str, int, str] | None) -> str:
    """``loader.py:42 in load_batch (time.sleep(60))``: a frame and the line it runs."""
    if place is None:
        return UNKNOWN_LINE
    name, filename, line, code = place
    where = f"{os.path.basename(filename) or filename}:{line} in {name}"
    return f"{where} ({code})" if code else where


def ms(ns: float) -> str:
    """A duration in nanoseconds as readable text."""
    value = ns / 1e6
    if value >= 1000:
        return f"{value / 1000:.1f} s"
    if value >= 10:
        return f"{value:.0f} ms"
    return f"{value:.2f} ms"
