"""How far each rank got in each group: what its thread issued, what its device finished,
and its unfinished work in the order it will run.

One model for both kinds of backend (:class:`RankProgress`). On gloo a call blocks the
thread that made it, so a rank's unfinished record *is* where its thread waits and its
newest record is as far as it issued. On NCCL (any device backend,
:attr:`~commscope.analyze.model.DumpKind.device`) a call returns once the op is queued
on the device: the thread goes on issuing until a host sync, the unfinished records are
a queue of device work (only the oldest is running; the rest wait behind it), and how
far the thread issued is ``pg_status``'s ``last_enqueued_collective``, a number the
records alone may not show (an active-only dump keeps unfinished entries only).

Algorithm (:func:`build_progress`), per rank:

1. **Join ``pg_status`` to the groups** (:func:`status_by_group`): its keys are the
   rank's own ``pg_id`` numbers, which differ between ranks (a rank builds no backend
   for a group it is not in), so each row is joined through the rank's own entries
   (``pg_id`` beside the group's name). Groups without an entry are joined by creation
   order (``pg_id`` counts the rank's groups as it created them, as the numbered names
   of its ``pg_config`` do), only when that order agrees with every pair the entries
   give (never with another rank's pairs). A row
   counts collectives in a group that ran collectives only; a p2p-only group's row
   counts send/recv work; in a group that did both it counts whatever its last work
   was, so it is used only when the rank's newest record there says which.
2. **Per group** (:class:`GroupProgress`): ``issued`` is the newest collective the
   thread issued (the newest record, or the row's last enqueued, whichever is
   further); ``pending`` the unfinished collectives (a coalesced batch's ops take the
   batch's state); ``done`` the collective before the oldest unfinished one, or
   everything issued when none is unfinished (in an active-only dump an issued
   collective without an entry finished).
3. **The queue** (:class:`Item`): the unfinished work in record order, one item per
   collective, per lone send/recv, and per coalesced batch (its ops together). On a
   device backend it is the device's queue, ``queue[0]`` the op it is in or stuck
   before; on gloo the thread waits in ``queue[0]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from commscope.analyze.model import (
    COMPLETED,
    DEVICE_BACKENDS,
    RETIRED,
    STARTED,
    DumpKind,
    Group,
    LoadResult,
    P2POp,
    RankDump,
)

__all__ = ["GroupProgress", "Item", "RankProgress", "build_progress", "status_by_group",
           "group_kinds", "SEEN_MARGIN_NS"]

_DONE = RETIRED | COMPLETED


@dataclass(slots=True)
class GroupProgress:
    """One rank's progress in one group (collective sequence numbers)."""

    issued: int = 0
    """The newest collective its thread issued (0: none)."""
    done: int = 0
    """Every collective up to this one finished on the rank (0: none)."""
    pending: list[int] = field(default_factory=list)
    """Unfinished collectives, oldest first."""
    from_status: bool = False
    """``issued`` comes from (or agrees with) the group's ``pg_status`` row."""


@dataclass(slots=True)
class Item:
    """One unit of a rank's unfinished work."""

    group: str
    seq: int | None
    """The collective's sequence number; ``None`` for send/recv."""
    index: int
    """Position of its entry in the rank's file (a batch's closing entry)."""
    ops: tuple[P2POp, ...] = ()
    """The send/recv it is (a batch's ops together)."""
    started: bool = False
    """Its start was seen (device backends with timing on: it is running)."""

    def same(self, other: Item | None) -> bool:
        """Whether ``other`` is the same work (the same collective, or a batch or op of
        the same entry)."""
        return other is not None and other.group == self.group and (
            other.seq == self.seq if self.seq is not None else other.index == self.index)


SEEN_MARGIN_NS = 50_000_000
"""How much earlier than a dump an event on another rank must be for the dump to be
expected to show it: commscope's recorder polls every device work as it dumps, so only
the clocks' alignment (rank 0's clock, to well under a millisecond on one host, a few on
a network) and the dump's own time in flight lie between."""


