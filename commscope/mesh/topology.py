"""Where ranks live: whether each mesh axis stays inside one host, and the warning.

An axis whose groups all stay inside a host talks over the fast local links (NVLink);
an axis whose groups cross hosts talks over the network. Tensor, context and expert
parallelism (``tp``, ``cp``, ``ep``) want the former. Which rank is on which host comes
from a :class:`~commscope.mesh.hosts.HostTable`: the ranks' real hostnames for a live
mesh (any placement), or a number of ranks per host for offline planning (torchrun's
consecutive placement: rank ``r`` on host ``r // ranks_per_host``).

A live mesh whose fast axis crosses hosts is warned about once per job, by rank 0
(:func:`warn_crossing_hosts`): the axis, the hosts one of its groups joins, and an axis
order that keeps it inside a host (or why none does).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import numpy as np

from commscope.mesh.hosts import HostTable
from commscope.mesh.layout import MeshError, MeshLayout, format_ranks

__all__ = [
    "AxisLocality",
    "FAST_AXIS_NAMES",
    "axis_locality",
    "crossing_warnings",
    "fast_axis_warnings",
    "host_of",
    "is_fast_axis_name",
    "ranks_per_host_from_env",
    "warn_crossing_hosts",
]

logger = logging.getLogger(__name__)

FAST_AXIS_NAMES = ("tp", "cp", "ep", "etp", "sp")
"""Axis names that say "keep me inside a host" (matched as the name or a ``_``-part of it)."""

_warned: set[str] = set()


def ranks_per_host_from_env(world_size: int, default: int | None = None) -> int:
    """Ranks per host by arithmetic: ``LOCAL_WORLD_SIZE`` (set by torchrun), else
    ``default``, else the whole world on one host. A live mesh uses it only where the
    ranks' hostnames cannot be gathered.
    """
    text = os.environ.get("LOCAL_WORLD_SIZE")
    if text:
        try:
            value = int(text)
        except ValueError:
            raise MeshError(f"LOCAL_WORLD_SIZE must be an integer, got {text!r}") from None
        if value >= 1:
            return value
    return default if default is not None else world_size


def host_of(rank: int, ranks_per_host: int) -> int:
    """Host index of a global rank under torchrun's consecutive placement."""
    if ranks_per_host < 1:
        raise MeshError(f"ranks per host must be >= 1, got {ranks_per_host}")
    return rank // ranks_per_host


@dataclass(frozen=True, slots=True)
class AxisLocality:
    """How one axis's groups sit on hosts."""

    axis: str
    """Axis name."""
    size: int
    """Ranks per group."""
    num_groups: int
    """Groups along this axis."""
    crossing_groups: int
    """How many of them span more than one host."""
    max_hosts_per_group: int
    """The most hosts one group spans."""
    min_hosts_per_group: int = 1
    """The fewest hosts one group spans."""

    @property
    def intra_host(self) -> bool:
        """True when every group stays inside one host."""
        return self.crossing_groups == 0

    def describe(self) -> str:
        """``inside a host`` or ``crosses hosts (...)`` in plain words."""
        if self.intra_host:
            return "inside a host"
        if self.crossing_groups == self.num_groups:
            share = "every group"
        else:
            share = f"{self.crossing_groups} of {self.num_groups} groups"
        if self.min_hosts_per_group == self.max_hosts_per_group:
            return f"crosses hosts ({share} spans {self.max_hosts_per_group} hosts)"
        return f"crosses hosts ({share} spans up to {self.max_hosts_per_group} hosts)"


def _host_array(layout: MeshLayout, hosts: int | HostTable) -> tuple[np.ndarray, bool]:
    """(host index of every rank of ``layout``, whether hosts never go back along ranks)."""
    n = layout.world_size
    if isinstance(hosts, HostTable):
        if hosts.world_size < n:
            raise MeshError(
                f"the host table holds {hosts.world_size} ranks; the mesh has {n}"
            )
        table = hosts.first(n)
        return table.host_index, table.is_consecutive
    if hosts < 1:
        raise MeshError(f"ranks per host must be >= 1, got {hosts}")
    return np.arange(n, dtype=np.int64) // hosts, True


