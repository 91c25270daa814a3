"""Ranks blocked creating a process group, and the member that never came to create it.

Creating a group is a rendezvous of its members: a rank that skips ``new_group`` (or a
mesh, or ``init_process_group`` itself) leaves the others blocked *outside* every
collective, while it goes on and, often, waits in a later collective for them. Without
the creations, the blocked ranks look like the culprits of that later collective.
commscope's dumps record each creation (``commscope_group_creations``); PyTorch's native
dumps have no such record (the wording says so where it matters).

Algorithm:

1. :func:`creation_waits`: a rank with an unfinished creation waits for every member
   that never started the same creation (same name, description and members), or left
   no dump at all. These edges join the wait-for graph.
2. :func:`creation_findings`: one ``missing_rank`` finding per unfinished creation with
   such members: they are the culprits; the ranks blocked in it, and every rank that
   waits on the culprits (the culprit's own later collective, transitively), wait.
   Culprits and waiters are *explained*: no later collective or cycle blames them again.
"""

from __future__ import annotations

from collections import defaultdict

from commscope.analyze.diagnose.context import Context
from commscope.analyze.diagnose.waits import Wait, WaitGraph, reaching
from commscope.analyze.model import Creation, Finding, Group, LoadResult
from commscope.analyze.text import frame_text, place_text, rank_list, ranks_phrase

__all__ = ["creation_waits", "creation_findings", "CREATE_OP"]

CREATE_OP = "create"
"""The ``op`` of a wait-for edge into a group creation."""


def _started(load: LoadResult) -> dict[tuple[str, str, tuple[int, ...]], set[int]]:
    out: dict[tuple[str, str, tuple[int, ...]], set[int]] = defaultdict(set)
    for r, d in load.dumps.items():
        for c in d.creations:
            out[c.identity].add(r)
    return out


def _knows_creations(load: LoadResult, rank: int) -> bool:
    """Whether ``rank``'s dump would show a creation it started (ours: yes; native: no
    such record, so its silence proves nothing)."""
    d = load.dumps.get(rank)
    return d is None or d.source == "commscope"


def _unfinished(load: LoadResult) -> list[tuple[int, Creation, list[int]]]:
    """(rank, its unfinished creation, the members that never started it)."""
    started = _started(load)
    out = []
    for r, d in sorted(load.dumps.items()):
        for c in d.creations:
            if c.done:
                continue
            absent = [q for q in c.ranks if q != r and q not in started[c.identity]
                      and _knows_creations(load, q)]
            out.append((r, c, absent))
    return out


def creation_waits(load: LoadResult) -> list[Wait]:
    """Step 1 of the module doc."""
    return [Wait(r, q, c.name, None, CREATE_OP)
            for r, c, absent in _unfinished(load) for q in absent]


def _label(c: Creation) -> str:
    if c.desc == "default_pg":
        return f"the default group (ranks {rank_list(c.ranks)}, init_process_group)"
    desc = f"{c.desc}, " if c.desc and c.desc != c.name else ""
    return f"group {c.desc or c.name} ({desc if not c.desc else ''}ranks {rank_list(c.ranks)})"


def _instead(ctx: Context, rank: int) -> str:
    """What a culprit did instead of creating the group."""
    d = ctx.load.dumps.get(rank)
    if d is None:
        return (f"rank {rank} left no dump: it never started recording (stuck before, or "
                "never launched) or died")
    if d.pending:
        group, seq, index = d.pending[0]
        frame = ctx.frames.frame(rank, index)
        what = ctx.op_at(rank, group, seq) if seq >= 0 else "a send/recv"
        return (f"rank {rank} went on to {what} of {ctx.group_ref(group)} and waits there "
                f"(at {frame_text(frame)})")
    place = ctx.frames.main_place(rank)
    if place is not None:
        return f"rank {rank} is alive and in no collective: at {place_text(place)}"
    return f"where rank {rank} is now is unknown"


def creation_findings(ctx: Context, graph: WaitGraph) -> tuple[list[Finding], set[int]]:
    """Step 2 of the module doc: the findings and every rank they explain.

    A member that is itself blocked creating another group is not a cause: its own wait
    leads on to one. A member that went on to a collective (and waits there for the
    blocked ones) is. The creations that lack the same culprits are one
    finding: one cause, one finding.
    """
    unfinished = _unfinished(ctx.load)
    creating = {r for r, _, _ in unfinished}
    causes: dict[tuple[int, ...], dict[tuple[str, str, tuple[int, ...]],
                                       tuple[Creation, set[int]]]] = {}
    for r, c, absent in unfinished:
        culprits = tuple(sorted(q for q in absent if q not in creating))
        if culprits:
            _, blocked = causes.setdefault(culprits, {}).setdefault(c.identity, (c, set()))
            blocked.add(r)
    findings: list[Finding] = []
    explained: set[int] = set()
    for culprit_key, creations in sorted(causes.items()):
        culprits = list(culprit_key)
        blocked_all = set().union(*(b for _, b in creations.values()))
        waiting = sorted((blocked_all | reaching(set(culprits), graph)) - set(culprits))
        parts = []
        for c, blocked in creations.values():
            first = min(blocked)
            creator = next(x for x in ctx.load.dumps[first].creations
                           if x.identity == c.identity and not x.done)
            at = place_text(creator.place) if creator.place else "an unknown place"
            verb = "waits" if len(blocked) == 1 else "wait"
            made = "init_process_group" if c.desc == "default_pg" else "new_group"
            parts.append(f"{_label(c)}, which {ranks_phrase(sorted(blocked))} {verb} to "
                         f"create ({made} at {at})")
        first_c = next(iter(creations.values()))[0]
        default = first_c.desc == "default_pg"
        never = "never joined" if default else "never created"
        behind = sorted(set(waiting) - blocked_all)
        behind_text = (f"; {ranks_phrase(behind)} {'waits' if len(behind) == 1 else 'wait'} "
                       "behind them" if behind else "")
        instead = "; ".join(_instead(ctx, q) for q in culprits[:4])
        fix = ("every rank must call init_process_group" if default and len(creations) == 1
               else "every member must create each group, in the same order")
        group = Group(key=first_c.name or first_c.desc, name=first_c.name or first_c.desc,
                      desc=first_c.desc, ranks=first_c.ranks, membership="creation")
        findings.append(Finding(
            kind="missing_rank", group=group, collective_seq_id=None,
            op="init_process_group" if default else "new_group",
            culprit_ranks=culprits, waiting_ranks=waiting, blocking=True,
            message=(f"{ranks_phrase(culprits).capitalize()} {never} "
                     f"{'; nor '.join(parts)}{behind_text}; {instead}. The others cannot "
                     f"go on: {fix}."),
            details={"creations": [c.identity for c, _ in creations.values()]},
        ))
        explained.update(culprits)
        explained.update(waiting)
    return findings, explained
