"""Which link of a wait cycle is a rank that skipped a collective and went on.

A rank that skips collective #s of group G and goes on to #t of group H makes a cycle
in the wait graph: the other members of G wait for it in G#s while it waits for them in
H#t. The cycle is real, but it is a consequence: the root cause is the skip. What tells
the two apart is the ranks outside the cycle, which ran the same program.

Algorithm (:func:`find_skip`), for one cycle of
:func:`commscope.analyze.diagnose.waits.find_cycles`:

1. For each edge "W waits for T in G#s", T's own edge of the cycle says where T waits
   instead: H#t. The hypothesis is "T should have issued G#s before H#t".
2. Witnesses are the ranks with a dump outside the cycle (the lowest
   :data:`MAX_WITNESSES`, so the answer does not depend on file order and stays cheap).
   For each, find the record that plays the part of G#s: its own G#s when it belongs
   to G, else #s of the one *sibling* group it belongs to (same ``desc``, same sequence
   number, same op, and the same user stack frame as W's record when both have one;
   a desc that says nothing, ``""`` or ``undefined``, needs the frames). Without a
   sibling of that desc, the one group of another desc whose #s (same op) was issued
   at the very line of W's record plays the part (pipeline stages or pairs named each
   for itself, ``stage_0``, ``stage_1``, run the same line). Likewise for H#t against
   T's record.
3. A witness with both records votes *for* when its G#s record comes before its H#t
   one in its file, *against* otherwise.
4. An edge is the skip when it has more votes for than against. Exactly one edge of the
   cycle must be one (the votes of a two-rank cycle's edges are mirror images, so at
   most one can win); otherwise (no witnesses, a tie, several) the cycle stays a
   ``cross_group_deadlock``.
"""

from __future__ import annotations

from dataclasses import dataclass

from commscope.analyze.diagnose.context import Context
from commscope.analyze.diagnose.waits import Wait, WaitGraph, reaching
from commscope.analyze.model import Finding
from commscope.analyze.read.places import Frame
from commscope.analyze.text import ranks_phrase

__all__ = ["Skip", "find_skip", "skip_finding", "MAX_WITNESSES"]

MAX_WITNESSES = 32
"""Witnesses looked at per cycle (their stacks may be read back from their files)."""

_VAGUE_DESCS = ("", "undefined")


@dataclass(slots=True)
class Skip:
    """The cycle edge ``missed`` is a skip: its target went on to ``instead``."""

    missed: Wait
    """``missed.waiter`` waits for ``missed.target`` in ``missed.group`` #``missed.seq``."""
    instead: Wait
    """Where the culprit (``missed.target``) waits instead."""
    before: list[int]
    """Witnesses that issued the missed collective before the one the culprit waits in."""
    after: list[int]
    """Witnesses with the opposite order."""


def _frame_key(frame: Frame | None) -> tuple[str, int] | None:
    return (frame[1], frame[2]) if frame is not None else None


class _Roles:
    """Finds, in a witness's dump, the record playing the part of a reference record."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._ref_frames: dict[tuple[int, str, int], tuple[str, int] | None] = {}

    def _ref_frame(self, rank: int, group: str, seq: int) -> tuple[str, int] | None:
        key = (rank, group, seq)
        if key not in self._ref_frames:
            self._ref_frames[key] = _frame_key(self.ctx.frame_at(rank, group, seq))
        return self._ref_frames[key]

    def position(self, witness: int, group: str, seq: int, ref: int) -> int | None:
        """Index in ``witness``'s entries of its counterpart of ``ref``'s ``group`` #``seq``."""
        ctx = self.ctx
        dump = ctx.load.dumps[witness]
        if group in dump.tracks:
            return ctx.index(witness, group, seq)
        if witness in ctx.groups[group].ranks:
            return None  # a member without the record: it never got there
        ref_sig = ctx.sig(ref, group, seq)
        if ref_sig is None:
            return None
        desc = ctx.groups[group].desc
        found: list[tuple[str, int]] = []
        alike: list[int] = []
        theirs = self._ref_frame(ref, group, seq)
        for key in sorted(dump.tracks):
            g = ctx.groups.get(key)
            if g is None or key == group:
                continue
            sig = ctx.sig(witness, key, seq)
            index = ctx.index(witness, key, seq)
            if sig is None or index is None or sig.op != ref_sig.op:
                continue
            if g.desc == desc:
                found.append((key, index))
            elif theirs is not None and _frame_key(ctx.frames.frame(witness, index)) == theirs:
                alike.append(index)  # a group of its own name, issued at the same line
        if not found:
            return alike[0] if len(alike) == 1 else None
        if len(found) != 1:
            return None
        key, index = found[0]
        mine = _frame_key(ctx.frames.frame(witness, index))
        if mine is not None and theirs is not None:
            return index if mine == theirs else None
        return None if desc in _VAGUE_DESCS else index