def _spans(host_rows: np.ndarray, ordered: bool) -> np.ndarray:
    """How many hosts each row (one group's hosts) spans."""
    if not ordered:  # any placement: count the distinct hosts of each row
        host_rows = np.sort(host_rows, axis=1)
    # Sorted rows never go back, so a row's host count is one plus its changes of host.
    return np.count_nonzero(np.diff(host_rows, axis=1), axis=1) + 1


def axis_locality(layout: MeshLayout, hosts: int | HostTable) -> list[AxisLocality]:
    """For every axis of ``layout``: how many of its groups cross a host boundary.

    ``hosts`` is the job's :class:`~commscope.mesh.hosts.HostTable` (any placement), or
    a number of ranks per host (torchrun's consecutive placement, as planning assumes).
    """
    where, ordered = _host_array(layout, hosts)
    out = []
    for i, name in enumerate(layout.names):
        rows = where[layout.all_groups(i)]
        spans = _spans(rows, ordered)
        crossing = int(np.count_nonzero(spans > 1))
        widest = int(spans.max()) if spans.size else 1
        narrowest = int(spans[spans > 1].min()) if crossing else 1
        out.append(
            AxisLocality(
                axis=name,
                size=layout.shape[i],
                num_groups=rows.shape[0],
                crossing_groups=crossing,
                max_hosts_per_group=widest,
                min_hosts_per_group=narrowest,
            )
        )
    return out


def is_fast_axis_name(name: str) -> bool:
    """True for ``tp``, ``cp``, ``ep``, … or a name with one of them as a ``_``-part."""
    return name in FAST_AXIS_NAMES or any(p in FAST_AXIS_NAMES for p in name.split("_"))


def fast_axis_warnings(localities: list[AxisLocality], ranks_per_host: int) -> list[str]:
    """Offline planning's sentence for each fast axis (``tp``, ``cp``, ``ep``) whose
    groups cross hosts under ``ranks_per_host`` consecutive ranks per host."""
    return [
        f"mesh axis {loc.axis!r} ({loc.size} ranks) {loc.describe()} with "
        f"{ranks_per_host} ranks per host: its collectives go over the network. "
        f"Put {loc.axis!r} last in the mesh shape (the last axis holds consecutive "
        f"ranks) or make it at most {ranks_per_host} ranks."
        for loc in localities
        if not loc.intra_host and is_fast_axis_name(loc.axis)
    ]


# ---------------------------------------------------------------- live meshes


def _fast_inside(layout: MeshLayout, table: HostTable) -> dict[str, bool]:
    return {
        loc.axis: loc.intra_host
        for loc in axis_locality(layout, table)
        if is_fast_axis_name(loc.axis)
    }


def _reordered(layout: MeshLayout, axis: int) -> list[MeshLayout]:
    """The layouts with axis ``axis`` moved to every other position (last first, then
    first, then the rest), the other axes kept in their order."""
    names, shape = list(layout.names), list(layout.shape)
    others = [i for i in range(layout.ndim) if i != axis]
    order = [layout.ndim - 1, 0, *range(layout.ndim - 2, 0, -1)]
    out = []
    for pos in order:
        if pos == axis:
            continue
        idx = [*others[:pos], axis, *others[pos:]]
        out.append(MeshLayout.create([shape[i] for i in idx], [names[i] for i in idx]))
    return out


