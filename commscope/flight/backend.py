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
``reduce_scatter_tensor_coalesced``, ``alltoall_base``) are deliberately not defined on
torch 2.13: their base implementations call the new names, which land here. Older
torch has only those names (they are the real methods there), so on it they are defined
instead, and ``_allgather_base``/``_reduce_scatter_base`` call the old single-tensor
methods. A method whose
trampoline exists must call ``ProcessGroup.<same name>`` directly from its own body:
pybind recognises that frame and runs the base implementation instead of recursing.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch.distributed as dist

from commscope.flight.describe import (
    any_source,
    arg,
    gather_like,
    inplace,
    nothing,
    out_in,
    p2p,
    scatter_like,
)
from commscope.flight.recorder import SLOT

__all__ = ["RecordingProcessGroup"]

_PG = dist.ProcessGroup

# torch 2.13 named the single-tensor forms ``all_gather_single``/``reduce_scatter_single``;
# older releases have only the underscored names, which newer ones keep as aliases.
_ALL_GATHER_SINGLE = "all_gather_single" if hasattr(_PG, "all_gather_single") else "_allgather_base"
_REDUCE_SCATTER_SINGLE = (
    "reduce_scatter_single" if hasattr(_PG, "reduce_scatter_single") else "_reduce_scatter_base"
)


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
        e = rec.begin(self, "all_reduce", inplace, args, kwargs)
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
        e = rec.begin(self, "allreduce_coalesced", inplace, args, kwargs)
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
        e = rec.begin(self, "all_gather", gather_like, args, kwargs)
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
        e = rec.begin(self, "all_gather_into_tensor_coalesced", out_in, args, kwargs)
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
        e = rec.begin(self, "reduce_scatter", scatter_like, args, kwargs)
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
        e = rec.begin(self, "reduce_scatter_tensor_coalesced", out_in, args, kwargs)
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
        e = rec.begin(self, "all_to_all", out_in, args, kwargs)
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
        e = rec.begin(self, "barrier", nothing, args, kwargs)
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
        e = rec.begin(self, "broadcast", inplace, args, kwargs)
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
        e = rec.begin(self, "send", p2p, args, kwargs)
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
        e = rec.begin(self, "recv", p2p, args, kwargs)
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
        e = rec.begin(self, "reduce", inplace, args, kwargs)
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
        e = rec.begin(self, "_all_gather_base", out_in, args, kwargs)
        try:
            work = inner.all_gather_single(*args, **kwargs)
        except BaseException:
            rec.not_issued(e)
            raise
        return rec.issued(e, work)

    def _allgather_base(self, *args: Any, **kwargs: Any) -> Any:
        """Deprecated alias of :meth:`all_gather_single` (recorded the same way).

        What ``all_gather_into_tensor`` calls on torch before 2.13, which has no
        ``all_gather_single``.
        """
        inner = self._commscope_inner or _Base(self)
        run = getattr(inner, _ALL_GATHER_SINGLE)
        rec = SLOT.rec
        if rec is None:
            return run(*args, **kwargs)
        e = rec.begin(self, "_all_gather_base", out_in, args, kwargs)
        try:
            work = run(*args, **kwargs)
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
        e = rec.begin(self, "ALLGATHER_coalesced", gather_like, args, kwargs)
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
        e = rec.begin(self, "gather", gather_like, args, kwargs)
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
        e = rec.begin(self, "scatter", scatter_like, args, kwargs)
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
        e = rec.begin(self, "_reduce_scatter_base", out_in, args, kwargs)
        try:
            work = inner.reduce_scatter_single(*args, **kwargs)
        except BaseException:
            rec.not_issued(e)
            raise
        return rec.issued(e, work)

    def _reduce_scatter_base(self, *args: Any, **kwargs: Any) -> Any:
        """Deprecated alias of :meth:`reduce_scatter_single` (recorded the same way).

        What ``reduce_scatter_tensor`` calls on torch before 2.13, which has no
        ``reduce_scatter_single``.
        """
        inner = self._commscope_inner or _Base(self)
        run = getattr(inner, _REDUCE_SCATTER_SINGLE)
        rec = SLOT.rec
        if rec is None:
            return run(*args, **kwargs)
        e = rec.begin(self, "_reduce_scatter_base", out_in, args, kwargs)
        try:
            work = run(*args, **kwargs)
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
        e = rec.begin(self, "all_to_all", out_in, args, kwargs)
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
        e = rec.begin(self, "recv", any_source, args, kwargs)
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
        e = rec.begin(self, "barrier", nothing, args, kwargs)
        try:
            result = inner.monitored_barrier(*args, **kwargs)
        except BaseException:
            rec.not_issued(e)
            raise
        rec.issued(e, None)
        return result

    # torch before 2.13: the older names are the real methods (not aliases). ----------

    if not hasattr(_PG, "all_to_all_single"):

        def alltoall_base(self, *args: Any, **kwargs: Any) -> Any:
            """Record an ``all_to_all_single`` (torch < 2.13), then run it."""
            inner = self._commscope_inner or _Base(self)
            rec = SLOT.rec
            if rec is None:
                return inner.alltoall_base(*args, **kwargs)
            e = rec.begin(self, "all_to_all", out_in, args, kwargs)
            try:
                work = inner.alltoall_base(*args, **kwargs)
            except BaseException:
                rec.not_issued(e)
                raise
            return rec.issued(e, work)

    if not hasattr(_PG, "all_gather_single_coalesced"):

        def allgather_into_tensor_coalesced(self, *args: Any, **kwargs: Any) -> Any:
            """Record a coalesced ``all_gather_into_tensor`` (torch < 2.13), then run it."""
            inner = self._commscope_inner or _Base(self)
            rec = SLOT.rec
            if rec is None:
                return inner.allgather_into_tensor_coalesced(*args, **kwargs)
            e = rec.begin(self, "all_gather_into_tensor_coalesced", out_in, args, kwargs)
            try:
                work = inner.allgather_into_tensor_coalesced(*args, **kwargs)
            except BaseException:
                rec.not_issued(e)
                raise
            return rec.issued(e, work)

    if not hasattr(_PG, "reduce_scatter_single_coalesced"):

        def reduce_scatter_tensor_coalesced(self, *args: Any, **kwargs: Any) -> Any:
            """Record a coalesced ``reduce_scatter_tensor`` (torch < 2.13), then run it."""
            inner = self._commscope_inner or _Base(self)
            rec = SLOT.rec
            if rec is None:
                return inner.reduce_scatter_tensor_coalesced(*args, **kwargs)
            e = rec.begin(self, "reduce_scatter_tensor_coalesced", out_in, args, kwargs)
            try:
                work = inner.reduce_scatter_tensor_coalesced(*args, **kwargs)
            except BaseException:
                rec.not_issued(e)
                raise
            return rec.issued(e, work)

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

    def split_group(self, *args: Any, **kwargs: Any) -> Any:
        """Split as torch does; the new group is recorded too (see ``install.adopt``)."""
        new = (self._commscope_inner or _Base(self)).split_group(*args, **kwargs)
        rec = SLOT.rec
        info = getattr(self, "_commscope_info", None)
        if new is None or rec is None or info is None:
            return new
        from commscope.flight.install import adopt

        ranks = [info.ranks[r] for r in sorted(arg(args, kwargs, 0, "ranks") or [])]
        return adopt(new, rec, ranks or None, arg(args, kwargs, 1, "timeout"))
