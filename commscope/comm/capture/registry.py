"""Which dispatcher ops are collectives, under which key they are counted, and what they move.

The comm tracer sees every op that reaches the Python dispatch key. This module answers,
once per op overload (the answer is cached by the caller):

* is it a collective at all? Only ``commscope.collectives`` decides, through
  :func:`commscope.collectives.canonical_name`, for ops of the ``c10d``,
  ``_c10d_functional``, ``c10d_functional``, ``_c10d_functional_autograd`` and ``_dtensor``
  namespaces;
* the **key** it is counted under: the op's ``OpOverloadPacket``, with native functional
  packets folded onto their legacy ``c10d_functional`` twins as PyTorch's
  ``CommDebugMode`` does (so ``counts[funcol.all_reduce]`` keeps working); eager ``c10d``
  ops keep their own packets;
* how to read the payload and the process group from its arguments: argument names
  (``output_tensor``, ``input_tensors``, ``out``...) say which tensors are written, the
  vocabulary says whether the message size is the input's or the output's.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from commscope import collectives

__all__ = [
    "COLLECTIVE_NAMESPACES",
    "BatchP2P",
    "OpClass",
    "batch_p2p_class",
    "batch_p2p_items",
    "classify",
    "GroupInfo",
    "group_info",
    "payload",
    "pytorch_registry",
    "resolve_key",
]

logger = logging.getLogger(__name__)

COLLECTIVE_NAMESPACES = (
    "c10d",
    "_c10d_functional",
    "c10d_functional",
    "_c10d_functional_autograd",
    "_dtensor",
)
"""Dispatcher namespaces whose ops may be collectives."""

# Namespaces whose packets PyTorch folds onto the legacy ``c10d_functional`` namespace.
_FOLDED_NAMESPACES = ("_c10d_functional", "_c10d_functional_autograd")


@dataclass(frozen=True, slots=True)
class OpClass:
    """What the tracer needs to know about one collective op overload."""

    key: Any
    """The ``OpOverloadPacket`` the op is counted under (PyTorch's key)."""
    collective: str
    """Canonical collective name from :mod:`commscope.collectives`."""
    arg_names: tuple[str, ...]
    """Names of the schema's arguments, in order (positional first)."""
    group_arg: int
    """Index of the process-group argument (a group name or a ``ProcessGroup``), or -1."""
    output_args: tuple[int, ...] = ()
    """Indices of the arguments the op writes (named ``output*`` or ``out``)."""
    input_args: tuple[int, ...] = ()
    """Indices of the other arguments that may hold tensors (the op's inputs)."""
    message_from_output: bool = False
    """The message size is the output's (nccl-tests convention for this collective)."""


def _legacy_packet(name: str) -> Any:
    """The legacy ``torch.ops.c10d_functional.<name>`` packet, or ``None`` if torch lacks it."""
    try:
        packet = getattr(torch.ops.c10d_functional, name)
    except (AttributeError, RuntimeError):
        return None
    # while collectives-only capture is on, the namespace holds a counting proxy
    return getattr(packet, "__wrapped__", packet)


def classify(func: Any) -> OpClass | None:
    """Return the :class:`OpClass` of a collective op overload, ``None`` for any other op.

    ``wait_tensor``, ``_wrap_tensor_autograd`` and every ``aten`` op are not collectives.
    """
    namespace = getattr(func, "namespace", None)
    if namespace not in COLLECTIVE_NAMESPACES:
        return None
    packet = getattr(func, "_overloadpacket", None)
    if packet is None:
        return None
    collective = collectives.canonical_name(str(packet))
    if collective is None:
        return None
    key = packet
    if namespace in _FOLDED_NAMESPACES:
        legacy = _legacy_packet(packet.__name__)
        if legacy is not None:
            key = legacy
    schema = func._schema
    arg_names = tuple(a.name for a in schema.arguments)
    group_arg = -1
    for i, arg in enumerate(schema.arguments):
        type_text = str(arg.type)
        if arg.name in ("group_name", "process_group") or type_text.endswith("ProcessGroup"):
            group_arg = i
            break
    outputs = tuple(i for i, n in enumerate(arg_names) if _is_output_name(n))
    inputs = tuple(i for i, a in enumerate(schema.arguments)
                   if i not in outputs and i != group_arg and "Tensor" in str(a.type))
    return OpClass(key=key, collective=collective, arg_names=arg_names, group_arg=group_arg,
                   output_args=outputs, input_args=inputs,
                   message_from_output=collectives.SPECS[collective].message_from == "output")


def _is_output_name(name: str) -> bool:
    return name.startswith("output") or name == "out"


@dataclass(frozen=True, slots=True)
class BatchP2P:
    """``_c10d_functional.batch_p2p_ops`` (what ``batch_isend_irecv`` becomes under
    ``torch.compile``): one op holding several sends and recvs, counted one by one as
    ``isend`` / ``irecv``, as eager ``batch_isend_irecv`` is counted as ``send`` /
    ``recv``."""

    send: OpClass
    """How each ``isend`` of the batch is counted."""
    recv: OpClass
    """How each ``irecv`` of the batch is counted."""


def batch_p2p_class(func: Any) -> BatchP2P | None:
    """The :class:`BatchP2P` of a ``batch_p2p_ops`` overload, ``None`` for any other op."""
    if getattr(func, "namespace", None) != "_c10d_functional":
        return None
    packet = getattr(func, "_overloadpacket", None)
    if packet is None or packet.__name__ != "batch_p2p_ops":
        return None
    try:
        send = classify(torch.ops._c10d_functional.isend.default)
        recv = classify(torch.ops._c10d_functional.irecv.default)
    except (AttributeError, RuntimeError):
        return None
    if send is None or recv is None:
        return None
    return BatchP2P(send=send, recv=recv)


def batch_p2p_items(
    batch: BatchP2P, args: tuple[Any, ...], kwargs: dict[str, Any] | None
) -> tuple[list[tuple[OpClass, int, str]], Any]:
    """``([(class, bytes, dtype) per send/recv], group name)`` of one ``batch_p2p_ops``
    call (schema: ``op_list, peer_list, tag_list, tensors, group_name``)."""
    named = dict(zip(("op_list", "peer_list", "tag_list", "tensors", "group_name"), args))
    if kwargs:
        named.update(kwargs)
    items = []
    for op, tensor in zip(named.get("op_list") or (), named.get("tensors") or ()):
        cls = batch.recv if "recv" in str(op) else batch.send
        dtype = collectives.normalize_dtype_name(str(tensor.dtype))
        items.append((cls, tensor.numel() * tensor.element_size(), dtype))
    return items, named.get("group_name")


def pytorch_registry() -> set[Any]:
    """The packets PyTorch 2.13's ``CommDebugMode`` counts (its ``comm_registry`` plus its
    eager ``c10d`` set), for users who inspect ``comm_registry``."""
    names = (
        "all_gather_into_tensor",
        "all_gather_into_tensor_coalesced",
        "all_reduce",
        "all_reduce_coalesced",
        "all_to_all_single",
        "broadcast",
        "reduce_scatter_tensor",
        "reduce_scatter_tensor_coalesced",
    )
    found: set[Any] = set()
    for name in names:
        for ns in (torch.ops._c10d_functional, torch.ops.c10d_functional):
            try:
                found.add(getattr(ns, name))
            except (AttributeError, RuntimeError):
                pass
    try:
        found.add(torch.ops._dtensor.shard_dim_alltoall)
    except (AttributeError, RuntimeError):
        pass
    return found


def resolve_key(spelling: object) -> Any:
    """Map a key given by the user onto the packet we count under, or ``None``.

    Accepts an ``OpOverloadPacket`` or ``OpOverload`` of any collective namespace
    (native functional packets fold onto legacy ones, like the counting does) and a
    printed name such as ``"c10d_functional.all_reduce"``, ``"_c10d_functional.all_reduce"``
    or ``"c10d.allreduce_"``. Canonical names (``"all_reduce"``) are not keys: they give
    ``None`` here and are summed by the counts dict itself.
    """
    if isinstance(spelling, str):
        text = spelling.strip()
        if text.startswith("torch.ops."):
            text = text[len("torch.ops.") :]
        parts = text.split(".")
        if len(parts) < 2 or parts[0] not in COLLECTIVE_NAMESPACES:
            return None
        try:
            packet = getattr(getattr(torch.ops, parts[0]), parts[1])
        except (AttributeError, RuntimeError):
            return None
        func = getattr(packet, "default", None)
        if func is None:
            return None
        cls = classify(func)
        return cls.key if cls is not None else None
    packet = getattr(spelling, "_overloadpacket", spelling)
    func = getattr(packet, "default", None)
    if func is None or getattr(func, "namespace", None) not in COLLECTIVE_NAMESPACES:
        return None
    cls = classify(func)
    return cls.key if cls is not None else None


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """The process group a collective ran on, as far as the tracer can tell."""

    name: str
    """``group_name`` of the process group ("" when unknown)."""
    desc: str
    """``group_desc`` (``mesh_tp``, ``default_pg``...; "" when unknown)."""
    size: int
    """Number of ranks in the group (0 when unknown)."""


_UNKNOWN_GROUP = GroupInfo(name="", desc="", size=0)


def group_info(value: Any, cache: dict[str, GroupInfo]) -> GroupInfo:
    """Describe the group argument of a collective: a group name or a boxed ProcessGroup."""
    try:
        if isinstance(value, str):
            found = cache.get(value)
            if found is not None:
                return found
            from torch.distributed.distributed_c10d import _resolve_process_group

            pg = _resolve_process_group(value)
        elif value is None:
            return _UNKNOWN_GROUP
        else:
            from torch._C._distributed_c10d import ProcessGroup

            pg = ProcessGroup.unbox(value) if type(value).__name__ == "ScriptObject" else value
            found = cache.get(pg.group_name)
            if found is not None:
                return found
        info = GroupInfo(name=str(pg.group_name), desc=str(pg.group_desc), size=int(pg.size()))
    except Exception as exc:  # a group torch cannot resolve any more: record what we know
        logger.debug("cannot resolve process group %r: %s", value, exc)
        return _UNKNOWN_GROUP
    cache[info.name] = info
    return info


def _collect(value: Any, into: list[torch.Tensor]) -> None:
    """Append the tensors in ``value`` (a tensor or nested lists/tuples) to ``into``."""
    if isinstance(value, torch.Tensor):
        into.append(value)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _collect(item, into)


_DTYPE_NAMES: dict[Any, str] = {}


def _dtype_name(dtype: Any) -> str:
    """``collectives.normalize_dtype_name`` of a ``torch.dtype``, cached per dtype."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = collectives.normalize_dtype_name(str(dtype))
    return name


def payload(
    cls: OpClass, args: tuple[Any, ...], kwargs: dict[str, Any] | None, out: Any
) -> tuple[int, str]:
    """Message bytes (nccl-tests convention) and c10 dtype name of one collective call.

    Tensors in arguments named ``output*``/``out`` are what the op writes; other tensor
    arguments are its inputs; a functional op's result is its output. A barrier moves no
    payload (its tensor is a dummy).
    """
    if cls.collective == collectives.BARRIER:
        return 0, ""
    inputs: list[torch.Tensor] = []
    outputs: list[torch.Tensor] = []
    n = len(args)
    if cls.input_args or cls.output_args:  # the schema's tensor arguments, by position
        for i in cls.output_args:
            if i < n:
                _collect(args[i], outputs)
        for i in cls.input_args:
            if i < n:
                _collect(args[i], inputs)
        for value in args[len(cls.arg_names):]:  # more than the schema names
            _collect(value, inputs)
    else:
        _collect(args, inputs)
    if kwargs:
        for name, value in kwargs.items():
            _collect(value, outputs if _is_output_name(name) else inputs)
    if not outputs:
        _collect(out, outputs)
    chosen = outputs if (cls.message_from_output and outputs) or not inputs else inputs
    if not chosen:
        return 0, ""
    total = 0
    for t in chosen:
        total += t.numel() * t.element_size()
    return total, _dtype_name(chosen[0].dtype)
