"""The terminal view of a snapshot (rich): verdict line, groups with lag, the ranks table.

The ranks table (:func:`rank_table`, which the web page draws too) shows the ranks that
matter (culprits, silent, behind, waiting the longest) up to ``max_rows``, and says how
many more there are. When the job spans several hosts it names each rank's host and pid,
and at scale (more ranks than rows) it folds the ranks by host: hosts whose ranks all
look alike are one line, hosts alike in the same state are one line together, and hosts
that split alike by local rank are one line per local-rank set
(:func:`commscope.analyze.present.byhost.fold_by_host`). On one host nothing changes.
"""

from __future__ import annotations

from typing import Any

from rich.console import Group as RichGroup
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from commscope.analyze.present.byhost import HostFold, HostView, fold_by_host, host_names
from commscope.analyze.text import rank_list

__all__ = ["render", "interesting_ranks", "rank_table"]

_STYLE = {"healthy": "bold green", "behind": "bold yellow", "slow": "bold yellow",
          "stuck": "bold red", "desync": "bold magenta", "waiting": "bold"}
_STUCK_STATES = ("stuck", "slow", "gone")
"""States whose rows fold only with rows waiting in the very same op at the same line."""


def _behind(snap: dict[str, Any]) -> dict[int, int]:
    behind: dict[int, int] = {}
    for g in snap["groups"]:
        for r, n in g["behind"].items():
            behind[int(r)] = max(behind.get(int(r), 0), n)
    return behind


def _named(snap: dict[str, Any]) -> set[int]:
    return {r for f in snap["findings"] for r in f["culprit_ranks"]}


def interesting_ranks(snap: dict[str, Any], max_rows: int) -> list[dict[str, Any]]:
    """Ranks worth a row: named by a finding, silent, waiting longest, behind, stepping."""
    named = _named(snap)
    behind = _behind(snap)

    def score(row: dict[str, Any]) -> tuple[Any, ...]:
        wait = row["oldest_unfinished"]["age_s"] if row["oldest_unfinished"] else -1.0
        return (row["rank"] not in named, not row["silent"], -behind.get(row["rank"], 0),
                -wait, row["rank"])

    rows = sorted(snap["ranks"], key=score)
    return sorted(rows[:max_rows], key=lambda r: r["rank"])


def _cells(row: dict[str, Any]) -> dict[str, str]:
    old = row["oldest_unfinished"]
    if row["silent"]:  # how long since its last record
        age = "silent" if row["age_s"] is None else f"silent {row['age_s']:.0f} s"
    else:
        age = f"{row['age_s']:.1f} s" if row["age_s"] is not None else "?"
    return {"rank": str(row["rank"]), "step": "-" if row["step"] is None else str(row["step"]),
            "age": age, "op": f"{old['op']} of {old['group'][:12]}" if old else "-",
            "wait": f"{old['age_s']:.1f} s" if old else "-",
            "where": (old["where"] if old else row["where_now"]) or "-"}


def _span(values: list[float] | list[int], unit: str = " s") -> str:
    """``0.3-0.9 s``, or one value; whole numbers stay whole (``12-14 s``)."""
    if not values:
        return "-"
    lo, hi = min(values), max(values)

    def text(v: float) -> str:
        return str(v) if isinstance(v, int) else f"{v:.1f}"
    return f"{text(lo)}{unit}" if hi - lo < 0.05 else f"{text(lo)}-{text(hi)}{unit}"


def _merged(rows: list[dict[str, Any]]) -> dict[str, str]:
    """One folded line's cells: a shared value as is, numbers as a range, else
    ``various``."""
    cells = [_cells(row) for row in rows]

    def same(key: str) -> str:
        values = {c[key] for c in cells}
        return values.pop() if len(values) == 1 else "various"

    steps = sorted({row["step"] for row in rows if row["step"] is not None})
    silent = all(row["silent"] for row in rows)
    ages = [row["age_s"] for row in rows if row["age_s"] is not None
            and row["silent"] == silent]
    waits = [row["oldest_unfinished"]["age_s"] for row in rows if row["oldest_unfinished"]]
    return {"step": "-" if not steps else (str(steps[0]) if len(steps) == 1
                                           else f"{steps[0]}-{steps[-1]}"),
            "age": (f"silent {_span([round(a) for a in ages])}" if silent and ages
                    else "silent" if silent else _span(ages) if ages else "?"),
            "op": same("op"), "wait": _span(waits), "where": same("where")}


