"""A :class:`~commscope.comm.present.compare.TraceDiff` as text and as JSON.

:func:`summary_line` says the whole change in one line (``+2 all_gather on tp, +1.0 KB
(+320.0%), est. +7.7 ns (+160.0%) at 100 GB/s``); :func:`format_diff` adds the table of rows,
biggest change first, and the modules present in only one trace; :func:`diff_parts` gives
the same pieces to a caller that draws the table itself (the CLI, with rich);
:func:`diff_to_json` is the machine form (schema ``commscope.comm.diff``, version 1).
"""

from __future__ import annotations

import math
from typing import Any

from commscope.comm.present.compare_types import UNKNOWN_AXIS, DiffRow, TraceDiff
from commscope.comm.present.report import format_bytes, format_us

__all__ = [
    "DIFF_SCHEMA",
    "DIFF_SCHEMA_VERSION",
    "diff_columns",
    "diff_parts",
    "diff_to_json",
    "format_diff",
    "growth_text",
    "signed_bytes",
    "signed_us",
    "summary_line",
]

DIFF_SCHEMA = "commscope.comm.diff"
DIFF_SCHEMA_VERSION = 1
"""Bumped when a key of :func:`diff_to_json` changes meaning or goes away."""

_TEXT_COLUMNS = 4
"""The first columns (module, phase, collective, axis) are text; the rest numbers."""


def signed_bytes(n: int | None) -> str:
    """``512`` -> ``"+512 B"``, ``-1536`` -> ``"-1.5 KB"``, ``0`` -> ``"0 B"``; ``None``
    (unknown) -> ``"?"``."""
    if n is None:
        return "?"
    if n == 0:
        return "0 B"
    return ("+" if n > 0 else "-") + format_bytes(abs(n))


def signed_us(us: float | None) -> str:
    """``0.00768`` -> ``"+7.7 ns"``, ``-0.31`` -> ``"-0.31 us"``, ``0`` -> ``"0 ns"``."""
    if us is None:
        return "?"
    if abs(us) < 5e-5:  # below what format_us prints (0.05 ns)
        return "0 ns"
    return ("+" if us > 0 else "-") + format_us(abs(us))


def _signed_int(n: int) -> str:
    return f"{n:+d}" if n else "0"


def _on(axis: str | None) -> str:
    return "" if axis is None or axis == UNKNOWN_AXIS else f" on {axis}"


def _percent(before: int, after: int) -> str:
    if before == 0:
        return "new" if after else ""
    return f"{(after - before) / before * 100:+.1f}%"


def summary_line(d: TraceDiff) -> str:
    """The change in one line: net calls per collective and axis, total bytes, est. time;
    ``no change (...)`` when every row is the same."""
    parts = []
    for n in d.net:
        if n.calls_delta:
            parts.append(f"{_signed_int(n.calls_delta)} {n.collective}{_on(n.axis)}")
        elif n.bytes_delta:
            parts.append(f"{n.collective}{_on(n.axis)} {signed_bytes(n.bytes_delta)}")
        elif n.est_changed:  # same calls and bytes, another group size
            parts.append(f"{n.collective}{_on(n.axis)} {signed_us(n.est_us_delta)}")
    t = d.totals
    if not d.changed:
        calls = f"{t.calls_after} call{'s' if t.calls_after != 1 else ''}"
        size = f", {format_bytes(t.bytes_after)}" if t.bytes_delta is not None else ""
        return f"no change ({calls}{size} in both traces)"
    if t.bytes_delta is not None and t.bytes_before is not None and t.bytes_after is not None:
        pct = _percent(t.bytes_before, t.bytes_after)
        if t.bytes_delta:
            parts.append(f"{signed_bytes(t.bytes_delta)}" + (f" ({pct})" if pct else ""))
        else:
            parts.append("same bytes")
        est = f"est. {signed_us(t.est_us_delta)}"
        g = d.growth()
        if g.before:
            est += f" ({g.percent:+.1f}%)"
        parts.append(f"{est} at {d.bandwidth_gbps:g} GB/s")
    else:
        blind = [s.label for s in (d.a, d.b) if not s.has_bytes]
        parts.append(f"bytes and time unknown ({' and '.join(blind)}: counts only)")
    return ", ".join(parts)


def growth_text(d: TraceDiff) -> str:
    """``total estimated time rose by 160.0% (4.8 ns -> 12.5 ns at 100 GB/s)``, or
    ``total calls fell by 66.7% (3 -> 1)`` when a trace has no bytes."""
    g = d.growth()
    if g.measure == "est_us":
        what = "estimated time"
        amounts = f"{format_us(g.before)} -> {format_us(g.after)} at {d.bandwidth_gbps:g} GB/s"
    else:
        what, amounts = "calls", f"{g.before:g} -> {g.after:g}"
    pct = g.percent
    if pct == 0:
        return f"total {what} did not change ({amounts})"
    if math.isinf(pct):
        return f"total {what} rose from nothing ({amounts})"
    return f"total {what} {'rose' if pct > 0 else 'fell'} by {abs(pct):.1f}% ({amounts})"