@dataclass(slots=True)
class RankProgress:
    """Everything the model says of one rank."""

    rank: int
    kind: DumpKind
    groups: dict[str, GroupProgress] = field(default_factory=dict)
    queue: list[Item] = field(default_factory=list)
    dump: RankDump | None = None
    as_of: int | None = None
    """When the dump was taken (commscope's say; on rank 0's clock), else ``None``:
    PyTorch's dumps carry no time, so theirs are read as one instant."""

    def sees(self, event_ns: int | None) -> bool:
        """Whether this rank's dump was taken late enough to show something that
        happened at ``event_ns`` on another rank (always, when either time is unknown)."""
        if self.as_of is None or not event_ns:
            return True
        return event_ns <= self.as_of - SEEN_MARGIN_NS

    def created(self, group: str, seq: int) -> int | None:
        """When this rank issued collective ``seq`` of ``group`` (``None``: unknown)."""
        d = self.dump
        t = d.tracks.get(group) if d is not None else None
        if t is None or not t.lo <= seq <= t.hi:
            return None
        value = t.created[seq - t.lo]
        return value or None

    def finished_at(self, group: str, seq: int) -> int | None:
        """When this rank's record of collective ``seq`` of ``group`` finished, where the
        dump kept the time (``None``: unknown)."""
        d = self.dump
        t = d.tracks.get(group) if d is not None else None
        if d is None or d.ends is None or t is None or not t.lo <= seq <= t.hi:
            return None
        index = t.index[seq - t.lo]
        return d.ends[index] or None if 0 <= index < len(d.ends) else None

    def issued_by(self, group: str, when: int | None) -> int:
        """How far this rank had issued ``group``'s collectives at ``when`` (everything it
        issued, when ``when`` or its times are unknown)."""
        issued = self.issued(group)
        if when is None or self.dump is None:
            return issued
        t = self.dump.tracks.get(group)
        if t is None or not len(t):
            return issued
        n = issued
        while n >= t.lo and n <= t.hi and (t.created[n - t.lo] or 0) > when:
            n -= 1
        return n

    @property
    def device(self) -> bool:
        """Its calls return at once and run on a device queue (NCCL and the like)."""
        return self.kind.device

    @property
    def head(self) -> Item | None:
        """The oldest unfinished work: the op running (or stuck before it runs)."""
        return self.queue[0] if self.queue else None

    def issued(self, group: str) -> int:
        """The newest collective of ``group`` the rank's thread issued (0: none)."""
        g = self.groups.get(group)
        return g.issued if g is not None else 0

    def finished(self, group: str, seq: int) -> bool:
        """Whether collective ``seq`` of ``group`` finished on this rank."""
        g = self.groups.get(group)
        if g is None or seq > g.issued:
            return False
        return seq <= g.done or seq not in g.pending


def group_kinds(load: LoadResult) -> dict[str, str]:
    """Group name -> ``collective``, ``p2p`` or ``mixed``: what its records are, on every
    rank (which counter its ``pg_status`` rows count)."""
    seen: dict[str, set[str]] = {}
    for d in load.dumps.values():
        for name in d.tracks:
            seen.setdefault(name, set()).add("collective")
        for op in d.p2p:
            seen.setdefault(op.group, set()).add("p2p")
        for name, _ in d.batches:
            seen.setdefault(name, set()).add("p2p")
    return {name: kinds.pop() if len(kinds) == 1 else "mixed" for name, kinds in seen.items()}


def _as_number(name: str) -> int | None:
    return int(name) if name.isdigit() else None


def status_by_group(d: RankDump) -> dict[str, tuple[int, int, int]]:
    """Step 1 of the module doc: group name -> (last enqueued, started, completed)."""
    out: dict[str, tuple[int, int, int]] = {}
    if not d.pg_status:
        return out
    for name, pg_id in d.group_pg_id.items():
        row = d.pg_status.get(pg_id)
        if row is not None:
            out[name] = row
    numbered = sorted((n, name) for name in d.config if (n := _as_number(name)) is not None)
    if len(numbered) == len(d.config) and d.group_pg_id:
        # pg_id counts the rank's groups in creation order, as the numbered names do
        by_order = {name: i for i, (_, name) in enumerate(numbered)}
        if all(by_order.get(name) == pg_id for name, pg_id in d.group_pg_id.items()):
            for name, pg_id in by_order.items():
                row = d.pg_status.get(pg_id)
                if row is not None:
                    out.setdefault(name, row)
    return out


