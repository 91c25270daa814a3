"""The culprits the device-queue graph shows, named by the side that stopped.

Two kinds of culprit, each said with its evidence (:func:`queue_findings`):

* **thread side** (``missing_rank``): a rank that never issued an op its peers have
  queued (its ``issued`` in that group is lower) and whose own device waits for nobody:
  its Python thread stopped (a held GIL, hung Python, a skipped call; it crashed if it
  left no dump, which :mod:`..crashes` tells). A rank that lacks an op only because its
  thread waits at a host sync behind its own blocked device waits for someone: it is a
  victim, and the chain is followed to its end.
* **device side** (``device_stopped``): a rank whose oldest unfinished op is one its
  peers finished (a data-exchanging op cannot finish without every member, so its GPU
  ran it: its records stopped being marked done, by a sticky CUDA error, a hung kernel
  or a dead watchdog), or, timing on, one it never started while its peers run it. It
  posted everything, so it never lacks an op; being a waiter on some edge never shields
  it. A rank that looks stale *and* lacks ops its peers have is only a dump taken
  earlier than theirs (both signatures at once): never a culprit for it.

Then: a cycle with a ``lack`` edge is the lacking rank's (it went on and now waits
itself); a cycle of ``behind`` edges only is a deadlock of device order
(``cross_group_deadlock``: the ranks whose head is in another group than most
members' heads; ``p2p_deadlock`` through send/recv only). Ranks all in one op with
nobody behind in it and nobody finished (nothing in the records tells a stopped device
from a stuck network or a job caught running, timing off) are one undecided
``stalled_collective``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from commscope.analyze.align.progress import SEEN_MARGIN_NS, Item, RankProgress
from commscope.analyze.diagnose.context import Context
from commscope.analyze.diagnose.queues.graph import QueueGraph, Stale
from commscope.analyze.diagnose.timing import pending_age_ns
from commscope.analyze.diagnose.waits import Wait, find_cycles, reaching
from commscope.analyze.model import FAILED, Finding
from commscope.analyze.text import frame_text, ms, place_text, plural, ranks_phrase

__all__ = ["queue_findings", "item_text", "ThreadRoot"]


def item_text(ctx: Context, rank: int, item: Item) -> str:
    """``all_to_all #17 of group 55 (EXPERT_MODEL_PARALLEL_GROUP, ranks 4-7)``, or a
    send/recv: ``send to rank 8 (p2p, PIPELINE_MODEL_PARALLEL_GROUP)``."""
    g = ctx.groups.get(item.group)
    label = g.label() if g is not None else f"group {item.group}"
    if item.seq is not None:
        return f"{ctx.op_at(rank, item.group, item.seq)} of {label}"
    parts = [f"{op.op} {'to' if op.op == 'send' else 'from'} rank {op.peer}"
             for op in item.ops]
    what = " and ".join(parts) if len(parts) <= 2 else f"{len(parts)} send/recv"
    batch = "a batch: " if len(item.ops) > 1 else ""
    return f"{batch}{what} in {g.ref() if g is not None else 'group ' + item.group}"


def _where(ctx: Context, rank: int, index: int) -> str:
    return frame_text(ctx.frames.frame(rank, index))


def _last_issued(ctx: Context, rank: int) -> str:
    """``all_reduce #3 of group 21 at train.py:88 in step``: the rank's newest record."""
    return ctx.last_text(rank)


def _behind_text(ctx: Context, culprits: set[int], direct: Iterable[int], graph_reach: set[int]
                 ) -> str:
    direct = sorted(set(direct) - culprits)
    behind = sorted(graph_reach - set(direct) - culprits)
    text = ""
    if direct:
        text += (f" {ranks_phrase(direct).capitalize()} "
                 f"{'waits' if len(direct) == 1 else 'wait'} for "
                 f"{'it' if len(culprits) == 1 else 'them'}")
    if behind:
        text += (f"{',' if direct else ''} and {ranks_phrase(behind)} behind them"
                 if direct else f" {ranks_phrase(behind).capitalize()} wait behind them")
    return text + "." if text else ""


# ---------------------------------------------------------------------- device side


