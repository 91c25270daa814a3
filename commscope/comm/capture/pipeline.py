"""Pipeline parallelism: charge a stage's send/recv to its phase and to the stage.

A ``torch.distributed.pipelining`` schedule issues its point-to-point ops between
compute steps, outside every module forward and outside the autograd engine, so the
module tracker alone would file them under whatever phase ran last (``forward``, or
``after_backward`` once a backward has run). The schedule knows better, and says it
through the stage method it asks for the ops. While a :class:`CommDebugMode` is active:

1. The stage classes of ``torch.distributed.pipelining.stage`` (the base class and every
   subclass that defines the method itself) get their op builders wrapped:
   ``get_fwd_recv_ops`` / ``get_fwd_send_ops`` tag the tensor of every ``P2POp`` they
   return as ``forward``, ``get_bwd_recv_ops`` / ``get_bwd_send_ops`` as ``backward``,
   each with the stage index. A tag is ``id(tensor) -> (weak reference, tag)``; the weak
   reference's callback drops the entry when the tensor dies, so no tensor is kept alive
   and a reused ``id`` never matches a dead tensor's tag.
   Where a builder's ops go both ways (torch 2.10-2.11's first-step handshake with the
   neighbour stages, ``_get_init_p2p_neighbors_ops``), each op's phase is its direction:
   toward the next stage is ``forward``.
2. The stage's one-time set-up (the warm-up vote and the shape/metadata exchange of the
   first step: ``_warmup_forward_vote``, ``_prepare_forward_infra``,
   ``_warmup_backward_result``, ``_prepare_backward_infra``) builds its tensors inside
   ``torch.distributed``, so there is nothing to tag; a send or recv issued while one of
   those methods runs belongs to that stage, ``forward`` for what travels toward the
   next stage and ``backward`` for what travels back. From torch 2.15 the schedule
   itself sets up the rank's links before any stage runs (an ``all_reduce`` over the
   pipeline group in place of the stage-to-stage vote, and one 4-byte message per pair
   of neighbouring ranks, ``_preconnect_shared_p2p_edges``): that is the rank's, which
   may hold several stages, not one stage's, so it is not wrapped and keeps the usual
   attribution (``Global``), as any collective outside a module does (row
   ``pipeline_schedule_preconnects`` of :mod:`commscope.compat`).
3. The mode's send/recv path (and each send/recv of a ``batch_p2p_ops``) asks
   :func:`attribute` with the tensor it sees: a tagged tensor wins, then the set-up
   context; anything else keeps the usual attribution (the autograd state, then the
   module stack). The question is one dict lookup and is asked for send/recv only.
   Whether the schedule issues the ops one by one or fused in one ``batch_isend_irecv``
   (1F1B pairs a forward send with a backward recv) does not matter: each op reaches
   the dispatcher with the very tensor object that was tagged.

Tags and the set-up context are module-level state on purpose: the wrapped methods are
class attributes shared by every mode, so nested modes see the same tags (a lookup does
not consume one). The set-up context assumes the schedule runs on one thread.

Such an op is charged to a pseudo-module ``pipeline stage N`` (``N`` the stage index), a
child of ``Global`` whose module type is the stage's class, and its record carries
``stage=N``. A pseudo-module rather than the stage's submodule: the ops run outside the
submodule's forward and backward (its own collectives, TP's for instance, stay
separate), and two stages on one rank (interleaved schedules) stay apart even when their
submodules share a class name, which the tracker's names would not tell apart.

The wrappers are installed when the first mode enters (only if the pipelining module is
already imported: nothing is imported for jobs that do not use it) and removed, with
every tag, when the last active mode exits, whether or not the block raised.
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from commscope.comm.capture.modules import (
    BACKWARD,
    FORWARD,
    ModuleRecord,
    ModuleTracker,
    _type_name,
)

__all__ = [
    "STAGE_MODULE",
    "StageTag",
    "stage_fqn",
    "attach",
    "detach",
    "installed",
    "attribute",
    "stage_record",
    "batch_tensors",
]

logger = logging.getLogger(__name__)

STAGE_MODULE = "torch.distributed.pipelining.stage"
"""The module whose stage classes are wrapped."""

_BASE_CLASS = "_PipelineStageBase"
# Methods that return a list of P2POp: phase of the ops they build.
_OP_BUILDERS = {
    "get_fwd_recv_ops": FORWARD,
    "get_fwd_send_ops": FORWARD,
    "get_bwd_recv_ops": BACKWARD,
    "get_bwd_send_ops": BACKWARD,
}
# Op builders whose ops go both ways (torch 2.10-2.11's first-step handshake with the
# neighbour stages): the phase of each op is its direction (toward the next stage: forward).
_TWO_WAY_BUILDERS = ("_get_init_p2p_neighbors_ops",)
# Set-up methods that issue send/recv themselves: phase of what they issue.
_SETUP_METHODS = {
    "_warmup_forward_vote": FORWARD,
    "_prepare_forward_infra": FORWARD,
    "_warmup_backward_result": BACKWARD,
    "_prepare_backward_infra": BACKWARD,
}


@dataclass(frozen=True, slots=True)
class StageTag:
    """Where a pipeline send/recv belongs."""

    phase: int
    """Phase code (:data:`~commscope.comm.capture.modules.FORWARD` or ``BACKWARD``)."""
    stage: int
    """The stage index (``PipelineStage.stage_index``)."""
    stage_type: str
    """PyTorch's spelling of the stage's class, the pseudo-module's type."""