def _fold_rows(snap: dict[str, Any], view: HostView, max_rows: int
               ) -> tuple[list[dict[str, Any]], str]:
    """The ranks table folded by host (see module doc): rows, caption."""
    by_rank = {row["rank"]: row for row in snap["ranks"]}
    named = _named(snap)
    behind = _behind(snap)
    stuck = snap.get("state") in _STUCK_STATES

    def look(r: int) -> tuple[Any, ...]:
        row = by_rank[r]
        if not stuck:
            return (r in named, row["silent"], behind.get(r, 0) > 0)
        c = _cells(row)
        return (r in named, row["silent"], c["op"], c["where"])

    folds: list[HostFold[tuple[Any, ...]]] = fold_by_host(view, look, by_rank)
    placed = {r for fold in folds for r in fold.ranks}
    lines: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    for fold in folds:
        n = len(fold.hosts)
        where = fold.hosts[0] if n == 1 else f"{n} hosts: {host_names(fold.hosts, 4)}"
        for key, ranks in fold.parts:
            if fold.local:
                members = [view.by_host[h] for h in fold.hosts]
                real = [m[i] for m in members for i in ranks]
                label = f"local {rank_list(ranks, 3)}"
            else:
                real, label = ranks, rank_list(ranks, 3)
            rows = [by_rank[r] for r in real]
            cells = _merged(rows) if len(rows) > 1 else _cells(rows[0])
            pid = rows[0].get("pid") if len(rows) == 1 else None
            cells.update(host=where, pid="-" if pid is None else str(pid), rank=label)
            cells["_class"] = ("culprit" if key[0] else "silent" if key[1] else "")
            waits = [row["oldest_unfinished"]["age_s"] for row in rows
                     if row["oldest_unfinished"]]
            order = (not key[0], not key[1], -max((behind.get(r, 0) for r in real), default=0),
                     -max(waits, default=-1.0), min(real))
            lines.append((order, {**cells, "_ranks": len(real)}))
    for r in sorted(set(by_rank) - placed):  # a record that names no host
        cells = {**_cells(by_rank[r]), "host": "?", "pid": "-",
                 "_class": "culprit" if r in named else ""}
        lines.append(((r not in named, True, 0, 0.0, r), {**cells, "_ranks": 1}))
    lines.sort(key=lambda item: item[0])
    shown = [cells for _, cells in lines[:max_rows]]
    rest = [cells for _, cells in lines[max_rows:]]
    caption = ""
    if rest:
        caption = (f"{len(rest)} more lines, {sum(c['_ranks'] for c in rest)} ranks "
                   "(--json shows all)")
    return shown, caption


def rank_table(snap: dict[str, Any], max_rows: int = 16) -> dict[str, Any]:
    """The ranks table as text cells, for the terminal and the web page: ``columns``
    (key, title), ``rows`` (cells by key, and ``_class``: ``culprit``, ``silent`` or
    ``""``), ``caption``, and ``hosts`` (how many hosts the ranks publish from)."""
    view = HostView.from_rows((row["rank"], row.get("host"), row.get("pid"))
                              for row in snap["ranks"])
    columns = [("rank", "rank"), ("step", "step"), ("age", "record age"),
               ("op", "oldest unfinished"), ("wait", "waiting"), ("where", "where now")]
    if view.several:
        columns = [("host", "host"), ("pid", "pid"), *columns]
    if view.several and len(snap["ranks"]) > max_rows:
        rows, caption = _fold_rows(snap, view, max_rows)
    else:
        named = _named(snap)
        chosen = interesting_ranks(snap, max_rows)
        rows = []
        for row in chosen:
            cells: dict[str, Any] = _cells(row)
            cells["_class"] = ("culprit" if row["rank"] in named
                               else "silent" if row["silent"] else "")
            if view.several:
                cells["host"] = row.get("host") or "?"
                cells["pid"] = "-" if row.get("pid") is None else str(row["pid"])
            rows.append(cells)
        hidden = len(snap["ranks"]) - len(chosen)
        caption = f"{hidden} more ranks like these (--json shows all)" if hidden > 0 else ""
    return {"columns": columns, "rows": [{k: v for k, v in row.items() if k != "_ranks"}
                                         for row in rows],
            "caption": caption, "hosts": len(view.by_host)}