def _device_finding(ctx: Context, qg: QueueGraph, progress: dict[int, RankProgress],
                    rank: int, stale: Stale) -> Finding:
    item = stale.item
    what = item_text(ctx, rank, item)
    if stale.finished_by:
        which = "its oldest unfinished op" if item.same(progress[rank].head) else \
            "an unfinished op of its"
        evidence = (f"{which}, {what}, is one {ranks_phrase(stale.finished_by)} "
                    f"finished, so its GPU ran it (and everything queued before it), yet "
                    f"nothing on rank {rank} was noted done since (a sticky CUDA error, a "
                    "hung kernel or a dead watchdog)")
    else:
        evidence = (f"its device never started its oldest unfinished op, {what}, which "
                    f"{ranks_phrase(stale.running_on)} "
                    f"{'is' if len(stale.running_on) == 1 else 'are'} running (timing is "
                    "on: a start event fires when a device reaches an op), so it is stuck "
                    "before it (a sticky CUDA error or a hung kernel)")
    n, groups = len(stale.phantoms), len({it.group for it in stale.phantoms})
    total = len(progress[rank].queue)
    more = (f"; {n} of its {total} unfinished ops are ones its peers finished, in "
            f"{plural(groups, 'group')}") if n > 1 else ""
    direct = sorted({w.waiter for w in qg.graph.edges() if w.target == rank})
    reach = reaching({rank}, qg.graph)
    return Finding(
        kind="device_stopped", group=ctx.groups.get(item.group), collective_seq_id=item.seq,
        op=ctx.sig(rank, item.group, item.seq).op if item.seq is not None
        and ctx.sig(rank, item.group, item.seq) else ("send/recv" if item.ops else None),
        culprit_ranks=[rank], waiting_ranks=sorted(reach), blocking=True,
        message=(f"Rank {rank}{ctx.on_hosts([rank])}'s device stopped: {evidence}{more}. "
                 f"Its thread went on issuing: its last issued op is "
                 f"{_last_issued(ctx, rank)}.{_behind_text(ctx, {rank}, direct, reach)}"),
        details={"side": "device", "frames": {rank: ctx.frames.frame(rank, item.index)},
                 "finished_by": stale.finished_by, "running_on": stale.running_on},
    )


def _failed_item(progress: RankProgress) -> Item | None:
    """The oldest unfinished op of a rank's queue whose work ended with an error
    (commscope's records: ``failed``), else ``None``."""
    d = progress.dump
    if d is None:
        return None
    for item in progress.queue:
        if item.seq is not None:
            t = d.tracks.get(item.group)
            if t is not None and t.lo <= item.seq <= t.hi and t.status[item.seq - t.lo] & FAILED:
                return item
        elif any(op.status & FAILED for op in item.ops):
            return item
    return None


def _failed_devices(ctx: Context, qg: QueueGraph, progress: dict[int, RankProgress],
                    skip: set[int]) -> list[tuple[int, Item]]:
    """Device ranks whose own works ended with an error (a CUDA error, an NCCL error on
    their communicator: our recorder marks the work failed), when that is local: fewer
    than half of the ranks with unfinished work have a failed one (every rank failing
    is a job-wide abort or a timeout, whose cause lies elsewhere) and no crash explains
    it (``skip``). Their peers may not wait on them yet: our dump on the error is taken
    at once, and the error is the evidence."""
    failed = [(r, item) for r, p in sorted(progress.items())
              if p.device and r not in skip and (item := _failed_item(p)) is not None]
    busy = sum(1 for p in progress.values() if p.queue)
    return failed if failed and 2 * len(failed) < busy else []


def _failed_finding(ctx: Context, qg: QueueGraph, rank: int, item: Item) -> Finding:
    d = ctx.load.dumps[rank]
    reason = f" (it dumped on {d.dump_reason})" if d.dump_reason else ""
    direct = sorted({w.waiter for w in qg.graph.edges() if w.target == rank})
    reach = reaching({rank}, qg.graph)
    sig = ctx.sig(rank, item.group, item.seq) if item.seq is not None else None
    return Finding(
        kind="device_stopped", group=ctx.groups.get(item.group), collective_seq_id=item.seq,
        op=sig.op if sig else ("send/recv" if item.ops else None),
        culprit_ranks=[rank], waiting_ranks=sorted(reach), blocking=True,
        message=(f"Rank {rank}{ctx.on_hosts([rank])}'s device stopped: its work on "
                 f"{item_text(ctx, rank, item)} ended with an error{reason}, a CUDA or "
                 "NCCL error on its device or communicator, while no other rank's failed: "
                 "nothing queued on it after that can finish. Its thread went on issuing: "
                 f"its last issued op is {_last_issued(ctx, rank)}."
                 f"{_behind_text(ctx, {rank}, direct, reach)}"),
        details={"side": "device", "frames": {rank: ctx.frames.frame(rank, item.index)},
                 "failed": True},
    )


