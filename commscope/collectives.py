"""One vocabulary of collectives for every part of commscope.

Every layer of ``torch.distributed`` spells a collective its own way: the eager
function (``dist.all_gather_into_tensor``), the ``c10d`` dispatcher op
(``c10d._allgather_base_``), the functional op (``_c10d_functional.all_gather_into_tensor``),
the process-group method (``ProcessGroup._allgather_base``), the flight recorder's
``profiling_name`` (``nccl:_allgather_base``, ``gloo:all_gather``) and the profiler's
upper-case ``OpType`` (``_ALLGATHER_BASE``). This module maps all of them onto eleven
canonical names and knows, for each, how big its message is and how the nccl-tests
convention turns a measured time into bus bandwidth.

Nothing else in commscope keeps a list of collectives: the comm tracer, the flight
recorder and the analyzer all ask this module.

The module imports nothing from torch, so the analyzer can use it on a laptop with no
torch installed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "ALL_REDUCE",
    "ALL_GATHER",
    "REDUCE_SCATTER",
    "ALL_TO_ALL",
    "BROADCAST",
    "REDUCE",
    "GATHER",
    "SCATTER",
    "BARRIER",
    "SEND",
    "RECV",
    "CANONICAL_NAMES",
    "CollectiveSpec",
    "SPECS",
    "canonical_name",
    "spec",
    "is_collective",
    "is_p2p",
    "dtype_itemsize",
    "normalize_dtype_name",
    "numel",
    "tensor_bytes",
    "message_bytes",
    "bus_bandwidth_factor",
    "bus_bandwidth_gbps",
    "estimate_time_us",
    "parse_profiling_name",
    "ProfilingName",
]

ALL_REDUCE = "all_reduce"
ALL_GATHER = "all_gather"
REDUCE_SCATTER = "reduce_scatter"
ALL_TO_ALL = "all_to_all"
BROADCAST = "broadcast"
REDUCE = "reduce"
GATHER = "gather"
SCATTER = "scatter"
BARRIER = "barrier"
SEND = "send"
RECV = "recv"


def _ring_all_reduce(n: int) -> float:
    return 2.0 * (n - 1) / n if n > 0 else 0.0


def _ring_gather_like(n: int) -> float:
    return (n - 1) / n if n > 0 else 0.0


def _one(n: int) -> float:
    return 1.0


def _zero(n: int) -> float:
    return 0.0


@dataclass(frozen=True, slots=True)
class CollectiveSpec:
    """Everything commscope knows about one canonical collective.

    Each ``*_names`` field lists how one layer of ``torch.distributed`` spells this
    collective; the lookups in this module are built from these tuples and nothing else.
    """

    name: str
    """Canonical name, e.g. ``"all_reduce"``."""
    eager_functions: tuple[str, ...]
    """``torch.distributed`` functions, e.g. ``all_reduce``, ``all_reduce_coalesced``."""
    c10d_ops: tuple[str, ...]
    """Ops of the ``c10d`` dispatcher namespace, e.g. ``allreduce_``."""
    functional_ops: tuple[str, ...]
    """Ops of ``_c10d_functional`` (and the legacy ``c10d_functional``), in-place ones included."""
    autograd_functional_ops: tuple[str, ...]
    """Ops of ``_c10d_functional_autograd``."""
    process_group_methods: tuple[str, ...]
    """``torch.distributed.ProcessGroup`` methods, e.g. ``allreduce``, ``_allgather_base``."""
    profiling_ops: tuple[str, ...]
    """The op part of flight-recorder ``profiling_name`` strings (``nccl:<op>``, ``gloo:<op>``)."""
    op_types: tuple[str, ...]
    """Upper-case ``OpType`` names used by the profiler and some trace tools."""
    is_p2p: bool
    """True for ``send`` and ``recv``."""
    busbw_factor: Callable[[int], float]
    """Bus-bandwidth factor for a group of ``n`` ranks (nccl-tests convention)."""
    message_from: str
    """Which side's size is the message size: ``"input"`` or ``"output"``."""

    def all_spellings(self) -> tuple[str, ...]:
        """Every spelling this collective answers to, the canonical name first."""
        return (
            self.name,
            *self.eager_functions,
            *self.c10d_ops,
            *self.functional_ops,
            *self.autograd_functional_ops,
            *self.process_group_methods,
            *self.profiling_ops,
            *self.op_types,
        )


