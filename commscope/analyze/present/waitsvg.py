"""The wait-for graph drawn: one inline SVG string, the same in the HTML report and on
``commscope watch --web``'s page (no script, no external resource, every name escaped,
its own scoped style).

Layout (:func:`render_svg`), deterministic:

1. The nodes of each cycle of arrows (a strongly connected component) form one unit,
   drawn as a ring in the order the arrows go, so a cycle reads as a cycle; every
   other node is a unit of its own.
2. Columns, left to right: a unit's column is the longest path from it to a unit that
   waits for nobody (the culprits), counted from the right; an arrow always goes right.
3. The rightmost column is ordered root cause first, then by first rank; every column to
   its left by the mean height of what its nodes wait for, so arrows cross little.
4. Arrows: a curve from a node's right side into its target's left side (the ends of
   several arrows into one node spread apart), a bulging arc between the nodes of a
   ring with its label outside the ring, a loop over a folded node that waits for
   itself; an arrowhead drawn as a triangle (no ``<marker>``: no ids to collide when two
   drawings share a page). Arrows are drawn after the boxes, so no box hides a label;
   a label is two short lines (the op, then ``of`` its group) that fit between two
   columns (:func:`label_lines`).

Nodes are ``<g class="node culprit root">`` (classes: the node's states) with a
``<title>``; arrows ``<g class="edge wait">`` (``cycle``, ``victim``) with a ``<title>``
and their label as text.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from itertools import pairwise

from commscope.analyze.diagnose.waits import strong_components
from commscope.analyze.present.waitgraph import Edge, Node, WaitForGraph
from commscope.analyze.text import rank_list

__all__ = ["BOX_W", "BOX_H", "render_svg", "label_lines"]

BOX_W = 232
"""A node's box, in SVG pixels: three lines of about 36 characters."""
BOX_H = 58
"""A node's box height, in SVG pixels."""
_COL_GAP, _ROW_GAP, _MARGIN, _TOP = 250, 30, 24, 46
_LABEL_W = 120
"""Room beside a ring for the labels of its arrows."""
_LABEL_CHARS = 34
"""An arrow's label is at most two lines of this many characters (the op, then its
group): at most about 240 pixels at 11 px, so a label fits between two columns."""
_BAD_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
_STYLE = """
svg.waitgraph { font: 12px system-ui, -apple-system, "Segoe UI", sans-serif;
  max-width: 100%; height: auto; background: #fff; }
svg.waitgraph .node rect { fill: #eef3f8; stroke: #7a8794; stroke-width: 1.2; }
svg.waitgraph .node text { font-weight: 400; }
svg.waitgraph .node .who { font-weight: 600; }
svg.waitgraph .node .what, svg.waitgraph .node .where { fill: #4b5560; font-size: 11px; }
svg.waitgraph .node.cycle rect { stroke: #b54708; stroke-width: 2; }
svg.waitgraph .node.culprit rect { fill: #fde8e7; stroke: #b42318; stroke-width: 2.5; }
svg.waitgraph .node.root rect { stroke-width: 4; }
svg.waitgraph .node.crashed rect { fill: #3b2220; }
svg.waitgraph .node.crashed text { fill: #fff; }
svg.waitgraph .node.silent rect, svg.waitgraph .node.nodump rect { stroke-dasharray: 6 3; }
svg.waitgraph .node.stuck rect { fill: #fff4d6; stroke: #b54708; }
svg.waitgraph .node.victim rect { fill: #f2f2f2; stroke: #8a8a8a; stroke-dasharray: 3 3; }
svg.waitgraph .edge path { fill: none; stroke: #5b6672; stroke-width: 1.5; }
svg.waitgraph .edge polygon { fill: #5b6672; }
svg.waitgraph .edge.cycle path { stroke: #b54708; stroke-width: 2.2; }
svg.waitgraph .edge.cycle polygon { fill: #b54708; }
svg.waitgraph .edge.victim path { stroke: #8a8a8a; stroke-dasharray: 5 3; }
svg.waitgraph .edge.victim polygon { fill: #8a8a8a; }
svg.waitgraph .edge text { font-size: 11px; fill: #1d232a; paint-order: stroke;
  stroke: #fff; stroke-width: 4px; stroke-linejoin: round; }
svg.waitgraph .legend text { font-size: 11px; fill: #4b5560; }
"""