def _stopped_devices(ctx: Context, qg: QueueGraph, progress: dict[int, RankProgress],
                     skip: set[int]) -> list[int]:
    """The ranks with stale records whose device stopped, as opposed to dumps taken a
    moment before their peers' in a job that was still running (both leave records a
    peer finished). Nothing in an NCCL dump says when it was taken, so the whole job is
    weighed:

    1. a rank that issued less than a peer in its stale group dumped earlier (its
       thread was still issuing too);
    2. the others, those with the most ranks waiting on them first: one whose direct
       waiters all wait on an earlier one already is that one's shadow;
    3. a stopped device stops the job: every other rank soon waits for it, directly or
       behind others. One that a quarter of the ranks with unfinished work do not wait
       for is a dump taken a moment before its peers' in a job still running (measured
       on the bed: a stopped device had three quarters of the job or more behind it,
       or, two at once, close to half each; a dump taken early, a few ranks)."""
    ranked = []
    for rank, stale in qg.stale.items():
        if rank in skip or _issued_less(ctx, progress, rank, stale.item.group):
            continue
        reach = reaching({rank}, qg.graph)
        direct = {w.waiter for w in qg.graph.edges() if w.target == rank}
        ranked.append((-len(reach), rank, direct, reach))
    kept: list[int] = []
    cover: set[int] = set()
    busy = sum(1 for p in progress.values() if p.queue)
    for _, rank, direct, reach in sorted(ranked):
        if (direct and direct <= cover) or not reach or len(reach) * 4 < busy:
            continue
        kept.append(rank)
        cover |= reach | {rank}
    return sorted(kept)


def _issued_less(ctx: Context, progress: dict[int, RankProgress], rank: int,
                 group: str) -> bool:
    """Whether a peer of ``rank`` in ``group`` issued more of its collectives: a rank
    whose device stopped went on issuing up to its host sync, as its peers did, while a
    dump taken earlier than its peers' shows both less issued and less finished."""
    g = ctx.groups.get(group)
    me = progress[rank]
    mine = me.issued(group)
    when = me.as_of - SEEN_MARGIN_NS if me.as_of is not None else None
    return g is not None and any(progress[q].issued_by(group, when) > mine for q in g.ranks
                                 if q != rank and q in progress)


# ---------------------------------------------------------------------- thread side


class ThreadRoot:
    """The ops a thread-side culprit never issued, and who has them queued."""

    def __init__(self) -> None:
        self.missing: dict[tuple[str, int | None, str], list[int]] = {}

    def add(self, w: Wait) -> None:
        """One ``lack`` edge to the culprit."""
        self.missing.setdefault((w.group, w.seq, w.op), []).append(w.waiter)


def _in_issue_order(ctx: Context, root: ThreadRoot
                    ) -> list[tuple[tuple[str, int | None, str], list[int]]]:
    """The calls a stopped thread never issued, the one its peers issued first first
    (where the program stopped; collectives before send/recv, whose time is unknown)."""
    progress = ctx.progress or {}

    def first_issued(item: tuple[tuple[str, int | None, str], list[int]]) -> tuple[Any, ...]:
        (group, seq, op), waiters = item
        times = [t for t in (progress[w].created(group, seq) for w in waiters
                             if w in progress and seq is not None) if t]
        return (seq is None, min(times) if times else float("inf"), group, seq or 0, op)

    return sorted(root.missing.items(), key=first_issued)


