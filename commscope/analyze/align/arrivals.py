"""When each rank arrived at each collective of a group, side by side: who comes last.

Per group (:func:`group_arrivals`):

1. Take the newest ``window`` sequence numbers (default 256; fewer on huge jobs: about
   400 000 arrivals are read in all, at least 8 collectives per group) that every member
   with a dump recorded and finished, where they agree (no mismatch).
2. A rank's arrival at a collective is its ``time_created_ns``, on rank 0's clock when
   the dumps carry their clock offsets (the reader moves them there). On a device
   backend (NCCL) that is only when the host queued it, ahead of its GPU by any amount:
   there the arrival is when the device reached it, told from the collective's
   ``duration_ms`` (timing on: the members end a collective together, so the one that
   came last spent least time in it, :func:`_device_arrivals`); a group with a member
   whose dump has no durations is not timed at all. For each
   collective, the last rank to arrive (the highest rank on a tie) and its lag behind
   the first are noted, and how long every other rank waited for the last one. On
   several hosts, a member on another host than rank 0 whose dump (ours) carries no
   offset leaves the group ``unaligned``: its times are on a clock of their own.
3. :class:`Arrivals` keeps, per rank, how often it came last and its lags then, and per
   group the time its members spent waiting for the last arrival against the time they
   spent in the window (the share of wall time lost to late arrivals).

Who is a straggler (:meth:`Arrivals.stragglers`, with :class:`Thresholds`):

4. A rank is one when the group has at least ``min_timed`` timed collectives and is not
   unaligned, the rank came last at ``last_share`` of them or more, its median lag then
   is ``lag_ms`` or more (and more than twice the clock offsets' uncertainty), and the
   members lost ``min_lost_share`` of their wall time or more waiting.
5. On several hosts, a host with two or more of the group's ranks is one when its ranks
   together pass step 4 and each of them came last at least half as often as an even
   split of the host's count gives it (the whole host is slow, not one rank on it); its
   ranks are then not named one by one.

The defaults (:data:`DEFAULT_THRESHOLDS`) were measured on real gloo jobs with one slow
rank and with ordinary jitter (``bench/straggler_thresholds.py``, docs/analyze.md). The
straggler finding (``diagnose/timing.py``), the report's "slowest ranks" section and the
live view read the same figures and the same thresholds.
"""

from __future__ import annotations

import statistics
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from commscope.analyze.align.match import GroupView
from commscope.analyze.model import (
    COMPLETED,
    GAP,
    RETIRED,
    TIMED_TAIL,
    LoadResult,
    RankDump,
    Track,
)

__all__ = ["Arrivals", "HostLag", "Thresholds", "DEFAULT_THRESHOLDS", "STRAGGLER_MS",
           "LAST_SHARE", "MIN_TIMED", "MIN_LOST_SHARE", "group_arrivals", "note_clocks", "tally",
           "unusable",
           "WINDOW", "BUDGET"]

WINDOW = TIMED_TAIL
"""Newest collectives read per group (a device backend's tracks keep their device times
for no more: :data:`commscope.analyze.model.TIMED_TAIL`)."""
BUDGET = 400_000
"""Arrivals read in all, over every group (bounded work on huge jobs)."""

STRAGGLER_MS = 30.0
"""Default median lag (ms) behind the first arrival from which a rank that keeps coming
last is a straggler (``--straggler-ms``). Measured (``bench/straggler_thresholds.py``,
docs/analyze.md): in healthy jobs, a rank that comes last half the time or more lags at
most 25 ms (others, last a third of the time, up to 28 ms); a slow rank 37-84 ms."""
LAST_SHARE = 0.7
"""Default share of the timed collectives a straggler came last at, at least. Measured:
at most 0.60 in a healthy job (in a pair, by chance; 0.58 for two ranks doing a little
more work than the others), at least 0.79 for a slow rank."""
MIN_TIMED = 8
"""Default number of timed collectives a group needs before anyone in it is called a
straggler (and before its slowest ranks are shown): with fewer, who comes last is mostly
chance (one rank of four last at 6 of 8 by chance: under 0.5 %)."""
MIN_LOST_SHARE = 0.01
"""Default share of the members' wall time lost waiting below which nobody is named: a
rank always 40 ms late in 10 s steps costs the others 0.3 %, not worth a finding. It does
not tell jitter from stragglers: healthy jobs with jitter lost 5-35 % in short steps,
with a slow rank 44-62 %."""