def _fix(layout: MeshLayout, loc: AxisLocality, table: HostTable) -> str:
    """What keeps ``loc.axis`` inside a host: another axis order, or why none does."""
    axis = layout.names.index(loc.axis)
    if layout.is_root and layout.ndim > 1:
        before = _fast_inside(layout, table)
        candidates = _reordered(layout, axis)
        fits = [c for c in candidates if _fast_inside(c, table)[loc.axis]]
        # prefer an order that keeps every other fast axis inside too
        best = next(
            (c for c in fits if all(v or not before[k] for k, v in _fast_inside(c, table).items())),
            fits[0] if fits else None,
        )
        if best is not None:
            lost = [k for k, v in _fast_inside(best, table).items() if before[k] and not v]
            cost = f" (then {', '.join(map(repr, lost))} crosses hosts)" if lost else ""
            return (
                f"to keep {loc.axis!r} inside a host, use mesh_shape {best.shape} with "
                f"mesh_dim_names {best.names}{cost}"
            )
    counts = table.counts
    if loc.size > int(counts.max()):
        return (
            f"no host holds {loc.size} ranks (the largest holds {int(counts.max())}): "
            f"make {loc.axis!r} at most {int(counts.max())} rank"
            + ("s" if int(counts.max()) != 1 else "")
        )
    per = table.ranks_per_host
    if per is None:
        uneven = ", ".join(
            f"{table.label(h)}: {int(c)}" for h, c in enumerate(counts.tolist()[:4])
        ) + (", ..." if table.num_hosts > 4 else "")
        return (
            f"hosts hold different numbers of ranks ({uneven}), so no axis order keeps "
            f"{loc.axis!r} inside a host: launch the same number of ranks on every host"
        )
    if per % loc.size:
        return f"make the size of {loc.axis!r} divide the {per} ranks of each host"
    return (
        f"no axis order keeps {loc.axis!r} inside a host with this placement: place "
        f"ranks on hosts in consecutive blocks of {per} (torchrun's way)"
    )


def _joins(layout: MeshLayout, axis: int, table: HostTable) -> str:
    """``group [0, 1] joins hostA (rank 0) and hostB (rank 1)``: the first crossing group."""
    where = table.first(layout.world_size).host_index
    groups = layout.all_groups(axis)
    rows = np.sort(where[groups], axis=1)
    first = int(np.flatnonzero(np.any(np.diff(rows, axis=1) != 0, axis=1))[0])
    group = groups[first].tolist()
    by_host: dict[int, list[int]] = {}
    for r in group:
        by_host.setdefault(int(where[r]), []).append(r)
    parts = []
    for h, ranks in list(by_host.items())[:4]:
        listed = format_ranks(ranks).strip("[]")
        parts.append(f"{table.label(h)} (rank{'s' if len(ranks) > 1 else ''} {listed})")
    if len(by_host) > 4:
        parts.append(f"{len(by_host) - 4} more hosts")
    joined = ", ".join(parts[:-1]) + " and " + parts[-1]
    return f"group {format_ranks(group)} joins {joined}"


def crossing_warnings(layout: MeshLayout, table: HostTable) -> list[str]:
    """One sentence for each fast axis (``tp``, ``cp``, ``ep``) whose groups cross hosts
    under the job's real placement: the axis, the hosts one of its groups joins, and
    the fix (an axis order that keeps it inside a host, or why none does)."""
    out = []
    for i, loc in enumerate(axis_locality(layout, table)):
        if loc.intra_host or not is_fast_axis_name(loc.axis):
            continue
        out.append(
            f"mesh axis {loc.axis!r} ({loc.size} ranks) {loc.describe()}: "
            f"{_joins(layout, i, table)}, so its collectives go over the network; "
            f"{_fix(layout, loc, table)}."
        )
    return out


def warn_crossing_hosts(layout: MeshLayout, table: HostTable, rank: int) -> list[str]:
    """On rank 0: log :func:`crossing_warnings`, each once per process (so once per
    job), and return them. Other ranks compute nothing and return ``[]``."""
    if rank != 0:
        return []
    messages = crossing_warnings(layout, table)
    for msg in messages:
        if msg not in _warned:
            _warned.add(msg)
            logger.warning("commscope mesh: %s", msg)
    return messages