def _missing_text(ctx: Context, rank: int, root: ThreadRoot, limit: int = 3) -> str:
    parts = []
    for (group, seq, op), waiters in _in_issue_order(ctx, root):
        g = ctx.groups.get(group)
        label = g.label() if g is not None else f"group {group}"
        waiters = sorted(set(waiters))
        verb = "has" if len(waiters) == 1 else "have"
        if seq is not None:
            ref = waiters[0]
            parts.append(f"{ctx.op_at(ref, group, seq)} of {label}, which "
                         f"{ranks_phrase(waiters)} {verb} queued")
        else:
            partner = "recv" if op == "send" else "send"
            parts.append(f"the {partner} matching the {op} {ranks_phrase(waiters)} "
                         f"{verb} queued in {g.ref() if g is not None else label}")
    shown = "; nor ".join(parts[:limit])
    if len(parts) > limit:
        shown += f" (and {len(parts) - limit} more)"
    return shown


def _thread_finding(ctx: Context, qg: QueueGraph, progress: dict[int, RankProgress],
                    rank: int, root: ThreadRoot) -> Finding:
    prog = progress[rank]
    (group, seq, op), _ = _in_issue_order(ctx, root)[0]
    p2p = seq is None
    missing = _missing_text(ctx, rank, root)
    last = _last_issued(ctx, rank)
    if prog.queue:
        head = item_text(ctx, rank, prog.queue[0])
        head_text = f"its device's oldest unfinished op is {head}"
        subject = (f"Rank {rank}{ctx.on_hosts([rank])} never "
                   f"{'posted' if p2p else 'issued'} {missing}")
        how = (f"It skipped it, or stopped before it while its other work went on: "
               f"{head_text}, and its last issued op is {last}.")
    else:
        d = ctx.load.dumps[rank]
        if ctx.frames.has_threads(rank) and d.main_place is not None:
            thread = f"its main thread is at {place_text(d.main_place)}"
        elif d.source == "pytorch":
            thread = ("its Python thread is stuck outside the collectives (a held GIL, hung "
                      "Python, a deadlock) or skipped the call; a PyTorch-native dump carries "
                      "no thread stacks")
        else:
            thread = "its thread is stuck outside the collectives, or skipped the call"
        subject = (f"Rank {rank}{ctx.on_hosts([rank])}'s thread stopped issuing: it never "
                   f"{'posted' if p2p else 'issued'} {missing}")
        how = (f"Its last issued op is {last}, and its device finished everything it "
               f"issued (it has no unfinished op), so {thread}.")
    direct = sorted({w for ws in root.missing.values() for w in ws})
    reach = reaching({rank}, qg.graph)
    first = sorted(root.missing[(group, seq, op)])[0]
    sig = ctx.sig(first, group, seq) if seq is not None else None
    return Finding(
        kind="p2p_unmatched" if p2p else "missing_rank", group=ctx.groups.get(group),
        collective_seq_id=seq, op=sig.op if sig else (op if p2p else None),
        culprit_ranks=[rank], waiting_ranks=sorted(reach | set(direct)), blocking=True,
        message=f"{subject}. {how}{_behind_text(ctx, {rank}, direct, reach)}",
        details={"side": "thread", "frames": {rank: ctx.last_activity(rank)[1]},
                 "groups": sorted({g for g, _, _ in root.missing})},
    )


def _most_issued(ctx: Context, progress: dict[int, RankProgress], group: str,
                 tops: dict[str, int]) -> int:
    """The most any member issued of ``group`` (remembered in ``tops``: asked per rank,
    counted once per group)."""
    top = tops.get(group)
    if top is None:
        g = ctx.groups[group]
        top = tops[group] = max((progress[q].issued(group) for q in g.ranks
                                 if q in progress), default=0)
    return top