def _esc(text: str) -> str:
    """Text safe inside an XML element or a double-quoted attribute."""
    text = _BAD_XML.sub("", text)
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;").replace("'", "&#39;"))


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[:n - 1] + "…"


def _components(ids: list[str], out: dict[str, list[str]]) -> list[list[str]]:
    """Strongly connected components, in ``ids`` order."""
    pos = {v: i for i, v in enumerate(ids)}
    comps = strong_components(ids, lambda v: out.get(v, []))
    return sorted((sorted(c, key=pos.__getitem__) for c in comps), key=lambda c: pos[c[0]])


def _ring_order(comp: list[str], out: dict[str, list[str]]) -> list[str]:
    """The nodes of a cycle in the order its arrows go, from its first node."""
    inside = set(comp)
    order = [comp[0]]
    seen = {comp[0]}
    while True:
        nxt = next((w for w in out.get(order[-1], []) if w in inside and w not in seen), None)
        if nxt is None:
            break
        order.append(nxt)
        seen.add(nxt)
    return order + [v for v in comp if v not in seen]


@dataclass
class _Unit:
    """One thing a column holds: a node, or the ring of a cycle's nodes."""

    nodes: list[str]
    width: float
    height: float
    offsets: dict[str, tuple[float, float]]
    """Each node's centre relative to the unit's centre."""
    x: float = 0.0
    y: float = 0.0


def _unit(comp: list[str], out: dict[str, list[str]], loops: set[str]) -> _Unit:
    if len(comp) == 1:
        if comp[0] in loops:  # room above the box for its loop and label
            return _Unit(comp, BOX_W + 40, BOX_H + 64, {comp[0]: (0.0, 32.0)})
        return _Unit(comp, BOX_W, BOX_H, {comp[0]: (0.0, 0.0)})
    ring = _ring_order(comp, out)
    k = len(ring)
    if k == 2:
        ry = BOX_H / 2 + 56
        offsets = {ring[0]: (0.0, -ry), ring[1]: (0.0, ry)}
        return _Unit(ring, BOX_W + 2 * _LABEL_W, 2 * ry + BOX_H, offsets)
    s = math.sin(math.pi / k)
    rx = max(200.0, (BOX_W + 90) / (2 * s))
    ry = max(110.0, (BOX_H + 70) / (2 * s))
    offsets = {}
    for i, v in enumerate(ring):  # clockwise from the top
        angle = -math.pi / 2 + 2 * math.pi * i / k
        offsets[v] = (rx * math.cos(angle), ry * math.sin(angle))
    return _Unit(ring, 2 * rx + BOX_W + 2 * _LABEL_W, 2 * ry + BOX_H + 60, offsets)


