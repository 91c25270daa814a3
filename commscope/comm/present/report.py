"""Text reports of a :class:`~commscope.comm.trace.model.CommTrace`: the per-module table and
the summary by collective and mesh axis.

The table keeps PyTorch's ``CommDebugMode`` layout character for character: a module
line at 4·depth spaces, ``*module type`` and ``*Parameter List`` at noise >= 1, section
headers at +2, ``*key: count`` collective lines and ``**op`` lines at +4 in yellow, and
the three red DTensor lines (shape, sharding, device mesh) at +6. Two deliberate
differences: a section header is printed only when something is listed under it
(PyTorch prints empty ``FORWARD PASS`` headers at noise 1 and 2), and collectives
issued outside every module after a backward pass get their own ``AFTER BACKWARD``
section.
"""

from __future__ import annotations

import os
import re

from commscope.comm.trace.model import CollectiveRecord, CommTrace, ModuleNode, OpEntry, aggregate

__all__ = [
    "format_table",
    "format_summary",
    "strip_ansi",
    "format_bytes",
    "format_us",
    "summary_rows",
]

_YELLOW_BOLD = "\033[1;33m"
_YELLOW = "\033[1;33m"
_RED_BOLD = "\033[1;31m"
_RESET = "\033[0m"
_ANSI = re.compile(r"\x1B\[[0-?]*[ -/]*[@-~]")

_SECTIONS = (
    ("forward", "FORWARD PASS"),
    ("backward", "BACKWARD PASS"),
    ("checkpointing", "ACTIVATION CHECKPOINTING"),
    ("after_backward", "AFTER BACKWARD"),
)


def strip_ansi(text: str) -> str:
    """``text`` without ANSI escape sequences."""
    return _ANSI.sub("", text)


def format_bytes(n: int) -> str:
    """``1536`` -> ``"1.5 KB"`` (decimal units, like the bandwidths)."""
    value = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{n} B"


def format_us(us: float) -> str:
    """``0.0048`` -> ``"4.8 ns"``, ``0.31`` -> ``"0.31 us"``, ``12345.0`` -> ``"12.35 ms"``."""
    if us < 0.1:
        return f"{us * 1000:.1f} ns"
    if us < 10:
        return f"{us:.2f} us"
    if us < 10000:
        return f"{us:.1f} us"
    return f"{us / 1000:.2f} ms"


def _use_color(color: bool | None) -> bool:
    if color is None:
        return not os.environ.get("NO_COLOR")
    return color


def format_table(
    trace: CommTrace, noise_level: int = 3, *, color: bool | None = None, details: bool = False
) -> str:
    """The per-module collective (and op) table at ``noise_level`` 0-3.

    Levels: 0 collectives only; 1 + module types, DTensor parameter placements and
    DTensor ops; 2 + every non-trivial op; 3 every op. Levels above 3 act as 3, below
    0 as 0. ``details`` appends bytes and mesh axis to each collective line.
    """
    noise = max(0, min(3, int(noise_level)))
    paint = _use_color(color)
    lines: list[str] = []
    for node in trace.modules():
        _module_lines(trace, node, noise, paint, details, lines)
    return "".join(lines)


def _module_lines(
    trace: CommTrace,
    node: ModuleNode,
    noise: int,
    paint: bool,
    details: bool,
    lines: list[str],
) -> None:
    indent = "    " * node.depth
    lines.append(f"{indent}{node.fqn}\n")
    if noise > 0:
        if node.module_type:
            lines.append(f"{indent}*module type: {node.module_type}\n")
        if node.parameters:
            lines.append(f"{indent}*Parameter List\n")
            for name, placement in node.parameters:
                lines.append(f"{indent} *{name}: {placement}\n")
    header_indent = indent + "  "
    item_indent = indent + "    "
    detail_indent = indent + "      "
    for phase, title in _SECTIONS:
        counts = node.collectives.get(phase, {}) if phase != "checkpointing" else {}
        ops = node.ops_in(phase, noise) if noise > 0 else []
        if not counts and not ops:
            continue
        lines.append(f"{header_indent}{title}\n")
        stats = _stats_by_key(trace, node, phase) if details else {}
        for key, count in counts.items():
            extra = stats.get(key, "")
            lines.append(_paint(f"{item_indent}*{key}: {count}{extra}", _YELLOW_BOLD, paint))
        for op in ops:
            _op_lines(op, item_indent, detail_indent, paint, lines)


