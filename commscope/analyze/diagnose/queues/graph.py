"""The wait-for graph of device queues: who waits for whom on NCCL and its kin.

On a device backend a rank's unfinished records are the queue of its device
(:mod:`commscope.analyze.align.progress`): the device is in (or stuck before) the oldest
item, its *head*; every later item only waits behind it. So only a head waits for
anyone, and for whom follows from where the other members are:

Algorithm (:func:`queue_waits`), for every rank ``r`` with a device dump and a head:

1. **A collective** ``#s`` of group ``G``: for each other member ``q``:
   * ``q`` left no dump: ``r`` waits for it (``nodump``);
   * ``q``'s thread never issued ``#s`` (its ``issued`` in ``G`` is lower): ``r`` waits
     for ``q``'s thread (``lack``);
   * ``q`` finished ``#s``, or has it at its own head: nobody waits for the other;
   * else ``#s`` is queued on ``q`` behind ``q``'s own head: ``r`` waits for ``q``'s
     device (``behind``).

   Before that, the whole queue is read: an unfinished collective of ``r`` that
   **every** other member (with a dump) finished is a stale record (:func:`phantoms`):
   each of them exchanged data with ``r``'s kernel, so that kernel ran to its end, yet
   it was never noted done. One member finishing is not enough (in an all_to_all or a
   ring a rank may finish while another is still receiving). The device runs its queue
   in order, so it ran everything up to the newest such record: ``r``'s head is no
   place it waits in, ``r`` waits for nobody (:class:`Stale`, a device-side signature).
2. **A send/recv** (a lone op, or a coalesced batch whose ops are the item): each op's
   partner on the peer is found per channel (group, sender, receiver) in issue order
   (:func:`partner`): where both sides hold the channel's whole history (full dumps, or
   batches, whose own entries an active-only dump keeps) the k-th send pairs with the
   k-th recv; otherwise (active-only dumps of lone send/recv, whose kept ops are the
   newest, unfinished ones) the oldest kept pairs with the oldest kept. A partner never posted is a
   ``lack``, one at the peer's head nothing, one queued behind the peer's head a
   ``behind``, one the peer finished a stale record of ``r``.
3. **Timing on**: a head that never started while every other member runs it (its
   start event fired there) or finished it shows the device stuck before it: recorded
   as stale too (``running_on``).

A rank whose stale head makes it a device-side culprit, a rank that lacks what others
wait for and waits for nobody (a thread-side culprit), the cycles, and a head every
member is inside (no one waits, none finished) are told in :mod:`.roots`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from commscope.analyze.align.progress import Item, RankProgress, status_by_group
from commscope.analyze.diagnose.context import Context
from commscope.analyze.diagnose.waits import Wait, WaitGraph
from commscope.analyze.model import COMPLETED, RETIRED, Group, P2POp, RankDump

__all__ = ["Stale", "QueueGraph", "queue_waits", "partner"]

_DONE = RETIRED | COMPLETED


@dataclass(slots=True)
class Stale:
    """A rank whose unfinished records include work its peers finished (or, timing on,
    run while it never started it): its device stopped marking work done."""

    item: Item
    """The evidence: the newest such op (or the head, for a send/recv or timing)."""
    finished_by: list[int] = field(default_factory=list)
    """Peers that finished it."""
    running_on: list[int] = field(default_factory=list)
    """Peers running it while this rank never started it (timing on)."""
    phantoms: list[Item] = field(default_factory=list)
    """Every unfinished collective of the rank that all its peers finished."""


@dataclass(slots=True)
class QueueGraph:
    """The graph and what it saw on the way."""

    graph: WaitGraph
    stale: dict[int, Stale]
    """Ranks whose head a peer finished (or runs while it never started)."""
    heads: dict[int, Item]
    """Every device rank's head."""


def _history(d: RankDump, group: str, op: str, peer: int) -> tuple[list[P2POp], bool]:
    """The rank's ops of one channel direction in issue order, and whether they are its
    whole history there: a full dump's are; an active-only dump drops a finished op's
    entry, except a coalesced batch's own entries, which never finish and stay, so a
    channel where a finished op was kept is one of batches (Megatron's send/recv) and
    complete too."""
    ops = sorted((o for o in d.p2p if o.group == group and o.op == op and o.peer == peer),
                 key=lambda o: (o.p2p_seq, o.index))
    if d.kind is not None and d.kind.active_only is False and not d.wrapped:
        return ops, True
    return ops, bool(d.kind and d.kind.active_only) and any(o.status & _DONE for o in ops)