def _layout(g: WaitForGraph) -> tuple[dict[str, tuple[float, float]], dict[str, _Unit],
                                      float, float]:
    """Node centres, the unit of each node, and the drawing's width and height."""
    ids = [n.id for n in g.nodes]
    out: dict[str, list[str]] = {v: [] for v in ids}
    for e in g.edges:
        if e.source != e.target and e.target not in out[e.source]:
            out[e.source].append(e.target)
    comps = _components(ids, out)
    loops = {e.source for e in g.edges if e.source == e.target}
    units = [_unit(c, out, loops) for c in comps]
    unit_of = {v: u for u in units for v in u.nodes}
    layer: dict[int, int] = {}

    def depth(u: _Unit) -> int:  # the longest path to a unit nobody in it waits beyond
        key = id(u)
        if key not in layer:
            layer[key] = 0
            nxt = {id(unit_of[w]): unit_of[w] for v in u.nodes for w in out[v]
                   if unit_of[w] is not u}
            layer[key] = 1 + max((depth(w) for w in nxt.values()), default=-1)
        return layer[key]

    top = max((depth(u) for u in units), default=0)
    columns: list[list[_Unit]] = [[] for _ in range(top + 1)]
    for u in units:
        columns[top - depth(u)].append(u)
    roots = {n.id for n in g.nodes if "root" in n.states}
    centre: dict[str, tuple[float, float]] = {}
    widths = [max(u.width for u in col) if col else BOX_W for col in columns]
    heights = [sum(u.height for u in col) + _ROW_GAP * (len(col) - 1) for col in columns]
    tall = max(heights, default=BOX_H)
    xs, x = [], _MARGIN
    for w in widths:
        xs.append(x + w / 2)
        x += w + _COL_GAP
    width = x - _COL_GAP + _MARGIN
    pos = {v: i for i, v in enumerate(ids)}
    for c in range(len(columns) - 1, -1, -1):  # right to left: a node faces what it waits for
        col = columns[c]

        def weight(u: _Unit) -> tuple[float, float]:
            ys = [centre[w][1] for v in u.nodes for w in out[v] if w in centre]
            if ys:
                return (0.0, sum(ys) / len(ys))
            return (0.0 if any(v in roots for v in u.nodes) else 1.0,
                    float(min(pos[v] for v in u.nodes)))

        col.sort(key=weight)
        y = _TOP + (tall - heights[c]) / 2
        for u in col:
            u.x, u.y = xs[c], y + u.height / 2
            for v in u.nodes:
                dx, dy = u.offsets[v]
                centre[v] = (u.x + dx, u.y + dy)
            y += u.height + _ROW_GAP
    return centre, unit_of, width, _TOP + tall + _MARGIN + 10


def _border(c: tuple[float, float], toward: tuple[float, float]) -> tuple[float, float]:
    """Where the line from box centre ``c`` toward ``toward`` leaves the box."""
    dx, dy = toward[0] - c[0], toward[1] - c[1]
    if dx == 0 and dy == 0:
        return c
    sx = (BOX_W / 2) / abs(dx) if dx else math.inf
    sy = (BOX_H / 2) / abs(dy) if dy else math.inf
    s = min(sx, sy)
    return c[0] + dx * s, c[1] + dy * s


def _arrowhead(tip: tuple[float, float], back: tuple[float, float]) -> str:
    dx, dy = tip[0] - back[0], tip[1] - back[1]
    n = math.hypot(dx, dy) or 1.0
    ux, uy = dx / n, dy / n
    bx, by = tip[0] - 9 * ux, tip[1] - 9 * uy
    pts = [tip, (bx - 4.5 * uy, by + 4.5 * ux), (bx + 4.5 * uy, by - 4.5 * ux)]
    return " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)


def _bezier(p: list[tuple[float, float]], t: float) -> tuple[float, float]:
    while len(p) > 1:
        p = [(a[0] + (b[0] - a[0]) * t, a[1] + (b[1] - a[1]) * t) for a, b in pairwise(p)]
    return p[0]


