"""Turn what :class:`~commscope.comm.capture.mode.CommDebugMode` captured into plain data.

The capture keeps raw objects (op overloads, ``torch.Size``, placements, meshes, group
descriptions) so that the per-op path stays cheap; this module makes strings, records and
PyTorch-shaped dicts out of them when a report is asked for, and finds the mesh axis of
each process group.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
import torch.distributed.tensor

from commscope import collectives
from commscope.comm.capture.modules import (
    CHECKPOINTING,
    COUNT_PHASES,
    PHASE_NAMES,
    ModuleRecord,
    ModuleTracker,
)
from commscope.comm.capture.needs import torch_internal
from commscope.comm.trace.model import CollectiveRecord, CommTrace, ModuleNode, OpEntry
from commscope.compat import mesh_group_names

DTensor = torch_internal("distributed.tensor.DTensor")  # public from torch 2.5

__all__ = [
    "mesh_axes",
    "known_group",
    "find_meshes",
    "build_records",
    "build_trace",
    "operation_dicts",
    "param_detail",
]


def mesh_axes(meshes: dict[int, Any]) -> dict[str, str]:
    """``group_name -> axis name`` for every mesh seen (``dim_<i>`` for unnamed axes)."""
    axes: dict[str, str] = {}
    for mesh in list(meshes.values()):
        names = getattr(mesh, "mesh_dim_names", None)
        groups = mesh_group_names(mesh)
        for i, group_name in enumerate(groups):
            if group_name is not None:
                axes.setdefault(str(group_name), names[i] if names else f"dim_{i}")
    return axes


def known_group(group_name: str, meshes: dict[int, Any]) -> bool:
    """True when one of the meshes seen so far has ``group_name`` as one of its axes."""
    return any(group_name in mesh_group_names(mesh) for mesh in meshes.values())


def find_meshes(meshes: dict[int, Any], max_frames: int = 48) -> None:
    """Look for device meshes in the callers' frames (``distribute_tensor(t, mesh, ...)``).

    Used once per process group whose description does not name a mesh axis (a 1-D
    mesh over the whole world reuses the default group, ``default_pg``), so the axis can
    still be named when no DTensor op has shown us the mesh yet.
    """
    from torch.distributed.device_mesh import DeviceMesh

    try:
        frame = sys._getframe(2)
    except ValueError:  # called from C++ with no Python caller (autograd's threads)
        return
    for _ in range(max_frames):
        if frame is None:
            return
        for value in frame.f_locals.values():
            if isinstance(value, DeviceMesh):
                meshes[id(value)] = value
            elif isinstance(value, DTensor):
                mesh = value.device_mesh
                meshes[id(mesh)] = mesh
        frame = frame.f_back


def build_records(raw: list[tuple[Any, ...]], axes: dict[str, str]) -> list[CollectiveRecord]:
    """One :class:`CollectiveRecord` per raw capture tuple, with its mesh axis.

    The axis is the group description's ``mesh_<axis>``, else the axis of a mesh seen in
    the block that owns the group, else ``None``.
    """
    records = []
    for i, (cls, fqn, bucket, ckpt, nbytes, dtype, group, stage) in enumerate(raw):
        axis = None
        if group.desc.startswith("mesh_") and group.desc != "mesh_default":
            axis = group.desc[len("mesh_") :]
        elif group.name in axes:
            axis = axes[group.name]
        records.append(
            CollectiveRecord(
                index=i,
                key=str(cls.key),
                collective=cls.collective,
                module=fqn,
                phase=COUNT_PHASES[bucket],
                bytes=nbytes,
                dtype=dtype,
                group_name=group.name,
                group_desc=group.desc,
                group_size=group.size,
                axis=axis,
                checkpointing=ckpt,
                stage=stage,
            )
        )
    return records


def param_detail(name: str, param: Any) -> dict[str, Any]:
    """Name, global and local shape, dtype, placements and mesh of one parameter."""
    placements = getattr(param, "placements", None)
    local = getattr(param, "_local_tensor", param)
    mesh = getattr(param, "device_mesh", None)
    return {
        "name": name,
        "shape": list(param.shape),
        "local_shape": list(local.shape),
        "dtype": collectives.normalize_dtype_name(str(param.dtype)),
        "placements": None if placements is None else str(placements),
        "mesh": None if mesh is None else str(mesh),
    }


def build_trace(
    tracker: ModuleTracker,
    records: list[CollectiveRecord],
    *,
    ops_recorded: bool,
    rank: int | None,
    world_size: int | None,
    bandwidth_gbps: float | None,
) -> CommTrace:
    """The module tree with strings for every op, as a :class:`CommTrace`."""
    strings: dict[int, str] = {}

    def text(obj: Any) -> str:
        found = strings.get(id(obj))
        if found is None:
            found = strings[id(obj)] = str(obj)
        return found

    by_fqn = tracker.records

    def node(rec: ModuleRecord) -> ModuleNode:
        n = ModuleNode(fqn=rec.fqn, depth=rec.depth, module_type=rec.module_type)
        for name, param in rec.params:
            placements = getattr(param, "placements", None)
            if placements is not None:
                n.parameters.append((name, str(placements)))
            n.parameter_details.append(param_detail(name, param))
        n.collectives = {
            phase: {str(k): v for k, v in rec.counts[i].items()} if rec.counts else {}
            for i, phase in enumerate(COUNT_PHASES)
        }
        for func, phase, info in rec.ops:
            entry = OpEntry(name=text(func), phase=PHASE_NAMES[phase])
            if info:
                entry.input_shape = [str(spec.shape) for spec in info]
                entry.input_sharding = [str(spec.placements) for spec in info]
                entry.device_mesh = text(info[-1].mesh)
            n.ops.append(entry)
        n.children = [node(by_fqn[child]) for child in rec.children]
        return n

    return CommTrace(
        root=node(tracker.global_record),
        records=list(records),
        noise_level=3 if ops_recorded else 0,
        rank=rank,
        world_size=world_size,
        torch_version=str(torch.__version__),
        bandwidth_gbps=bandwidth_gbps,
    )


def operation_dicts(tracker: ModuleTracker) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """PyTorch's ``comm_module_operation_counts``: ``{fqn: {"operations_list": [...]}}``."""
    out: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for rec in tracker.modules():
        if not rec.ops:
            continue
        ops = []
        for func, phase, info in rec.ops:
            specs = info or ()
            ops.append(
                {
                    "name": func,
                    "input_shape": [spec.shape for spec in specs],
                    "input_sharding": [spec.placements for spec in specs],
                    "device_mesh": str(specs[-1].mesh) if specs else "",
                    "is_bw": phase in (1, CHECKPOINTING),
                    "is_activation_checkpointing": phase == CHECKPOINTING,
                }
            )
        out[rec.fqn] = {"operations_list": ops}
    return out