def partner(ctx: Context, progress: dict[int, RankProgress], rank: int,
            op: P2POp) -> tuple[str, P2POp | None]:
    """Where the partner of ``rank``'s unfinished ``op`` is: ``("pending", its op)``,
    ``("done", its op)``, ``("never", None)`` (the peer never posted it), ``("nodump",
    None)`` or ``("unknown", ...)`` (no peer known, or an op of the channel whose state an
    active-only dump cannot tell). See step 2 of the module doc."""
    q = op.peer
    if q is None:
        return "unknown", None
    d, other = ctx.load.dumps[rank], ctx.load.dumps.get(q)
    if other is None:
        return "nodump", None
    want = "recv" if op.op == "send" else "send"
    mine, whole = _history(d, op.group, op.op, q)
    theirs, whole_theirs = _history(other, op.group, want, rank)
    if whole and whole_theirs:
        k = next(i for i, o in enumerate(mine) if o is op)
        if k >= len(theirs):
            return "never", None
        found = theirs[k]
        return ("done" if found.status & _DONE else "pending"), found
    mine = [o for o in mine if not o.status & _DONE]
    theirs = [o for o in theirs if not o.status & _DONE]
    k = next((i for i, o in enumerate(mine) if o is op), 0)
    if k >= len(theirs):
        # nothing unfinished on the peer's side: it never posted it, unless an op of
        # this channel on either side cannot be told finished or not, or the peer's
        # count of send/recv work in a two-member group says it got that far
        if any(not o.settled for o in (*mine, *theirs)) or _posted_as_far(ctx, q, op):
            return "unknown", None
        return "never", None
    found = theirs[k]
    return ("pending" if found.settled else "unknown"), found


def _posted_as_far(ctx: Context, peer: int, op: P2POp) -> bool:
    """Whether ``peer``'s own count of send/recv work in ``op``'s group reaches ``op``'s
    ``p2p_seq_id``: comparable only in a group of two that runs send/recv only (every
    work of either side is with the other, batched alike), where the peer's
    ``pg_status`` row counts that work."""
    g = ctx.groups.get(op.group)
    d = ctx.load.dumps.get(peer)
    if g is None or d is None or len(g.ranks) != 2 or op.group in d.tracks:
        return False
    row = status_by_group(d).get(op.group)
    return row is not None and row[0] >= op.p2p_seq


def _item_of(prog: RankProgress, op: P2POp) -> Item | None:
    return next((it for it in prog.queue if any(o is op for o in it.ops)), None)


@dataclass
class _Members:
    """One collective's members, each told once for every rank whose head it is (a
    group of 4 096 ranks waiting in one collective costs N, not N squared)."""

    ordered: list[tuple[int, str]]
    """(member, why) of the members a rank with this head waits for, in group order:
    ``nodump``, ``lack`` (issued less; kept only if its dump is late enough to show
    it, :meth:`RankProgress.sees`) or ``behind`` (another head)."""
    finished: list[int]
    """Members that finished it."""
    started: list[int]
    """Members whose head it is too, and whose device started it."""
    peers: int
    """Members with a dump."""


def _members(ctx: Context, progress: dict[int, RankProgress], g: Group, head: Item
             ) -> _Members:
    seq = head.seq
    assert seq is not None
    ordered: list[tuple[int, str]] = []
    finished, started = [], []
    peers = 0
    for q in g.ranks:
        if q not in ctx.load.dumps:
            ordered.append((q, "nodump"))
            continue
        peers += 1
        other = progress[q]
        if other.issued(head.group) < seq:
            ordered.append((q, "lack"))
        elif other.finished(head.group, seq):
            finished.append(q)
        elif head.same(other.head):
            if other.head is not None and other.head.started:
                started.append(q)
        else:
            ordered.append((q, "behind"))
    return _Members(ordered, finished, started, peers)