def _edge_svg(e: Edge, g: WaitForGraph, centre: dict[str, tuple[float, float]],
              unit_of: dict[str, _Unit], port: dict[tuple[str, str], float]) -> str:
    s, t = centre[e.source], centre[e.target]
    if e.source == e.target:  # a folded node whose ranks wait for each other
        x0, y0 = s[0] + 40, s[1] - BOX_H / 2
        pts = [(x0, y0), (x0 + 10, y0 - 46), (x0 - 90, y0 - 46), (x0 - 80, y0)]
        at, anchor = (x0 - 40, y0 - 44), "middle"
    elif unit_of[e.source] is unit_of[e.target]:  # a hop of a ring
        u = unit_of[e.source]
        a, b = _border(s, t), _border(t, s)
        mx, my = (a[0] + b[0]) / 2, (a[1] + b[1]) / 2
        nx, ny = mx - u.x, my - u.y
        if math.hypot(nx, ny) < 1:  # two nodes: bulge to the right of the direction
            nx, ny = -(b[1] - a[1]), b[0] - a[0]
        n = math.hypot(nx, ny) or 1.0
        bend = 26 + 0.12 * math.hypot(b[0] - a[0], b[1] - a[1])
        ctrl = (mx + nx / n * bend * 2, my + ny / n * bend * 2)
        a, b = _border(s, ctrl), _border(t, ctrl)
        pts = [a, ctrl, b]
        mid = _bezier(pts, 0.5)
        ux, uy = nx / n, ny / n  # the label outside the ring, clear of its arrow
        anchor = "start" if ux > 0.35 else "end" if ux < -0.35 else "middle"
        at = (mid[0] + 6 * ux, mid[1] + (6 * uy if anchor != "middle" else
                                         (16 if uy > 0 else -4)) + 4)
    else:
        a = (s[0] + BOX_W / 2, s[1])
        b = (t[0] - BOX_W / 2, t[1] + port.get((e.source, e.target), 0.0))
        if b[0] < a[0] + 20:  # not to the right: straight, border to border
            a, b = _border(s, t), _border(t, s)
            pts = [a, b]
        else:
            reach = (b[0] - a[0]) * 0.45
            pts = [a, (a[0] + reach, a[1]), (b[0] - reach, b[1]), b]
        at, anchor = _bezier(pts, 0.5), "middle"
    if len(pts) == 2:
        d = f"M{pts[0][0]:.1f},{pts[0][1]:.1f} L{pts[1][0]:.1f},{pts[1][1]:.1f}"
    elif len(pts) == 3:
        d = (f"M{pts[0][0]:.1f},{pts[0][1]:.1f} Q{pts[1][0]:.1f},{pts[1][1]:.1f} "
             f"{pts[2][0]:.1f},{pts[2][1]:.1f}")
    else:
        d = f"M{pts[0][0]:.1f},{pts[0][1]:.1f} C" + " ".join(
            f"{x:.1f},{y:.1f}" for x, y in pts[1:])
    src, dst = g.node(e.source), g.node(e.target)
    verb = "waits" if len(src.ranks) == 1 else "wait"
    who = src.lines[0]
    if e.waiters < len(src.ranks):  # some of a folded node's ranks only
        who = f"{e.waiters} of {who}"
        verb = "waits" if e.waiters == 1 else "wait"
    if e.kind == "victim":
        tip = f"{who}: {'; '.join(e.labels)}, killed by {dst.lines[0]}"
    else:
        tip = f"{who} {verb} for {dst.lines[0]} in {'; '.join(e.labels)}"
    return (f'<g class="edge {e.kind}" data-from="{e.source}" data-to="{e.target}">'
            f"<title>{_esc(tip)}</title><path d=\"{d}\"/>"
            f'<polygon points="{_arrowhead(pts[-1], pts[-2])}"/>'
            + _label_svg(e.label, at, anchor) + "</g>")


def label_lines(label: str) -> list[str]:
    """An arrow's label as at most two short lines: ``all_reduce #5 +1 more`` and ``of
    DATA_PARALLEL_GROUP`` (each cut to :data:`_LABEL_CHARS`)."""
    what, sep, rest = label.partition(" of ")
    if not sep:
        return [_cut(label, _LABEL_CHARS)]
    group, plus, more = rest.partition(" +")
    first = what + (f" +{more}" if plus else "")
    return [_cut(first, _LABEL_CHARS), _cut("of " + group, _LABEL_CHARS)]


