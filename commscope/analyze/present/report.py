"""The text report people read: verdict, findings root cause first, groups, bad files."""

from __future__ import annotations

import os
import textwrap
from collections import Counter

from commscope.analyze.analysis import Analysis
from commscope.analyze.model import COMPLETED, RETIRED
from commscope.analyze.present.byhost import HostView, host_lines, ranks_with_hosts
from commscope.analyze.read.load import LATER_DIR
from commscope.analyze.summary import slowest_lines
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


def _creating(a: Analysis) -> dict[tuple[str, str, tuple[int, ...]], list[tuple[int, str]]]:
    """Each group creation some rank is blocked in: (rank, where it asked) per creation."""
    out: dict[tuple[str, str, tuple[int, ...]], list[tuple[int, str]]] = {}
    for r, d in sorted(a.load.dumps.items()):
        for c in d.creations:
            if not c.done:
                where = f"{os.path.basename(c.place[1])}:{c.place[2]}" if c.place else "?"
                out.setdefault(c.identity, []).append((r, where))
    return out


def _creation_note(a: Analysis, ranks: list[int],
                   creating: dict[tuple[str, str, tuple[int, ...]], list[tuple[int, str]]]
                   ) -> str:
    """`` (creating experts)`` when the ranks that never came are blocked creating a group."""
    names = sorted({(desc or name) for (name, desc, _), who in creating.items()
                    for r, _ in who if r in ranks})
    return f" (creating {', '.join(names[:3])})" if names else ""


def _idle_single(a: Analysis, key: str) -> bool:
    """A one-member group with nothing recorded: a mesh axis of size 1 (pp, cp, ...)."""
    v = a.views[key]
    return (len(v.group.ranks) == 1 and not any(hi > 0 for _, hi in v.spans.values())
            and v.frontier is None and not v.nodump and not v.mismatches
            and not p2p_stops(a, key))


def _group_rows(a: Analysis, all_groups: bool = False) -> list[str]:
    header = ("group", "desc", "ranks", "recorded", "compared", "mismatches", "stops at")
    rows = [header]
    creating = _creating(a)
    view = HostView.of(a.hosts)
    keys = sorted(a.views, key=lambda k: (len(k), k))
    folded = [] if all_groups else [k for k in keys if _idle_single(a, k)]
    shown = [k for k in keys if k not in set(folded)]
    limit = len(shown) if all_groups else _MAX_GROUP_ROWS
    for key in shown[:limit]:
        v = a.views[key]
        g = v.group
        spans = list(v.spans.values())
        recorded = (f"#{min(lo for lo, _ in spans)}-#{max(hi for _, hi in spans)}"
                    if spans and max(hi for _, hi in spans) > 0 else "-")
        stops = []
        if v.frontier is not None:
            f = v.frontier
            waiting = rank_list(f.waiting, 4)
            if "..." in waiting:  # cut: their hosts may say it whole (local rank 1 of ...)
                waiting = ranks_with_hosts(f.waiting, view, 4, compact_only=True)
            waits = f"{waiting} wait" if f.waiting else "none waiting"
            stops.append(f"#{f.seq}: {waits}; {ranks_with_hosts(f.lack, view, 4)} never came"
                         + _creation_note(a, list(f.lack), creating))
        if v.nodump:
            stops.append(f"no dump: {ranks_with_hosts(v.nodump, view, 4)}")
        p2p_waits = p2p_stops(a, key)
        if p2p_waits:
            stops.append(p2p_waits)
        stop = "; ".join(stops) or "-"
        n_mis = len(v.mismatches) + v.more_mismatches
        rows.append((g.display, g.desc or "-", rank_list(g.ranks, 3), recorded, str(v.checked),
                     str(n_mis), stop))
    for (name, desc, members), who in sorted(creating.items(),
                                             key=lambda kv: (len(kv[0][0]), kv[0])):
        blocked = [r for r, _ in who]
        absent = [r for r in members if r not in blocked]
        where = ", ".join(sorted({w for _, w in who})[:2])
        stop = f"being created: {rank_list(blocked, 4)} wait at {where}"
        if absent:
            stop += f"; {rank_list(absent, 4)} never came"
        rows.append((name or "?", desc or "-", rank_list(list(members), 3), "-", "0", "0", stop))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
    out = []
    for r in rows:
        cells = [c.ljust(w) for c, w in zip(r, widths)]
        out.append("  " + "  ".join([*cells, r[-1]]))
    if len(shown) > limit:
        out.append(f"  ... and {len(shown) - limit} more groups (--all-groups shows them)")
    if folded:
        descs = Counter(a.views[k].group.desc or "-" for k in folded)
        kinds = ", ".join(d for d, _ in sorted(descs.items(), key=lambda kv: (-kv[1], kv[0]))[:4])
        more = ", ..." if len(descs) > 4 else ""
        out.append(f"  + {len(folded)} one-member groups with no record ({kinds}{more}; "
                   "--all-groups shows them)")
    return out


_MAX_HOST_ROWS = 16