def find_skip(ctx: Context, cycle: list[Wait]) -> Skip | None:
    """The one edge of ``cycle`` that is a skipped collective, if witnesses say so."""
    in_cycle = {w.waiter for w in cycle}
    witnesses = sorted(r for r in ctx.load.dumps if r not in in_cycle)[:MAX_WITNESSES]
    if not witnesses:
        return None
    roles = _Roles(ctx)
    winners: list[Skip] = []
    for i, missed in enumerate(cycle):
        instead = cycle[(i + 1) % len(cycle)]
        if missed.seq is None or instead.seq is None or instead.waiter != missed.target:
            continue  # p2p links carry no sequence order to compare
        before, after = [], []
        for b in witnesses:
            first = roles.position(b, missed.group, missed.seq, missed.waiter)
            if first is None:
                continue
            then = roles.position(b, instead.group, instead.seq, instead.waiter)
            if then is None or then == first:
                continue
            (before if first < then else after).append(b)
        if len(before) > len(after):
            winners.append(Skip(missed=missed, instead=instead, before=before, after=after))
    return winners[0] if len(winners) == 1 else None


def skip_finding(ctx: Context, skip: Skip, cycle: list[Wait], graph: WaitGraph) -> Finding:
    """The ``missing_rank`` finding of a skip, the cycle named as its consequence."""
    m, inst = skip.missed, skip.instead
    culprit = m.target
    g, h = ctx.groups[m.group], ctx.groups[inst.group]
    seq = m.seq if m.seq is not None else 0
    view = ctx.views.get(m.group)
    f = view.frontier if view is not None else None
    waiting = sorted(f.waiting) if f is not None and f.seq == seq and f.waiting else [m.waiter]
    sig = ctx.sig(m.waiter, m.group, seq)
    what = f"{sig.op} #{seq} ({sig.sizes_text()})" if sig else f"collective #{seq}"
    ring = {w.waiter for w in cycle}
    held = sorted(reaching(ring, graph) | (ring - {culprit} - set(waiting)))
    others = sorted({w.target for w in graph.out.get(culprit, [])
                     if w.group == inst.group and w.seq == inst.seq})
    held_text = f", so {ranks_phrase(held)} wait too" if held else ""
    last, frame = ctx.last_text(culprit), ctx.last_activity(culprit)[1]
    where = ctx.op_at(culprit, inst.group, inst.seq) if inst.seq is not None else inst.op
    verb = "waits" if len(waiting) == 1 else "wait"
    named = all(b in g.ranks or any(ctx.groups[k].desc == g.desc and k != g.key
                                    for k in ctx.load.dumps[b].tracks if k in ctx.groups)
                for b in skip.before)
    theirs = (g.desc or "their") if named else "their own"
    message = (
        f"Rank {culprit} never joined {what} of {g.label()}, which {ranks_phrase(waiting)} "
        f"{verb} in: it went on to {where} of {h.label()} and waits there for "
        f"{ranks_phrase(others)}{held_text}; {ranks_phrase(skip.before)} issued "
        f"{theirs} {ctx.op_at(m.waiter, m.group, seq)} before {where} of "
        f"{h.ref()}, so rank {culprit} skipped or postponed it; its last record is {last}."
    )
    return Finding(
        kind="missing_rank", group=g, collective_seq_id=seq, op=sig.op if sig else None,
        culprit_ranks=[culprit], waiting_ranks=sorted(set(waiting) | set(held)),
        message=message, blocking=True,
        details={"frames": {culprit: frame},
                 "cycle": [(w.waiter, w.target, w.group, w.seq) for w in cycle],
                 "witnesses": (list(skip.before), list(skip.after))},
    )