def slowest_cells(rows: list[dict[str, Any]], limit: int = 3) -> list[dict[str, str]]:
    """The "slowest ranks" panel's rows (the terminal's and the web page's): per group
    losing the most, its slowest ranks (or slow hosts) with how often they came last and
    their lags; ``straggler`` marks what passes the analyzer's thresholds."""
    out = []
    for row in rows[:limit]:
        who = []
        slow_hosts = [h for h in row["hosts"] if h.get("straggler")]
        for h in slow_hosts:
            who.append(f"{h['host']} (ranks {rank_list(h['ranks'])}) last "
                       f"{h['last']}/{row['samples']}, lag {h['lag_median_ms']:.1f} ms "
                       f"(p90 {h['lag_p90_ms']:.1f}) straggler")
        for x in row["ranks"] if not slow_hosts else []:
            who.append(f"rank {x['rank']} last {x['last']}/{row['samples']}, lag "
                       f"{x['lag_median_ms']:.1f} ms (p90 {x['lag_p90_ms']:.1f})"
                       + (" straggler" if x["straggler"] else ""))
        out.append({"group": str(row["group"])[:24],
                    "window": f"#{row['first_seq']}-#{row['last_seq']}",
                    "lost": f"{row['lost_share'] * 100:.0f} %", "slowest": "; ".join(who),
                    "straggler": "yes" if slow_hosts or any(
                        x["straggler"] for x in row["ranks"]) else ""})
    return out


def slowest_table(rows: list[dict[str, Any]]) -> Table:
    """The terminal's "slowest ranks" panel (see :func:`slowest_cells`)."""
    t = Table(title="slowest ranks (who arrives last at each group's newest collectives)",
              expand=True)
    for col in ("group", "window", "time lost waiting", "slowest"):
        t.add_column(col, no_wrap=col != "slowest")
    for cells in slowest_cells(rows):
        t.add_row(cells["group"], cells["window"], cells["lost"], cells["slowest"],
                  style="red" if cells["straggler"] else None)
    if len(rows) > 3:
        t.caption = f"{len(rows) - 3} more groups (--json shows all)"
    return t


def render(snap: dict[str, Any], max_rows: int = 16) -> RichGroup:
    """The whole view as one rich renderable."""
    state = snap.get("state", "waiting")
    head = Text(f"{state.upper()}  ", style=_STYLE.get(state, "bold"))
    head.append(snap.get("headline", ""))
    table = rank_table(snap, max_rows)
    on_hosts = f" on {table['hosts']} hosts" if table["hosts"] > 1 else ""
    meta = Text(f"store {snap['store']} · {snap['world_size']} ranks{on_hosts} · records every "
                f"{snap['interval_s']:g} s · stuck after {snap['stall_s']:g} s",
                style="dim")
    parts: list[Any] = [Panel(RichGroup(head, meta), expand=True)]
    if snap["findings"]:
        ft = Table(title="why (same analysis as `commscope analyze`)", show_lines=False,
                   expand=True)
        ft.add_column("kind", no_wrap=True)
        ft.add_column("message")
        for f in snap["findings"][:4]:
            ft.add_row(f["kind"], f["message"])
        parts.append(ft)
    if snap.get("desyncs"):
        dt = Table(title="silent desyncs (the ranks' running fingerprints differ)",
                   expand=True)
        dt.add_column("kind", no_wrap=True)
        dt.add_column("message")
        for f in snap["desyncs"][:4]:
            dt.add_row(f["kind"], f["message"])
        parts.append(dt)
    if snap.get("slowest"):
        parts.append(slowest_table(snap["slowest"]))
    gt = Table(title="groups", expand=True)
    for col in ("group", "desc", "ranks", "enqueued", "completed (min)", "lag", "behind"):
        gt.add_column(col, no_wrap=col != "behind")
    for g in snap["groups"][:24]:
        behind = ", ".join(f"{r} (-{n})" for r, n in list(g["behind"].items())[:6])
        gt.add_row(g["name"][:12], g["desc"], g["ranks"], str(g["enqueued_max"]),
                   str(g["completed_min"]), str(g["lag"]) if g["lag"] else "-", behind or "-")
    if len(snap["groups"]) > 24:
        gt.caption = f"{len(snap['groups']) - 24} more groups (--json shows all)"
    parts.append(gt)
    rt = Table(title="ranks", expand=True)
    for key, title in table["columns"]:
        rt.add_column(title, no_wrap=key in ("pid", "rank", "step", "age", "wait"))
    for row in table["rows"]:
        style = {"culprit": "red", "silent": "dim"}.get(row["_class"])
        rt.add_row(*(row[key] for key, _ in table["columns"]), style=style)
    if table["caption"]:
        rt.caption = table["caption"]
    parts.append(rt)
    notes = []
    if snap["missing"]:
        notes.append(f"not publishing: ranks {snap['missing'][:16]}")
    for bad in snap["bad_records"][:4]:
        notes.append(f"rank {bad['rank']}'s record skipped: {bad['why']}")
    if notes:
        parts.append(Text("\n".join(notes), style="yellow"))
    return RichGroup(*parts)
