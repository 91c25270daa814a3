"""Draw a mesh as text: a grid of ranks with their hosts, and each axis's locality."""

from __future__ import annotations

import numpy as np

from commscope.mesh.layout import MeshLayout
from commscope.mesh.plan import format_ranks
from commscope.mesh.topology import axis_locality, fast_axis_warnings

__all__ = ["describe_mesh", "GRID_LIMIT"]

GRID_LIMIT = 512
"""Meshes with more ranks than this are summarised instead of drawn."""


def _panel(grid: np.ndarray, names: tuple[str, ...], per_host: int, rank: int | None) -> list[str]:
    """A 2-D grid (rows: first axis, columns: second) as aligned text lines."""
    rows, cols = grid.shape

    def cell(r: int) -> str:
        text = f"{r} h{r // per_host}"
        return f"[{text}]" if r == rank else f" {text} "

    cells = [[cell(int(v)) for v in row] for row in grid]
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
) -> str:
    """Text picture of the sub-mesh of ``layout`` that holds ``rank`` (default rank 0).

    Each cell shows a global rank and its host (``5 h1``); the given rank is in
    brackets. Below the grid: each axis's group size, group count and whether its
    groups stay inside a host, then the given rank's coordinate and groups.
    """
    per_host = ranks_per_host or layout.world_size
    shown_rank = 0 if rank is None else rank
    grid = layout.submesh(shown_rank)
    hosts = -(-layout.world_size // per_host)
    dims = ", ".join(f"{n}={s}" for n, s in zip(layout.names, layout.shape))
    lines = [
        f"DeviceMesh({dims}, device={device_type!r}): {grid.size} ranks"
        + (f" of {layout.world_size}" if grid.size != layout.world_size else "")
        + f", {hosts} host{'s' if hosts != 1 else ''} of {per_host} ranks",
        "",
    ]
    if grid.size > GRID_LIMIT:
        lines.append(f"(grid of {grid.size} ranks not drawn; `commscope mesh` plans it)")
    elif layout.ndim == 1:
        lines += _panel(grid.reshape(1, -1), ("", layout.names[0]), per_host, rank)[1:]
        lines[-1] = f"{layout.names[0]}: " + lines[-1].strip()
    else:
        lead_shape = grid.shape[:-2]
        for index in np.ndindex(*lead_shape) if lead_shape else [()]:
            if index:
                where = ", ".join(f"{n}={i}" for n, i in zip(layout.names, index))
                lines.append(f"{where}:")
            panel = _panel(grid[index], layout.names[-2:], per_host, rank)
            lines += [("  " if index else "") + line for line in panel]
            if index:
                lines.append("")
    lines.append("")
    localities = axis_locality(layout, per_host)
    width = max(len(n) for n in layout.names)
    for loc in localities:
        lines.append(
            f"  {loc.axis:<{width}}  {loc.size} ranks per group, {loc.num_groups} groups: "
            f"{loc.describe()}"
        )
    for warning in fast_axis_warnings(localities, per_host):
        lines.append(f"  warning: {warning}")
    if rank is not None:
        coord = ", ".join(f"{n}={c}" for n, c in zip(layout.names, layout.coordinate(rank)))
        groups = "; ".join(f"{n} {format_ranks(g)}" for n, g in layout.groups_of(rank).items())
        lines.append(f"rank {rank}: ({coord}), host {rank // per_host}; groups: {groups}")
    return "\n".join(line.rstrip() for line in lines).rstrip() + "\n"
