"""The JSON dump of a comm trace: PyTorch's keys, kept as they are, plus ours (versioned).

PyTorch's ``generate_json_dump`` writes one tree of nodes, the root being ``Global``; each
node has exactly ``fqn``, ``module_type``, ``parameters``, ``children``,
``collectives_forward``, ``collectives_backward``, ``operations_forward``,
``operations_backward`` and ``operations_checkpointing``, filtered by noise level. We
write the same keys, in the same order and with the same meaning, so PyTorch's browser
script reads our files, then add our own keys after them:

* per node: ``depth``, ``module_class`` (the module type at every noise level),
  ``parameter_details`` (every direct parameter: shape, local shape, dtype, placements,
  mesh), ``collectives_after_backward``, ``operations_after_backward`` and
  ``collective_stats`` (per phase: key, collective, axis, group size, count, bytes,
  bus-bandwidth factor, estimated time);
* on the root only: ``commscope`` with ``schema`` (``"commscope.comm"``),
  ``schema_version``, ``noise_level``, ``rank``, ``world_size``, ``torch_version``,
  ``bandwidth_gbps`` and ``records`` (every collective in issue order).

:func:`trace_from_json` reads ours and PyTorch's dumps alike.
"""

from __future__ import annotations

import json
import os
from typing import Any

from commscope.comm.trace.model import (
    PHASES,
    CollectiveRecord,
    CommTrace,
    ModuleNode,
    OpEntry,
)

__all__ = [
    "SCHEMA",
    "SCHEMA_VERSION",
    "trace_to_json",
    "trace_from_json",
    "write_json",
    "load_json",
    "is_comm_dump",
]

SCHEMA = "commscope.comm"
SCHEMA_VERSION = 1
"""Bumped when a key changes meaning or goes away; new keys do not bump it."""

_OP_PHASES = ("forward", "backward", "checkpointing", "after_backward")


def _op_json(op: OpEntry) -> dict[str, Any]:
    return {
        "name": op.name,
        "input_shape": list(op.input_shape),
        "input_sharding": list(op.input_sharding),
        "device_mesh": op.device_mesh,
        "is_bw": op.phase in ("backward", "checkpointing"),
        "is_activation_checkpointing": op.phase == "checkpointing",
    }


def _node_json(trace: CommTrace, node: ModuleNode, noise: int) -> dict[str, Any]:
    ops = {phase: [_op_json(op) for op in node.ops_in(phase, noise)] for phase in _OP_PHASES}
    stats = {}
    for phase in PHASES:
        items = []
        for stat in trace.stats(node, phase):
            item: dict[str, Any] = {
                "key": stat.key,
                "collective": stat.collective,
                "axis": stat.axis,
                "group_size": stat.group_size,
                "count": stat.count,
                "bytes": stat.bytes,
                "busbw_factor": stat.busbw_factor,
            }
            if trace.bandwidth_gbps:
                item["estimated_us"] = (
                    stat.bytes * stat.busbw_factor / (trace.bandwidth_gbps * 1e9) * 1e6
                )
            items.append(item)
        stats[phase] = items
    return {
        # PyTorch's keys, in PyTorch's order.
        "fqn": node.fqn,
        "module_type": node.module_type if noise > 0 else "",
        "parameters": [[n, p] for n, p in node.parameters] if noise > 0 else [],
        "children": [_node_json(trace, child, noise) for child in node.children],
        "collectives_forward": [[k, v] for k, v in node.collectives["forward"].items()],
        "collectives_backward": [[k, v] for k, v in node.collectives["backward"].items()],
        "operations_forward": ops["forward"],
        "operations_backward": ops["backward"],
        "operations_checkpointing": ops["checkpointing"],
        # Ours.
        "depth": node.depth,
        "module_class": node.module_type,
        "parameter_details": node.parameter_details,
        "collectives_after_backward": [
            [k, v] for k, v in node.collectives["after_backward"].items()
        ],
        "operations_after_backward": ops["after_backward"],
        "collective_stats": stats,
    }


