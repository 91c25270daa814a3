"""The text report people read: verdict, findings root cause first, groups, bad files."""

from __future__ import annotations

import os
import textwrap
from collections import Counter

from commscope.analyze.analysis import Analysis
from commscope.analyze.answer import is_note
from commscope.analyze.model import COMPLETED, RETIRED, Finding
from commscope.analyze.present.byhost import HostView, host_lines, ranks_with_hosts
from commscope.analyze.read.load import LATER_DIR
from commscope.analyze.summary import slowest_lines
from commscope.analyze.text import plural, rank_list

__all__ = ["format_report", "p2p_stops", "group_table", "GROUP_COLUMNS", "VERDICT_WORDS"]

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
    """``16 PyTorch native (version 2.10; nccl, active entries only, timing off, no
    stacks)``: the dumps read, by where they come from and what kind they are."""
    kinds = Counter(
        ("commscope" if d.source == "commscope" else "PyTorch native", d.version,
         d.kind.text() if d.kind is not None else d.backend)
        for d in a.load.dumps.values()
    )
    parts = []
    for (source, version, kind), n in sorted(kinds.items()):
        extra = f"; {kind}" if kind else ""
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


_FOLD_FROM = 16
"""From this many groups on, the groups with nothing to report fold into one row per
description (``8 groups  DATA_PARALLEL_GROUP  0-15 (2 each)``)."""


def _stops(a: Analysis, key: str,
           creating: dict[tuple[str, str, tuple[int, ...]], list[tuple[int, str]]],
           view: HostView) -> str:
    """The "stops at" cell of a group: where its collectives stop, who never came, the
    members with no dump, its unfinished send/recv (``""``: nothing)."""
    v = a.views[key]
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
    return "; ".join(stops)


def _n_mismatches(a: Analysis, key: str) -> int:
    v = a.views[key]
    return len(v.mismatches) + v.more_mismatches


def _recorded(a: Analysis, keys: list[str]) -> str:
    """``#1-#6``: the sequence numbers the members' records span in these groups; ``#12
    done`` when active-only dumps hold none but say how far the group finished; ``-``
    when nothing is recorded."""
    spans = [span for k in keys for span in a.views[k].spans.values()]
    held = [(lo, hi) for lo, hi in spans if hi >= lo and hi > 0]
    if held:
        return f"#{min(lo for lo, _ in held)}-#{max(hi for _, hi in held)}"
    done = max((hi for _, hi in spans), default=0)
    return f"#{done} done" if done > 0 else "-"


GROUP_COLUMNS = ("group", "desc", "ranks", "recorded", "compared", "mismatches", "stops at")
"""The groups table's columns, in the text and the HTML report alike."""


def group_table(a: Analysis, all_groups: bool = False) -> tuple[list[dict[str, str]], list[str]]:
    """The groups table (rows keyed by :data:`GROUP_COLUMNS`) and the lines after it:
    every group with something to report on a row of its own; from
    :data:`_FOLD_FROM` groups on, the quiet ones folded by description; one-member
    groups with no record counted; at most :data:`_MAX_GROUP_ROWS` rows (``all_groups``:
    every group on its own row)."""
    creating = _creating(a)
    view = HostView.of(a.hosts)
    keys = sorted(a.views, key=lambda k: (len(k), k))
    folded = [] if all_groups else [k for k in keys if _idle_single(a, k)]
    shown = [k for k in keys if k not in set(folded)]
    quiet: dict[str, list[str]] = {}
    if not all_groups and len(shown) > _FOLD_FROM:
        for key in shown:
            if not _stops(a, key, creating, view) and not _n_mismatches(a, key):
                quiet.setdefault(a.views[key].group.desc or "-", []).append(key)
        quiet = {desc: ks for desc, ks in quiet.items() if len(ks) > 1}
        folded_keys = {k for ks in quiet.values() for k in ks}
        shown = [k for k in shown if k not in folded_keys]
    limit = len(shown) if all_groups else _MAX_GROUP_ROWS
    rows: list[tuple[str, ...]] = []
    for key in shown[:limit]:
        v = a.views[key]
        g = v.group
        rows.append((g.display, g.desc or "-", rank_list(g.ranks, 3), _recorded(a, [key]),
                     str(v.checked), str(_n_mismatches(a, key)),
                     _stops(a, key, creating, view) or "-"))
    for desc, ks in sorted(quiet.items(), key=lambda kv: min((len(k), k) for k in kv[1])):
        members = sorted({r for k in ks for r in a.views[k].group.ranks})
        sizes = sorted({len(a.views[k].group.ranks) for k in ks})
        each = f"{sizes[0]} each" if len(sizes) == 1 else f"{sizes[0]}-{sizes[-1]} each"
        rows.append((f"{len(ks)} groups", desc, f"{rank_list(members, 2)} ({each})",
                     _recorded(a, ks), str(sum(a.views[k].checked for k in ks)), "0", "-"))
    for (name, desc, members), who in sorted(creating.items(),
                                             key=lambda kv: (len(kv[0][0]), kv[0])):
        blocked = [r for r, _ in who]
        absent = [r for r in members if r not in blocked]
        where = ", ".join(sorted({w for _, w in who})[:2])
        stop = f"being created: {rank_list(blocked, 4)} wait at {where}"
        if absent:
            stop += f"; {rank_list(absent, 4)} never came"
        rows.append((name or "?", desc or "-", rank_list(list(members), 3), "-", "0", "0", stop))
    after = []
    if len(shown) > limit:
        after.append(f"... and {len(shown) - limit} more groups (--all-groups shows them)")
    if folded:
        descs = Counter(a.views[k].group.desc or "-" for k in folded)
        kinds = ", ".join(d for d, _ in sorted(descs.items(), key=lambda kv: (-kv[1], kv[0]))[:4])
        more = ", ..." if len(descs) > 4 else ""
        after.append(f"+ {len(folded)} one-member groups with no record ({kinds}{more}; "
                     "--all-groups shows them)")
    return [dict(zip(GROUP_COLUMNS, row)) for row in rows], after


