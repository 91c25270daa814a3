"""The plain data a comm trace is made of, whether it was just captured or read from JSON.

A :class:`CommTrace` is a tree of :class:`ModuleNode` (``Global`` at the root) plus the
flat list of every :class:`CollectiveRecord`. The text table, the summary, the JSON dump
and the viewer all read this, so a trace loaded back from JSON prints the same table as
the live one. Nothing here imports ``torch.distributed``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from commscope import collectives

__all__ = [
    "PHASES",
    "CollectiveRecord",
    "OpEntry",
    "ModuleNode",
    "CollectiveStat",
    "CommTrace",
    "TRIVIAL_OPS",
    "aggregate",
]

PHASES = ("forward", "backward", "after_backward")
"""Phases collectives are counted under. Op lists also have ``checkpointing``."""

TRIVIAL_OPS = frozenset(
    {
        "aten.detach.default",
        "aten.t.default",
        "aten.view.default",
        "aten._to_copy.default",
        "aten.as_strided.default",
        "aten.transpose.int",
    }
)
"""Ops hidden below noise level 3 (PyTorch's list)."""


@dataclass(frozen=True, slots=True)
class CollectiveRecord:
    """One collective call seen by the tracer, on this rank."""

    index: int
    """Position among the collectives of the block (0-based)."""
    key: str
    """PyTorch's count key as printed: ``c10d_functional.all_reduce``, ``c10d.allreduce_``."""
    collective: str
    """Canonical name (:mod:`commscope.collectives`): ``all_reduce``..."""
    module: str
    """FQN of the module it is charged to (``Global`` outside every module)."""
    phase: str
    """``forward``, ``backward`` or ``after_backward``."""
    bytes: int
    """Message size in bytes, the nccl-tests way (all_gather: the gathered output)."""
    dtype: str = ""
    """c10 dtype name of the payload (``Float``); "" for a barrier."""
    group_name: str = ""
    """The process group's ``group_name``."""
    group_desc: str = ""
    """The process group's ``group_desc`` (``mesh_tp``, ``default_pg``)."""
    group_size: int = 0
    """Ranks in the process group (0 when unknown)."""
    axis: str | None = None
    """Mesh axis of the group (``tp``); ``None`` when the group is not a mesh axis."""
    checkpointing: bool = False
    """True when issued while a forward was recomputed inside backward."""
    stage: int | None = None
    """Pipeline stage index of a send/recv issued by a ``torch.distributed.pipelining``
    schedule (then ``module`` is ``pipeline stage N``); ``None`` otherwise."""

    def estimated_us(self, busbw_gbps: float) -> float:
        """Estimated time at a bus bandwidth in decimal GB/s (nccl-tests model)."""
        return collectives.estimate_time_us(
            self.collective, self.bytes, max(self.group_size, 1), busbw_gbps
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON object with one key per field."""
        return {name: getattr(self, name) for name in self.__slots__}  # type: ignore[attr-defined]

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> CollectiveRecord:
        """Inverse of :meth:`to_json`; unknown keys are ignored."""
        names = cls.__slots__  # type: ignore[attr-defined]
        return cls(**{k: v for k, v in obj.items() if k in names})


@dataclass(slots=True)
class OpEntry:
    """One op in a module's op list, already turned into strings."""

    name: str
    """``aten.addmm.default``."""
    phase: str
    """``forward``, ``backward``, ``checkpointing`` or ``after_backward``."""
    input_shape: list[str] = field(default_factory=list)
    """``str(torch.Size)`` of each positional DTensor argument; empty for a plain op."""
    input_sharding: list[str] = field(default_factory=list)
    """``str(placements)`` of each positional DTensor argument."""
    device_mesh: str = ""
    """``str(DeviceMesh)`` of the last DTensor argument, "" for a plain op."""

    @property
    def is_dtensor(self) -> bool:
        """True for the DTensor-level entry of an op (it has shapes)."""
        return bool(self.input_shape)

    def shown(self, noise_level: int) -> bool:
        """Whether this op is listed at ``noise_level`` (1: DTensor ops, 2: + plain, 3: all)."""
        if noise_level >= 3:
            return True
        if noise_level <= 0 or self.name in TRIVIAL_OPS:
            return False
        return noise_level >= 2 or self.is_dtensor


@dataclass(slots=True)
class CollectiveStat:
    """Collectives of one module and phase, grouped by key and mesh axis."""

    key: str
    collective: str
    axis: str | None
    group_size: int
    count: int
    bytes: int

    @property
    def busbw_factor(self) -> float:
        """The nccl-tests factor for this collective and group size."""
        return collectives.bus_bandwidth_factor(self.collective, max(self.group_size, 1))


@dataclass(slots=True)
class ModuleNode:
    """One module of the tree, with its collectives (its own and its descendants')."""

    fqn: str
    depth: int
    module_type: str = ""
    """PyTorch's ``class 'pkg.mod.Class'`` spelling; "" for Global."""
    parameters: list[tuple[str, str]] = field(default_factory=list)
    """``(name, str(placements))`` of the module's DTensor parameters."""
    parameter_details: list[dict[str, Any]] = field(default_factory=list)
    """Every direct parameter: name, shape, local_shape, dtype, placements, mesh."""
    children: list[ModuleNode] = field(default_factory=list)
    collectives: dict[str, dict[str, int]] = field(
        default_factory=lambda: {p: {} for p in PHASES}
    )
    """Per phase, ``{key: count}`` in first-seen order, including descendants."""
    ops: list[OpEntry] = field(default_factory=list)
    """Ops run directly in this module, in order."""

    def ops_in(self, phase: str, noise_level: int) -> list[OpEntry]:
        """The ops of one phase shown at ``noise_level``."""
        return [op for op in self.ops if op.phase == phase and op.shown(noise_level)]

    def walk(self) -> list[ModuleNode]:
        """The node and its descendants, pre-order."""
        out = [self]
        for child in self.children:
            out.extend(child.walk())
        return out


@dataclass(slots=True)
class CommTrace:
    """A whole trace: the module tree, every collective, and where it was taken."""

    root: ModuleNode
    records: list[CollectiveRecord] = field(default_factory=list)
    noise_level: int = 3
    """The most detailed noise level this trace can print (3 when captured live)."""
    rank: int | None = None
    world_size: int | None = None
    torch_version: str = ""
    bandwidth_gbps: float | None = None
    """Bus bandwidth the user gave for time estimates, if any."""

    def modules(self) -> list[ModuleNode]:
        """Every module, Global first, pre-order."""
        return self.root.walk()

    def find(self, fqn: str) -> ModuleNode | None:
        """The node named ``fqn``, or ``None``."""
        for node in self.modules():
            if node.fqn == fqn:
                return node
        return None

    def stats(self, node: ModuleNode, phase: str) -> list[CollectiveStat]:
        """The collectives of ``node`` (and descendants) in ``phase``, by key and axis."""
        names = {n.fqn for n in node.walk()}
        return aggregate(r for r in self.records if r.phase == phase and r.module in names)

    def counts(self) -> dict[str, int]:
        """Total count per key, all phases, as ``get_comm_counts()`` printed."""
        out: dict[str, int] = {}
        for phase in PHASES:
            for key, n in self.root.collectives[phase].items():
                out[key] = out.get(key, 0) + n
        return out


def aggregate(records: Any) -> list[CollectiveStat]:
    """Group collective records by (key, axis, group size), in first-seen order."""
    out: dict[tuple[str, str | None, int], CollectiveStat] = {}
    for r in records:
        k = (r.key, r.axis, r.group_size)
        stat = out.get(k)
        if stat is None:
            out[k] = CollectiveStat(r.key, r.collective, r.axis, r.group_size, 1, r.bytes)
        else:
            stat.count += 1
            stat.bytes += r.bytes
    return list(out.values())