def _host_rows(a: Analysis) -> list[str]:
    """``hosts:`` one row per host when the job spans several (where its ranks' dumps
    went, which are here, who the findings blame there); at scale only the hosts with
    something to say, the rest counted."""
    by_host = a.hosts.hosts()
    if len(by_host) < 2:
        return []
    crashed = {r for f in a.findings if f.kind == "crashed_rank" for r in f.culprit_ranks}
    culprits = {r for f in a.findings if f.blocking for r in f.culprit_ranks}
    loaded = set(a.loaded)
    rows = [("host", "ranks", "dumps here", "dump folder (on that host)", "")]
    quiet = 0
    for host, ranks in by_host.items():
        here = [r for r in ranks if r in loaded]
        notes = []
        if crashed & set(ranks):
            notes.append(f"crashed: {rank_list(sorted(crashed & set(ranks)), 4)}")
        if (culprits - crashed) & set(ranks):
            notes.append(f"culprit: {rank_list(sorted((culprits - crashed) & set(ranks)), 4)}")
        if not here:
            notes.append("no dump here")
        elif len(here) < len(ranks):
            notes.append(f"missing: {rank_list([r for r in ranks if r not in loaded], 4)}")
        if not notes and len(by_host) > _MAX_HOST_ROWS:
            quiet += 1
            continue
        rows.append((host, rank_list(ranks, 4), f"{len(here)}/{len(ranks)}",
                     a.hosts.dump_dir(ranks) or "?", "; ".join(notes)))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    out = ["hosts:"]
    for r in rows:
        out.append(("  " + "  ".join(c.ljust(w) for c, w in zip(r[:4], widths))
                    + ("  " + r[4] if r[4] else "")).rstrip())
    if quiet:
        out.append(f"  + {quiet} more hosts: every dump here, nothing to report")
    exclude = [h for h in dict.fromkeys(a.hosts.host(r) for r in sorted(crashed)) if h]
    if exclude:
        out.append(f"  leave out on restart: {', '.join(exclude)} (--json: exclude_hosts)")
    return out


def format_report(a: Analysis, source: str | None = None, *, all_groups: bool = False) -> str:
    """The analysis as text for a terminal or a file (see ``commscope analyze``);
    ``all_groups`` lists every group, also the one-member ones that recorded nothing."""
    where = source or a.load.root or "."
    lines = [f"commscope analyze: {where}", f"dumps: {_sources(a)}", ""]
    lines += _wrap(f"verdict: {VERDICT_WORDS.get(a.verdict, a.verdict)}", "", "  ")
    lines.append("")
    stuck = a.stuck
    if stuck:
        lines.append("stuck:")
        for text in stuck:
            lines += _wrap(text, "  ", "    ")
        lines.append("")
    lines.append("findings (root cause first):")
    for i, f in enumerate(a.findings, 1):
        label = f"  {i}. [{f.kind}] "
        lines += _wrap(f.message, label, " " * 6)
    lines.append("")
    lines.append(f"ranks: expected {rank_list(a.expected)}; loaded {rank_list(a.loaded)}; "
                 f"missing {rank_list(a.missing)}")
    lines += _host_rows(a)
    by_host = host_lines(a)
    if by_host:
        lines.append("by host:")
        lines += [line for text in by_host for line in _wrap(text, "  ", "    ")]
    if a.views or any(not c.done for d in a.load.dumps.values() for c in d.creations):
        lines.append("groups:")
        lines += _group_rows(a, all_groups)
    slow = slowest_lines(a.slowest)
    if slow:
        lines.append("slowest ranks (who arrives last at each group's newest finished "
                     "collectives):")
        lines += [line for text in slow for line in _wrap(text, "  ", "    ")]
    if a.unreadable:
        lines.append("files not used as they are:")
        for u in a.unreadable[:_MAX_FILES]:
            lines += _wrap(f"{_shown_path(u.file, a.load.root)}: {u.error}",
                           "  ", "    ")
        if len(a.unreadable) > _MAX_FILES:
            lines.append(f"  ... and {len(a.unreadable) - _MAX_FILES} more (see --json)")
    later = [p for p in a.load.ignored if os.path.basename(os.path.dirname(p)) == LATER_DIR]
    ignored = [p for p in a.load.ignored if p not in set(later)]
    if later:
        names = ", ".join(os.path.basename(p) for p in later[:5])
        more = f" and {len(later) - 5} more" if len(later) > 5 else ""
        lines += _wrap(f"later dumps, set aside in {LATER_DIR}/ (each rank's first dump of "
                       f"the incident is the one analyzed): {names}{more}", "", "  ")
    if ignored:
        names = ", ".join(os.path.basename(p) for p in ignored[:5])
        more = f" and {len(ignored) - 5} more" if len(ignored) > 5 else ""
        lines.append(f"ignored (no rank number in the name): {names}{more}")
    if a.load.other_jobs:
        lines.append("other jobs in this folder, not analyzed (never merged with this one):")
        for u in a.load.other_jobs[:_MAX_FILES]:
            lines += _wrap(f"{_shown_path(u.file, a.load.root)}: {u.error}", "  ", "    ")
        if len(a.load.other_jobs) > _MAX_FILES:
            lines.append(f"  ... and {len(a.load.other_jobs) - _MAX_FILES} more (see --json)")
    lines.append(f"analyzed in {a.elapsed_s:.3f} s")
    return "\n".join(lines) + "\n"