def trace_to_json(trace: CommTrace, noise_level: int = 3) -> dict[str, Any]:
    """The dump as a JSON-ready dict (the ``Global`` node at the root)."""
    noise = max(0, min(3, int(noise_level)))
    root = _node_json(trace, trace.root, noise)
    from commscope import __version__

    root["commscope"] = {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "commscope_version": __version__,
        "noise_level": noise,
        "rank": trace.rank,
        "world_size": trace.world_size,
        "torch_version": trace.torch_version,
        "bandwidth_gbps": trace.bandwidth_gbps,
        "records": [r.to_json() for r in trace.records],
    }
    return root


def write_json(trace: CommTrace, path: str | os.PathLike[str], noise_level: int = 3) -> None:
    """Write :func:`trace_to_json` to ``path`` (overwritten, ``indent=4`` like PyTorch)."""
    with open(path, "w") as f:
        json.dump(trace_to_json(trace, noise_level), f, indent=4)


def is_comm_dump(obj: Any) -> bool:
    """True for a comm-trace dump, ours or PyTorch's (a node with ``fqn`` and ``children``)."""
    return isinstance(obj, dict) and isinstance(obj.get("fqn"), str) and "children" in obj


def _op_from_json(obj: dict[str, Any], phase: str) -> OpEntry:
    return OpEntry(
        name=str(obj.get("name", "")),
        phase=phase,
        input_shape=[str(s) for s in obj.get("input_shape", [])],
        input_sharding=[str(s) for s in obj.get("input_sharding", [])],
        device_mesh=str(obj.get("device_mesh", "")),
    )


def _node_from_json(obj: dict[str, Any], depth: int) -> ModuleNode:
    node = ModuleNode(
        fqn=str(obj["fqn"]),
        depth=int(obj.get("depth", depth)),
        module_type=str(obj.get("module_class") or obj.get("module_type") or ""),
        parameters=[(str(n), str(p)) for n, p in obj.get("parameters", [])],
        parameter_details=list(obj.get("parameter_details", [])),
    )
    if not node.parameters and node.parameter_details:
        node.parameters = [
            (d["name"], d["placements"]) for d in node.parameter_details if d.get("placements")
        ]
    for phase in PHASES:
        pairs = obj.get(f"collectives_{phase}", [])
        node.collectives[phase] = {str(k): int(v) for k, v in pairs}
    for phase in _OP_PHASES:
        node.ops.extend(_op_from_json(op, phase) for op in obj.get(f"operations_{phase}", []))
    node.children = [_node_from_json(child, depth + 1) for child in obj.get("children", [])]
    return node


def trace_from_json(obj: Any) -> CommTrace:
    """Rebuild a :class:`CommTrace` from a dump (ours or PyTorch's).

    Raises ``ValueError`` naming what is wrong when ``obj`` is not a comm dump or was
    written by a newer schema version.
    """
    if not is_comm_dump(obj):
        got = type(obj).__name__ if not isinstance(obj, dict) else f"keys {sorted(obj)[:6]}"
        raise ValueError(
            f"not a CommDebugMode JSON dump (expected an object with 'fqn' and 'children', "
            f"got {got}); write one with generate_json_dump()"
        )
    meta = obj.get("commscope") or {}
    version = int(meta.get("schema_version", 0) or 0)
    if version > SCHEMA_VERSION:
        raise ValueError(
            f"comm dump schema_version {version} is newer than this commscope reads "
            f"({SCHEMA_VERSION}); upgrade commscope"
        )
    root = _node_from_json(obj, 0)
    return CommTrace(
        root=root,
        records=[CollectiveRecord.from_json(r) for r in meta.get("records", [])],
        noise_level=int(meta.get("noise_level", 3)),
        rank=meta.get("rank"),
        world_size=meta.get("world_size"),
        torch_version=str(meta.get("torch_version", "")),
        bandwidth_gbps=meta.get("bandwidth_gbps"),
    )


def load_json(path: str | os.PathLike[str]) -> CommTrace:
    """Read a dump file written by :func:`write_json` or by PyTorch's ``CommDebugMode``."""
    with open(path) as f:
        return trace_from_json(json.load(f))
