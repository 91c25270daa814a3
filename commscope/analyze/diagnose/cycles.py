"""Who is to blame for a deadlock cycle of the wait graph.

A cycle (one strongly connected component of
:func:`commscope.analyze.diagnose.waits.find_cycles`) that no skipped collective explains
(:mod:`commscope.analyze.diagnose.skips` is asked first) becomes one blocking finding.

Algorithm (:func:`cycle_finding`):

1. The component: every rank the cycle reaches that also reaches the cycle.
2. A cycle only through send/recv: a rank whose first unfinished send/recv breaks the
   schedule its own earlier ops repeat (a period of up to 16 ops; a pipeline stage
   repeats every step) skipped that op and went on; so did a rank whose earlier ops
   leave out, once, the partner of the op a peer of the cycle waits in for it (two
   periods of its schedule, then the op the period calls for is missing and the ops
   after it go on as if it had been posted: a stage that skipped one recv in a GPipe
   forward pass and deadlocks later, in the backward pass); so did a rank whose ops
   repeat a whole step (a 1F1B pipeline: forward and backward ops interleave, so no
   short period holds) except that partner, left out once, the ops after it going on
   as the previous step did after it (:func:`_skipped_in_step`). When no rank's own
   history shows a skip (the first step of a 1F1B pipeline has no step before it), a
   pipeline stage's counts may (:func:`_relay_gaps`): a stage passes on what it
   receives (activations forward, gradients back), so it never posts more sends to one
   neighbour than recvs from the other; one that did, while that other neighbour waits
   in a send to it, skipped a recv and went on. When some but not all ranks of the
   component do, they are the ``p2p_unmatched`` culprits. Otherwise the component is a
   ``p2p_deadlock``: each rank posted its op before the one its peer waits for.
3. A cycle through a send/recv and collectives: the peer of its first send/recv link
   never posted the partner op and went on to wait itself: ``p2p_unmatched``.
4. A cycle through collectives of several groups is a ``cross_group_deadlock``. Each
   rank (in the component or waiting on it) that belongs to two or more of the cycle's
   groups chose an order: the group of its first unfinished collective among them. The
   group most of them chose is the order they agree on, and the ranks that chose
   another are the culprits; with no majority every rank of the component is one.
5. Every message lists the cycle's hops (who waits for whom, in which op, at which
   frame); the ranks outside the component that reach it wait behind it.
"""

from __future__ import annotations

from commscope.analyze.diagnose.context import Context
from commscope.analyze.diagnose.waits import Wait, WaitGraph, reaching
from commscope.analyze.diagnose.wording import record_op, wait_verb
from commscope.analyze.model import COMPLETED, RETIRED, Finding
from commscope.analyze.text import frame_text, plural, ranks_phrase

__all__ = ["cycle_finding"]

_DONE = RETIRED | COMPLETED


def _cycle_hops(ctx: Context, cycle: list[Wait]) -> tuple[list[str], dict[int, object]]:
    hops, frames = [], {}
    for w in cycle:
        if w.seq is not None:
            frame = ctx.frame_at(w.waiter, w.group, w.seq)
            what = f"{ctx.op_at(w.waiter, w.group, w.seq)} of {ctx.groups[w.group].label()}"
        else:
            frame = _p2p_frame(ctx, w)
            direction = "to" if w.op == "send" else "from"
            what = f"{w.op} {direction} rank {w.target} in {ctx.group_ref(w.group)}"
        frames[w.waiter] = frame
        hops.append(f"rank {w.waiter} waits for rank {w.target} in {what} at {frame_text(frame)}")
    return hops, frames


def _p2p_frame(ctx: Context, w: Wait) -> object:
    d = ctx.load.dumps.get(w.waiter)
    if d is None:
        return None
    for op in d.p2p:
        if op.group == w.group and op.peer == w.target and op.op == w.op \
                and not op.status & _DONE:
            return ctx.frames.frame(w.waiter, op.index)
    return None


def _component(cycle: list[Wait], graph: WaitGraph) -> set[int]:
    """Every rank of the strongly connected component through ``cycle``."""
    ring = {w.waiter for w in cycle}
    upstream = reaching(ring, graph) | ring
    down: set[int] = set()
    todo = list(ring)
    while todo:
        v = todo.pop()
        for w in graph.out.get(v, []):
            if w.target not in down:
                down.add(w.target)
                todo.append(w.target)
    return (upstream & (down | ring))


