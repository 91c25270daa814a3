"""The recording process group: a ``torch.distributed.ProcessGroup`` that notes every call.

:class:`RecordingProcessGroup` is what ``init_process_group`` and ``new_group`` build
while recording is enabled (see :mod:`commscope.flight.splice.install`). The real backends
(gloo, nccl, fake, ...) are registered on it exactly as on a plain group, so names,
descriptions, ``_get_backend``, bound devices and the group registry are untouched.
Each collective method hands the call to a plain twin group, which goes through the
``c10d`` dispatcher to the real backend as before, and records an entry: before handing
it over where that can block (NCCL), just after where the backend only enqueues (gloo);
see :meth:`commscope.flight.record.recorder.Recorder.run`.

Every road into a group passes through these methods, checked on torch 2.13:

* eager ``torch.distributed`` calls look the method up on the Python object;
* C++ callers (DDP's reducer, functional collectives of DTensor/TP, FSDP) call the
  group's virtual methods, which pybind's trampoline forwards to Python for
  ``allreduce``, ``allreduce_coalesced``, ``allgather``, ``all_gather_single_coalesced``
  (functional ``all_gather_into_tensor``), ``reduce_scatter``,
  ``reduce_scatter_single_coalesced`` (functional ``reduce_scatter_tensor``),
  ``all_to_all_single``, ``broadcast``, ``barrier``, ``send`` and ``recv``.

The deprecated aliases (``allgather_into_tensor_coalesced``,
``reduce_scatter_tensor_coalesced``, ``alltoall_base``) are deliberately not defined on
torch 2.13: their base implementations call the new names, which land here. Older
torch has only those names (they are the real methods there), so on it they are defined
instead, and ``_allgather_base``/``_reduce_scatter_base`` call the old single-tensor
methods. A method whose
trampoline exists must call ``ProcessGroup.<same name>`` directly from its own body:
pybind recognises that frame and runs the base implementation instead of recursing.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from functools import partial
from typing import Any

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from commscope.compat import backend_name, has
from commscope.flight.record.recorder import SLOT, Recorder
from commscope.flight.splice.describe import (
    any_source,
    arg,
    gather_like,
    inplace,
    nothing,
    out_in,
    p2p,
    scatter_like,
)

__all__ = ["RecordingProcessGroup", "adopt", "adopt_python", "python_methods", "timeout_ms"]

logger = logging.getLogger(__name__)

_PG = dist.ProcessGroup
_NEW_NAMES = has("pg_single_tensor_names")
"""torch 2.13 named the single-tensor forms ``all_gather_single``/``reduce_scatter_single``
(and ``all_to_all_single``, coalesced forms); older releases have only the underscored
names, which newer ones keep as aliases (:mod:`commscope.compat`)."""
_ALL_GATHER_SINGLE = "all_gather_single" if _NEW_NAMES else "_allgather_base"
_REDUCE_SCATTER_SINGLE = "reduce_scatter_single" if _NEW_NAMES else "_reduce_scatter_base"


# --------------------------------------------------------------------------- the group


class _Base:
    """Calls the base-class implementation on ``pg`` (used only when no inner group exists).

    pybind recognises the calling frame (our method of the same name) and runs the
    C++ base method instead of coming back to Python.
    """

    __slots__ = ("_pg",)

    def __init__(self, pg: Any) -> None:
        self._pg = pg

    def __getattr__(self, name: str) -> Any:
        # partial adds no Python frame, so pybind sees the calling method's frame.
        return partial(getattr(_PG, name), self._pg)


class RecordingProcessGroup(_PG):
    """A process group that records every collective and p2p call, then runs it.

    Built by torch itself (``init_process_group`` / ``new_group``) while recording is
    enabled; construct it directly only in tests. ``store`` is accepted for the
    signature torch uses and not kept (pybind allows Python subclasses only the
    ``(rank, size)`` constructor); torch keeps the group's store in its own registry.
    """

    _commscope_inner: Any = None
    """A plain ``ProcessGroup`` sharing this group's backends; the calls go through it.

    Calling the base class's trampolined methods from Python would run the whole
    collective with the GIL held (pybind's trampoline takes it), which deadlocks gloo:
    its worker thread may need the GIL to release a tensor while holding the queue
    lock that the next call waits for. The plain group's bindings release the GIL
    exactly as an unrecorded group does. Set by
    :func:`commscope.flight.splice.install.attach_inner`.
    """

    _commscope_options: Any = None
    """torch before 2.6 builds a group with ``(store, rank, size, options)``: the options,
    for the plain twin (:func:`commscope.flight.splice.install.attach_inner`)."""

    def __new__(cls, *args: Any) -> Any:
        """A :class:`_LegacyRecordingProcessGroup` for torch 2.5's four arguments."""
        if len(args) == 4 and cls is RecordingProcessGroup:  # torch 2.5 and older
            cls = _LegacyRecordingProcessGroup
        return super().__new__(cls)

    def __init__(self, *args: Any) -> None:
        if len(args) == 4:  # torch 2.5 and older
            _store, rank, size, self._commscope_options = args
        elif len(args) == 3:
            _store, rank, size = args
        elif len(args) == 2:
            rank, size = args
        else:
            raise TypeError(
                f"RecordingProcessGroup takes (store, rank, size[, options]) or (rank, size), "
                f"got {len(args)} arguments"
            )
        super().__init__(int(rank), int(size))

    # Methods with a pybind trampoline (reached from C++ as well as Python). -----------

    def allreduce(self, *args: Any, **kwargs: Any) -> Any:
        """Run an ``all_reduce`` and record it."""
        inner = self._commscope_inner
        if inner is None:
            return _PG.allreduce(self, *args, **kwargs)
        call = inner.allreduce
        rec = SLOT.rec
        if rec is None:
            return call(*args, **kwargs)
        return rec.run(self, "all_reduce", inplace, call, args, kwargs)

    def allreduce_coalesced(self, *args: Any, **kwargs: Any) -> Any:
        """Run a coalesced ``all_reduce`` and record it."""
        inner = self._commscope_inner
        if inner is None:
            return _PG.allreduce_coalesced(self, *args, **kwargs)
        call = inner.allreduce_coalesced
        rec = SLOT.rec
        if rec is None:
            return call(*args, **kwargs)
        return rec.run(self, "allreduce_coalesced", inplace, call, args, kwargs)

    def allgather(self, *args: Any, **kwargs: Any) -> Any:
        """Run an ``all_gather`` (list form) and record it."""
        inner = self._commscope_inner
        if inner is None:
            return _PG.allgather(self, *args, **kwargs)
        call = inner.allgather
        rec = SLOT.rec
        if rec is None:
            return call(*args, **kwargs)
        return rec.run(self, "all_gather", gather_like, call, args, kwargs)

    def all_gather_single_coalesced(self, *args: Any, **kwargs: Any) -> Any:
        """Run a coalesced ``all_gather_into_tensor`` and record it."""
        inner = self._commscope_inner
        if inner is None:
            return _PG.all_gather_single_coalesced(self, *args, **kwargs)
        call = inner.all_gather_single_coalesced
        rec = SLOT.rec
        if rec is None:
            return call(*args, **kwargs)
        return rec.run(self, "all_gather_into_tensor_coalesced", out_in, call, args, kwargs)

    def reduce_scatter(self, *args: Any, **kwargs: Any) -> Any:
        """Run a ``reduce_scatter`` (list form) and record it."""
        inner = self._commscope_inner
        if inner is None:
            return _PG.reduce_scatter(self, *args, **kwargs)
        call = inner.reduce_scatter
        rec = SLOT.rec
        if rec is None:
            return call(*args, **kwargs)
        return rec.run(self, "reduce_scatter", scatter_like, call, args, kwargs)

    def reduce_scatter_single_coalesced(self, *args: Any, **kwargs: Any) -> Any:
        """Run a coalesced ``reduce_scatter_tensor`` and record it."""
        inner = self._commscope_inner
        if inner is None:
            return _PG.reduce_scatter_single_coalesced(self, *args, **kwargs)
        call = inner.reduce_scatter_single_coalesced
        rec = SLOT.rec
        if rec is None:
            return call(*args, **kwargs)
        return rec.run(self, "reduce_scatter_tensor_coalesced", out_in, call, args, kwargs)

    def all_to_all_single(self, *args: Any, **kwargs: Any) -> Any:
        """Run an ``all_to_all_single`` and record it."""
        inner = self._commscope_inner
        if inner is None:
            return _PG.all_to_all_single(self, *args, **kwargs)
        call = inner.all_to_all_single
        rec = SLOT.rec
        if rec is None:
            return call(*args, **kwargs)
        return rec.run(self, "all_to_all", out_in, call, args, kwargs)

    def barrier(self, *args: Any, **kwargs: Any) -> Any:
        """Run a ``barrier`` and record it."""
        inner = self._commscope_inner
        if inner is None:
            return _PG.barrier(self, *args, **kwargs)
        call = inner.barrier
        rec = SLOT.rec
        if rec is None:
            return call(*args, **kwargs)
        return rec.run(self, "barrier", nothing, call, args, kwargs)

    def broadcast(self, *args: Any, **kwargs: Any) -> Any:
        """Run a ``broadcast`` and record it."""
        inner = self._commscope_inner
        if inner is None:
            return _PG.broadcast(self, *args, **kwargs)
        call = inner.broadcast
        rec = SLOT.rec
        if rec is None:
            return call(*args, **kwargs)
        return rec.run(self, "broadcast", inplace, call, args, kwargs)

    def send(self, *args: Any, **kwargs: Any) -> Any:
        """Run a ``send`` with its peer and record it."""
        inner = self._commscope_inner
        if inner is None:
            return _PG.send(self, *args, **kwargs)
        call = inner.send
        rec = SLOT.rec
        if rec is None:
            return call(*args, **kwargs)
        return rec.run(self, "send", p2p, call, args, kwargs)

    def recv(self, *args: Any, **kwargs: Any) -> Any:
        """Run a ``recv`` with its peer and record it."""
        inner = self._commscope_inner
        if inner is None:
            return _PG.recv(self, *args, **kwargs)
        call = inner.recv
        rec = SLOT.rec
        if rec is None:
            return call(*args, **kwargs)
        return rec.run(self, "recv", p2p, call, args, kwargs)

    # Methods without a trampoline (reached from Python only). -------------------------

    def reduce(self, *args: Any, **kwargs: Any) -> Any:
        """Run a ``reduce`` and record it."""
        inner = self._commscope_inner
        if inner is None:
            return _PG.reduce(self, *args, **kwargs)
        call = inner.reduce
        rec = SLOT.rec
        if rec is None:
            return call(*args, **kwargs)
        return rec.run(self, "reduce", inplace, call, args, kwargs)

    def all_gather_single(self, *args: Any, **kwargs: Any) -> Any:
        """Run an ``all_gather_into_tensor`` and record it."""
        inner = self._commscope_inner
        if inner is None:
            return _PG.all_gather_single(self, *args, **kwargs)
        call = inner.all_gather_single
        rec = SLOT.rec
        if rec is None:
            return call(*args, **kwargs)
        return rec.run(self, "_all_gather_base", out_in, call, args, kwargs)

    def _allgather_base(self, *args: Any, **kwargs: Any) -> Any:
        """Deprecated alias of :meth:`all_gather_single` (recorded the same way).

        What ``all_gather_into_tensor`` calls on torch before 2.13, which has no
        ``all_gather_single``.
        """
        inner = self._commscope_inner
        if inner is None:
            return getattr(_PG, _ALL_GATHER_SINGLE)(self, *args, **kwargs)
        call = getattr(inner, _ALL_GATHER_SINGLE)
        rec = SLOT.rec
        if rec is None:
            return call(*args, **kwargs)
        return rec.run(self, "_all_gather_base", out_in, call, args, kwargs)

    def allgather_coalesced(self, *args: Any, **kwargs: Any) -> Any:
        """Run a coalesced ``all_gather`` (list form) and record it."""
        inner = self._commscope_inner
        if inner is None:
            return _PG.allgather_coalesced(self, *args, **kwargs)
        call = inner.allgather_coalesced
        rec = SLOT.rec
        if rec is None:
            return call(*args, **kwargs)
        return rec.run(self, "ALLGATHER_coalesced", gather_like, call, args, kwargs)

    def gather(self, *args: Any, **kwargs: Any) -> Any:
        """Run a ``gather`` and record it."""
        inner = self._commscope_inner
        if inner is None:
            return _PG.gather(self, *args, **kwargs)
        call = inner.gather
        rec = SLOT.rec
        if rec is None:
            return call(*args, **kwargs)
        return rec.run(self, "gather", gather_like, call, args, kwargs)

    def scatter(self, *args: Any, **kwargs: Any) -> Any:
        """Run a ``scatter`` and record it."""
        inner = self._commscope_inner
        if inner is None:
            return _PG.scatter(self, *args, **kwargs)
        call = inner.scatter
        rec = SLOT.rec
        if rec is None:
            return call(*args, **kwargs)
        return rec.run(self, "scatter", scatter_like, call, args, kwargs)

    def reduce_scatter_single(self, *args: Any, **kwargs: Any) -> Any:
        """Run a ``reduce_scatter_tensor`` and record it."""
        inner = self._commscope_inner
        if inner is None:
            return _PG.reduce_scatter_single(self, *args, **kwargs)
        call = inner.reduce_scatter_single
        rec = SLOT.rec
        if rec is None:
            return call(*args, **kwargs)
        return rec.run(self, "_reduce_scatter_base", out_in, call, args, kwargs)

    def _reduce_scatter_base(self, *args: Any, **kwargs: Any) -> Any:
        """Deprecated alias of :meth:`reduce_scatter_single` (recorded the same way).

        What ``reduce_scatter_tensor`` calls on torch before 2.13, which has no
        ``reduce_scatter_single``.
        """
        inner = self._commscope_inner
        if inner is None:
            return getattr(_PG, _REDUCE_SCATTER_SINGLE)(self, *args, **kwargs)
        call = getattr(inner, _REDUCE_SCATTER_SINGLE)
        rec = SLOT.rec
        if rec is None:
            return call(*args, **kwargs)
        return rec.run(self, "_reduce_scatter_base", out_in, call, args, kwargs)

    def alltoall(self, *args: Any, **kwargs: Any) -> Any:
        """Run an ``all_to_all`` (list form) and record it."""
        inner = self._commscope_inner
        if inner is None:
            return _PG.alltoall(self, *args, **kwargs)
        call = inner.alltoall
        rec = SLOT.rec
        if rec is None:
            return call(*args, **kwargs)
        return rec.run(self, "all_to_all", out_in, call, args, kwargs)

    def recv_anysource(self, *args: Any, **kwargs: Any) -> Any:
        """Run a ``recv`` from any source and record it."""
        inner = self._commscope_inner
        if inner is None:
            return _PG.recv_anysource(self, *args, **kwargs)
        call = inner.recv_anysource
        rec = SLOT.rec
        if rec is None:
            return call(*args, **kwargs)
        return rec.run(self, "recv", any_source, call, args, kwargs)

    def monitored_barrier(self, *args: Any, **kwargs: Any) -> Any:
        """Run a ``monitored_barrier`` and record it as a ``barrier`` (synchronous)."""
        inner = self._commscope_inner
        if inner is None:
            return _PG.monitored_barrier(self, *args, **kwargs)
        rec = SLOT.rec
        if rec is None:
            return inner.monitored_barrier(*args, **kwargs)
        # It blocks until every rank arrives: recorded first on every backend, and
        # retired when it returns (its result is not a work).
        return rec.run(self, "barrier", nothing, inner.monitored_barrier, args, kwargs,
                       blocking=True)

    # torch before 2.13: the older names are the real methods (not aliases). ----------

    if not _NEW_NAMES:

        def alltoall_base(self, *args: Any, **kwargs: Any) -> Any:
            """Run an ``all_to_all_single`` (torch < 2.13) and record it."""
            inner = self._commscope_inner
            if inner is None:
                return _PG.alltoall_base(self, *args, **kwargs)
            call = inner.alltoall_base
            rec = SLOT.rec
            if rec is None:
                return call(*args, **kwargs)
            return rec.run(self, "all_to_all", out_in, call, args, kwargs)

    if not _NEW_NAMES:

        def allgather_into_tensor_coalesced(self, *args: Any, **kwargs: Any) -> Any:
            """Run a coalesced ``all_gather_into_tensor`` (torch < 2.13) and record it."""
            inner = self._commscope_inner
            if inner is None:
                return _PG.allgather_into_tensor_coalesced(self, *args, **kwargs)
            call = inner.allgather_into_tensor_coalesced
            rec = SLOT.rec
            if rec is None:
                return call(*args, **kwargs)
            return rec.run(self, "all_gather_into_tensor_coalesced", out_in, call, args, kwargs)

    if not _NEW_NAMES:

        def reduce_scatter_tensor_coalesced(self, *args: Any, **kwargs: Any) -> Any:
            """Run a coalesced ``reduce_scatter_tensor`` (torch < 2.13) and record it."""
            inner = self._commscope_inner
            if inner is None:
                return _PG.reduce_scatter_tensor_coalesced(self, *args, **kwargs)
            call = inner.reduce_scatter_tensor_coalesced
            rec = SLOT.rec
            if rec is None:
                return call(*args, **kwargs)
            return rec.run(self, "reduce_scatter_tensor_coalesced", out_in, call, args, kwargs)

    # Coalescing and splitting. -----------------------------------------------------

    def _start_coalescing(self, *args: Any, **kwargs: Any) -> Any:
        """Start a coalesced block: its collectives share one collective seq id."""
        result = (self._commscope_inner or _Base(self))._start_coalescing(*args, **kwargs)
        info = getattr(self, "_commscope_info", None)
        if info is not None:
            info.coalescing = True
            info.coalesced_seq = None
        return result

    def _end_coalescing(self, *args: Any, **kwargs: Any) -> Any:
        """End a coalesced block."""
        info = getattr(self, "_commscope_info", None)
        if info is not None:
            info.coalescing = False
            info.coalesced_seq = None
        return (self._commscope_inner or _Base(self))._end_coalescing(*args, **kwargs)

    if has("pg_split_group"):  # torch 2.9+; before, a plain group has none either

        def split_group(self, *args: Any, **kwargs: Any) -> Any:
            """Split as torch does; the new group is recorded too (see :func:`adopt`)."""
            new = (self._commscope_inner or _Base(self)).split_group(*args, **kwargs)
            rec = SLOT.rec
            info = getattr(self, "_commscope_info", None)
            if new is None or rec is None or info is None:
                return new
            ranks = [info.ranks[r] for r in sorted(arg(args, kwargs, 0, "ranks") or [])]
            return adopt(new, rec, ranks or None, arg(args, kwargs, 1, "timeout"))


# ------------------------------------------------------------ groups built in C++


def timeout_ms(timeout: Any) -> int:
    """A group's timeout in ms (torch's default group timeout when none was given)."""
    if isinstance(timeout, timedelta):
        return int(timeout.total_seconds() * 1000)
    return int(c10d.default_pg_timeout.total_seconds() * 1000)


def adopt(pg: Any, rec: Recorder, ranks: list[int] | None = None, timeout: Any = None) -> Any:
    """A recording group that serves through the backends of an existing plain group.

    Used for groups torch builds in C++ (``split_group``). Returns ``pg`` unchanged
    (and logs why) when it cannot be adopted.
    """
    try:
        new = RecordingProcessGroup(pg.rank(), pg.size())
        default_name = str(pg.name()).lower()
        for device in pg._device_types:
            backend = pg._get_backend(device)
            name = backend_name(backend, default_name)
            kind = dist.Backend.backend_type_map.get(name, _PG.BackendType.CUSTOM)
            new._register_backend(device, kind, backend)
        new._set_default_backend(
            dist.Backend.backend_type_map.get(default_name, _PG.BackendType.CUSTOM)
        )
        if pg.bound_device_id is not None:
            new.bound_device_id = pg.bound_device_id
        new._set_group_name(pg.group_name)
        new._set_group_desc(pg.group_desc)
        new._commscope_inner = pg
        rec.attach_group(
            new,
            list(ranks) if ranks is not None else list(range(pg.size())),
            pg.rank(),
            {str(d.type): backend_name(pg._get_backend(d), default_name)
             for d in pg._device_types},
            timeout_ms(timeout),
        )
        return new
    except Exception as exc:
        logger.warning("commscope flight: cannot record split group %r: %r", pg, exc)
        return pg


_RECORDED_METHODS: dict[str, tuple[str, Any]] = {
    # method name -> (the op it records, how to read its arguments), as above
    "allreduce": ("all_reduce", inplace),
    "allreduce_coalesced": ("allreduce_coalesced", inplace),
    "allgather": ("all_gather", gather_like),
    "all_gather_single": ("_all_gather_base", out_in),
    "_allgather_base": ("_all_gather_base", out_in),
    "all_gather_single_coalesced": ("all_gather_into_tensor_coalesced", out_in),
    "allgather_coalesced": ("ALLGATHER_coalesced", gather_like),
    "reduce_scatter": ("reduce_scatter", scatter_like),
    "reduce_scatter_single": ("_reduce_scatter_base", out_in),
    "_reduce_scatter_base": ("_reduce_scatter_base", out_in),
    "reduce_scatter_single_coalesced": ("reduce_scatter_tensor_coalesced", out_in),
    "all_to_all_single": ("all_to_all", out_in),
    "alltoall_base": ("all_to_all", out_in),
    "alltoall": ("all_to_all", out_in),
    "broadcast": ("broadcast", inplace),
    "reduce": ("reduce", inplace),
    "gather": ("gather", gather_like),
    "scatter": ("scatter", scatter_like),
    "barrier": ("barrier", nothing),
    "send": ("send", p2p),
    "recv": ("recv", p2p),
    "recv_anysource": ("recv", any_source),
}


def python_methods(pg: Any) -> list[str]:
    """The collective methods ``pg``'s own Python class defines (a process group written
    in Python: torch's ``threaded`` backend, a custom backend's), which torch calls in
    place of a C++ backend's; ``[]`` for torch's own classes."""
    found = []
    for name in _RECORDED_METHODS:
        for klass in type(pg).__mro__:
            if klass is _PG or klass.__module__.startswith("torch._C"):
                break
            if name in klass.__dict__:
                found.append(name)
                break
    return found


def _recording(pg: Any, op: str, describe: Any, call: Any) -> Any:
    """``pg``'s method ``call``, recorded (its caller's frame is two levels up, as the
    recording group's methods have it)."""

    def method(*args: Any, **kwargs: Any) -> Any:
        rec = SLOT.rec
        if rec is None:
            return call(*args, **kwargs)
        return rec.run(pg, op, describe, call, args, kwargs)

    method.__name__ = getattr(call, "__name__", op)
    method.__doc__ = getattr(call, "__doc__", None)
    return method


def adopt_python(pg: Any, rec: Recorder, ranks: list[int], group_rank: int,
                 backends: dict[str, str], timeout: int) -> bool:
    """Record a process group written in Python, which a custom backend returned and
    torch uses as the group itself (a recording group cannot stand in for it): each of
    its collective methods is wrapped on the object, so every road into it (Python
    calls, and C++ through pybind's lookup on the object) is recorded. Returns whether
    it was adopted (``False``: it has no such method)."""
    names = python_methods(pg)
    if not names:
        return False
    for name in names:
        op, describe = _RECORDED_METHODS[name]
        setattr(pg, name, _recording(pg, op, describe, getattr(pg, name)))
    rec.attach_group(pg, ranks, group_rank, backends, timeout)
    return True


class _LegacyRecordingProcessGroup(RecordingProcessGroup):
    """A recording group on torch 2.5 and older (built with ``options``, unsupported:
    ``COMMSCOPE_ALLOW_OLD_TORCH``): there a Python subclass must name its backend itself
    (the base class's ``getBackendName`` is pure virtual), and it is the options'."""

    def getBackendName(self) -> str:
        """The backend's name, from the options torch built the group with."""
        return str(self._commscope_options.backend)