def _issued_behind(ctx: Context, progress: dict[int, RankProgress], rank: int,
                   agreed: bool = False, tops: dict[str, int] | None = None) -> ThreadRoot:
    """The groups where peers of ``rank`` issued collectives it never did (the first it
    lacks, and who issued it); empty when it kept up everywhere. ``agreed`` (a rank whose
    own device still has work): only groups whose other members all issued the same,
    higher count (they all stopped at one place of the program, this rank short of it),
    and one of which went past this rank's point while its own device had not finished
    the work up to it (so no host sync lies between: this rank's thread did not stop to
    wait for its device there). ``tops``: each group's most issued, shared across calls."""
    tops = {} if tops is None else tops
    root = ThreadRoot()
    prog = progress[rank]
    when = prog.as_of - SEEN_MARGIN_NS if prog.as_of is not None else None
    for name, gp in sorted(prog.groups.items()):
        g = ctx.groups.get(name)
        if g is None:
            continue
        top = _most_issued(ctx, progress, name, tops)
        if top <= gp.issued:
            continue  # nobody issued more (as far as any dump goes): nothing to lack
        # what the others had issued by the time this rank's dump was taken
        others = {q: progress[q].issued_by(name, when) for q in g.ranks if q != rank
                  and q in progress and name in progress[q].groups}
        ahead = sorted(q for q, n in others.items() if n > gp.issued)
        if not ahead or (agreed and (len(ahead) < len(others)
                                     or len(set(others.values())) > 1)):
            continue
        if agreed and not any(progress[q].groups[name].pending
                              and progress[q].groups[name].pending[0] <= gp.issued
                              for q in ahead):
            # none of them went past this point with its own device still short of it,
            # so a host sync may lie there, where this rank's thread waits for its device
            continue
        root.missing[(name, gp.issued + 1, "collective")] = ahead
    return root


# ---------------------------------------------------------------------- cycles


def _cycle_finding(ctx: Context, qg: QueueGraph, progress: dict[int, RankProgress],
                   cycle: list[Wait]) -> list[Finding]:
    lacks = [w for w in cycle if w.why == "lack"]
    if lacks and len(lacks) == len(cycle):
        return [_order_finding(ctx, qg, cycle)]
    if lacks:
        out = []
        for target in sorted({w.target for w in lacks}):
            root = ThreadRoot()
            for w in qg.graph.edges():
                if w.target == target and w.why == "lack":
                    root.add(w)
            f = _thread_finding(ctx, qg, progress, target, root)
            own = qg.heads.get(target)
            if own is not None:
                f.message += (f" It went on: its own oldest unfinished op, "
                              f"{item_text(ctx, target, own)}, now waits for ranks that "
                              "wait for it, so the two wait for each other.")
            f.details["cycle_root"] = True
            out.append(f)
        return out
    comp = sorted({w.waiter for w in cycle})
    groups = {w.group for w in cycle}
    short = _short_ranks(ctx, progress, set(comp), groups)
    if short:
        return [_skip_finding(ctx, qg, progress, rank, parts, cycle)
                for rank, parts in sorted(short.items())]
    hops = ", ".join(
        f"rank {w.waiter}'s oldest unfinished op ({item_text(ctx, w.waiter, qg.heads[w.waiter])})"
        f" waits for rank {w.target}'s device" for w in cycle if w.waiter in qg.heads)
    behind = sorted(reaching(set(comp), qg.graph))
    also = f"; {ranks_phrase(behind)} wait behind them" if behind else ""
    first = cycle[0]
    if all(w.seq is None for w in cycle):
        return [Finding(
            kind="p2p_deadlock", group=ctx.groups.get(first.group), collective_seq_id=None,
            op="send/recv", culprit_ranks=comp, waiting_ranks=behind, blocking=True,
            message=(f"{ranks_phrase(comp).capitalize()} deadlock in send/recv: {hops}{also}. "
                     "Each queued its op before the one its peer's device is in: reorder "
                     "them, or post both sides in one batch_isend_irecv."),
            details=_order_details(cycle),
        )]
    culprits = _odd_order(qg, comp)
    return [Finding(
        kind="cross_group_deadlock", group=ctx.groups.get(first.group),
        collective_seq_id=first.seq, op="collective", culprit_ranks=culprits,
        waiting_ranks=sorted((set(comp) | set(behind)) - set(culprits)), blocking=True,
        message=(f"{ranks_phrase(culprits).capitalize()} queued collectives of "
                 f"{plural(len(groups), 'group')} in another order than their peers, so "
                 f"their devices wait for each other: {hops}{also}."),
        details=_order_details(cycle),
    )]