@dataclass(frozen=True, slots=True)
class Thresholds:
    """When a rank (or a host) that keeps arriving last is called a straggler (steps 4-5
    of the module doc). One place for the analyzer, its reports and the live view."""

    lag_ms: float = STRAGGLER_MS
    """Median lag behind the first arrival, when it came last, at least (ms)."""
    last_share: float = LAST_SHARE
    """Share of the timed collectives it came last at, at least."""
    min_timed: int = MIN_TIMED
    """Timed collectives the group needs, at least."""
    min_lost_share: float = MIN_LOST_SHARE
    """Share of the members' wall time lost waiting, at least."""


DEFAULT_THRESHOLDS = Thresholds()
"""The measured defaults (docs/analyze.md, "Stragglers")."""


@dataclass(frozen=True, slots=True)
class HostLag:
    """A host whose ranks in one group came last together (step 5 of the module doc)."""

    host: str
    ranks: list[int]
    """The group's ranks on that host, sorted."""
    last: int
    """Collectives at which one of them came last."""
    lags: list[int]
    """Their lags (ns) behind the first arrival then."""

    def lag_ms(self, q: float = 0.5) -> float:
        """The lag (ms) at quantile ``q`` of the times one of them came last."""
        return _quantile_ms(self.lags, q)


def _quantile_ms(lags: list[int], q: float) -> float:
    values = sorted(lags)
    if not values:
        return 0.0
    if q == 0.5:
        return statistics.median(values) / 1e6
    return values[min(len(values) - 1, int(q * len(values)))] / 1e6


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
    ops: dict[str, int] = field(default_factory=dict)
    """Op → how many of the timed collectives were that op (``all_reduce``)."""
    unaligned: list[int] = field(default_factory=list)
    """Members on another host than rank 0 whose dump (ours) carries no clock offset:
    their times cannot be put on rank 0's clock, so nobody is called a straggler."""
    device: bool = False
    """Arrivals of devices (a device backend: told from each collective's duration), not
    of threads."""
    clock_uncertainty_ns: int = 0
    """The largest uncertainty of the clock offsets of members on another host than
    rank 0: a lag must be twice this before it counts."""

    def lost_share(self) -> float:
        """Share of the members' wall time in the window spent waiting for late ranks."""
        whole = self.span_ns * len(self.ranks)
        return self.waited_ns / whole if whole > 0 else 0.0

    def lag_ms(self, rank: int, q: float = 0.5) -> float:
        """``rank``'s lag (ms) at quantile ``q`` of the times it came last (0 if never)."""
        return _quantile_ms(self.lags.get(rank, []), q)

    def slowest(self, n: int = 3) -> list[int]:
        """The ranks that came last most often, most first (ties: lower rank first)."""
        return sorted(self.last, key=lambda r: (-self.last[r], r))[:n]

    def _passes(self, last: int, lags: list[int], th: Thresholds) -> bool:
        """Step 4 of the module doc for ``last`` arrivals with these ``lags``."""
        return (self.samples >= th.min_timed and last > 0 and not self.unaligned
                and last >= th.last_share * self.samples
                and _quantile_ms(lags, 0.5) >= max(th.lag_ms,
                                                   2 * self.clock_uncertainty_ns / 1e6)
                and self.lost_share() >= th.min_lost_share)

    def straggles(self, rank: int, th: Thresholds = DEFAULT_THRESHOLDS) -> bool:
        """Whether ``rank`` alone passes ``th`` (step 4; hosts are not asked)."""
        return self._passes(self.last.get(rank, 0), self.lags.get(rank, []), th)

    def by_host(self, host_of: Callable[[int], str | None]) -> list[HostLag]:
        """Per host of the group's ranks (``host_of(rank)``, ``None`` when unknown), the
        times its ranks came last, most first; ``[]`` when the ranks are not on two
        known hosts or more."""
        members: dict[str, list[int]] = {}
        for r in self.ranks:
            host = host_of(r)
            if host is not None:
                members.setdefault(host, []).append(r)
        if len(members) < 2:
            return []
        rows = [HostLag(host=h, ranks=sorted(rs), last=sum(self.last.get(r, 0) for r in rs),
                        lags=[lag for r in rs for lag in self.lags.get(r, [])])
                for h, rs in members.items()]
        return sorted(rows, key=lambda x: (-x.last, x.ranks[0]))

    def stragglers(self, host_of: Callable[[int], str | None] | None = None,
                   th: Thresholds = DEFAULT_THRESHOLDS) -> tuple[list[HostLag], list[int]]:
        """The slow hosts (step 5, with ``host_of``) and the slow ranks on no slow host
        (step 4), each most often last first."""
        hosts = []
        for h in self.by_host(host_of) if host_of is not None else []:
            even = h.last / len(h.ranks)
            if len(h.ranks) > 1 and self._passes(h.last, h.lags, th) and all(
                    2 * self.last.get(r, 0) >= even for r in h.ranks):
                hosts.append(h)
        on_slow = {r for h in hosts for r in h.ranks}
        ranks = [r for r in self.slowest(len(self.last))
                 if r not in on_slow and self.straggles(r, th)]
        return hosts, ranks


