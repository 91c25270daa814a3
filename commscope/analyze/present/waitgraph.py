"""Who waits for whom, drawn: the wait-for graph of an analysis as a model and an SVG.

The HTML report and ``commscope watch --web`` draw the same picture, made here in
Python (so no page can tell it differently from the text report) as one inline SVG
string: no script, no external resource, every name escaped.

Algorithm (:func:`wait_graph`):

1. The facts come from the findings that stop the job (the blocking ones, and every
   crash), the ones the "where it is stuck" lines are made from. Each finding's
   culprits; its victims (ranks its cause killed), each with an arrow to the culprit
   (``died in broadcast #4 of default_pg``); each waiting rank with where it waits (its
   oldest unfinished op: ``all_reduce #5 of mesh_dp``, as the stuck lines say) and whom
   it waits for directly: the members of that group that never reached the collective
   (the group's frontier), else the members without a dump, the peer of a send/recv,
   else the finding's culprits. A finding through a cycle adds the cycle's hops (``rank
   3 waits for rank 1 in all_reduce #5 of default_pg``).
2. Each rank's states: ``culprit`` (``root``: of the first such finding), ``crashed``,
   ``silent`` (the live watch's), ``victim``, ``nodump``, ``cycle``, ``waiting``, and
   ``stuck`` (inside an op every rank reached: a stalled op, no one to blame).
3. Alike ranks fold into one node, at 8 ranks as at 4 096 (partition refinement: the
   same states, the same arrows with the same labels to the same nodes, the same arrows
   in), except that the ranks of a cycle of up to 12 and up to 6 culprits keep a node
   each. While that leaves more than :data:`MAX_NODES` nodes, labels stop counting,
   then arrows: ranks fold by state alone. A folded node says how many ranks and hosts
   it holds (``ranks 0-40, 42-4095 (4095)`` / ``waiting`` / ``all of 511 hosts; 7 of
   node005``).
4. One arrow per pair of nodes, labelled with what its waiters wait in (the most common
   label, ``+2 more`` when they differ; every label in its ``<title>``).

:mod:`commscope.analyze.present.waitsvg` draws it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from commscope.analyze.analysis import Analysis
from commscope.analyze.model import COMPLETED, RETIRED, Finding
from commscope.analyze.present.byhost import HostView, host_names, ranks_with_hosts
from commscope.analyze.summary import call_text, group_name
from commscope.analyze.text import plural, rank_list

__all__ = ["MAX_NODES", "MAX_EDGES", "Node", "Edge", "WaitForGraph", "wait_graph"]

MAX_NODES = 24
"""Folding goes on until at most this many nodes remain (ranks kept apart aside)."""
MAX_EDGES = 60
"""Arrows drawn at most; the rest are counted in the caption."""
_PIN_CYCLE = 12
"""A cycle of up to this many ranks keeps one node a rank, at any scale."""
_PIN_CULPRITS = 6
"""Up to this many culprits keep one node each, at any scale."""
_STATE_ORDER = ("root", "culprit", "crashed", "silent", "victim", "nodump", "cycle",
                "waiting", "stuck")
_KIND_ORDER = {"cycle": 0, "wait": 1, "victim": 2}
_DONE = RETIRED | COMPLETED


@dataclass
class Node:
    """One node of the picture: one rank, or alike ranks folded together."""

    id: str
    ranks: list[int]
    states: list[str]
    """Its classes: ``root``, ``culprit``, ``crashed``, ``silent``, ``victim``,
    ``nodump``, ``cycle``, ``waiting``, ``stuck`` (module doc, step 2)."""
    lines: list[str]
    """What its box says, one to three lines: who, what, where."""
    title: str
    """The longer text shown on hover: every rank with its hosts, and why."""

    def to_json(self) -> dict[str, Any]:
        """One entry of ``nodes`` in the ``wait_graph`` JSON."""
        return {"id": self.id, "ranks": list(self.ranks), "states": list(self.states),
                "lines": list(self.lines), "title": self.title}


@dataclass
class Edge:
    """One arrow: the ranks of ``source`` wait for the ranks of ``target``."""

    source: str
    target: str
    kind: str
    """``wait``; ``cycle`` (a hop of a cycle of waits); ``victim`` (killed by it)."""
    labels: list[str]
    """Where the waiters wait (``all_reduce #5 of mesh_dp``), most common first."""
    waiters: int = 1
    """How many ranks of ``source`` wait so (all of them, or some)."""

    @property
    def label(self) -> str:
        """The text on the arrow: its first label, ``+N more`` when there are others."""
        if not self.labels:
            return ""
        more = len(self.labels) - 1
        return self.labels[0] + (f" +{more} more" if more else "")

    def to_json(self) -> dict[str, Any]:
        """One entry of ``edges`` in the ``wait_graph`` JSON."""
        return {"from": self.source, "to": self.target, "kind": self.kind,
                "labels": list(self.labels), "waiters": self.waiters}


@dataclass
class WaitForGraph:
    """The picture's model: nodes, arrows, and what folding did."""

    nodes: list[Node] = field(default_factory=list)
    edges: list[Edge] = field(default_factory=list)
    ranks: int = 0
    """Ranks in the picture."""
    folded: bool = False
    """Some node holds several ranks."""
    more_edges: int = 0
    """Arrows left out past :data:`MAX_EDGES`."""
    caption: str = ""
    """One line under the drawing (what was folded, what was left out)."""

    def __bool__(self) -> bool:
        return bool(self.nodes)

    def node(self, node_id: str) -> Node:
        """The node with this id."""
        return next(n for n in self.nodes if n.id == node_id)

    def node_of(self, rank: int) -> Node | None:
        """The node that holds ``rank``, if it is in the picture."""
        return next((n for n in self.nodes if rank in n.ranks), None)

    def to_json(self) -> dict[str, Any]:
        """The ``wait_graph`` object (docs/analyze.md): ``nodes``, ``edges``, ``ranks``,
        ``folded``, ``more_edges``, ``caption``."""
        return {"nodes": [n.to_json() for n in self.nodes],
                "edges": [e.to_json() for e in self.edges], "ranks": self.ranks,
                "folded": self.folded, "more_edges": self.more_edges,
                "caption": self.caption}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WaitForGraph:
        """Read back :meth:`to_json` (the live page draws the snapshot's model)."""
        return cls(
            nodes=[Node(str(n["id"]), [int(r) for r in n["ranks"]],
                        [str(s) for s in n["states"]], [str(x) for x in n["lines"]],
                        str(n.get("title", ""))) for n in data.get("nodes", [])],
            edges=[Edge(str(e["from"]), str(e["to"]), str(e["kind"]),
                        [str(x) for x in e["labels"]], int(e.get("waiters", 1)))
                   for e in data.get("edges", [])],
            ranks=int(data.get("ranks", 0)), folded=bool(data.get("folded", False)),
            more_edges=int(data.get("more_edges", 0)), caption=str(data.get("caption", "")))


# ---------------------------------------------------------------- step 1: the facts


def _op_at(a: Analysis, rank: int, group: str, seq: int) -> str:
    d = a.load.dumps.get(rank)
    t = d.tracks.get(group) if d is not None else None
    if t is not None and t.lo <= seq <= t.hi:
        sid = t.sig[seq - t.lo]
        if 0 <= sid < len(a.load.sigs.sigs):
            return a.load.sigs.sigs[sid].op
    return "a collective"


class _Facts:
    """Step 1 and 2: rank states and rank-level arrows, kept as hyper-arrows (one per
    kind, label and set of targets, with all the ranks that wait so)."""

    def __init__(self, a: Analysis, silent: set[int]) -> None:
        self.a = a
        self.states: dict[int, set[str]] = {}
        self.kinds: dict[int, list[str]] = {}
        """Rank → the kinds of the findings that blame it."""
        self.stuck_in: dict[int, str] = {}
        """Rank → the op it is stuck inside, where no rank is to blame (a stalled op)."""
        self.arrows: dict[tuple[str, str, tuple[int, ...]], set[int]] = {}
        self._targets_memo: dict[tuple[Any, ...], tuple[int, ...]] = {}
        shown = [f for f in a.findings if f.blocking or f.kind == "crashed_rank"]
        first = next((f for f in shown if f.blocking), None)
        self.known: set[int] = set()
        """Every rank the findings name: the only ones an arrow may point at."""
        for f in shown:
            self.known.update(f.culprit_ranks, f.waiting_ranks, f.victims)
            for hop in f.details.get("cycle") or ():
                self.known.update(hop[:2])
        for f in shown:
            self._finding(f, f is first)
        for r in silent & set(self.states):
            self.states[r].add("silent")
        for r, states in self.states.items():
            if r in a.missing and not states & {"crashed", "silent", "victim"}:
                states.add("nodump")

    def _add(self, rank: int, state: str) -> None:
        self.states.setdefault(rank, set()).add(state)

    def _arrow(self, kind: str, label: str, source: int, targets: tuple[int, ...]) -> None:
        targets = tuple(t for t in targets if t != source)
        if targets:
            self.arrows.setdefault((kind, label, targets), set()).add(source)

    def _finding(self, f: Finding, root: bool) -> None:
        culprits = tuple(sorted(set(f.culprit_ranks)))
        for r in culprits:
            self._add(r, "culprit")
            if root:
                self._add(r, "root")
            if f.kind == "crashed_rank":
                self._add(r, "crashed")
            self.kinds.setdefault(r, []).append(f.kind)
        hops: set[tuple[int, int, str]] = set()
        for hop in f.details.get("cycle") or ():
            waiter, target, group, seq = hop
            label = self._hop_label(waiter, target, group, seq)
            hops.add((waiter, target, label))
            self._add(waiter, "cycle")
            self._add(target, "cycle")
            self._arrow("cycle", label, waiter, (target,))
        victims = sorted(set(f.victims) - set(culprits))
        for r in victims:
            self._add(r, "victim")
            self._arrow("victim", f"died in {call_text(f)}", r, culprits)
        for r in sorted(set(f.waiting_ranks) - set(culprits) - set(victims)):
            label, targets = self._waits_for(f, r, culprits)
            if not culprits and not hops:  # inside an op every rank reached: no arrow
                self._add(r, "stuck")
                self.stuck_in.setdefault(r, label)
                continue
            self._add(r, "waiting")
            if hops:
                targets = tuple(t for t in targets if (r, t, label) not in hops)
            self._arrow("wait", label, r, targets)

    def _hop_label(self, waiter: int, target: int, group: str, seq: int | None) -> str:
        name = group_name(self.a.groups.get(group), group)
        if seq is not None:
            return f"{_op_at(self.a, waiter, group, seq)} #{seq} of {name}"
        d = self.a.load.dumps.get(waiter)
        op = next((o.op for o in (d.p2p if d is not None else ()) if o.group == group
                   and o.peer == target and not o.status & _DONE), "send/recv")
        return f"{op} of {name}"

    def _waits_for(self, f: Finding, rank: int, culprits: tuple[int, ...]
                   ) -> tuple[str, tuple[int, ...]]:
        """Where ``rank`` waits (its oldest unfinished op) and whom for, directly."""
        a = self.a
        d = a.load.dumps.get(rank)
        for group, seq, index in d.pending if d is not None else ():
            name = group_name(a.groups.get(group), group)
            if seq < 0:  # a send or recv
                op = next((o for o in d.p2p if o.index == index), None)
                if op is None:
                    continue
                peer = (op.peer,) if op.peer is not None and op.peer in self.known else None
                return f"{op.op} of {name}", peer or culprits
            t = d.tracks.get(group)
            if t is None or not t.lo <= seq <= t.hi:
                continue
            return f"{_op_at(a, rank, group, seq)} #{seq} of {name}", \
                self._collective_targets(group, seq) or culprits
        return call_text(f), culprits

    def _collective_targets(self, group: str, seq: int) -> tuple[int, ...]:
        """The members that never reached ``seq`` (the group's frontier), else those
        without a dump; only ranks the findings name."""
        view = self.a.views.get(group)
        if view is None:
            return ()
        front = view.frontier
        if front is not None and front.lack and not front.completed_by and seq >= front.seq:
            key: tuple[Any, ...] = (group, "frontier")
            ranks = front.lack
        elif view.nodump:
            key, ranks = (group, "nodump"), view.nodump
        else:
            return ()
        found = self._targets_memo.get(key)
        if found is None:
            found = self._targets_memo[key] = tuple(sorted(r for r in ranks if r in self.known))
        return found


# ---------------------------------------------------------------- step 3: folding


def _refine(ranks: list[int], facts: _Facts, pinned: set[int], labels: bool, incoming: bool,
            rounds: int) -> dict[int, int]:
    """Rank → block number: alike ranks in one block (see module doc, step 3)."""
    def key0(r: int) -> tuple[Any, ...]:
        if r in pinned:
            return ("pin", r)
        return ("state", tuple(sorted(facts.states[r])), facts.stuck_in.get(r) if labels else None)

    first: dict[tuple[Any, ...], int] = {}
    block = {r: first.setdefault(key0(r), len(first)) for r in ranks}
    for _ in range(rounds):
        out: dict[int, set[Any]] = {r: set() for r in ranks}
        into: dict[int, set[Any]] = {r: set() for r in ranks}
        for (kind, label, targets), sources in facts.arrows.items():
            word = label if labels else ""
            to = frozenset(block[t] for t in targets)
            for s in sources:
                out[s].add((kind, word, to))
            if incoming:
                came = {(kind, word, block[s]) for s in sources}
                for t in targets:
                    into[t].update(came)
        keys: dict[tuple[Any, ...], int] = {}
        new = {r: keys.setdefault((block[r], frozenset(out[r]), frozenset(into[r])), len(keys))
               for r in ranks}
        done = len(keys) == len(set(block.values()))
        block = new
        if done:
            break
    return block


def _blocks(facts: _Facts) -> dict[int, int]:
    ranks = sorted(facts.states)
    cycle = {r for r, s in facts.states.items() if "cycle" in s}
    culprits = {r for r, s in facts.states.items() if "culprit" in s}
    pinned = (cycle if len(cycle) <= _PIN_CYCLE else set()) | (
        culprits if len(culprits) <= _PIN_CULPRITS else set())
    block: dict[int, int] = {}
    for labels, incoming, pins, rounds in ((True, True, pinned, 30), (True, False, pinned, 30),
                                           (False, False, pinned, 30), (False, False, set(), 0)):
        block = _refine(ranks, facts, pins, labels, incoming, rounds)
        if len(set(block.values())) <= MAX_NODES:
            break
    return block


# ---------------------------------------------------------------- step 3-4: nodes, arrows


def _state_words(states: set[str]) -> str:
    if "root" in states:
        words = "root cause"
    elif "culprit" in states:
        words = "culprit"
    elif "victim" in states:
        words = "victim, died"
    elif "waiting" in states or "cycle" in states:
        words = "waiting"
    elif "stuck" in states:
        words = "stuck inside"
    else:
        words = ""
    extra = [w for w in ("silent", "crashed", "nodump") if w in states]
    if extra:
        gone = {"silent": "silent", "crashed": "crashed", "nodump": "no dump"}[extra[0]]
        words = f"{words}, {gone}" if words else gone
    if "cycle" in states:
        words += " · in a cycle"
    return words


def _where(ranks: list[int], view: HostView) -> str:
    """The hosts of a node in a few words: ``hostB, pid 4242``; ``all of node005``;
    ``512 hosts: node[000-511]``; ``local rank 1 of 511 hosts``; ``all of 511 hosts; 7 of
    node005``; ``on 12 hosts``."""
    if not view.several:
        return ""
    if len(ranks) == 1:
        return view.label(ranks[0])
    whole, part, _ = view.split(ranks)
    if whole and not part:
        return (f"all of {whole[0]}" if len(whole) == 1 else
                f"{len(whole)} hosts: {host_names(whole, 2)}")
    if part and not whole:
        local = {tuple(view.by_host[h].index(r) for r in rs) for h, rs in part.items()}
        if len(part) == 1:
            return next(iter(part))
        if len(local) == 1:
            which = next(iter(local))
            words = "rank" if len(which) == 1 else "ranks"
            return f"local {words} {rank_list(which, 3)} of {len(part)} hosts"
    if whole and part:
        held = (f"{len(next(iter(part.values())))} of {next(iter(part))}" if len(part) == 1
                else f"{len(part)} hosts in part")
        return f"all of {plural(len(whole), 'host')}; {held}"
    return f"on {plural(len(part), 'host')}" if part else ""


def _node(facts: _Facts, view: HostView, index: int, ranks: list[int]) -> Node:
    states: set[str] = set().union(*(facts.states[r] for r in ranks))
    who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {rank_list(ranks, 2)}"
    if len(ranks) > 3 and not who.endswith(" ranks)"):  # a cut list says how many
        who += f" ({len(ranks)})"
    what = _state_words(states)
    inside = {facts.stuck_in[r] for r in ranks if r in facts.stuck_in}
    if len(inside) == 1 and states == {"stuck"}:
        what = f"stuck in {inside.pop()}"
    lines = [who, what, _where(ranks, view)]
    kinds = sorted({k for r in ranks for k in facts.kinds.get(r, ())})
    blame = f"; blamed by {', '.join(kinds)}" if kinds else ""
    title = f"{'rank' if len(ranks) == 1 else 'ranks'} {ranks_with_hosts(ranks, view, 24)}: " \
            f"{_state_words(states) or 'named by a finding'}{blame}"
    return Node(id=f"n{index}", ranks=ranks,
                states=[s for s in _STATE_ORDER if s in states],
                lines=[x for x in lines if x], title=title)


def wait_graph(a: Analysis, silent: set[int] | frozenset[int] = frozenset()) -> WaitForGraph:
    """The wait-for graph of ``a`` (module doc, steps 1-4); ``silent``: ranks the live
    watch heard nothing from. Empty when nothing stops the job."""
    facts = _Facts(a, set(silent))
    if not facts.states:
        return WaitForGraph()
    block = _blocks(facts)
    members: dict[int, list[int]] = {}
    for r in sorted(block):
        members.setdefault(block[r], []).append(r)
    order = sorted(members, key=lambda b: members[b][0])
    view = HostView.of(a.hosts)
    nodes = [_node(facts, view, i, members[b]) for i, b in enumerate(order)]
    node_of = {b: nodes[i].id for i, b in enumerate(order)}
    pairs: dict[tuple[str, str], tuple[set[str], Counter[str], set[int]]] = {}
    for (kind, label, targets), sources in sorted(facts.arrows.items(),
                                                  key=lambda kv: (kv[0][0], kv[0][1])):
        to = sorted({block[t] for t in targets})
        for s in sorted(sources):
            for tb in to:
                if tb == block[s] and len(members[tb]) == 1:
                    continue
                kinds, labels, who = pairs.setdefault((node_of[block[s]], node_of[tb]),
                                                      (set(), Counter(), set()))
                kinds.add(kind)
                labels[label] += 1
                who.add(s)
    edges = [Edge(src, dst, min(kinds, key=lambda k: _KIND_ORDER[k]),
                  [lab for lab, _ in sorted(labels.items(), key=lambda kv: (-kv[1], kv[0]))],
                  len(who))
             for (src, dst), (kinds, labels, who) in pairs.items()]
    roots = {n.id for n in nodes if "root" in n.states}
    edges.sort(key=lambda e: (_KIND_ORDER[e.kind], e.target not in roots, -e.waiters,
                              int(e.source[1:]), int(e.target[1:])))
    more = max(0, len(edges) - MAX_EDGES)
    edges = edges[:MAX_EDGES]
    folded = any(len(n.ranks) > 1 for n in nodes)
    parts = []
    if folded:
        parts.append(f"{len(block)} ranks in {plural(len(nodes), 'node')}: alike ranks "
                     "folded together (same state, waiting in the same op for the same ranks)")
    if more:
        parts.append(f"{plural(more, 'more arrow')} not drawn")
    return WaitForGraph(nodes=nodes, edges=edges, ranks=len(block), folded=folded,
                        more_edges=more, caption="; ".join(parts))