def diff_columns(d: TraceDiff) -> list[str]:
    """The table's header."""
    return [
        "module", "phase", "collective", "axis",
        "calls A", "calls B", "calls +/-",
        "bytes A", "bytes B", "bytes +/-",
        f"est. +/- @ {d.bandwidth_gbps:g} GB/s",
    ]


def _bytes(n: int | None) -> str:
    return "?" if n is None else format_bytes(n)


def _cells(row: DiffRow) -> list[str]:
    return [
        row.module, row.phase, row.collective, "-" if row.axis is None else row.axis,
        str(row.calls_before), str(row.calls_after), _signed_int(row.calls_delta),
        _bytes(row.bytes_before), _bytes(row.bytes_after), signed_bytes(row.bytes_delta),
        signed_us(row.est_us_delta),
    ]


def _top_modules(fqns: list[str]) -> list[str]:
    """``["m.l1", "m.l1.a", "m.l1.b"]`` -> ``["m.l1 (+2 submodules)"]``."""
    tops: list[list[Any]] = []
    for fqn in fqns:
        if tops and fqn.startswith(tops[-1][0] + "."):
            tops[-1][1] += 1
        else:
            tops.append([fqn, 0])
    return [f"{f} (+{n} submodule{'s' if n != 1 else ''})" if n else f for f, n in tops]


def diff_parts(
    d: TraceDiff, *, unchanged: bool = False, hint: str = ""
) -> tuple[list[str], list[list[str]], list[int], list[str]]:
    """(heading lines, table rows under :func:`diff_columns`, each row's direction, the
    lines after the table). ``hint`` is added to the "unchanged rows hidden" line."""
    heading = [f"A: {d.a.describe()}", f"B: {d.b.describe()}"]
    if not d.axes_known:
        heading.append(f"axes are unknown ({UNKNOWN_AXIS}): a PyTorch dump does not record them")
    shown = d.shown(unchanged)
    rows = [_cells(r) for r in shown]
    directions = [r.direction for r in shown]
    rest: list[str] = []
    hidden = 0 if unchanged else d.unchanged_count
    if hidden:
        rows_word = "row" if hidden == 1 else "rows"
        rest.append(f"{hidden} unchanged {rows_word} hidden" + (f" ({hint})" if hint else ""))
    if d.only_in_a:
        rest.append(f"only in A: {', '.join(_top_modules(d.only_in_a))}")
    if d.only_in_b:
        rest.append(f"only in B: {', '.join(_top_modules(d.only_in_b))}")
    rest.append(f"A -> B: {summary_line(d)}")
    return heading, rows, directions, rest


def format_diff(d: TraceDiff, *, unchanged: bool = False, hint: str = "") -> str:
    """The whole comparison as plain text: heading, table, modules in one trace only,
    summary line."""
    heading, rows, _, rest = diff_parts(d, unchanged=unchanged, hint=hint)
    out = [*heading, ""]
    if rows:
        header = diff_columns(d)
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        for i, row in enumerate([header, *rows]):
            cells = [
                c.ljust(w) if j < _TEXT_COLUMNS else c.rjust(w)
                for j, (c, w) in enumerate(zip(row, widths))
            ]
            out.append("  ".join(cells).rstrip())
            if i == 0:
                out.append("  ".join("-" * w for w in widths))
        out.append("")
    out.extend(rest)
    return "\n".join(out) + "\n"


def diff_to_json(d: TraceDiff, *, unchanged: bool = False) -> dict[str, Any]:
    """The comparison as a JSON-ready dict (``rows``: changed ones, or all with
    ``unchanged=True``). ``growth.percent`` is ``null`` when ``a`` had none of the measure
    and ``b`` has some."""
    growth = d.growth()
    percent = growth.percent

    def side(s: Any) -> dict[str, Any]:
        return {
            "label": s.label,
            "source": s.source,
            "has_bytes": s.has_bytes,
            "rank": s.rank,
            "world_size": s.world_size,
            "torch_version": s.torch_version,
            "modules": len(s.modules),
        }

    return {
        "schema": DIFF_SCHEMA,
        "schema_version": DIFF_SCHEMA_VERSION,
        "bandwidth_gbps": d.bandwidth_gbps,
        "a": side(d.a),
        "b": side(d.b),
        "axes_known": d.axes_known,
        "summary": summary_line(d),
        "totals": d.totals.to_json(),
        "growth": {
            "measure": growth.measure,
            "before": growth.before,
            "after": growth.after,
            "percent": None if math.isinf(percent) else percent,
        },
        "net": [n.to_json() for n in d.net],
        "rows": [r.to_json() for r in d.shown(unchanged)],
        "unchanged_rows": d.unchanged_count,
        "only_in_a": list(d.only_in_a),
        "only_in_b": list(d.only_in_b),
        "module_order": [[fqn, depth] for fqn, depth in d.module_order],
    }