def _order_finding(ctx: Context, qg: QueueGraph, cycle: list[Wait]) -> Finding:
    """A cycle of ``lack`` edges only: each rank issued its op and then stopped (at a host
    sync, waiting for it) before the one its peer waits for, so each waits for the
    other's thread: the ranks issue the groups (or the sends and recvs) in different
    orders. The ranks whose first unfinished op is in another group than most others'
    are the culprits; with no majority, every rank of the cycle is."""
    comp = sorted({w.waiter for w in cycle})
    behind = sorted(reaching(set(comp), qg.graph))
    hops = ", ".join(
        f"rank {w.waiter} issued {item_text(ctx, w.waiter, qg.heads[w.waiter])} and waits "
        f"for rank {w.target}, which never issued it"
        for w in cycle if w.waiter in qg.heads)
    first = cycle[0]
    if all(w.seq is None for w in cycle):
        return Finding(
            kind="p2p_deadlock", group=ctx.groups.get(first.group), collective_seq_id=None,
            op="send/recv", culprit_ranks=comp, waiting_ranks=behind, blocking=True,
            message=(f"{ranks_phrase(comp).capitalize()} deadlock in send/recv: {hops}. "
                     "Each posted its op and stopped before the one its peer waits for: "
                     "post both sides in one batch_isend_irecv."),
            details=_order_details(cycle),
        )
    culprits = _odd_order(qg, comp)
    groups = {w.group for w in cycle}
    return Finding(
        kind="cross_group_deadlock", group=ctx.groups.get(first.group),
        collective_seq_id=first.seq, op="collective", culprit_ranks=culprits,
        waiting_ranks=sorted((set(comp) | set(behind)) - set(culprits)), blocking=True,
        message=(f"{ranks_phrase(culprits).capitalize()} issued collectives of "
                 f"{plural(len(groups), 'group')} in another order than their peers, and "
                 f"each stopped before the other's: {hops}"
                 + (f"; {ranks_phrase(behind)} wait behind them." if behind else ".")),
        details=_order_details(cycle),
    )


def _odd_order(qg: QueueGraph, comp: list[int]) -> list[int]:
    """The ranks of an order cycle whose oldest unfinished op is in another group than
    most others'; every rank of ``comp`` when no group has a strict majority."""
    chose = {r: qg.heads[r].group for r in comp if r in qg.heads}
    counts: dict[str, int] = {}
    for g in chose.values():
        counts[g] = counts.get(g, 0) + 1
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    if len(ranked) > 1 and ranked[0][1] > ranked[1][1]:
        return sorted(r for r, g in chose.items() if g != ranked[0][0])
    return comp


def _order_details(cycle: list[Wait]) -> dict[str, object]:
    """The details of an order finding: its side and the cycle's hops."""
    return {"side": "order", "cycle": [(w.waiter, w.target, w.group, w.seq) for w in cycle]}


def _short_ranks(ctx: Context, progress: dict[int, RankProgress], comp: set[int],
                 groups: set[str]) -> dict[int, list[tuple[str, int, int, list[int]]]]:
    """Ranks of a device-order cycle that issued fewer collectives of one of its groups
    than most members: ``rank -> [(group, its count, the others', who)]``."""
    out: dict[int, list[tuple[str, int, int, list[int]]]] = {}
    for name in sorted(groups):
        g = ctx.groups.get(name)
        if g is None:
            continue
        counts = {q: progress[q].issued(name) for q in g.ranks
                  if q in progress and name in progress[q].groups}
        if len(counts) < 2:
            continue
        top = max(counts.values())
        full = sorted(q for q, n in counts.items() if n == top)
        short = [q for q, n in counts.items() if n < top]
        if short and len(short) < len(full) and set(short) & comp:
            for q in short:
                out.setdefault(q, []).append((name, counts[q], top, full))
    return out


def _first_apart(ctx: Context, rank: int, ref: int, group: str, upto: int) -> int | None:
    """The first collective of ``group`` whose user line differs between ``rank`` and
    ``ref`` (both recorded with stacks): where a shifted count began."""
    for seq in range(1, upto + 1):
        a, b = ctx.frame_at(rank, group, seq), ctx.frame_at(ref, group, seq)
        if a is None or b is None:
            continue
        if (a[1], a[2]) != (b[1], b[2]):
            return seq
    return None


