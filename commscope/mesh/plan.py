"""Offline planning of a mesh of any size: what ``commscope mesh`` prints.

A plan answers, with no process started: the groups of every axis, one rank's
coordinate and groups, which axes stay inside a host, and how many process groups each
rank must create (with commscope, and with PyTorch's ``init_device_mesh``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from commscope.mesh.layout import MeshLayout, format_ranks
from commscope.mesh.topology import axis_locality, fast_axis_warnings, host_of

__all__ = [
    "AXIS_COLUMNS",
    "AxisPlan",
    "MeshPlan",
    "format_plan",
    "format_ranks",
    "plan_mesh",
    "plan_parts",
    "plan_to_json",
]

DEFAULT_RANKS_PER_HOST = 8


@dataclass(frozen=True, slots=True)
class AxisPlan:
    """One axis of a plan."""

    name: str
    size: int
    num_groups: int
    stride: int
    """Rank distance between neighbours along the axis (1 = consecutive ranks)."""
    locality: str
    """``inside a host`` or ``crosses hosts (...)``."""
    intra_host: bool
    group_of_rank: list[int]
    """The planned rank's group along this axis."""
    local_rank: int
    """The planned rank's position in that group."""


@dataclass(frozen=True, slots=True)
class MeshPlan:
    """Everything ``commscope mesh`` reports about one mesh."""

    shape: list[int]
    names: list[str]
    world_size: int
    ranks_per_host: int
    num_hosts: int
    rank: int
    coordinate: list[int]
    host: int
    axes: list[AxisPlan]
    groups_per_rank_commscope: int
    """Process groups one rank creates with commscope (its own, member-only)."""
    new_group_calls_per_rank_torch: int
    """``new_group`` calls one rank makes in PyTorch's ``init_device_mesh`` (every group of
    every axis)."""
    warnings: list[str]


def plan_mesh(
    shape: Sequence[int],
    names: Sequence[str] | None = None,
    *,
    world_size: int | None = None,
    rank: int = 0,
    ranks_per_host: int | None = None,
) -> MeshPlan:
    """Plan a mesh; raises ``ValueError`` (:class:`~commscope.mesh.layout.MeshError`)
    with the arithmetic when the shape, names, world size or rank do not fit.
    """
    layout = MeshLayout.create(shape, names, world_size=world_size)
    layout.check_rank(rank)
    per_host = (
        ranks_per_host
        if ranks_per_host is not None
        else min(DEFAULT_RANKS_PER_HOST, layout.world_size)
    )
    if per_host < 1:
        raise ValueError(f"--ranks-per-host must be >= 1, got {per_host}")
    localities = axis_locality(layout, per_host)
    coordinate = layout.coordinate(rank)
    axes = [
        AxisPlan(
            name=name,
            size=layout.shape[i],
            num_groups=layout.num_groups(i),
            stride=layout.root_strides[i],
            locality=loc.describe(),
            intra_host=loc.intra_host,
            group_of_rank=layout.group(rank, i),
            local_rank=coordinate[i],
        )
        for i, (name, loc) in enumerate(zip(layout.names, localities))
    ]
    return MeshPlan(
        shape=list(layout.shape),
        names=list(layout.names),
        world_size=layout.world_size,
        ranks_per_host=per_host,
        num_hosts=-(-layout.world_size // per_host),
        rank=rank,
        coordinate=list(coordinate),
        host=host_of(rank, per_host),
        axes=axes,
        groups_per_rank_commscope=sum(not layout.covers_world(i) for i in range(layout.ndim)),
        new_group_calls_per_rank_torch=sum(
            layout.num_groups(i) for i in range(layout.ndim) if not layout.covers_world(i)
        ),
        warnings=fast_axis_warnings(localities, per_host),
    )


AXIS_COLUMNS = ["axis", "size", "groups", "stride", "locality"]
"""Header of the plan's axis table."""


def plan_parts(plan: MeshPlan) -> tuple[list[str], list[list[str]], list[str]]:
    """The plan as (heading lines, axis-table rows under :data:`AXIS_COLUMNS`, the rest),
    for a caller that draws the table itself."""
    dims = ", ".join(f"{n}={s}" for n, s in zip(plan.names, plan.shape))
    heading = [
        f"mesh ({dims}) over {plan.world_size} ranks, "
        f"{plan.num_hosts} host{'s' if plan.num_hosts != 1 else ''} of {plan.ranks_per_host} ranks",
    ]
    rows = [[a.name, str(a.size), str(a.num_groups), str(a.stride), a.locality] for a in plan.axes]
    width = max(4, *(len(a.name) for a in plan.axes))
    coord = ", ".join(f"{n}={c}" for n, c in zip(plan.names, plan.coordinate))
    rest = [
        f"rank {plan.rank}: coordinate ({coord}), host {plan.host} "
        f"(local rank {plan.rank % plan.ranks_per_host})",
        *(f"  {a.name:<{width}}  group {format_ranks(a.group_of_rank)}" for a in plan.axes),
        "",
        "process groups each rank creates:",
        f"  commscope: {plan.groups_per_rank_commscope} (only its own, created by their members)",
        f"  torch init_device_mesh: {plan.new_group_calls_per_rank_torch} new_group calls "
        "(every group of every axis, on every rank)",
        *(f"warning: {w}" for w in plan.warnings),
    ]
    return heading, rows, rest


def format_plan(plan: MeshPlan) -> str:
    """The plan as plain text."""
    heading, rows, rest = plan_parts(plan)
    width = max(4, *(len(r[0]) for r in rows))
    table = [f"  {'axis':<{width}}  {'size':>6}  {'groups':>7}  {'stride':>7}  locality"]
    table += [
        f"  {name:<{width}}  {size:>6}  {groups:>7}  {stride:>7}  {locality}"
        for name, size, groups, stride, locality in rows
    ]
    return "\n".join([*heading, "", *table, "", *rest])


def plan_to_json(plan: MeshPlan) -> str:
    """The plan as JSON (``format: commscope.mesh-plan/1``)."""
    data = {"format": "commscope.mesh-plan/1", **asdict(plan)}
    return json.dumps(data, indent=2)