def _collective_waits(ctx: Context, progress: dict[int, RankProgress], r: int, head: Item,
                      waits: list[Wait], stale: dict[int, Stale],
                      told: dict[tuple[str, int], _Members]) -> None:
    """Step 1 (and 3) for a head that is a collective (``told``: its members, told once
    per collective)."""
    seq = head.seq
    assert seq is not None
    g = ctx.groups.get(head.group)
    if g is None:
        return
    m = told.get((head.group, seq))
    if m is None:
        m = told[(head.group, seq)] = _members(ctx, progress, g, head)
    op = "collective"
    created = None
    for q, why in m.ordered:
        if q == r:
            continue
        if why == "lack":
            if created is None:
                created = progress[r].created(head.group, seq) or 0
            if not progress[q].sees(created or None):
                continue  # q's dump was taken before r issued it: it shows nothing of it
        waits.append(Wait(r, q, head.group, seq, op, why))
    running = [q for q in m.started if q != r] if not head.started \
        and progress[r].kind.timing else []
    if running and len(running) + len(m.finished) == m.peers - 1:
        stale[r] = Stale(head, finished_by=list(m.finished), running_on=running)


def _p2p_waits(ctx: Context, progress: dict[int, RankProgress], r: int, head: Item,
               waits: list[Wait], stale: dict[int, Stale]) -> None:
    """Step 2 for a head that is a send/recv or a batch of them."""
    done = []
    for op in head.ops:
        where, found = partner(ctx, progress, r, op)
        q = op.peer
        if q is None or where == "unknown":
            continue
        if where == "nodump":
            waits.append(Wait(r, q, op.group, None, op.op, "nodump"))
        elif where == "never":
            waits.append(Wait(r, q, op.group, None, op.op, "lack"))
        elif where == "done":
            done.append(q)
        elif found is not None:
            theirs = _item_of(progress[q], found)
            if theirs is None or not theirs.same(progress[q].head):
                waits.append(Wait(r, q, op.group, None, op.op, "behind"))
    if head.ops and len(done) == len(head.ops):
        stale[r] = Stale(head, finished_by=sorted(set(done)))  # every partner finished


def phantoms(ctx: Context, progress: dict[int, RankProgress], rank: int
             ) -> list[tuple[Item, list[int]]]:
    """``rank``'s unfinished collectives that every other member (with a dump) finished,
    with those members, oldest first."""
    out = []
    mine = progress[rank]
    for item in mine.queue:
        if item.seq is None:
            continue
        g = ctx.groups.get(item.group)
        peers = [q for q in g.ranks if q != rank and q in progress] if g is not None else []
        # each finished it, early enough for this rank's dump to show it done (a dump
        # taken a moment before its peers' shows it running)
        if peers and all(progress[q].finished(item.group, item.seq)
                         and mine.sees(progress[q].finished_at(item.group, item.seq))
                         for q in peers):
            out.append((item, peers))
    return out


def queue_waits(ctx: Context, progress: dict[int, RankProgress],
                busy: Iterable[int] = (), extra: Iterable[Wait] = ()) -> QueueGraph:
    """The wait-for graph of every device rank's head (see module doc); ``busy`` ranks
    are in a disagreeing unfinished collective, ``extra`` more edges (group creations)."""
    waits: list[Wait] = list(extra)
    stale: dict[int, Stale] = {}
    heads: dict[int, Item] = {}
    told: dict[tuple[str, int], _Members] = {}
    for r in sorted(progress):
        prog = progress[r]
        head = prog.head
        if not prog.device or head is None:
            continue
        heads[r] = head
        ran = phantoms(ctx, progress, r)
        if ran:
            # its device ran everything up to the newest of them (one stream, in order):
            # its head is no place it waits in
            item, peers = ran[-1]
            stale[r] = Stale(item, finished_by=peers, phantoms=[it for it, _ in ran])
            continue
        if head.seq is not None:
            _collective_waits(ctx, progress, r, head, waits, stale, told)
        else:
            _p2p_waits(ctx, progress, r, head, waits, stale)
    for s in stale.values():
        s.finished_by = sorted(set(s.finished_by))
        s.running_on = sorted(set(s.running_on))
    return QueueGraph(graph=WaitGraph(waits, busy), stale=stale, heads=heads)