def _label_svg(label: str, at: tuple[float, float], anchor: str) -> str:
    """The label's ``<text>``: its lines above the point ``at`` (the arrow's middle)."""
    lines = label_lines(label) if label else []
    if not lines:
        return ""
    top = at[1] - 7 - 13 * (len(lines) - 1)
    spans = "".join(f'<tspan x="{at[0]:.1f}" y="{top + 13 * i:.1f}">'
                    f'{" " if i else ""}{_esc(line)}</tspan>'  # text content: the label
                    for i, line in enumerate(lines))
    return f'<text text-anchor="{anchor}">{spans}</text>'


def _node_svg(n: Node, c: tuple[float, float]) -> str:
    x, y = c[0] - BOX_W / 2, c[1] - BOX_H / 2
    lines = n.lines[:3]
    first = c[1] - 7 * (len(lines) - 1) + 4
    spans = "".join(
        f'<text class="{cls}" x="{c[0]:.1f}" y="{first + 14 * i:.1f}" text-anchor="middle">'
        f"{_esc(_cut(line, 30 if cls == 'who' else 36))}</text>"
        for i, (cls, line) in enumerate(zip(("who", "what", "where"), lines)))
    ranks = rank_list(n.ranks, 6)
    return (f'<g class="node {" ".join(n.states)}" data-id="{n.id}" data-ranks="{_esc(ranks)}">'
            f"<title>{_esc(n.title)}</title>"
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{BOX_W}" height="{BOX_H}" rx="7"/>'
            f"{spans}</g>")


def _legend(g: WaitForGraph) -> tuple[str, float]:
    """The key of the states drawn, and how wide it is."""
    seen = {s for n in g.nodes for s in n.states}
    items = [(s, w) for s, w in (("root", "root cause"), ("culprit", "culprit"),
                                 ("crashed", "crashed"), ("silent", "silent"),
                                 ("nodump", "no dump"), ("victim", "victim"),
                                 ("cycle", "in a cycle"), ("waiting", "waiting"),
                                 ("stuck", "stuck inside an op all reached"))
             if s in seen]
    parts, x = [], _MARGIN
    for state, words in items:
        classes = "culprit root" if state == "root" else state
        parts.append(f'<g class="node {classes}"><rect x="{x}" y="10" width="18" height="12" '
                     f'rx="3"/></g><text x="{x + 24}" y="20">{words}</text>')
        x += 34 + 7 * len(words)
    parts.append(f'<text x="{x + 6}" y="20">A → B: A waits for B</text>')
    return f'<g class="legend">{"".join(parts)}</g>', x + 6 + 7 * 20 + _MARGIN


def render_svg(g: WaitForGraph) -> str:
    """The graph as one inline SVG element (module doc); ``""`` when the graph is empty."""
    if not g:
        return ""
    centre, unit_of, width, height = _layout(g)
    incoming: dict[str, list[Edge]] = {}
    for e in g.edges:
        if e.source != e.target and unit_of[e.source] is not unit_of[e.target]:
            incoming.setdefault(e.target, []).append(e)
    port: dict[tuple[str, str], float] = {}
    for edges in incoming.values():
        edges.sort(key=lambda e: centre[e.source][1])
        step = min(12.0, (BOX_H - 14) / max(1, len(edges)))
        for i, e in enumerate(edges):
            port[(e.source, e.target)] = (i - (len(edges) - 1) / 2) * step
    body = [_node_svg(n, centre[n.id]) for n in g.nodes]  # arrows over boxes: labels whole
    body += [_edge_svg(e, g, centre, unit_of, port) for e in g.edges]
    legend, legend_w = _legend(g)
    w, h = max(width, legend_w), height
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="waitgraph" '
            f'viewBox="0 0 {w:.0f} {h:.0f}" width="{w:.0f}" height="{h:.0f}" role="img" '
            f'aria-label="who waits for whom"><style>{_STYLE}</style>{legend}'
            f'{"".join(body)}</svg>')