SPECS: dict[str, CollectiveSpec] = {
    s.name: s
    for s in (
        CollectiveSpec(
            name=ALL_REDUCE,
            eager_functions=("all_reduce", "all_reduce_coalesced"),
            c10d_ops=("allreduce_", "allreduce_coalesced_"),
            functional_ops=(
                "all_reduce",
                "all_reduce_",
                "all_reduce_coalesced",
                "all_reduce_coalesced_",
            ),
            autograd_functional_ops=(),
            process_group_methods=("allreduce", "allreduce_coalesced"),
            profiling_ops=(
                "all_reduce",
                "allreduce",
                "allreduce_coalesced",
                "all_reduce_coalesced",
                "all_reduce_barrier",
            ),
            op_types=("ALLREDUCE", "ALLREDUCE_COALESCED"),
            is_p2p=False,
            busbw_factor=_ring_all_reduce,
            message_from="input",
        ),
        CollectiveSpec(
            name=ALL_GATHER,
            eager_functions=(
                "all_gather",
                "all_gather_into_tensor",
                "all_gather_coalesced",
                "all_gather_object",
            ),
            c10d_ops=(
                "allgather_",
                "_allgather_base_",  # also dist.all_gather_object's from torch 2.15
                "allgather_coalesced_",
                "allgather_into_tensor_coalesced_",
            ),
            functional_ops=(
                "all_gather_into_tensor",
                "all_gather_into_tensor_out",
                "all_gather_into_tensor_coalesced",
            ),
            autograd_functional_ops=("all_gather_into_tensor",),
            process_group_methods=(
                "allgather",
                "_allgather_base",
                "allgather_coalesced",
                "allgather_into_tensor_coalesced",
                "all_gather_single",
                "all_gather_single_coalesced",
            ),
            profiling_ops=(
                "all_gather",
                "allgather",
                "_allgather_base",
                "_all_gather_base",
                "all_gather_base",
                "all_gather_single",
                "all_gather_v",
                "all_gather_into_tensor_coalesced",
                "allgather_into_tensor_coalesced",
                "allgather_coalesced",
                "ALLGATHER_coalesced",
            ),
            op_types=("ALLGATHER", "_ALLGATHER_BASE", "ALLGATHER_COALESCED"),
            is_p2p=False,
            busbw_factor=_ring_gather_like,
            message_from="output",
        ),
        CollectiveSpec(
            name=REDUCE_SCATTER,
            eager_functions=("reduce_scatter", "reduce_scatter_tensor"),
            c10d_ops=(
                "reduce_scatter_",
                "_reduce_scatter_base_",
                "reduce_scatter_tensor_coalesced_",
            ),
            functional_ops=(
                "reduce_scatter_tensor",
                "reduce_scatter_tensor_out",
                "reduce_scatter_tensor_coalesced",
            ),
            autograd_functional_ops=("reduce_scatter_tensor",),
            process_group_methods=(
                "reduce_scatter",
                "_reduce_scatter_base",
                "reduce_scatter_tensor_coalesced",
                "reduce_scatter_single",
                "reduce_scatter_single_coalesced",
            ),
            profiling_ops=(
                "reduce_scatter",
                "_reduce_scatter_base",
                "reduce_scatter_single",
                "reduce_scatter_v",
                "reduce_scatter_tensor_coalesced",
                "REDUCE_SCATTER_coalesced",
            ),
            op_types=("REDUCE_SCATTER", "_REDUCE_SCATTER_BASE"),
            is_p2p=False,
            busbw_factor=_ring_gather_like,
            message_from="input",
        ),
        CollectiveSpec(
            name=ALL_TO_ALL,
            eager_functions=("all_to_all", "all_to_all_single"),
            c10d_ops=("alltoall_", "alltoall_base_"),
            functional_ops=("all_to_all_single",),
            autograd_functional_ops=("all_to_all_single",),
            process_group_methods=("alltoall", "alltoall_base", "all_to_all_single"),
            profiling_ops=(
                "all_to_all",
                "alltoall",
                "alltoall_base",
                "all_to_all_single",
                "all_to_all_v_single",
                "shard_dim_alltoall",
            ),
            op_types=("ALLTOALL", "ALLTOALL_BASE"),
            is_p2p=False,
            busbw_factor=_ring_gather_like,
            message_from="input",
        ),
        CollectiveSpec(
            name=BROADCAST,
            eager_functions=("broadcast", "broadcast_object_list"),
            c10d_ops=("broadcast_",),
            functional_ops=("broadcast", "broadcast_"),
            autograd_functional_ops=(),
            process_group_methods=("broadcast",),
            profiling_ops=("broadcast", "_broadcast_oop"),
            op_types=("BROADCAST",),
            is_p2p=False,
            busbw_factor=_one,
            message_from="input",
        ),
        CollectiveSpec(
            name=REDUCE,
            eager_functions=("reduce",),
            c10d_ops=("reduce_",),
            functional_ops=(),
            autograd_functional_ops=(),
            process_group_methods=("reduce",),
            profiling_ops=("reduce", "_reduce_oop"),
            op_types=("REDUCE",),
            is_p2p=False,
            busbw_factor=_one,
            message_from="input",
        ),
        CollectiveSpec(
            name=GATHER,
            eager_functions=("gather", "gather_object", "gather_into_tensor"),
            c10d_ops=("gather_", "gather_into_tensor_"),  # the second: torch 2.14
            functional_ops=(),
            autograd_functional_ops=(),
            process_group_methods=("gather",),
            profiling_ops=("gather",),
            op_types=("GATHER",),
            is_p2p=False,
            busbw_factor=_ring_gather_like,
            message_from="input",
        ),
        CollectiveSpec(
            name=SCATTER,
            eager_functions=("scatter", "scatter_object_list"),
            c10d_ops=("scatter_",),
            functional_ops=(),
            autograd_functional_ops=(),
            process_group_methods=("scatter",),
            profiling_ops=("scatter",),
            op_types=("SCATTER",),
            is_p2p=False,
            busbw_factor=_ring_gather_like,
            message_from="output",
        ),
        CollectiveSpec(
            name=BARRIER,
            eager_functions=("barrier", "monitored_barrier"),
            c10d_ops=("barrier", "monitored_barrier_"),
            functional_ops=(),
            autograd_functional_ops=(),
            process_group_methods=("barrier", "monitored_barrier"),
            profiling_ops=("barrier",),
            op_types=("BARRIER",),
            is_p2p=False,
            busbw_factor=_zero,
            message_from="input",
        ),
        CollectiveSpec(
            name=SEND,
            eager_functions=("send", "isend"),
            c10d_ops=("send",),
            functional_ops=("isend",),
            autograd_functional_ops=(),
            process_group_methods=("send",),
            profiling_ops=("send",),
            op_types=("SEND",),
            is_p2p=True,
            busbw_factor=_one,
            message_from="input",
        ),
        CollectiveSpec(
            name=RECV,
            eager_functions=("recv", "irecv"),
            c10d_ops=("recv_", "recv_any_source_"),
            functional_ops=("irecv",),
            autograd_functional_ops=(),
            process_group_methods=("recv", "recv_anysource"),
            profiling_ops=("recv",),
            op_types=("RECV", "RECVANYSOURCE"),
            is_p2p=True,
            busbw_factor=_one,
            message_from="output",
        ),
    )
}