def _p2p_tokens(ctx: Context, rank: int) -> tuple[list[tuple[str, str, int | None]], int]:
    """The rank's send/recv ops in record order as (group, op, peer), and the position of
    its first unfinished one (``-1`` if none)."""
    d = ctx.load.dumps.get(rank)
    if d is None:
        return [], -1
    ops = sorted(d.p2p, key=lambda o: o.index)
    tokens = [(o.group, o.op, o.peer) for o in ops]
    first = next((i for i, o in enumerate(ops) if not o.status & _DONE), -1)
    return tokens, first


def _breaks_period(tokens: list[tuple[str, str, int | None]], at: int) -> bool:
    """Whether ``tokens[at]`` breaks the shortest period the ops before it repeat.

    A pipeline stage's send/recv schedule repeats every step; a stage that drops or
    skips one op shows it as the first op that does not fit its own earlier steps."""
    history = tokens[:at]
    for period in range(1, min(len(history), 16) + 1):
        if len(history) < period + 1:
            break
        if all(history[i] == history[i - period] for i in range(period, len(history))):
            return tokens[at] != history[at - period]
    return False


def _skipped_once(tokens: list[tuple[str, str, int | None]], first: int,
                  wanted: tuple[str, str, int | None]) -> bool:
    """Whether a rank's send/recv ops leave out ``wanted`` once before its first
    unfinished one (``first``): at some position the ops before it repeat with a period of ``p``
    (up to 16) for two periods, the period calls for ``wanted`` there but the rank posted
    another op, and its next ``p`` ops go on as if ``wanted`` had been posted (the rest
    of that period, then ``wanted`` again). A schedule that moves on to another phase
    (forward to backward) does not go on that way."""
    for b in range(2, first):
        for p in range(1, min(b // 2, 16) + 1):
            if tokens[b - p] != wanted or tokens[b] == wanted or b + p > len(tokens):
                continue
            if any(tokens[i] != tokens[i - p] for i in range(b - p, b)):
                continue
            if all(tokens[b + i] == tokens[b + 1 + i - p] for i in range(p - 1)) \
                    and tokens[b + p - 1] == wanted:
                return True
    return False


_MAX_PERIOD = 4096
"""The longest schedule (send/recv ops of one training step) a skip is looked for in."""


def _period(tokens: list[tuple[str, str, int | None]]) -> int:
    """The shortest ``q`` with ``tokens[i] == tokens[i - q]`` for every ``i >= q`` (the
    prefix function of Knuth, Morris and Pratt; ``len(tokens)`` when none is shorter)."""
    border = [0] * len(tokens)
    k = 0
    for i in range(1, len(tokens)):
        while k and tokens[i] != tokens[k]:
            k = border[k - 1]
        if tokens[i] == tokens[k]:
            k += 1
        border[i] = k
    return len(tokens) - (border[-1] if tokens else 0)


def _skipped_in_step(tokens: list[tuple[str, str, int | None]], first: int,
                     wanted: tuple[str, str, int | None]) -> bool:
    """Whether a rank's send/recv ops, up to and with its first unfinished one
    (``first``), are a schedule that repeats every ``p`` ops (a whole training step: a
    1F1B or interleaved pipeline's forward and backward ops interleave, so no short
    period holds) with ``wanted`` left out once: the ops repeat the previous step until
    position ``b``, where that step had ``wanted``, and from ``b`` on they go on as the
    previous step did after its ``wanted`` (shifted by one), through the first
    unfinished op. The two steps must agree on at least half a step (4 to 16 ops)
    besides the one left out, and ops that repeat exactly (two whole periods or more)
    left nothing out."""
    n = first + 1
    if 2 * _period(tokens[:n]) <= n:
        return False  # the ops repeat exactly: nothing left out
    for p in range(2, min(first, _MAX_PERIOD) + 1):
        if first - p + 1 < max(4, min(p // 2, 16)):
            break
        b = next((i for i in range(p, n) if tokens[i] != tokens[i - p]), None)
        if b is None or tokens[b - p] != wanted:
            continue
        if all(tokens[b + i] == tokens[b - p + 1 + i] for i in range(n - b)):
            return True
    return False


_AT_FIRST_UNFINISHED = ("repeats every step until there, then it skipped that op and went "
                        "on")
_EARLIER = "repeats, but earlier it once skipped that op and went on"


def _pattern_breakers(ctx: Context, comp: set[int], cycle: list[Wait]) -> dict[int, str]:
    """The ranks of ``comp`` that skipped a send/recv and went on (step 2), each with
    how its own ops show it (the end of the finding's "its own send/recv schedule ..."
    clause)."""
    out: dict[int, str] = {}
    for r in sorted(comp):
        tokens, first = _p2p_tokens(ctx, r)
        if first > 0 and _breaks_period(tokens, first):
            out[r] = _AT_FIRST_UNFINISHED
            continue
        wanted = {(w.group, "recv" if w.op == "send" else "send", w.waiter)
                  for w in cycle if w.target == r and w.seq is None}
        if first > 0 and any(_skipped_once(tokens, first, t) or _skipped_in_step(tokens, first, t)
                             for t in sorted(wanted)):
            out[r] = _EARLIER
    return out or _relay_gaps(ctx, comp, cycle)


def _relay_gaps(ctx: Context, comp: set[int], cycle: list[Wait]) -> dict[int, str]:
    """The pipeline stages of ``comp`` that passed on more than they received (step 2's
    last test): rank ``r`` exchanges sends and recvs with two neighbours ``a`` and ``b``
    of one group (a stage between two others, both directions used: forward and
    backward), posted more sends to ``b`` than recvs from ``a``, and ``a`` waits in the
    cycle in a send to ``r``. A stage can only send on what it received (the recv is
    posted first, alone or batched with the send), so the missing recv was skipped."""
    out: dict[int, str] = {}
    for w in cycle:
        r, a = w.target, w.waiter
        if w.seq is not None or w.op != "send" or r not in comp or r in out:
            continue
        d = ctx.load.dumps.get(r)
        if d is None:
            continue
        peers = {o.peer for o in d.p2p if o.group == w.group and o.peer is not None}
        got = _count(ctx, r, w.group, "recv", a)
        for b in sorted(peers - {a}):
            two_way = all(_count(ctx, r, w.group, op, p) for op in ("send", "recv")
                          for p in (a, b))
            sent = _count(ctx, r, w.group, "send", b)
            if two_way and sent > got:
                out[r] = (f"passes on what it receives, yet it posted {plural(sent, 'send')} "
                          f"to rank {b} against {plural(got, 'recv')} from rank {a}: it "
                          "skipped a recv and went on")
                break
    return out


def _broken_pattern_finding(ctx: Context, broke: dict[int, str], cycle: list[Wait],
                            comp: set[int], graph: WaitGraph,
                            details: dict[str, object]) -> Finding:
    culprit = min(broke)
    link = next((w for w in cycle if w.target == culprit), cycle[0])
    partner = "recv" if link.op == "send" else "send"
    direction = "to" if link.op == "send" else "from"
    waiting = sorted((comp | reaching(comp, graph)) - set(broke))
    others = [w for w in waiting if w != link.waiter]
    hops, _ = _cycle_hops(ctx, cycle)
    how = broke[culprit]
    return Finding(
        kind="p2p_unmatched", group=ctx.groups[link.group], collective_seq_id=None,
        op=link.op, culprit_ranks=sorted(broke), waiting_ranks=waiting, blocking=True,
        message=(f"Rank {link.waiter} waits in {link.op} {direction} rank {culprit} "
                 f"({ctx.group_ref(link.group)}) but rank {culprit} never posted the "
                 f"matching {partner}: "
                 + ("its own send/recv schedule " if how in (_EARLIER, _AT_FIRST_UNFINISHED)
                    else "it ") + how
                 + _count_gap(ctx, link, culprit) + ", so the two now wait for each "
                 "other: " + ", ".join(hops) + "."
                 + (f" {ranks_phrase(others).capitalize()} {wait_verb(others)} behind them."
                    if others else "")),
        details={**details, "cycle_root": True},
    )


def _count_gap(ctx: Context, link: Wait, culprit: int) -> str:
    """`` (rank 1 posted 3 recvs from rank 0, 1 recv fewer than the 4 sends ...)``: how
    many partner ops the culprit posted against how many the waiter posted, when they
    differ."""
    partner = "recv" if link.op == "send" else "send"
    posted = _count(ctx, culprit, link.group, partner, link.waiter)
    wanted = _count(ctx, link.waiter, link.group, link.op, culprit)
    if posted >= wanted:
        return ""
    back = "from" if partner == "recv" else "to"
    forth = "to" if link.op == "send" else "from"
    return (f" (rank {culprit} posted {plural(posted, partner)} {back} rank {link.waiter}, "
            f"{wanted - posted} {partner} fewer than the {plural(wanted, link.op)} rank "
            f"{link.waiter} posted {forth} it)")


def _count(ctx: Context, rank: int, group: str, op: str, peer: int) -> int:
    d = ctx.load.dumps.get(rank)
    if d is None:
        return 0
    if d.p2p_totals is not None:  # a progress record: counted since the job began
        return d.p2p_totals.get((group, op, peer), 0)
    return sum(1 for o in d.p2p if o.group == group and o.op == op and o.peer == peer)


def _deviants(ctx: Context, comp: set[int], graph: WaitGraph) -> tuple[list[int], str | None]:
    """Step 4: the ranks of a cross-group cycle whose order differs from the majority's.

    Every member of the component (and everyone waiting on it) waits in one group of the
    cycle; the group most of them wait in is the order they agree on."""
    involved = comp | reaching(comp, graph)
    groups = {w.group for r in comp for w in graph.out.get(r, []) if w.target in comp}
    choice: dict[int, str] = {}
    for r in sorted(involved):
        if sum(r in ctx.groups[g].ranks for g in groups) < 2:
            continue  # only a member of two of the groups chooses an order between them
        d = ctx.load.dumps.get(r)
        if d is None:
            continue
        for g, seq, _ in d.pending:
            if g in groups and seq >= 0:
                choice[r] = g
                break
    counts: dict[str, int] = {}
    for g in choice.values():
        counts[g] = counts.get(g, 0) + 1
    if len(counts) < 2:
        return sorted(comp), None
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    if ranked[0][1] == ranked[1][1]:
        return sorted(comp), None
    major = ranked[0][0]
    odd = sorted(r for r, g in choice.items() if g != major)
    return odd, major


def cycle_finding(ctx: Context, cycle: list[Wait], graph: WaitGraph) -> Finding:
    """The one blocking finding of a cycle that no skip explains (steps 1-5)."""
    comp = _component(cycle, graph)
    hops, frames = _cycle_hops(ctx, cycle)
    first = cycle[0]
    p2p_links = [w for w in cycle if w.seq is None]
    details = {"frames": frames, "cycle": [(w.waiter, w.target, w.group, w.seq) for w in cycle]}
    if p2p_links and len(p2p_links) == len(cycle):
        broke = _pattern_breakers(ctx, comp, cycle)
        if broke and len(broke) < len(comp):
            return _broken_pattern_finding(ctx, broke, cycle, comp, graph, details)
        ranks = sorted(comp)
        behind = sorted(reaching(comp, graph))
        also = f"; {ranks_phrase(behind)} {wait_verb(behind)} behind them" if behind else ""
        return Finding(
            kind="p2p_deadlock", group=ctx.groups[first.group], collective_seq_id=None,
            op="send/recv", culprit_ranks=ranks, waiting_ranks=behind, blocking=True,
            message=(f"{ranks_phrase(ranks).capitalize()} deadlock in send/recv: "
                     + ", ".join(hops) + f"{also}. Each posted its op before the one its "
                     "peer waits for (on gloo a send blocks until the matching recv is "
                     "posted): reorder them, or use batch_isend_irecv."),
            details=details,
        )
    if p2p_links:
        link = p2p_links[0]
        culprit = link.target
        partner = "recv" if link.op == "send" else "send"
        direction = "to" if link.op == "send" else "from"
        waiting = sorted((comp | reaching(comp, graph)) - {culprit})
        return Finding(
            kind="p2p_unmatched", group=ctx.groups[link.group], collective_seq_id=None,
            op=link.op, culprit_ranks=[culprit], waiting_ranks=waiting, blocking=True,
            message=(f"Rank {link.waiter} waits in {link.op} {direction} rank {culprit} "
                     f"({ctx.group_ref(link.group)}) but rank {culprit} never posted the "
                     f"matching {partner}: it went on and now waits itself, so the job "
                     f"deadlocks: " + ", ".join(hops) + f". {ranks_phrase(waiting).capitalize()} "
                     f"{wait_verb(waiting)} behind it."),
            details={**details, "cycle_root": True},
        )
    culprits, major = _deviants(ctx, comp, graph)
    behind = sorted((comp | reaching(comp, graph)) - set(culprits))
    n_groups = len({w.group for w in cycle})
    if major is not None:
        g = ctx.groups[major]
        text = (f"{ranks_phrase(culprits).capitalize()} issued collectives of "
                f"{plural(n_groups, 'group')} out of order: "
                f"{ranks_phrase(behind)} wait in {g.label()} first, "
                f"{ranks_phrase(culprits)} in another group, so they wait for each other: "
                + ", ".join(hops) + ".")
    else:
        also = f"; {ranks_phrase(behind)} {wait_verb(behind)} behind them" if behind else ""
        text = (f"{ranks_phrase(culprits).capitalize()} wait for each other across "
                f"{plural(n_groups, 'group')}: " + ", ".join(hops) + f"{also}.")
    return Finding(
        kind="cross_group_deadlock", group=ctx.groups[first.group], collective_seq_id=first.seq,
        op=record_op(ctx, first.waiter, first.group, first.seq) or first.op,
        culprit_ranks=culprits, waiting_ranks=behind, message=text, blocking=True,
        details=details,
    )
