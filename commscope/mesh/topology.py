"""Where ranks live: hosts, and whether each mesh axis stays inside one.

``torchrun`` gives each host ``LOCAL_WORLD_SIZE`` consecutive global ranks, so rank
``r`` lives on host ``r // ranks_per_host``. An axis whose groups all stay inside a host
talks over the fast local links (NVLink); an axis whose groups cross hosts talks over
the network. Tensor, context and expert parallelism (``tp``, ``cp``, ``ep``) want the
former; this module says which axes have it and warns once when a fast axis does not.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import numpy as np

from commscope.mesh.layout import MeshError, MeshLayout

__all__ = [
    "AxisLocality",
    "FAST_AXIS_NAMES",
    "axis_locality",
    "fast_axis_warnings",
    "host_of",
    "is_fast_axis_name",
    "ranks_per_host_from_env",
    "warn_fast_axes_crossing_hosts",
]

logger = logging.getLogger(__name__)

FAST_AXIS_NAMES = ("tp", "cp", "ep", "etp", "sp")
"""Axis names that say "keep me inside a host" (matched as the name or a ``_``-part of it)."""

_warned: set[tuple[str, int, int]] = set()


def ranks_per_host_from_env(world_size: int, default: int | None = None) -> int:
    """Ranks per host: ``LOCAL_WORLD_SIZE`` (set by torchrun), else ``default``, else
    the whole world on one host.
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


def axis_locality(layout: MeshLayout, ranks_per_host: int) -> list[AxisLocality]:
    """For every axis of ``layout``: how many of its groups cross a host boundary."""
    if ranks_per_host < 1:
        raise MeshError(f"ranks per host must be >= 1, got {ranks_per_host}")
    out = []
    for i, name in enumerate(layout.names):
        hosts = layout.all_groups(i) // ranks_per_host
        # Rows list ranks in increasing order, so hosts along a row never go back:
        # a row's host count is one plus the number of times it changes host.
        spans = np.count_nonzero(np.diff(hosts, axis=1), axis=1) + 1
        crossing = int(np.count_nonzero(spans > 1))
        widest = int(spans.max()) if spans.size else 1
        narrowest = int(spans[spans > 1].min()) if crossing else 1
        out.append(
            AxisLocality(
                axis=name,
                size=layout.shape[i],
                num_groups=hosts.shape[0],
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
    """One sentence for each fast axis (``tp``, ``cp``, ``ep``) whose groups cross hosts."""
    return [
        f"mesh axis {loc.axis!r} ({loc.size} ranks) {loc.describe()} with "
        f"{ranks_per_host} ranks per host: its collectives go over the network. "
        f"Put {loc.axis!r} last in the mesh shape (the last axis holds consecutive "
        f"ranks) or make it at most {ranks_per_host} ranks."
        for loc in localities
        if not loc.intra_host and is_fast_axis_name(loc.axis)
    ]


def warn_fast_axes_crossing_hosts(
    localities: list[AxisLocality], ranks_per_host: int, world_size: int
) -> list[str]:
    """Log :func:`fast_axis_warnings` once per axis and set-up; return them all."""
    messages = fast_axis_warnings(localities, ranks_per_host)
    crossing = [x for x in localities if not x.intra_host and is_fast_axis_name(x.axis)]
    for loc, msg in zip(crossing, messages):
        key = (loc.axis, ranks_per_host, world_size)
        if key not in _warned:
            _warned.add(key)
            logger.warning(msg)
    return messages