def _group_rows(a: Analysis, all_groups: bool = False) -> list[str]:
    rows, after = group_table(a, all_groups)
    cells = [GROUP_COLUMNS, *(tuple(r[c] for c in GROUP_COLUMNS) for r in rows)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(GROUP_COLUMNS) - 1)]
    out = ["  " + "  ".join([*(c.ljust(w) for c, w in zip(r, widths)), r[-1]]) for r in cells]
    return out + ["  " + line for line in after]


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


def _first_screen(a: Analysis) -> list[str]:
    """The answer (:mod:`commscope.analyze.answer`): verdict and headline, root cause,
    stuck places, what next, notes; a blank line after it."""
    ans = a.answer
    head = ans.headline or VERDICT_WORDS.get(a.verdict, a.verdict)
    lines = _wrap(f"verdict: {head}", "", "  ")
    sections = (("root cause:", ans.root), ("stuck:", ans.stuck), ("next:", ans.next),
                ("notes:", ans.notes))
    for title, items in sections:
        if items:
            lines.append(title)
            for text in items:
                lines += _wrap(text, "  ", "    ")
    return [*lines, ""]


def _alike_key(f: Finding) -> tuple[str, tuple[int, ...]]:
    """Findings told once together: the same kind blaming the same ranks (a finding
    without culprits is its own)."""
    return (f.kind, tuple(sorted(f.culprit_ranks)) if f.culprit_ranks else (-id(f),))


def _findings(a: Analysis) -> list[str]:
    """The findings at length, root cause first, without the notes the first screen
    folded (``--json`` keeps every one); alike findings (same kind, same culprits) told
    once with the groups they repeat in."""
    shown = [f for f in a.findings if not is_note(f)]
    if not shown:
        return []
    lines = ["findings (root cause first):"]
    alike: dict[tuple[str, tuple[int, ...]], list[Finding]] = {}
    for f in shown:
        alike.setdefault(_alike_key(f), []).append(f)
    told: set[tuple[str, tuple[int, ...]]] = set()
    i = 0
    for f in shown:
        key = _alike_key(f)
        if key in told:
            continue
        told.add(key)
        i += 1
        same = alike[key]
        text = f.message
        if len(same) > 1 and f.culprit_ranks:
            groups = [g.group.display for g in same[1:] if g.group is not None]
            where = f" ({', '.join(groups[:4])}{', ...' if len(groups) > 4 else ''})" \
                if groups else ""
            text += f" The same in {plural(len(same) - 1, 'more place')}{where}."
        lines += _wrap(text, f"  {i}. [{f.kind}] ", " " * 6)
    return lines


def format_report(a: Analysis, source: str | None = None, *, all_groups: bool = False) -> str:
    """The analysis as text for a terminal or a file (see ``commscope analyze``);
    ``all_groups`` lists every group, also the one-member ones that recorded nothing."""
    where = source or a.load.root or "."
    lines = [f"commscope analyze: {where}", f"dumps: {_sources(a)}", ""]
    lines += _first_screen(a)
    told = _findings(a)
    lines += [*told, ""] if told else []
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