def _skip_finding(ctx: Context, qg: QueueGraph, progress: dict[int, RankProgress], rank: int,
                  parts: list[tuple[str, int, int, list[int]]], cycle: list[Wait]) -> Finding:
    name, mine, top, full = parts[0]
    g = ctx.groups[name]
    n = top - mine
    apart = _first_apart(ctx, rank, full[0], name, mine)
    where = ""
    if apart is not None:
        where = (f" The first it skipped is {ctx.op_at(full[0], name, apart)} at "
                 f"{_where(ctx, full[0], ctx.index(full[0], name, apart) or -1)} (its own "
                 f"#{apart} is at {_where(ctx, rank, ctx.index(rank, name, apart) or -1)}).")
    hops = ", ".join(
        f"rank {w.waiter}'s oldest unfinished op ({item_text(ctx, w.waiter, qg.heads[w.waiter])})"
        f" waits for rank {w.target}'s device" for w in cycle if w.waiter in qg.heads)
    reach = reaching({rank}, qg.graph)
    waiting = sorted((reach | {w.waiter for w in cycle}) - {rank})
    return Finding(
        kind="missing_rank", group=g, collective_seq_id=mine + 1, op=None,
        culprit_ranks=[rank], waiting_ranks=waiting, blocking=True,
        message=(f"Rank {rank}{ctx.on_hosts([rank])} issued {mine} collectives of "
                 f"{g.label()}, {plural(n, 'fewer')} than {ranks_phrase(full)} ({top}): it "
                 f"skipped {'one' if n == 1 else n}, so from there on its collectives of "
                 "that group paired with its peers' next ones, and its device now queues "
                 f"its work in another order than theirs: {hops}.{where}"
                 f"{_behind_text(ctx, {rank}, [], reach)}"),
        details={"side": "thread", "cycle_root": True, "shape": "skip",
                 "frames": {rank: ctx.last_activity(rank)[1]},
                 "cycle": [(w.waiter, w.target, w.group, w.seq) for w in cycle]},
    )


# ---------------------------------------------------------------------- stalls


def _inside_finding(ctx: Context, qg: QueueGraph, progress: dict[int, RankProgress],
                    ranks: list[int], item: Item, stall_s: float) -> Finding:
    """Ranks all in one op that every member issued and none finished. Where the dumps
    say how long it had been there (commscope's carry their time and reason), an op
    older than ``stall_s`` or a dump on timeout is stuck (blocking); a younger one was
    caught running (a note); without times it cannot be told (undecided)."""
    timing = all(progress[r].kind.timing for r in ranks)
    reach = reaching(set(ranks), qg.graph)
    behind = (f" {ranks_phrase(sorted(reach)).capitalize()} "
              f"wait{'s' if len(reach) == 1 else ''} behind "
              f"{'it' if len(ranks) == 1 else 'them'}.") if reach else ""
    what = item_text(ctx, ranks[0], item)
    ages = [pending_age_ns(ctx, r) for r in ranks]
    timed_out = any(ctx.load.dumps[r].dump_reason == "timeout" for r in ranks)
    have = "has" if len(ranks) == 1 else "all have"
    their = "its" if len(ranks) == 1 else "their"
    head = (f"{ranks_phrase(ranks).capitalize()} {have} {what} as {their} oldest unfinished "
            "op, every member issued it and none finished it")
    at = f"rank {ranks[0]} issued it at {_where(ctx, ranks[0], item.index)}"
    known = [a for a in ages if a is not None]
    if timed_out or (known and max(known) >= stall_s * 1e9):
        age = f" for {ms(max(known))}" if known else ""
        details: dict[str, object] = {"side": "inside"}
        blocking = True
        text = (f"{head}{age}: the program agrees, the transport is stuck (the network, "
                f"NCCL, a device); {at}.{behind}")
    elif known and len(known) == len(ages):
        details = {"caught": dict(zip(ranks, ages)), "side": "inside"}
        blocking = False
        text = (f"{head}, inside it for at most {ms(max(known))}, under the {stall_s:g} s "
                f"stall threshold: the dumps caught it running, not a hang; {at}.")
    else:
        why = ("" if timing else " (timing is off, so the records cannot tell a device that "
               "never started it from one inside it: TORCH_NCCL_ENABLE_TIMING=1 records "
               "when each device starts an op)")
        details = {"undecided": True, "side": "inside"}
        blocking = False
        text = (f"{head}: a device or the network stopped inside it, or the dumps caught the "
                f"job running{why}; {at}.{behind}")
    sig = ctx.sig(ranks[0], item.group, item.seq) if item.seq is not None else None
    return Finding(
        kind="stalled_collective", group=ctx.groups.get(item.group),
        collective_seq_id=item.seq, op=sig.op if sig else None, culprit_ranks=[],
        waiting_ranks=sorted(set(ranks) | reach), blocking=blocking, message=text,
        details=details,
    )