def _op_lines(
    op: OpEntry, item_indent: str, detail_indent: str, paint: bool, lines: list[str]
) -> None:
    lines.append(_paint(f"{item_indent}**{op.name}", _YELLOW, paint))
    if op.input_shape:
        shape = "[" + ", ".join(op.input_shape) + "]"
        sharding = "[" + ", ".join(op.input_sharding) + "]"
        lines.append(_paint(f"{detail_indent}shape: {shape}", _RED_BOLD, paint))
        lines.append(_paint(f"{detail_indent}sharding: {sharding}", _RED_BOLD, paint))
        lines.append(_paint(f"{detail_indent}device mesh: {op.device_mesh}", _RED_BOLD, paint))


def _paint(text: str, code: str, paint: bool) -> str:
    return f"{code}{text}{_RESET}\n" if paint else f"{text}\n"


def _stats_by_key(trace: CommTrace, node: ModuleNode, phase: str) -> dict[str, str]:
    """``{key: "  [320 B on tp]"}`` for the detailed table."""
    per_key: dict[str, list[str]] = {}
    for stat in trace.stats(node, phase):
        where = stat.axis or "?"
        text = f"{format_bytes(stat.bytes)} on {where}"
        if trace.bandwidth_gbps:
            us = sum(
                r.estimated_us(trace.bandwidth_gbps)
                for r in trace.records
                if r.key == stat.key and r.axis == stat.axis and r.phase == phase
                and r.module in {n.fqn for n in node.walk()}
            )
            text += f", ~{format_us(us)}"
        per_key.setdefault(stat.key, []).append(text)
    return {key: "  [" + "; ".join(parts) + "]" for key, parts in per_key.items()}


def summary_rows(
    records: list[CollectiveRecord], bandwidth_gbps: float | None = None
) -> list[dict[str, object]]:
    """One row per (collective, axis, group size): calls per phase, bytes, estimated time."""
    rows: dict[tuple[str, str | None, int], dict[str, object]] = {}
    for stat in aggregate(records):
        k = (stat.collective, stat.axis, stat.group_size)
        row = rows.setdefault(
            k,
            {
                "collective": stat.collective,
                "axis": stat.axis,
                "group_size": stat.group_size,
                "count": 0,
                "forward": 0,
                "backward": 0,
                "after_backward": 0,
                "bytes": 0,
                "estimated_us": None,
            },
        )
        row["count"] = int(row["count"]) + stat.count  # type: ignore[call-overload]
        row["bytes"] = int(row["bytes"]) + stat.bytes  # type: ignore[call-overload]
    for r in records:
        row = rows[(r.collective, r.axis, r.group_size)]
        row[r.phase] = int(row[r.phase]) + 1  # type: ignore[call-overload]
        if bandwidth_gbps:
            prev = row["estimated_us"] or 0.0
            row["estimated_us"] = float(prev) + r.estimated_us(bandwidth_gbps)  # type: ignore[arg-type]
    return list(rows.values())


def format_summary(records: list[CollectiveRecord], bandwidth_gbps: float | None = None) -> str:
    """A plain-text table of :func:`summary_rows` with a total line."""
    rows = summary_rows(records, bandwidth_gbps)
    time_title = f"est. time @ {bandwidth_gbps:g} GB/s" if bandwidth_gbps else "est. time"
    header = ["collective", "axis", "ranks", "calls", "fwd", "bwd", "after bwd", "bytes"]
    header.append(time_title)
    table: list[list[str]] = [header]
    total_calls = total_bytes = 0
    total_us = 0.0
    for row in rows:
        us = row["estimated_us"]
        table.append(
            [
                str(row["collective"]),
                str(row["axis"] or "-"),
                str(row["group_size"] or "?"),
                str(row["count"]),
                str(row["forward"]),
                str(row["backward"]),
                str(row["after_backward"]),
                format_bytes(int(row["bytes"])),  # type: ignore[call-overload]
                "-" if us is None else format_us(float(us)),  # type: ignore[arg-type]
            ]
        )
        total_calls += int(row["count"])  # type: ignore[call-overload]
        total_bytes += int(row["bytes"])  # type: ignore[call-overload]
        total_us += float(us or 0.0)  # type: ignore[arg-type]
    if not rows:
        return "no collectives were issued\n"
    table.append(
        [
            "total",
            "",
            "",
            str(total_calls),
            "",
            "",
            "",
            format_bytes(total_bytes),
            format_us(total_us) if bandwidth_gbps else "-",
        ]
    )
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    out = []
    for i, r in enumerate(table):
        cells = [c.ljust(w) if j < 3 else c.rjust(w) for j, (c, w) in enumerate(zip(r, widths))]
        out.append("  ".join(cells).rstrip())
        if i == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out) + "\n"