def stage_fqn(stage: int) -> str:
    """The pseudo-module name a stage's send/recv are charged to: ``pipeline stage N``."""
    return f"pipeline stage {stage}"


# id(tensor) -> (weak reference to it, tag). Guarded by the GIL: one dict operation each.
_TAGS: dict[int, tuple[weakref.ref[torch.Tensor], StageTag]] = {}
# Tags of the set-up methods running now, innermost last (the schedule's thread).
_CONTEXT: list[StageTag] = []
# (class, method name, the function it had) for every method wrapped.
_WRAPPED: list[tuple[type, str, Any]] = []
_LOCK = threading.Lock()
_USERS = 0


# ------------------------------------------------------------------ install


def attach() -> None:
    """Count one more active mode; wrap the stage classes if they are not yet wrapped.

    Never raises: a torch whose stages look different keeps the usual attribution.
    """
    global _USERS
    with _LOCK:
        _USERS += 1
        if not _WRAPPED:
            module = sys.modules.get(STAGE_MODULE)
            if module is not None:
                try:
                    _wrap(module)
                except Exception as exc:  # never let bookkeeping break the user's job
                    logger.debug("cannot wrap pipeline stages: %s", exc)
                    _unwrap()


def detach() -> None:
    """Count one active mode less; the last one out unwraps and drops every tag."""
    global _USERS
    with _LOCK:
        _USERS = max(0, _USERS - 1)
        if _USERS == 0 and (_WRAPPED or _TAGS or _CONTEXT):
            _unwrap()
            _TAGS.clear()
            _CONTEXT.clear()


def installed() -> bool:
    """True while the stage classes are wrapped."""
    return bool(_WRAPPED)


def _stage_classes(module: Any) -> list[type]:
    base = getattr(module, _BASE_CLASS, None)
    if not isinstance(base, type):
        return []
    out: list[type] = []
    todo = [base]
    while todo:
        cls = todo.pop()
        if cls not in out:
            out.append(cls)
            todo.extend(cls.__subclasses__())
    return out


def _wrap(module: Any) -> None:
    for cls in _stage_classes(module):
        own = cls.__dict__
        for name, phase in _OP_BUILDERS.items():
            if callable(own.get(name)):
                _replace(cls, name, _builder_wrapper(own[name], phase))
        for name in _TWO_WAY_BUILDERS:
            if callable(own.get(name)):
                _replace(cls, name, _two_way_wrapper(own[name]))
        for name, phase in _SETUP_METHODS.items():
            if callable(own.get(name)):
                _replace(cls, name, _setup_wrapper(own[name], phase))


def _replace(cls: type, name: str, wrapper: Callable[..., Any]) -> None:
    _WRAPPED.append((cls, name, cls.__dict__[name]))
    setattr(cls, name, wrapper)


def _unwrap() -> None:
    while _WRAPPED:
        cls, name, original = _WRAPPED.pop()
        try:
            setattr(cls, name, original)
        except Exception as exc:  # a class that refuses: nothing more we can do
            logger.debug("cannot restore %s.%s: %s", cls.__name__, name, exc)


def _tag_of(stage: Any, phase: int) -> StageTag:
    return StageTag(phase, int(stage.stage_index), _type_name(type(stage)))


def _builder_wrapper(original: Callable[..., Any], phase: int) -> Callable[..., Any]:
    @functools.wraps(original)
    def build_ops(self: Any, *args: Any, **kwargs: Any) -> Any:
        ops = original(self, *args, **kwargs)
        try:
            if ops:
                tag = _tag_of(self, phase)
                for op in ops:
                    _tag(getattr(op, "tensor", None), tag)
        except Exception as exc:  # never let bookkeeping break the user's job
            logger.debug("cannot tag pipeline ops: %s", exc)
        return ops

    return build_ops


