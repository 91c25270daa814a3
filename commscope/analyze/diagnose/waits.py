"""Who waits for whom, and the cycles in it.

This is the one graph every verdict and finding comes from. Nodes are ranks, with or
without a dump; an edge says "this rank cannot go on until that rank issues
something".

Algorithm (:func:`build_waits`, :func:`find_cycles`):

1. For every group whose frontier has waiting ranks, each waiting rank waits for each
   rank that never reached the frontier collective (an edge labelled with the group
   and sequence number).
2. For every group, a rank with an unfinished collective of it waits for the members
   that left no dump (they may never have reached it: crashed or not collected).
3. For every unfinished send/recv with no partner, its rank waits for the peer; an
   unfinished send/recv whose peer left no dump waits for that peer too.
4. A rank is *stuck* when it has an outgoing edge or an unfinished collective whose
   ranks disagree; a rank that others wait for and that is not stuck is *free*: it
   went elsewhere (missing rank, unmatched p2p) or is gone (crashed).
5. Cycles: strongly connected components of the rank graph (Tarjan's algorithm,
   iterative so 100 000 ranks do not hit Python's recursion limit). Every component
   of two or more ranks is one deadlock (through send/recv, across groups, or both);
   one concrete cycle through it is extracted for the message, starting at its
   lowest rank.
6. Ranks outside a set (a root, a cycle) that can reach it wait behind it (reverse
   reachability, transitively down chains).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from commscope.analyze.align.match import GroupView, P2PIssue
from commscope.analyze.model import COMPLETED, RETIRED, LoadResult

__all__ = ["Wait", "WaitGraph", "build_waits", "find_cycles", "reaching", "strong_components"]

_DONE = RETIRED | COMPLETED
Node = TypeVar("Node", bound=Hashable)


@dataclass(frozen=True, slots=True)
class Wait:
    """``waiter`` cannot go on until ``target`` issues something."""

    waiter: int
    target: int
    group: str
    seq: int | None
    """Collective sequence number; ``None`` for a p2p wait."""
    op: str
    why: str = "lack"
    """``lack``: the target never issued it (or never reached it, gloo); ``behind``: the
    target issued it but its device has not reached it (queued behind its own oldest
    unfinished op, device backends); ``nodump``: the target left no dump."""


class WaitGraph:
    """Edges by waiter, with the stuck/free classification."""

    def __init__(self, waits: Iterable[Wait], busy: Iterable[int]) -> None:
        self.out: dict[int, list[Wait]] = {}
        for w in waits:
            if w.waiter != w.target:
                self.out.setdefault(w.waiter, []).append(w)
        for edges in self.out.values():
            edges.sort(key=lambda w: (w.target, w.group, w.seq if w.seq is not None else -1))
        self.busy = set(busy)

    def stuck(self, rank: int) -> bool:
        """The rank is itself waiting (an edge) or in a disagreeing unfinished collective."""
        return rank in self.out or rank in self.busy

    def edges(self) -> Iterable[Wait]:
        """Every edge, in rank order."""
        for r in sorted(self.out):
            yield from self.out[r]


def build_waits(views: dict[str, GroupView], p2p: list[P2PIssue],
                pending_mismatch_ranks: Iterable[int],
                load: LoadResult | None = None, extra: Iterable[Wait] = ()) -> WaitGraph:
    """Steps 1-4 of the module doc (steps 2 and 3's no-dump peers need ``load``);
    ``extra``: more edges (a rank blocked creating a group waits for its absent members,
    :mod:`.creations`)."""
    waits: list[Wait] = list(extra)
    for key in sorted(views):
        view = views[key]
        f = view.frontier
        if f is not None and f.waiting and not f.completed_by:
            for w in f.waiting:
                for q in f.lack:
                    waits.append(Wait(w, q, key, f.seq, "collective"))
        if view.nodump and load is not None:
            for r in sorted(view.spans):
                seq = _oldest_unfinished(load, r, key)
                if seq is not None:
                    waits.extend(Wait(r, q, key, seq, "collective") for q in view.nodump)
    for issue in p2p:
        if issue.kind == "unmatched" and not issue.op.status & _DONE and issue.peer is not None:
            waits.append(Wait(issue.rank, issue.peer, issue.group, None, issue.op.op))
    if load is not None:
        for r, d in sorted(load.dumps.items()):
            for op in d.p2p:
                if op.peer is not None and op.peer not in load.dumps and not op.status & _DONE:
                    waits.append(Wait(r, op.peer, op.group, None, op.op))
    return WaitGraph(waits, pending_mismatch_ranks)


def _oldest_unfinished(load: LoadResult, rank: int, group: str) -> int | None:
    for g, seq, _ in load.dumps[rank].pending:
        if g == group and seq >= 0:
            return seq
    return None


def strong_components(nodes: Iterable[Node], successors: Callable[[Node], Sequence[Node]]
                      ) -> list[list[Node]]:
    """The strongly connected components of the graph reached from ``nodes`` (each
    component sorted), by Tarjan's algorithm without recursion (thousands of ranks);
    ``successors(v)`` is asked once per node."""
    index: dict[Node, int] = {}
    low: dict[Node, int] = {}
    on_stack: set[Node] = set()
    stack: list[Node] = []
    comps: list[list[Node]] = []
    succ: dict[Node, Sequence[Node]] = {}
    counter = 0
    for root in nodes:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on_stack.add(v)
                succ[v] = successors(v)
            edges = succ[v]
            recurse = False
            while i < len(edges):
                w = edges[i]
                i += 1
                if w not in index:
                    work.append((v, i))
                    work.append((w, 0))
                    recurse = True
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            if recurse:
                continue
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                comps.append(sorted(comp))  # type: ignore[type-var]
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    return comps


def _one_cycle(comp: set[int], graph: WaitGraph) -> list[Wait]:
    start = min(comp)
    path: list[Wait] = []
    seen = {start: 0}
    v = start
    while True:
        nxt = next(w for w in graph.out[v] if w.target in comp)
        path.append(nxt)
        v = nxt.target
        if v in seen:
            return path[seen[v]:]
        seen[v] = len(path)


def find_cycles(graph: WaitGraph) -> list[list[Wait]]:
    """Wait cycles, one per strongly connected component of two or more ranks (step 5)."""
    nodes = sorted(set(graph.out) | {w.target for w in graph.edges()})
    cycles = []
    for comp in strong_components(nodes, lambda v: [e.target for e in graph.out.get(v, [])]):
        if len(comp) < 2:
            continue
        cycles.append(_one_cycle(set(comp), graph))
    cycles.sort(key=lambda c: min(w.waiter for w in c))
    return cycles


def reaching(targets: set[int], graph: WaitGraph) -> set[int]:
    """Ranks outside ``targets`` that wait on them, directly or through others (step 6)."""
    reverse: dict[int, set[int]] = {}
    for w in graph.edges():
        reverse.setdefault(w.target, set()).add(w.waiter)
    found: set[int] = set()
    todo = list(targets)
    while todo:
        v = todo.pop()
        for u in reverse.get(v, ()):
            if u not in targets and u not in found:
                found.add(u)
                todo.append(u)
    return found