CANONICAL_NAMES: tuple[str, ...] = tuple(SPECS)
"""The eleven canonical names, in a fixed order."""

# Namespaces a dispatcher op may be printed under; ``torch.ops.<ns>.<op>[.<overload>]``.
_FUNCTIONAL_NAMESPACES = ("_c10d_functional", "c10d_functional")
_AUTOGRAD_NAMESPACES = ("_c10d_functional_autograd",)
_C10D_NAMESPACES = ("c10d",)
_DTENSOR_OPS = {"_dtensor.shard_dim_alltoall": ALL_TO_ALL}

# Backend prefixes of flight-recorder profiling names (``nccl:all_reduce``).
_PROFILING_PREFIX = re.compile(r"^(?P<backend>[A-Za-z0-9_]+):(?P<rest>.*)$")


def _build_lookup() -> tuple[dict[str, str], dict[str, str]]:
    """Map every spelling to its canonical name.

    Returns two dicts: one for qualified spellings (``namespace.op``), which are never
    ambiguous, and one for bare words (``allreduce``, ``ALLREDUCE``, ``all_gather``).
    A bare word used by two collectives would be a bug in ``SPECS``; it is checked here.
    """
    qualified: dict[str, str] = {}
    bare: dict[str, str] = {}

    def add_bare(word: str, name: str) -> None:
        previous = bare.setdefault(word, name)
        if previous != name:
            raise AssertionError(f"spelling {word!r} claimed by {previous} and {name}")

    for spec_ in SPECS.values():
        for word in spec_.all_spellings():
            add_bare(word, spec_.name)
        for op in spec_.functional_ops:
            for ns in _FUNCTIONAL_NAMESPACES:
                qualified[f"{ns}.{op}"] = spec_.name
        for op in spec_.autograd_functional_ops:
            for ns in _AUTOGRAD_NAMESPACES:
                qualified[f"{ns}.{op}"] = spec_.name
        for op in spec_.c10d_ops:
            for ns in _C10D_NAMESPACES:
                qualified[f"{ns}.{op}"] = spec_.name
    qualified.update(_DTENSOR_OPS)
    return qualified, bare


