"""When each rank arrived at each collective of a group, side by side: who comes last.

Per group (:func:`group_arrivals`):

1. Take the newest ``window`` sequence numbers (default 256; fewer on huge jobs: about
   400 000 arrivals are read in all, at least 8 collectives per group) that every member
   with a dump recorded and finished, where they agree (no mismatch).
2. A rank's arrival at a collective is its ``time_created_ns``, on rank 0's clock when the
   dumps carry their clock offsets (the reader moves them there). For each collective,
   the last rank to arrive (the highest rank on a tie) and its lag behind the first are
   noted, and how long every other rank waited for the last one.
3. :class:`Arrivals` keeps, per rank, how often it came last and its lags then, and per
   group the time its members spent waiting for the last arrival against the time they
   spent in the window (the share of wall time lost to late arrivals).

The straggler finding (``diagnose/timing.py``) and the report's "slowest ranks" section
read the same figures.
"""

from __future__ import annotations

import statistics
from array import array
from dataclasses import dataclass, field

from commscope.analyze.align.match import GroupView
from commscope.analyze.model import COMPLETED, GAP, RETIRED, LoadResult

__all__ = ["Arrivals", "group_arrivals", "unusable", "WINDOW", "BUDGET"]

WINDOW = 256
"""Newest collectives read per group."""
BUDGET = 400_000
"""Arrivals read in all, over every group (bounded work on huge jobs)."""

_DONE = RETIRED | COMPLETED
_DONE_TABLE = bytes(1 if b & _DONE else 0 for b in range(256))


def unusable(sig: array, status: array, created: array) -> set[int]:
    """Positions of a window that cannot be timed: a gap, unfinished, or no timestamp."""
    out: set[int] = set()
    if GAP in sig:
        out.update(i for i, s in enumerate(sig) if s == GAP)
    done = status.tobytes().translate(_DONE_TABLE)
    if 0 in done:
        out.update(i for i, d in enumerate(done) if not d)
    if min(created, default=1) <= 0:
        out.update(i for i, c in enumerate(created) if c <= 0)
    return out


@dataclass
class Arrivals:
    """The arrival figures of one group's newest finished collectives."""

    ranks: list[int]
    """The members with a dump, in group order."""
    lo: int
    hi: int
    """The sequence numbers of the window."""
    samples: int = 0
    """Collectives timed (the window less those that cannot be)."""
    last: dict[int, int] = field(default_factory=dict)
    """Rank → how many of them it arrived at last."""
    lags: dict[int, list[int]] = field(default_factory=dict)
    """Rank → its lags (ns) behind the first arrival, when it came last."""
    waited_ns: int = 0
    """Time the members spent waiting for the last arrival, summed over ranks."""
    span_ns: int = 0
    """From the first arrival of the window to the last arrival of its newest collective."""

    def lost_share(self) -> float:
        """Share of the members' wall time in the window spent waiting for late ranks."""
        whole = self.span_ns * len(self.ranks)
        return self.waited_ns / whole if whole > 0 else 0.0

    def lag_ms(self, rank: int, q: float = 0.5) -> float:
        """``rank``'s lag (ms) at quantile ``q`` of the times it came last (0 if never)."""
        values = sorted(self.lags.get(rank, ()))
        if not values:
            return 0.0
        if q == 0.5:
            return statistics.median(values) / 1e6
        return values[min(len(values) - 1, int(q * len(values)))] / 1e6

    def slowest(self, n: int = 3) -> list[int]:
        """The ranks that came last most often, most first (ties: lower rank first)."""
        return sorted(self.last, key=lambda r: (-self.last[r], r))[:n]


def group_arrivals(load: LoadResult, views: dict[str, GroupView], window: int = WINDOW,
                   budget: int = BUDGET) -> dict[str, Arrivals]:
    """Group key → :class:`Arrivals`, for groups with two or more members that all have
    records of the group (see module doc)."""
    out: dict[str, Arrivals] = {}
    per_group = budget // max(1, len(views))
    for key in sorted(views):
        view = views[key]
        ranks = [r for r in view.group.ranks if r in load.dumps]
        tracks = [load.dumps[r].tracks.get(key) for r in ranks]
        if len(ranks) < 2 or any(t is None or not len(t) for t in tracks):
            continue
        span = max(8, min(window, per_group // len(ranks)))
        lo = max(t.lo for t in tracks)  # type: ignore[union-attr]
        hi = min(t.hi for t in tracks)  # type: ignore[union-attr]
        start = max(lo, hi - span + 1)
        if hi < start:
            continue
        skip = {m.seq - start for m in view.mismatches if start <= m.seq <= hi}
        columns = []
        for t in tracks:
            a, b = start - t.lo, hi + 1 - t.lo  # type: ignore[union-attr]
            created = t.created[a:b]  # type: ignore[union-attr]
            skip.update(unusable(t.sig[a:b], t.status[a:b], created))  # type: ignore[union-attr]
            columns.append(created)
        got = Arrivals(ranks=ranks, lo=start, hi=hi)
        top = len(ranks) - 1
        first_seen = last_seen = None
        for pos, times in enumerate(zip(*columns)):  # one tuple per collective, C-level
            if pos in skip:
                continue
            got.samples += 1
            when = max(times)
            first = min(times)
            rank = ranks[top - times[::-1].index(when)]  # the highest rank on a tie
            got.last[rank] = got.last.get(rank, 0) + 1
            got.lags.setdefault(rank, []).append(when - first)
            got.waited_ns += when * len(times) - sum(times)
            first_seen = first if first_seen is None else first_seen
            last_seen = when
        if first_seen is not None and last_seen is not None:
            got.span_ns = max(0, last_seen - first_seen)
        out[key] = got
    return out
