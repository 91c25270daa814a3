"""The text report people read: verdict, findings root cause first, groups, bad files."""

from __future__ import annotations

import os
import textwrap
from collections import Counter

from commscope.analyze.analysis import Analysis
from commscope.analyze.model import COMPLETED, RETIRED
from commscope.analyze.text import rank_list

__all__ = ["format_report", "p2p_stops", "VERDICT_WORDS"]

VERDICT_WORDS = {
    "healthy": "HEALTHY: nothing is stuck and every rank agrees",
    "hang": "HANG: the job is stuck",
    "desync": "DESYNC: ranks disagreed about a collective that still completed",
    "crash": "CRASH: a rank died or left no dump",
    "incomplete": "INCOMPLETE: the dumps cannot decide",
}
_WIDTH = 100
_MAX_GROUP_ROWS = 40
_MAX_FILES = 20


def _sources(a: Analysis) -> str:
    kinds = Counter(
        ("commscope" if d.source == "commscope" else "PyTorch native", d.version, d.backend)
        for d in a.load.dumps.values()
    )
    parts = []
    for (source, version, backend), n in sorted(kinds.items()):
        extra = f", {backend}" if backend else ""
        parts.append(f"{n} {source} (version {version}{extra})")
    return "; ".join(parts) or "no readable dump"


def _shown_path(path: str, root: str | None) -> str:
    """A file's path relative to the analysed folder (itself when a file was given)."""
    if not root or os.path.isfile(root):
        return path
    return os.path.relpath(path, root)


def _wrap(text: str, first: str, rest: str) -> list[str]:
    return textwrap.wrap(text, _WIDTH, initial_indent=first, subsequent_indent=rest) or [first]


def p2p_stops(a: Analysis, group: str) -> str:
    """``p2p: 1 send->2, 3 recv<-2 unfinished`` for a group's unfinished send/recv."""
    parts = []
    for r, d in sorted(a.load.dumps.items()):
        for op in d.p2p:
            if op.group == group and not op.status & (RETIRED | COMPLETED):
                arrow = "->" if op.op == "send" else "<-"
                peer = "?" if op.peer is None else str(op.peer)
                parts.append(f"{r} {op.op}{arrow}{peer}")
                break
    if not parts:
        return ""
    shown = ", ".join(parts[:4]) + (f", +{len(parts) - 4}" if len(parts) > 4 else "")
    return f"p2p: {shown} unfinished"


def _group_rows(a: Analysis) -> list[str]:
    header = ("group", "desc", "ranks", "recorded", "compared", "mismatches", "stops at")
    rows = [header]
    for key in sorted(a.views, key=lambda k: (len(k), k))[:_MAX_GROUP_ROWS]:
        v = a.views[key]
        g = v.group
        spans = list(v.spans.values())
        recorded = (f"#{min(lo for lo, _ in spans)}-#{max(hi for _, hi in spans)}"
                    if spans and max(hi for _, hi in spans) > 0 else "-")
        stops = []
        if v.frontier is not None:
            f = v.frontier
            waits = f"{rank_list(f.waiting, 4)} wait" if f.waiting else "none waiting"
            stops.append(f"#{f.seq}: {waits}; {rank_list(f.lack, 4)} never came")
        if v.nodump:
            stops.append(f"no dump: {rank_list(v.nodump, 4)}")
        p2p_waits = p2p_stops(a, key)
        if p2p_waits:
            stops.append(p2p_waits)
        stop = "; ".join(stops) or "-"
        n_mis = len(v.mismatches) + v.more_mismatches
        rows.append((g.display, g.desc or "-", rank_list(g.ranks, 3), recorded, str(v.checked),
                     str(n_mis), stop))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
    out = []
    for r in rows:
        cells = [c.ljust(w) for c, w in zip(r, widths)]
        out.append("  " + "  ".join([*cells, r[-1]]))
    if len(a.views) > _MAX_GROUP_ROWS:
        out.append(f"  ... and {len(a.views) - _MAX_GROUP_ROWS} more groups (see --json/--html)")
    return out


def format_report(a: Analysis, source: str | None = None) -> str:
    """The analysis as text for a terminal or a file (see ``commscope analyze``)."""
    where = source or a.load.root or "."
    lines = [f"commscope analyze: {where}", f"dumps: {_sources(a)}", ""]
    lines += _wrap(f"verdict: {VERDICT_WORDS.get(a.verdict, a.verdict)}", "", "  ")
    lines.append("")
    lines.append("findings (root cause first):")
    for i, f in enumerate(a.findings, 1):
        label = f"  {i}. [{f.kind}] "
        lines += _wrap(f.message, label, " " * 6)
    lines.append("")
    lines.append(f"ranks: expected {rank_list(a.expected)}; loaded {rank_list(a.loaded)}; "
                 f"missing {rank_list(a.missing)}")
    if a.views:
        lines.append("groups:")
        lines += _group_rows(a)
    if a.unreadable:
        lines.append("files not used as they are:")
        for u in a.unreadable[:_MAX_FILES]:
            lines += _wrap(f"{_shown_path(u.file, a.load.root)}: {u.error}",
                           "  ", "    ")
        if len(a.unreadable) > _MAX_FILES:
            lines.append(f"  ... and {len(a.unreadable) - _MAX_FILES} more (see --json)")
    if a.load.ignored:
        names = ", ".join(os.path.basename(p) for p in a.load.ignored[:5])
        more = f" and {len(a.load.ignored) - 5} more" if len(a.load.ignored) > 5 else ""
        lines.append(f"ignored (no rank number in the name): {names}{more}")
    lines.append(f"analyzed in {a.elapsed_s:.3f} s")
    return "\n".join(lines) + "\n"
