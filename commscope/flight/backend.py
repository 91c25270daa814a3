"""The recording process group: a ``torch.distributed.ProcessGroup`` that notes every call.

:class:`RecordingProcessGroup` is what ``init_process_group`` and ``new_group`` build
while recording is enabled (see :mod:`commscope.flight.install`). The real backends
(gloo, nccl, fake, ...) are registered on it exactly as on a plain group, so names,
descriptions, ``_get_backend``, bound devices and the group registry are untouched.
Each collective method records an entry and then calls the base implementation, which
goes through the ``c10d`` dispatcher to the real backend as before.

Every road into a group passes through these methods, checked on torch 2.13:

* eager ``torch.distributed`` calls look the method up on the Python object;
* C++ callers (DDP's reducer, functional collectives of DTensor/TP, FSDP) call the
  group's virtual methods, which pybind's trampoline forwards to Python for
  ``allreduce``, ``allreduce_coalesced``, ``allgather``, ``all_gather_single_coalesced``
  (functional ``all_gather_into_tensor``), ``reduce_scatter``,
  ``reduce_scatter_single_coalesced`` (functional ``reduce_scatter_tensor``),
  ``all_to_all_single``, ``broadcast``, ``barrier``, ``send`` and ``recv``.

The deprecated aliases (``allgather_into_tensor_coalesced``,
``reduce_scatter_tensor_coalesced``, ``alltoall_base``) are deliberately not defined:
their base implementations call the new names, which land here. A method whose
trampoline exists must call ``ProcessGroup.<same name>`` directly from its own body:
pybind recognises that frame and runs the base implementation instead of recursing.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch.distributed as dist

from commscope.flight.recorder import SLOT

__all__ = ["RecordingProcessGroup"]

_PG = dist.ProcessGroup


# --------------------------------------------------------------------------- describe
# ``describe(args, kwargs) -> (inputs, outputs, peer)``; see recorder.Describe.


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], i: int, *names: str) -> Any:
    if len(args) > i:
        return args[i]
    for name in names:
        if name in kwargs:
            return kwargs[name]
    return None


def _as_list(x: Any) -> list[Any]:
    if x is None:
        return []
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _inplace(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any, None]:
    if args and type(args[0]) is list:  # the common case: (tensors, opts)
        return args[0], args[0], None
    tensors = _as_list(_arg(args, kwargs, 0, "tensors", "tensor"))
    return tensors, tensors, None


def _gather_like(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any, None]:
    # allgather / gather / allgather_coalesced: (outputs, inputs, ...), where outputs is
    # a list of lists (one per input) or a list of tensors for a single input tensor.
    out = _arg(args, kwargs, 0, "output_tensors", "output_lists")
    inp = _arg(args, kwargs, 1, "input_tensors", "input_tensor", "input_list")
    if isinstance(inp, (list, tuple)):
        return list(inp), _as_list(out), None
    return _as_list(inp), [_as_list(out)], None


def _scatter_like(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any, None]:
    # scatter / reduce_scatter: (outputs, inputs, ...), inputs a list of lists (one per
    # output) or a list of tensors for a single output tensor.
    out = _arg(args, kwargs, 0, "output_tensors", "output_tensor", "output")
    inp = _arg(args, kwargs, 1, "input_tensors", "input")
    if isinstance(out, (list, tuple)):
        return _as_list(inp), list(out), None
    return [_as_list(inp)], _as_list(out), None


def _out_in(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any, None]:
    # (output, input, ...) with single tensors or lists of tensors.
    out = _arg(args, kwargs, 0, "output", "outputs", "outputTensor", "output_tensors")
    inp = _arg(args, kwargs, 1, "input", "inputs", "inputTensor", "input_tensors")
    return _as_list(inp), _as_list(out), None


def _nothing(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any, None]:
    return [], [], None


def _p2p(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any, int]:
    tensors = _as_list(_arg(args, kwargs, 0, "tensors"))
    peer = _arg(args, kwargs, 1, "dstRank", "srcRank")
    return tensors, tensors, int(peer)


def _any_source(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any, int]:
    tensors = _as_list(_arg(args, kwargs, 0, "arg0", "tensors"))
    return tensors, tensors, -1


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
    exactly as an unrecorded group does. Set by :func:`commscope.flight.install.attach_inner`.
    """

    def __init__(self, *args: Any) -> None:
        if len(args) == 3:
            _store, rank, size = args
        elif len(args) == 2:
            rank, size = args
        else:
            raise TypeError(
                f"RecordingProcessGroup takes (store, rank, size) or (rank, size), "
                f"got {len(args)} arguments"
            )
        super().__init__(int(rank), int(size))

    # Methods with a pybind trampoline (reached from C++ as well as Python). -----------

    def allreduce(self, *args: Any, **kwargs: Any) -> Any:
        """Record an ``all_reduce``, then run it."""
        inner = self._commscope_inner or _Base(self)
        rec = SLOT.rec
        if rec is None:
            return inner.allreduce(*args, **kwargs)
        e = rec.begin(self, "all_reduce", _inplace, args, kwargs)
        try:
            work = inner.allreduce(*args, **kwargs)
        except BaseException:
            rec.not_issued(e)
            raise
        return rec.issued(e, work)

    def allreduce_coalesced(self, *args: Any, **kwargs: Any) -> Any:
        """Record a coalesced ``all_reduce``, then run it."""
        inner = self._commscope_inner or _Base(self)
        rec = SLOT.rec
        if rec is None:
            return inner.allreduce_coalesced(*args, **kwargs)
        e = rec.begin(self, "allreduce_coalesced", _inplace, args, kwargs)
        try:
            work = inner.allreduce_coalesced(*args, **kwargs)
        except BaseException:
            rec.not_issued(e)
            raise
        return rec.issued(e, work)

    def allgather(self, *args: Any, **kwargs: Any) -> Any:
        """Record an ``all_gather`` (list form), then run it."""
        inner = self._commscope_inner or _Base(self)
        rec = SLOT.rec
        if rec is None:
            return inner.allgather(*args, **kwargs)
        e = rec.begin(self, "all_gather", _gather_like, args, kwargs)
        try:
            work = inner.allgather(*args, **kwargs)
        except BaseException:
            rec.not_issued(e)
            raise
        return rec.issued(e, work)

    def all_gather_single_coalesced(self, *args: Any, **kwargs: Any) -> Any:
        """Record a coalesced ``all_gather_into_tensor``, then run it."""
        inner = self._commscope_inner or _Base(self)
        rec = SLOT.rec
        if rec is None:
            return inner.all_gather_single_coalesced(*args, **kwargs)
        e = rec.begin(self, "all_gather_into_tensor_coalesced", _out_in, args, kwargs)
        try:
            work = inner.all_gather_single_coalesced(*args, **kwargs)
        except BaseException:
            rec.not_issued(e)
            raise
        return rec.issued(e, work)

    def reduce_scatter(self, *args: Any, **kwargs: Any) -> Any:
        """Record a ``reduce_scatter`` (list form), then run it."""
        inner = self._commscope_inner or _Base(self)
        rec = SLOT.rec
        if rec is None:
            return inner.reduce_scatter(*args, **kwargs)
        e = rec.begin(self, "reduce_scatter", _scatter_like, args, kwargs)
        try:
            work = inner.reduce_scatter(*args, **kwargs)
        except BaseException:
            rec.not_issued(e)
            raise
        return rec.issued(e, work)

    def reduce_scatter_single_coalesced(self, *args: Any, **kwargs: Any) -> Any:
        """Record a coalesced ``reduce_scatter_tensor``, then run it."""
        inner = self._commscope_inner or _Base(self)
        rec = SLOT.rec
        if rec is None:
            return inner.reduce_scatter_single_coalesced(*args, **kwargs)
        e = rec.begin(self, "reduce_scatter_tensor_coalesced", _out_in, args, kwargs)
        try:
            work = inner.reduce_scatter_single_coalesced(*args, **kwargs)
        except BaseException:
            rec.not_issued(e)
            raise
        return rec.issued(e, work)

    def all_to_all_single(self, *args: Any, **kwargs: Any) -> Any:
        """Record an ``all_to_all_single``, then run it."""
        inner = self._commscope_inner or _Base(self)
        rec = SLOT.rec
        if rec is None:
            return inner.all_to_all_single(*args, **kwargs)
        e = rec.begin(self, "all_to_all", _out_in, args, kwargs)
        try:
            work = inner.all_to_all_single(*args, **kwargs)
        except BaseException:
            rec.not_issued(e)
            raise
        return rec.issued(e, work)

    def barrier(self, *args: Any, **kwargs: Any) -> Any:
        """Record a ``barrier``, then run it."""
        inner = self._commscope_inner or _Base(self)
        rec = SLOT.rec
        if rec is None:
            return inner.barrier(*args, **kwargs)
        e = rec.begin(self, "barrier", _nothing, args, kwargs)
        try:
            work = inner.barrier(*args, **kwargs)
        except BaseException:
            rec.not_issued(e)
            raise
        return rec.issued(e, work)

    def broadcast(self, *args: Any, **kwargs: Any) -> Any:
        """Record a ``broadcast``, then run it."""
        inner = self._commscope_inner or _Base(self)
        rec = SLOT.rec
        if rec is None:
            return inner.broadcast(*args, **kwargs)
        e = rec.begin(self, "broadcast", _inplace, args, kwargs)
        try:
            work = inner.broadcast(*args, **kwargs)
        except BaseException:
            rec.not_issued(e)
            raise
        return rec.issued(e, work)

    def send(self, *args: Any, **kwargs: Any) -> Any:
        """Record a ``send`` with its peer, then run it."""
        inner = self._commscope_inner or _Base(self)
        rec = SLOT.rec
        if rec is None:
            return inner.send(*args, **kwargs)
        e = rec.begin(self, "send", _p2p, args, kwargs)
        try:
            work = inner.send(*args, **kwargs)
        except BaseException:
            rec.not_issued(e)
            raise
        return rec.issued(e, work)

    def recv(self, *args: Any, **kwargs: Any) -> Any:
        """Record a ``recv`` with its peer, then run it."""
        inner = self._commscope_inner or _Base(self)
        rec = SLOT.rec
        if rec is None:
            return inner.recv(*args, **kwargs)
        e = rec.begin(self, "recv", _p2p, args, kwargs)
        try:
            work = inner.recv(*args, **kwargs)
        except BaseException:
            rec.not_issued(e)
            raise
        return rec.issued(e, work)

    # Methods without a trampoline (reached from Python only). -------------------------

    def reduce(self, *args: Any, **kwargs: Any) -> Any:
        """Record a ``reduce``, then run it."""
        inner = self._commscope_inner or _Base(self)
        rec = SLOT.rec
        if rec is None:
            return inner.reduce(*args, **kwargs)
        e = rec.begin(self, "reduce", _inplace, args, kwargs)
        try:
            work = inner.reduce(*args, **kwargs)
        except BaseException:
            rec.not_issued(e)
            raise
        return rec.issued(e, work)

    def all_gather_single(self, *args: Any, **kwargs: Any) -> Any:
        """Record an ``all_gather_into_tensor``, then run it."""
        inner = self._commscope_inner or _Base(self)
        rec = SLOT.rec
        if rec is None:
            return inner.all_gather_single(*args, **kwargs)
        e = rec.begin(self, "_all_gather_base", _out_in, args, kwargs)
        try:
            work = inner.all_gather_single(*args, **kwargs)
        except BaseException:
            rec.not_issued(e)
            raise
        return rec.issued(e, work)

    def _allgather_base(self, *args: Any, **kwargs: Any) -> Any:
        """Deprecated alias of :meth:`all_gather_single` (recorded the same way)."""
        inner = self._commscope_inner or _Base(self)
        rec = SLOT.rec
        if rec is None:
            return inner.all_gather_single(*args, **kwargs)
        e = rec.begin(self, "_all_gather_base", _out_in, args, kwargs)
        try:
            work = inner.all_gather_single(*args, **kwargs)
        except BaseException:
            rec.not_issued(e)
            raise
        return rec.issued(e, work)

    def allgather_coalesced(self, *args: Any, **kwargs: Any) -> Any:
        """Record a coalesced ``all_gather`` (list form), then run it."""
        inner = self._commscope_inner or _Base(self)
        rec = SLOT.rec
        if rec is None:
            return inner.allgather_coalesced(*args, **kwargs)
        e = rec.begin(self, "ALLGATHER_coalesced", _gather_like, args, kwargs)
        try:
            work = inner.allgather_coalesced(*args, **kwargs)
        except BaseException:
            rec.not_issued(e)
            raise
        return rec.issued(e, work)

    def gather(self, *args: Any, **kwargs: Any) -> Any:
        """Record a ``gather``, then run it."""
        inner = self._commscope_inner or _Base(self)
        rec = SLOT.rec
        if rec is None:
            return inner.gather(*args, **kwargs)
        e = rec.begin(self, "gather", _gather_like, args, kwargs)
        try:
            work = inner.gather(*args, **kwargs)
        except BaseException:
            rec.not_issued(e)
            raise
        return rec.issued(e, work)

    def scatter(self, *args: Any, **kwargs: Any) -> Any:
        """Record a ``scatter``, then run it."""
        inner = self._commscope_inner or _Base(self)
        rec = SLOT.rec
        if rec is None:
            return inner.scatter(*args, **kwargs)
        e = rec.begin(self, "scatter", _scatter_like, args, kwargs)
        try:
            work = inner.scatter(*args, **kwargs)
        except BaseException:
            rec.not_issued(e)
            raise
        return rec.issued(e, work)

    def reduce_scatter_single(self, *args: Any, **kwargs: Any) -> Any:
        """Record a ``reduce_scatter_tensor``, then run it."""
        inner = self._commscope_inner or _Base(self)
        rec = SLOT.rec
        if rec is None:
            return inner.reduce_scatter_single(*args, **kwargs)
        e = rec.begin(self, "_reduce_scatter_base", _out_in, args, kwargs)
        try:
            work = inner.reduce_scatter_single(*args, **kwargs)
        except BaseException:
            rec.not_issued(e)
            raise
        return rec.issued(e, work)

    def _reduce_scatter_base(self, *args: Any, **kwargs: Any) -> Any:
        """Deprecated alias of :meth:`reduce_scatter_single` (recorded the same way)."""
        inner = self._commscope_inner or _Base(self)
        rec = SLOT.rec
        if rec is None:
            return inner.reduce_scatter_single(*args, **kwargs)
        e = rec.begin(self, "_reduce_scatter_base", _out_in, args, kwargs)
        try:
            work = inner.reduce_scatter_single(*args, **kwargs)
        except BaseException:
            rec.not_issued(e)
            raise
        return rec.issued(e, work)

    def alltoall(self, *args: Any, **kwargs: Any) -> Any:
        """Record an ``all_to_all`` (list form), then run it."""
        inner = self._commscope_inner or _Base(self)
        rec = SLOT.rec
        if rec is None:
            return inner.alltoall(*args, **kwargs)
        e = rec.begin(self, "all_to_all", _out_in, args, kwargs)
        try:
            work = inner.alltoall(*args, **kwargs)
        except BaseException:
            rec.not_issued(e)
            raise
        return rec.issued(e, work)

    def recv_anysource(self, *args: Any, **kwargs: Any) -> Any:
        """Record a ``recv`` from any source, then run it."""
        inner = self._commscope_inner or _Base(self)
        rec = SLOT.rec
        if rec is None:
            return inner.recv_anysource(*args, **kwargs)
        e = rec.begin(self, "recv", _any_source, args, kwargs)
        try:
            work = inner.recv_anysource(*args, **kwargs)
        except BaseException:
            rec.not_issued(e)
            raise
        return rec.issued(e, work)

    def monitored_barrier(self, *args: Any, **kwargs: Any) -> Any:
        """Record a ``monitored_barrier`` as a ``barrier``, then run it (synchronous)."""
        inner = self._commscope_inner or _Base(self)
        rec = SLOT.rec
        if rec is None:
            return inner.monitored_barrier(*args, **kwargs)
        e = rec.begin(self, "barrier", _nothing, args, kwargs)
        try:
            result = inner.monitored_barrier(*args, **kwargs)
        except BaseException:
            rec.not_issued(e)
            raise
        rec.issued(e, None)
        return result

    # Coalescing and splitting. -----------------------------------------------------

    def _start_coalescing(self, *args: Any, **kwargs: Any) -> Any:
        """Start a coalesced block: its collectives share one collective seq id."""
        result = self._inner(_PG._start_coalescing)._start_coalescing(*args, **kwargs)
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
        return self._inner(_PG._end_coalescing)._end_coalescing(*args, **kwargs)

    def split_group(self, *args: Any, **kwargs: Any) -> Any:
        """Split as torch does; the new group is recorded too (see ``install.adopt``)."""
        new = self._inner(_PG.split_group).split_group(*args, **kwargs)
        rec = SLOT.rec
        info = getattr(self, "_commscope_info", None)
        if new is None or rec is None or info is None:
            return new
        from commscope.flight.install import adopt

        ranks = [info.ranks[r] for r in sorted(_arg(args, kwargs, 0, "ranks") or [])]
        return adopt(new, rec, ranks or None, _arg(args, kwargs, 1, "timeout"))