def _newest_is_p2p(d: RankDump, group: str) -> bool | None:
    """Whether the rank's newest record of ``group`` is a send/recv (``None``: none)."""
    newest_coll = -1
    t = d.tracks.get(group)
    if t is not None and len(t):
        newest_coll = max(i for i in t.index if i >= 0) if not isinstance(t.index, range) \
            else t.index[-1]
    newest_p2p = max((op.index for op in d.p2p if op.group == group), default=-1)
    newest_p2p = max([newest_p2p, *(i for (g, _), (_, i) in d.batches.items() if g == group)])
    if newest_coll < 0 and newest_p2p < 0:
        return None
    return newest_p2p > newest_coll


def _queue(d: RankDump) -> list[Item]:
    """Step 3 of the module doc."""
    by_index = {op.index: op for op in d.p2p}
    closing = {index: key for key, (_, index) in d.batches.items()}
    batch_ops: dict[tuple[str, int], list[P2POp]] = {}
    for op in d.p2p:
        if op.batch:
            batch_ops.setdefault((op.group, op.p2p_seq), []).append(op)
    items: list[Item] = []
    seen_batches: set[tuple[str, int]] = set()
    for group, seq, index in d.pending:
        if seq >= 0:
            t = d.tracks.get(group)
            started = bool(t is not None and t.lo <= seq <= t.hi
                           and t.status[seq - t.lo] & STARTED)
            items.append(Item(group, seq, index, started=started))
            continue
        op = by_index.get(index)
        key = closing.get(index)
        if op is not None and op.batch:
            key = (op.group, op.p2p_seq)
        if key is not None:
            if key in seen_batches:
                continue
            seen_batches.add(key)
            ops = tuple(sorted(batch_ops.get(key, ()), key=lambda o: o.index))
            status, end = d.batches.get(key, (op.status if op else 0, index))
            items.append(Item(key[0], None, end, ops, started=bool(status & STARTED)))
        elif op is not None and op.settled:
            items.append(Item(group, None, index, (op,), started=bool(op.status & STARTED)))
    items.sort(key=lambda it: it.index)
    return items


def build_progress(load: LoadResult, groups: dict[str, Group]) -> dict[int, RankProgress]:
    """Every loaded rank's :class:`RankProgress` (see module doc)."""
    kinds = group_kinds(load)
    out: dict[int, RankProgress] = {}
    for rank, d in load.dumps.items():
        kind = d.kind or DumpKind(backend=d.backend, device=d.backend in DEVICE_BACKENDS,
                                  active_only=None, timing=None, stacks=None)
        device = kind.device
        rows = status_by_group(d) if device else {}
        prog = RankProgress(rank=rank, kind=kind, dump=d,
                            as_of=d.dump_time_ns if d.source == "commscope" else None)
        for name in set(d.tracks) | set(rows):
            t = d.tracks.get(name)
            g = GroupProgress()
            if t is not None and len(t):
                g.issued = t.hi
                g.pending = [t.lo + i for i, s in enumerate(t.status)
                             if not s & _DONE and t.sig[i] >= 0]
            row = rows.get(name)
            if row is not None and row[0] > 0:
                counts = kinds.get(name, "collective")
                newest_p2p = _newest_is_p2p(d, name)
                if counts == "collective" or (counts == "mixed" and newest_p2p is False):
                    g.from_status = row[0] >= g.issued
                    g.issued = max(g.issued, row[0])
            g.done = g.pending[0] - 1 if g.pending else g.issued
            if groups.get(name) is not None or g.issued:
                prog.groups[name] = g
        prog.queue = _queue(d)
        out[rank] = prog
    return out