_QUALIFIED, _BARE = _build_lookup()
_OVERLOADS = ("default", "Tensor", "int", "out")


def canonical_name(spelling: object) -> str | None:
    """Return the canonical collective name for any spelling, or ``None``.

    Accepts a canonical name (``"all_reduce"``), an eager function or process-group
    method name (``"all_gather_into_tensor"``, ``"_allgather_base"``), a dispatcher op
    as printed (``"c10d.allreduce_"``, ``"c10d_functional.all_reduce"``,
    ``"_c10d_functional.all_reduce.default"``), a flight-recorder profiling name
    (``"nccl:all_reduce"``, ``"gloo:broadcast"``, ``"nccl:send 0->1"``), an
    ``OpType`` name (``"ALLREDUCE"``), or a torch op object (anything whose ``str()``
    is one of those). Non-collectives such as ``"wait_tensor"``, ``"aten.mm.default"``
    or the coalescing marker ``"nccl:coalesced"`` give ``None``.

    >>> canonical_name("nccl:_allgather_base")
    'all_gather'
    >>> canonical_name("c10d._reduce_scatter_base_")
    'reduce_scatter'
    >>> canonical_name("gloo:recv 1<-0")
    'recv'
    """
    text = spelling if isinstance(spelling, str) else str(spelling)
    text = text.strip()
    if not text:
        return None
    match = _PROFILING_PREFIX.match(text)
    if match:
        text = match.group("rest").split(" ", 1)[0]
        return _BARE.get(text)
    if text.startswith("torch.ops."):
        text = text[len("torch.ops.") :]
    if "." in text:
        found = _QUALIFIED.get(text)
        if found is not None:
            return found
        head, _, tail = text.rpartition(".")
        if tail in _OVERLOADS or (tail.islower() and head in _QUALIFIED):
            return _QUALIFIED.get(head)
        return None
    return _BARE.get(text)


def spec(name: str) -> CollectiveSpec:
    """Return the :class:`CollectiveSpec` for a canonical name or any spelling of one.

    Raises ``KeyError`` listing the canonical names when the spelling is unknown.
    """
    canonical = canonical_name(name)
    if canonical is None:
        raise KeyError(
            f"{name!r} is not a collective commscope knows; "
            f"canonical names are: {', '.join(CANONICAL_NAMES)}"
        )
    return SPECS[canonical]


def is_collective(spelling: object) -> bool:
    """True when ``spelling`` names a collective or p2p op in any layer's spelling."""
    return canonical_name(spelling) is not None


def is_p2p(spelling: object) -> bool:
    """True for ``send``/``recv`` in any spelling (``nccl:send 0->1``, ``c10d.recv_``)."""
    canonical = canonical_name(spelling)
    return canonical is not None and SPECS[canonical].is_p2p


