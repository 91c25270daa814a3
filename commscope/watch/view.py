"""The terminal view of a snapshot (rich): verdict line, groups with lag, slowest ranks.

At scale the ranks table shows the ranks that matter (culprits, waiting the longest,
behind, silent) up to ``max_rows``, and says how many more there are.
"""

from __future__ import annotations

from typing import Any

from rich.console import Group as RichGroup
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

__all__ = ["render", "interesting_ranks"]

_STYLE = {"healthy": "bold green", "behind": "bold yellow", "slow": "bold yellow",
          "stuck": "bold red", "waiting": "bold"}


def interesting_ranks(snap: dict[str, Any], max_rows: int) -> list[dict[str, Any]]:
    """Ranks worth a row: named by a finding, silent, waiting longest, behind, stepping."""
    named = {r for f in snap["findings"] for r in f["culprit_ranks"]}
    behind: dict[int, int] = {}
    for g in snap["groups"]:
        for r, n in g["behind"].items():
            behind[int(r)] = max(behind.get(int(r), 0), n)

    def score(row: dict[str, Any]) -> tuple[Any, ...]:
        wait = row["oldest_unfinished"]["age_s"] if row["oldest_unfinished"] else -1.0
        return (row["rank"] not in named, not row["silent"], -behind.get(row["rank"], 0),
                -wait, row["rank"])

    rows = sorted(snap["ranks"], key=score)
    return sorted(rows[:max_rows], key=lambda r: r["rank"])


def render(snap: dict[str, Any], max_rows: int = 16) -> RichGroup:
    """The whole view as one rich renderable."""
    state = snap.get("state", "waiting")
    head = Text(f"{state.upper()}  ", style=_STYLE.get(state, "bold"))
    head.append(snap.get("headline", ""))
    meta = Text(f"store {snap['store']} · {snap['world_size']} ranks · records every "
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
    for col in ("rank", "step", "record age", "oldest unfinished", "waiting", "where now"):
        rt.add_column(col, no_wrap=col in ("rank", "step", "record age", "waiting"))
    rows = interesting_ranks(snap, max_rows)
    for row in rows:
        old = row["oldest_unfinished"]
        age = "silent" if row["silent"] else (f"{row['age_s']:.1f} s" if row["age_s"] is not None
                                              else "?")
        rt.add_row(str(row["rank"]), "-" if row["step"] is None else str(row["step"]), age,
                   f"{old['op']} of {old['group'][:12]}" if old else "-",
                   f"{old['age_s']:.1f} s" if old else "-",
                   (old["where"] if old else row["where_now"]) or "-")
    hidden = len(snap["ranks"]) - len(rows)
    if hidden > 0:
        rt.caption = f"{hidden} more ranks like these (--json shows all)"
    parts.append(rt)
    notes = []
    if snap["missing"]:
        notes.append(f"not publishing: ranks {snap['missing'][:16]}")
    for bad in snap["bad_records"][:4]:
        notes.append(f"rank {bad['rank']}'s record skipped: {bad['why']}")
    if notes:
        parts.append(Text("\n".join(notes), style="yellow"))
    return RichGroup(*parts)