def _device_arrivals(tracks: list[Track], windows: list[tuple[int, int]]) -> list[array]:
    """When each member's device reached each collective of the window (step 2 on a
    device backend): the members of a collective end it together, so a device that
    came later spent less time in it; its arrival is the collective's end less its own
    duration. The end is the median of the members' seen completions (the watchdog sees
    them up to a poll late: this moves every member alike and leaves the lags exact).
    0 where a member's duration or every completion is missing (not timed)."""
    out = [array("q", bytes(8 * (b - a))) for a, b in windows]
    n = windows[0][1] - windows[0][0]
    # the times cover each track's tail only: position i of a track is i - off there
    offs = [len(t.sig) - len(t.duration) for t in tracks]  # type: ignore[arg-type]

    def at(col: array, k: int, j: int) -> int:
        i = windows[k][0] + j - offs[k]
        return col[i] if 0 <= i < len(col) else 0

    for j in range(n):
        ends = sorted(e for e in (at(t.done, k, j) for k, t in enumerate(tracks))  # type: ignore[arg-type]
                      if e > 0)
        if not ends:
            continue
        end = ends[len(ends) // 2]
        for k, t in enumerate(tracks):
            dur = at(t.duration, k, j)  # type: ignore[arg-type]
            out[k][j] = end - dur if dur > 0 else 0
    return out


def tally(got: Arrivals, columns: list[Sequence[int]], ops: Sequence[str],
          skip: set[int] | frozenset[int] = frozenset()) -> None:
    """Time ``got``'s collectives: ``columns`` holds each member's arrival times (ns, in
    ``got.ranks`` order, one per collective of the window), ``ops`` each collective's op;
    positions in ``skip`` are left out (step 2 of the module doc)."""
    ranks = got.ranks
    top = len(ranks) - 1
    first_seen = last_seen = None
    for pos, times in enumerate(zip(*columns)):  # one tuple per collective, C-level
        if pos in skip:
            continue
        got.samples += 1
        op = ops[pos]
        got.ops[op] = got.ops.get(op, 0) + 1
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


def note_clocks(got: Arrivals, dumps: dict[int, RankDump],
                host_of: Callable[[int], str | None]) -> None:
    """Step 2's claim on one clock: on several hosts, the members on another host than
    rank 0's whose dump (ours) carries no clock offset make ``got`` unaligned, and the
    largest uncertainty of the others' offsets is kept."""
    if len({host_of(r) for r in got.ranks} - {None}) < 2:
        return
    home = host_of(0)
    away = [r for r in got.ranks if r != 0 and (home is None or host_of(r) != home)]
    got.unaligned = [r for r in away if dumps[r].source == "commscope"
                     and dumps[r].clock_offset_ns is None]
    got.clock_uncertainty_ns = max((dumps[r].clock_uncertainty_ns or 0 for r in away),
                                   default=0)


def group_arrivals(load: LoadResult, views: dict[str, GroupView], window: int = WINDOW,
                   budget: int = BUDGET) -> dict[str, Arrivals]:
    """Group key → :class:`Arrivals`, for groups with two or more members that all have
    records of the group (see module doc)."""
    out: dict[str, Arrivals] = {}
    per_group = budget // max(1, len(views))
    host = {r: d.place.host if d.place is not None else d.hostname
            for r, d in load.dumps.items()}
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
        first_sigs = tracks[0].sig[start - tracks[0].lo:hi + 1 - tracks[0].lo]  # type: ignore[union-attr]
        sigs = load.sigs.sigs
        device = any(load.dumps[r].kind is not None and load.dumps[r].kind.device
                     for r in ranks)
        if device and any(t.duration is None for t in tracks):  # type: ignore[union-attr]
            continue  # enqueued, not arrived: nothing says when each GPU came
        columns = []
        windows = [(start - t.lo, hi + 1 - t.lo) for t in tracks]  # type: ignore[union-attr]
        device_times = _device_arrivals(tracks, windows) if device else None  # type: ignore[arg-type]
        for k, t in enumerate(tracks):
            a, b = windows[k]
            created = device_times[k] if device_times is not None else t.created[a:b]  # type: ignore[union-attr]
            skip.update(unusable(t.sig[a:b], t.status[a:b], created))  # type: ignore[union-attr]
            columns.append(created)
        got = Arrivals(ranks=ranks, lo=start, hi=hi, device=device)
        note_clocks(got, load.dumps, host.get)
        ops = [sigs[sid].op if 0 <= sid < len(sigs) else "?" for sid in first_sigs]
        tally(got, columns, ops, skip)
        out[key] = got
    return out