# ---------------------------------------------------------------------- all


def _unless_caught_running(progress: dict[int, RankProgress], findings: list[Finding],
                           named: set[int]) -> tuple[list[Finding], set[int]]:
    """Step 3 of :func:`_stopped_devices` for the whole job: a stopped device stops
    everyone, so when a quarter of the ranks with unfinished work wait on no culprit at
    all, dumps without a time (PyTorch's) caught a job still running, a moment apart,
    and the records a peer finished are the later dumps' lead, not a stopped device.
    Those device findings go (their ranks are then read as work in flight); dumps that
    carry their time were weighed against it already (``RankProgress.sees``). A device
    whose works failed is told by its error, not by who waits on it: it stays."""
    devices = [f for f in findings
               if f.kind == "device_stopped" and not f.details.get("failed")]
    if not devices or all(p.as_of is not None for p in progress.values()):
        return findings, named
    busy = {r for r, p in progress.items() if p.queue}
    covered = named | {r for f in findings for r in f.waiting_ranks}
    if len(busy - covered) * 4 < len(busy):
        return findings, named
    dropped = {r for f in devices for r in f.culprit_ranks}
    return [f for f in findings if f not in devices], named - dropped


def queue_findings(ctx: Context, qg: QueueGraph, progress: dict[int, RankProgress],
                   explained: set[int], stall_s: float) -> list[Finding]:
    """Every culprit and stall of the device-queue graph (see module doc); ranks in
    ``explained`` (crashed, on another host, creating a group) are left to their own
    findings."""
    graph = qg.graph
    findings: list[Finding] = []
    lack_targets = {w.target for w in graph.edges() if w.why == "lack"}
    named: set[int] = set(explained)
    for cycle in find_cycles(graph):
        if named & {w.waiter for w in cycle}:
            continue
        made = _cycle_finding(ctx, qg, progress, cycle)
        findings += made
        named.update(w.waiter for w in cycle)
    for rank, item in _failed_devices(ctx, qg, progress, named):
        findings.append(_failed_finding(ctx, qg, rank, item))
        named.add(rank)
    for rank in _stopped_devices(ctx, qg, progress, named | lack_targets):
        findings.append(_device_finding(ctx, qg, progress, rank, qg.stale[rank]))
        named.add(rank)
    roots: dict[int, ThreadRoot] = {}
    for w in graph.edges():
        if w.why != "lack" or w.target in named or w.target not in ctx.load.dumps:
            continue
        if graph.out.get(w.target) or w.target in qg.stale:
            continue  # it waits for someone itself (a victim), or is an older snapshot
        roots.setdefault(w.target, ThreadRoot()).add(w)
    for rank, root in sorted(roots.items()):
        findings.append(_thread_finding(ctx, qg, progress, rank, root))
        named.add(rank)
    if any(f.blocking for f in findings):
        # the job is stuck on those: a rank whose thread also stopped short of where its
        # peers went is a second fault, though nobody reached its missing op yet (with
        # nothing stuck, a rank a little behind is a dump taken a moment earlier)
        tops: dict[str, int] = {}
        for rank, prog in sorted(progress.items()):
            if rank in named or not prog.device or rank in qg.stale:
                continue
            behind = _issued_behind(ctx, progress, rank, agreed=bool(prog.queue), tops=tops)
            if behind.missing:
                findings.append(_thread_finding(ctx, qg, progress, rank, behind))
                named.add(rank)
    findings, named = _unless_caught_running(progress, findings, named)
    covered = named | {r for f in findings for r in f.waiting_ranks}
    inside: dict[tuple[str, int | None, int], list[int]] = {}
    for r, head in sorted(qg.heads.items()):
        if r in covered or graph.out.get(r) or r in qg.stale:
            continue
        inside.setdefault((head.group, head.seq, head.index if head.seq is None else -1),
                          []).append(r)
    for (_, _, _), ranks in sorted(inside.items(), key=lambda kv: kv[1]):
        if len(ranks) > 1 or qg.heads[ranks[0]].seq is not None:
            findings.append(_inside_finding(ctx, qg, progress, ranks, qg.heads[ranks[0]],
                                            stall_s))
    return findings