def _direction(stage: Any, op: Any) -> int:
    """FORWARD for an op toward the next stage (a send to it, a recv from the previous
    one), BACKWARD for one toward the previous stage."""
    ranks = stage.stage_index_to_group_rank
    peer = getattr(op, "group_peer", None)
    is_send = getattr(getattr(op, "op", None), "__name__", "") == "isend"
    to_next = peer == ranks.get(stage.stage_index + 1)
    to_prev = peer == ranks.get(stage.stage_index - 1)
    if to_next and not to_prev:
        return FORWARD if is_send else BACKWARD
    if to_prev and not to_next:
        return BACKWARD if is_send else FORWARD
    return FORWARD


def _two_way_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def build_ops(self: Any, *args: Any, **kwargs: Any) -> Any:
        ops = original(self, *args, **kwargs)
        try:
            phases: dict[int, int] = {}
            for op in ops or ():
                phase = _direction(self, op)
                tensor = getattr(op, "tensor", None)
                if not isinstance(tensor, torch.Tensor):
                    continue
                if phases.setdefault(id(tensor), phase) != phase:
                    # one tensor sent both ways (a middle stage): the other direction
                    # gets a view of it, the same bytes on the wire, a tag of its own
                    op.tensor = tensor = tensor.view(tensor.shape)
                    phases[id(tensor)] = phase
                _tag(tensor, _tag_of(self, phase))
        except Exception as exc:  # never let bookkeeping break the user's job
            logger.debug("cannot tag pipeline ops: %s", exc)
        return ops

    return build_ops


def _setup_wrapper(original: Callable[..., Any], phase: int) -> Callable[..., Any]:
    @functools.wraps(original)
    def set_up(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            tag: StageTag | None = _tag_of(self, phase)
        except Exception as exc:  # a stage without an index: leave it to the tracker
            logger.debug("cannot read the stage index: %s", exc)
            tag = None
        if tag is None:
            return original(self, *args, **kwargs)
        _CONTEXT.append(tag)
        try:
            return original(self, *args, **kwargs)
        finally:
            if _CONTEXT:
                _CONTEXT.pop()

    return set_up


def _tag(tensor: Any, tag: StageTag) -> None:
    if not isinstance(tensor, torch.Tensor):
        return
    key = id(tensor)

    def forget(ref: weakref.ref[torch.Tensor]) -> None:
        entry = _TAGS.get(key)
        if entry is not None and entry[0] is ref:
            del _TAGS[key]

    _TAGS[key] = (weakref.ref(tensor, forget), tag)


# ------------------------------------------------------------------ lookup


def attribute(tracker: ModuleTracker, tensors: Any) -> tuple[ModuleRecord, int, int] | None:
    """``(stage record, phase, stage index)`` for a send/recv of ``tensors`` issued by a
    pipeline stage, ``None`` for any other send/recv (it keeps the usual attribution).

    ``tensors`` is the op's tensor argument: a tensor or a list of tensors (the first
    one decides).
    """
    if not _TAGS and not _CONTEXT:
        return None
    tensor = tensors
    if isinstance(tensors, (list, tuple)):
        tensor = tensors[0] if tensors else None
    tag = None
    entry = _TAGS.get(id(tensor))
    if entry is not None and entry[0]() is tensor:
        tag = entry[1]
    elif _CONTEXT:
        tag = _CONTEXT[-1]
    if tag is None:
        return None
    return stage_record(tracker, tag), tag.phase, tag.stage


def stage_record(tracker: ModuleTracker, tag: StageTag) -> ModuleRecord:
    """The tracker's record of the pseudo-module ``pipeline stage N``, made on first use."""
    fqn = stage_fqn(tag.stage)
    rec = tracker.records.get(fqn)
    if rec is None:
        root = tracker.global_record
        rec = ModuleRecord(
            fqn=fqn,
            depth=1,
            module_type=tag.stage_type,
            parent=root,
            ancestors=(root,),
        )
        root.children.append(fqn)
        tracker.records[fqn] = rec
    return rec


def batch_tensors(args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> list[Any]:
    """The ``tensors`` argument of a ``_c10d_functional.batch_p2p_ops`` call
    (schema: ``op_list, peer_list, tag_list, tensors, group_name``)."""
    if len(args) > 3:
        return list(args[3] or ())
    return list((kwargs or {}).get("tensors") or ())