# --------------------------------------------------------------------------- dtypes

# Item sizes by c10 scalar-type name (what flight-recorder dumps write) and by the
# torch attribute name. Keys are lower-cased for the lookup.
_ITEMSIZE: dict[str, int] = {}
_C10_NAME: dict[str, str] = {}


def _dtype(size: int, c10: str, *torch_names: str) -> None:
    for key in (c10, *torch_names):
        _ITEMSIZE[key.lower()] = size
        _C10_NAME[key.lower()] = c10


_dtype(1, "Byte", "uint8")
_dtype(1, "Char", "int8")
_dtype(2, "Short", "int16", "short")
_dtype(4, "Int", "int32", "int")
_dtype(8, "Long", "int64", "long")
_dtype(2, "Half", "float16", "half")
_dtype(4, "Float", "float32", "float")
_dtype(8, "Double", "float64", "double")
_dtype(4, "ComplexHalf", "complex32", "chalf")
_dtype(4, "BComplex32", "bcomplex32")  # torch 2.14: complex of two bfloat16
_dtype(8, "ComplexFloat", "complex64", "cfloat")
_dtype(16, "ComplexDouble", "complex128", "cdouble")
_dtype(1, "Bool", "bool")
_dtype(2, "BFloat16", "bfloat16")
_dtype(1, "QInt8", "qint8")
_dtype(1, "QUInt8", "quint8")
_dtype(4, "QInt32", "qint32")
# Packed sub-byte types: torch counts one storage byte per element.
_dtype(1, "QUInt4x2", "quint4x2")
_dtype(1, "QUInt2x4", "quint2x4")
_dtype(1, "Float8_e5m2", "float8_e5m2")
_dtype(1, "Float8_e4m3fn", "float8_e4m3fn")
_dtype(1, "Float8_e5m2fnuz", "float8_e5m2fnuz")
_dtype(1, "Float8_e4m3fnuz", "float8_e4m3fnuz")
_dtype(1, "Float8_e8m0fnu", "float8_e8m0fnu")
_dtype(1, "Float4_e2m1fn_x2", "float4_e2m1fn_x2")
_dtype(2, "UInt16", "uint16")
_dtype(4, "UInt32", "uint32")
_dtype(8, "UInt64", "uint64")


def _dtype_key(dtype: object) -> str:
    text = dtype if isinstance(dtype, str) else str(dtype)
    text = text.strip()
    if text.startswith("torch."):
        text = text[len("torch.") :]
    return text.lower()


def dtype_itemsize(dtype: object) -> int:
    """Bytes per element of a dtype given by c10 name (``"BFloat16"``), torch name
    (``"bfloat16"``, ``"torch.bfloat16"``) or a ``torch.dtype``.

    Raises ``KeyError`` naming the dtype when it is unknown.
    """
    try:
        return _ITEMSIZE[_dtype_key(dtype)]
    except KeyError:
        raise KeyError(f"unknown dtype {dtype!r}") from None


def normalize_dtype_name(dtype: object) -> str:
    """The c10 scalar-type name flight-recorder dumps use (``torch.float32`` → ``"Float"``).

    Unknown names are returned unchanged, so a new dtype never breaks a record.
    """
    text = dtype if isinstance(dtype, str) else str(dtype)
    return _C10_NAME.get(_dtype_key(text), text)


def numel(shape: Iterable[int]) -> int:
    """Number of elements of one tensor shape (``[]`` is a scalar: 1)."""
    return math.prod(int(d) for d in shape)


def tensor_bytes(sizes: Sequence[Sequence[int]], dtypes: Sequence[object]) -> int:
    """Total bytes of a list of tensors given their shapes and dtype names.

    With fewer dtypes than shapes, the last dtype is reused (dumps sometimes carry one
    dtype for a list of same-typed tensors); with no dtype at all, the result is 0.
    """
    if not sizes or not dtypes:
        return 0
    total = 0
    for i, shape in enumerate(sizes):
        dtype = dtypes[i] if i < len(dtypes) else dtypes[-1]
        total += numel(shape) * dtype_itemsize(dtype)
    return total


