"""Draw a mesh as text: a grid of ranks with their hosts, and each axis's locality."""

from __future__ import annotations

import numpy as np

from commscope.mesh.hosts import HostTable
from commscope.mesh.layout import MeshLayout, format_ranks
from commscope.mesh.topology import axis_locality, crossing_warnings

__all__ = ["describe_mesh", "GRID_LIMIT"]

GRID_LIMIT = 512
"""Meshes with more ranks than this are summarised instead of drawn."""


def _cell(r: int, table: HostTable, rank: int | None) -> str:
    """``5 hostB``, in brackets for the given rank."""
    text = f"{r} {table.label(table.host(r))}"
    return f"[{text}]" if r == rank else f" {text} "


def _panel(
    grid: np.ndarray, names: tuple[str, ...], table: HostTable, rank: int | None
) -> list[str]:
    """A 2-D grid (rows: first axis, columns: second) as aligned text lines."""
    rows, cols = grid.shape
    cells = [[_cell(int(v), table, rank) for v in row] for row in grid]
    width = max(len(c) for row in cells for c in row)
    row_labels = [f"{names[0]}={i}" for i in range(rows)]
    label_width = max(len(x) for x in row_labels)
    header = " " * (label_width + 2) + "  ".join(
        f"{names[1]}={j}".center(width) for j in range(cols)
    )
    lines = [header.rstrip()]
    for label, row in zip(row_labels, cells):
        lines.append(f"{label:<{label_width}}  " + "  ".join(c.center(width) for c in row))
    return lines


def describe_mesh(
    layout: MeshLayout,
    *,
    rank: int | None = None,
    device_type: str = "cpu",
    ranks_per_host: int | None = None,
    hosts: HostTable | None = None,
) -> str:
    """Text picture of the sub-mesh of ``layout`` that holds ``rank`` (default rank 0).

    Each cell shows a global rank and its host (``5 hostB``, or ``5 h1`` with a legend
    below the grid where host names are long or many); the given rank is in brackets.
    Hosts come from ``hosts`` (a live mesh's gathered table), else from arithmetic:
    ``ranks_per_host`` consecutive ranks per host (default: all on one host). Below the
    grid: each axis's group size, group count and whether its groups stay inside a
    host, a warning for a fast axis (``tp``, ``cp``, ``ep``) that crosses hosts, then
    the given rank's coordinate and groups.
    """
    if hosts is None:
        hosts = HostTable.consecutive(layout.world_size, ranks_per_host or layout.world_size)
    table = hosts.first(layout.world_size)
    shown_rank = 0 if rank is None else rank
    grid = layout.submesh(shown_rank)
    dims = ", ".join(f"{n}={s}" for n, s in zip(layout.names, layout.shape))
    lines = [
        f"DeviceMesh({dims}, device={device_type!r}): {grid.size} ranks"
        + (f" of {layout.world_size}" if grid.size != layout.world_size else "")
        + f", {table.among(grid).summary()}",
        "",
    ]
    if grid.size > GRID_LIMIT:
        lines.append(f"(grid of {grid.size} ranks not drawn; `commscope mesh` plans it)")
    elif layout.ndim == 1:
        cells = "  ".join(_cell(int(r), table, rank) for r in grid.tolist())
        lines.append(f"{layout.names[0]}: {cells.strip()}")
    else:
        lead_shape = grid.shape[:-2]
        for index in np.ndindex(*lead_shape) if lead_shape else [()]:
            if index:
                where = ", ".join(f"{n}={i}" for n, i in zip(layout.names, index))
                lines.append(f"{where}:")
            panel = _panel(grid[index], layout.names[-2:], table, rank)
            lines += [("  " if index else "") + line for line in panel]
            if index:
                lines.append("")
    legend = table.legend()
    if legend:
        lines += ["", "hosts: " + legend[0], *(f"       {x}" for x in legend[1:])]
    lines.append("")
    width = max(len(n) for n in layout.names)
    for loc in axis_locality(layout, table):
        lines.append(
            f"  {loc.axis:<{width}}  {loc.size} ranks per group, {loc.num_groups} groups: "
            f"{loc.describe()}"
        )
    for warning in crossing_warnings(layout, table):
        lines.append(f"  warning: {warning}")
    if rank is not None:
        coord = ", ".join(f"{n}={c}" for n, c in zip(layout.names, layout.coordinate(rank)))
        groups = "; ".join(f"{n} {format_ranks(g)}" for n, g in layout.groups_of(rank).items())
        host = table.label(table.host(rank))
        lines.append(f"rank {rank}: ({coord}), host {host}; groups: {groups}")
    return "\n".join(line.rstrip() for line in lines).rstrip() + "\n"