def message_bytes(
    op: str,
    input_sizes: Sequence[Sequence[int]],
    input_dtypes: Sequence[object],
    output_sizes: Sequence[Sequence[int]] = (),
    output_dtypes: Sequence[object] = (),
) -> int:
    """Message size of one collective in bytes, as nccl-tests counts it.

    all_reduce, reduce_scatter, all_to_all, broadcast, reduce, gather and send use the
    input; all_gather, scatter and recv use the output (the full gathered buffer). When
    the preferred side is missing the other one is used, so a record with only input
    sizes still gets a size.
    """
    s = spec(op)
    if s.message_from == "output" and output_sizes:
        return tensor_bytes(output_sizes, output_dtypes or input_dtypes)
    if input_sizes:
        return tensor_bytes(input_sizes, input_dtypes or output_dtypes)
    return tensor_bytes(output_sizes, output_dtypes)


def bus_bandwidth_factor(op: str, group_size: int) -> float:
    """The nccl-tests factor that turns algorithm bandwidth into bus bandwidth.

    ``2(n-1)/n`` for all_reduce, ``(n-1)/n`` for all_gather, reduce_scatter,
    all_to_all, gather and scatter, ``1`` for broadcast, reduce, send and recv, ``0``
    for barrier (it moves no payload).

    >>> bus_bandwidth_factor("all_reduce", 8)
    1.75
    """
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    return spec(op).busbw_factor(group_size)


def bus_bandwidth_gbps(op: str, nbytes: int, group_size: int, time_us: float) -> float:
    """Bus bandwidth in decimal GB/s of one collective that took ``time_us``."""
    if time_us <= 0:
        return 0.0
    algbw = nbytes / (time_us * 1e-6) / 1e9
    return algbw * bus_bandwidth_factor(op, group_size)


def estimate_time_us(op: str, nbytes: int, group_size: int, busbw_gbps: float) -> float:
    """Estimated time of one collective at a given bus bandwidth (decimal GB/s).

    The inverse of :func:`bus_bandwidth_gbps`: ``bytes * factor / busbw``. A group of
    one rank, a barrier or an empty message costs 0 (latency is not modelled).
    """
    if busbw_gbps <= 0:
        raise ValueError(f"bandwidth must be > 0 GB/s, got {busbw_gbps}")
    factor = bus_bandwidth_factor(op, group_size)
    return nbytes * factor / (busbw_gbps * 1e9) * 1e6


# ------------------------------------------------------------------ profiling names

_SEND_META = re.compile(r"^(?P<src>-?\d+)\s*->\s*(?P<dst>-?\d+)$")
_RECV_META = re.compile(r"^(?P<dst>-?\d+)\s*<-\s*(?P<src>-?\d+)$")


@dataclass(frozen=True, slots=True)
class ProfilingName:
    """A parsed flight-recorder ``profiling_name`` such as ``nccl:send 0->1``."""

    backend: str
    """``nccl``, ``gloo``, ``commscope`` …; empty when the name had no prefix."""
    op: str
    """The op word as written (``_allgather_base``, ``coalesced``)."""
    collective: str | None
    """Canonical name, ``None`` for markers such as ``coalesced``."""
    src: int | None = None
    """Group-local source rank of a p2p op."""
    dst: int | None = None
    """Group-local destination rank of a p2p op."""


def parse_profiling_name(text: str) -> ProfilingName:
    """Split a profiling name into backend, op, canonical collective and p2p peers.

    >>> parse_profiling_name("nccl:recv 1<-0")
    ProfilingName(backend='nccl', op='recv', collective='recv', src=0, dst=1)
    """
    backend = ""
    rest = text.strip()
    match = _PROFILING_PREFIX.match(rest)
    if match:
        backend, rest = match.group("backend"), match.group("rest")
    op, _, meta = rest.partition(" ")
    collective = _BARE.get(op)
    src = dst = None
    meta = meta.strip()
    pattern = {SEND: _SEND_META, RECV: _RECV_META}.get(collective or "")
    if pattern is not None and (m := pattern.match(meta)):
        src, dst = int(m.group("src")), int(m.group("dst"))
    return ProfilingName(backend=backend, op=op, collective=collective, src=src, dst=dst)
