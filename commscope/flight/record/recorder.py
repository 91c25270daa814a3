"""The recorder: turns each call on a recording process group into an :class:`Entry`.

:class:`Recorder` owns the ring, the per-group counters and the set of pending entries
the watchdog looks at. Every method of the recording process group
(:mod:`commscope.flight.splice.backend`) goes through :meth:`Recorder.run`, which hands the
call to the real backend and records it with :meth:`Recorder.begin` (before or just
after the hand-over, see there) and :meth:`Recorder.issued`. Completion is learnt without
keeping tensors alive (NCCL works excepted, see below):

* gloo and most backends: the work goes back to the caller wrapped in a
  :class:`~commscope.flight.record.work.WaitedWork` where torch's eager function waits for it
  at once (``opts.asyncOp`` False), else in a
  :class:`~commscope.flight.record.work.TrackedWork`; its ``wait()`` (what eager calls, FSDP
  and functional collectives do) or ``is_completed()`` marks the entry, and asking for
  its future (DDP, comm hooks) hangs a completion callback on that future. A callback
  on every future would make the backend's thread take the GIL after every op, which
  costs two thread switches per collective (measured: +40-60 µs per gloo all_reduce
  on a busy 2-core box, against +6 µs for the wrapper);
* NCCL/XCCL futures complete at enqueue (CUDA futures), so their works are polled with
  ``is_completed()`` by the watchdog until done, then released (NCCL's own watchdog
  holds them that long too). A synchronous call (``async_op=False``) returns no work
  at all on NCCL: it runs on the caller's stream, so an event recorded on that stream
  right after it is polled instead.

Nothing here ever raises into the caller: the first internal failure is logged with
its traceback and recording stops (``active`` becomes False); the job goes on.
"""

from __future__ import annotations

import logging
import sys
import threading
import weakref
from collections.abc import Callable, Sequence
from functools import partial
from time import perf_counter_ns, time_ns
from typing import Any

from commscope.collectives import normalize_dtype_name
from commscope.compat import has, work_failed
from commscope.flight.config import FlightConfig
from commscope.flight.record.agree.arguments import READERS as _READERS
from commscope.flight.record.agree.fingerprint import Fingerprint
from commscope.flight.record.agree.fingerprint import fold as _fold
from commscope.flight.record.creations import Creation, Creations
from commscope.flight.record.entry import COMPLETED, SCHEDULED, STARTED, Entry
from commscope.flight.record.groups import GroupInfo, is_device_backend
from commscope.flight.record.marks import StreamMark, release_mark, stream_mark
from commscope.flight.record.ring import Ring
from commscope.flight.record.stack import capture_to_user
from commscope.flight.record.work import TrackedWork, WaitedWork

__all__ = ["Recorder", "SLOT", "Describe", "DEVICE_TIMEOUT_SHARE"]

DEVICE_TIMEOUT_SHARE = 0.8
"""On a device backend, a pending op is overdue at this share of its group's timeout
(8 of NCCL's default 10 minutes): PyTorch's watchdog aborts at the timeout itself."""

logger = logging.getLogger(__name__)


Describe = Callable[[tuple[Any, ...], dict[str, Any]], tuple[Sequence[Any], Sequence[Any], Any]]
"""``describe(args, kwargs) -> (inputs, outputs, peer)`` for one process-group method.

``inputs``/``outputs`` hold tensors, or lists of tensors that PyTorch's recorder shows
as one flattened buffer (``all_gather``'s output list: ``[[n, *shape]]``); ``peer`` is
the group rank of a p2p op's other side, ``None`` for a collective.
"""


_getframe = sys._getframe
_WRAP_WORKS = has("py_work_holder")
"""Whether a :class:`TrackedWork` may go to C++ callers (torch 2.7+, see
:mod:`commscope.compat`)."""
_new_entry = object.__new__
get_ident = threading.get_ident


def _first_tensor(items: Sequence[Any]) -> Any:
    """The first tensor of ``items`` (which may nest one list), or ``None``."""
    for x in items:
        if isinstance(x, (list, tuple)):
            if not x:
                continue
            x = x[0]
        return x
    return None


def _first_device(items: Sequence[Any]) -> Any:
    """Device of the first tensor of ``items``, or ``None``."""
    x = _first_tensor(items)
    return None if x is None else x.device


def _device_type(items: Sequence[Any]) -> str:
    """Device type of the first tensor of ``items`` (``"cpu"`` when there is none)."""
    x = _first_tensor(items)
    if x is None or x.is_cpu:
        return "cpu"
    return "cuda" if x.is_cuda else str(x.device.type)


class _Slot:
    """Where the recording process groups find the active recorder (or ``None``)."""

    __slots__ = ("rec",)

    def __init__(self) -> None:
        self.rec: Recorder | None = None


SLOT = _Slot()


def _wait_failed(work: Any) -> bool:
    """Whether a completed host-side work (gloo) ended with an error: its ``wait()``
    returns at once and raises that error (``Work.exception()`` would say it too, with a
    deprecation warning in the job's log)."""
    try:
        work.wait()
    except Exception:
        return True
    return False


class Recorder:
    """Per-process recorder state: config, ring, groups, pending entries."""

    def __init__(self, config: FlightConfig) -> None:
        self.config = config
        self.ring: Ring[Entry] = Ring(config.buffer_size)
        self.groups: list[GroupInfo] = []
        self.next_pg_id = 0
        self.pending: dict[int, Entry] = {}
        """Entries issued and not yet known to be completed, by record id."""
        self.polled: dict[int, tuple[Entry, Any]] = {}
        """Poll-mode works (NCCL; a gloo work dropped before it completed) by record id,
        released once completed."""
        self.unwaited: dict[int, weakref.ref[Any]] = {}
        """The :class:`TrackedWork` wrappers handed out and not yet known completed, by
        record id, held weakly: :meth:`check_unwaited` asks them before a dump and
        before calling an entry overdue (an async op nobody waits on completes anyway)."""
        self.adopted: set[int] = set()
        """Record ids of :attr:`polled` works that are a backend's own host-side works
        (gloo), dropped unfinished by their caller (:meth:`adopt`)."""
        self.active = True
        self.global_rank = -1
        self.world_size = -1
        self.store: Any = None
        """The default group's store (dump requests travel through it)."""
        self.creations = Creations()
        """The groups this rank created or is creating (:mod:`.creations`)."""
        self.job: dict[str, Any] | None = None
        """This rank's job identity once the default group exists (:mod:`.job`)."""
        self.watch_token: str | None = None
        """The job's watch token, agreed by every host once the default group exists
        (:func:`.job.agree_token`); ``None`` before."""
        self.request_secret: str | None = None
        """What this rank's dump requests through the store are proven with, agreed at
        the same time (:func:`.job.request_secret`); never logged or dumped."""
        self.place: dict[str, Any] | None = None
        """Where this rank runs (:func:`.placement.this_place`), once it has a rank."""
        self.hosts: Any = None
        """This rank's :class:`.placement.HostTableGatherer` (the job's host table)."""
        self.thread_deaths: list[dict[str, Any]] = []
        """Threads of this process that died of an uncaught exception (the newest 16):
        ``{"thread", "type", "message", "frames", "time_ns"}``; every dump carries them."""
        self.clock: Any = None
        """This clock's :class:`.clock.ClockOffset` to rank 0's, once measured."""
        self.clock_service: Any = None
        """Rank 0's :class:`.clock.ClockService` (answers the others' clock asks)."""
        self.failed_collectives = 0
        """How many works completed with an error (the watchdog dumps on a new one)."""
        self.device_done_ns = 0
        """When a device's work (NCCL) was last seen finished: how the device frontier
        moves, which ``commscope watch`` reads (a queue running ahead is no stall)."""
        self._timing = config.timing
        self._max_frames = config.max_frames
        self._pending_cap = max(4096, 2 * config.buffer_size)
        self._threads: dict[int, tuple[str, str]] = {}
        self._dtypes: dict[Any, str] = {}
        self._failed = False
        self._groups_lock = threading.Lock()
        self._on_future_cb = self._on_future  # bound once, not per collective

    def note_thread_death(self, record: dict[str, Any]) -> None:
        """Keep a thread's death (see :attr:`thread_deaths`)."""
        self.thread_deaths = [*self.thread_deaths[-15:], record]

    # ------------------------------------------------------------------ groups

    def add_group(
        self,
        name: str,
        desc: str,
        ranks: list[int],
        rank: int,
        backends: dict[str, str],
        timeout_ms: int,
    ) -> GroupInfo:
        """Register a group this rank is a member of; returns its :class:`GroupInfo`."""
        with self._groups_lock:
            info = GroupInfo(self.next_pg_id, name, desc, ranks, rank, backends, timeout_ms)
            if self.config.fingerprint:
                info.fp = Fingerprint()
            self.next_pg_id += 1
            self.groups.append(info)
        return info

    def attach_group(
        self,
        pg: Any,
        ranks: list[int],
        rank: int,
        backends: dict[str, str],
        timeout_ms: int,
    ) -> GroupInfo:
        """Register recording group ``pg``; its :class:`GroupInfo` hangs on it as
        ``_commscope_info`` (with a weak reference back to the group)."""
        info = self.add_group(str(pg.group_name), str(pg.group_desc), ranks, rank, backends,
                              timeout_ms)
        pg._commscope_info = info
        info.pg_ref = weakref.ref(pg)
        return info

    # ------------------------------------------------------------------ hot path

    def run(
        self,
        pg: Any,
        op: str,
        describe: Describe,
        call: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        blocking: bool = False,
    ) -> Any:
        """Hand ``op`` to the backend with ``call(*args, **kwargs)`` and record it.

        Called by every method of the recording process group (and only from there:
        the stack is taken from that method's caller). Returns what the backend
        returned, or the work wrapped to report its completion.

        Where handing over can block (NCCL's lazy communicator set-up; a ``blocking``
        call such as ``monitored_barrier``; any backend not known to only enqueue), the
        entry is recorded first, so a rank stuck there is still in its dump. Where it
        only enqueues the op for the backend's own threads (gloo), the op is handed over
        first and recorded while the transport already runs: on a small gloo
        all_reduce between two ranks that halves what recording adds.
        """
        info: GroupInfo | None = getattr(pg, "_commscope_info", None)
        if info is None:
            return call(*args, **kwargs)
        if blocking or info.record_first:
            e = self.begin(info, op, describe, args, kwargs, False)
            try:
                work = call(*args, **kwargs)
            except BaseException:
                self.not_issued(e)
                raise
            if blocking:
                self.issued(e, None)  # it has returned: retired now
                return work
            return self.issued(e, work)
        try:
            work = call(*args, **kwargs)
        except BaseException:
            self.not_issued(self.begin(info, op, describe, args, kwargs, False))
            raise
        # Handed over already: the entry is created in the started state.
        e = self.begin(info, op, describe, args, kwargs, True)
        if e is None:
            return work
        if work is not None and not e.polled:
            # torch's eager functions pass ``opts.asyncOp = False`` when they will wait
            # for the work at once and drop it: a lighter wrapper does for them.
            opts = args[-1] if args else kwargs.get("opts")
            if getattr(opts, "asyncOp", True) is False:
                return WaitedWork(work, e, self)
        return self._track(e, work)

    def begin(
        self,
        info: GroupInfo,
        op: str,
        describe: Describe,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        started: bool,
    ) -> Entry | None:
        """Record ``op`` on the group ``info`` describes (called by :meth:`run` only,
        just before handing it to the backend, or just after when ``started``).

        Returns the new entry, or ``None`` when recording is off or failed. This is the
        hot path (a few microseconds): no formatting, no tensor kept.
        """
        if not self.active:
            return None
        try:
            e = _new_entry(Entry)
            now = time_ns()
            e.time_created_ns = now
            inputs, outputs, peer = describe(args, kwargs)
            read = _READERS.get(op)
            e.agree = read(args, kwargs, info) if read is not None else None
            if len(inputs) == 1 and not isinstance(x := inputs[0], (list, tuple)):
                dtype = x.dtype
                in_sizes: Sequence[Any] = (x.shape,)
                in_dtypes: Sequence[str] = (self._dtypes.get(dtype) or self._dtype_name(dtype),)
            else:
                in_sizes, in_dtypes = self._shapes(inputs)
            e.input_sizes = in_sizes
            e.input_dtypes = in_dtypes
            if outputs is inputs:
                e.output_sizes = in_sizes
                e.output_dtypes = in_dtypes
            else:
                e.output_sizes, e.output_dtypes = self._shapes(outputs)
            if info.multi_backend:
                backend = info.backend_for(_device_type(inputs or outputs))
                e.polled = polled = is_device_backend(backend)
            else:
                backend = info.default_backend
                e.polled = polled = info.polled
            if polled:
                e.device = _first_device(inputs) or _first_device(outputs)
            if peer is None:
                if info.multi_backend:
                    e.profiling_name = f"{backend}:{op}"
                else:
                    # One string per op name and group, shared by its entries.
                    name = info.profiling_names.get(op)
                    if name is None:
                        name = info.profiling_names[op] = f"{backend}:{op}"
                    e.profiling_name = name
                e.is_p2p = False
                e.peer = None
            else:
                if op == "send":
                    e.profiling_name = f"{backend}:send {info.rank}->{peer}"
                else:
                    e.profiling_name = f"{backend}:recv {info.rank}<-{peer}"
                e.is_p2p = True
                e.peer = info.global_rank(peer)
            e.group = info
            if started:
                e.state = STARTED
                e.time_discovered_started_ns = now
            else:
                e.state = SCHEDULED
                e.time_discovered_started_ns = None
            e.time_discovered_completed_ns = None
            e.retired = e.failed = False
            e.duration_ms = None
            ident = get_ident()
            thread = self._threads.get(ident)
            if thread is None:
                thread = self._thread_info(ident)
            e.thread = thread
            # The stack from the caller of the process-group method, as a flat list of
            # (code, instruction offset) pairs: lines are worked out at dump time.
            # Frames 1 and 2 are run() and the process group's method; frame 3 is its
            # caller (asked for directly: no frame object is made for the frames in
            # between). From C++ (DDP's reducer on the autograd engine's device thread)
            # there may be no caller frame at all.
            try:
                caller: Any = _getframe(3)
            except ValueError:
                caller = None
            e.frames = capture_to_user(caller, self._max_frames)
            ring = self.ring
            with ring.lock:
                rid = ring._written
                info.op_id += 1
                if peer is not None:
                    if info.batch_p2p_seq is not None:
                        p2p = info.batch_p2p_seq
                    else:
                        info.p2p_seq_id += 1
                        p2p = info.p2p_seq_id
                    coll = info.collective_seq_id
                else:
                    if info.coalescing:
                        if info.coalesced_seq is None:
                            info.collective_seq_id += 1
                            info.coalesced_seq = info.collective_seq_id
                        coll = info.coalesced_seq
                    else:
                        info.collective_seq_id += 1
                        coll = info.collective_seq_id
                    info.last_enqueued = coll
                    if started:
                        info.last_started = coll
                    p2p = info.p2p_seq_id
                    fp = info.fp
                    if fp is not None:
                        _fold(fp, op, e, coll, now)
                e.record_id = rid
                e.collective_seq_id = coll
                e.p2p_seq_id = p2p
                e.op_id = info.op_id
                cap = ring._capacity
                if cap:
                    ring._items[rid % cap] = e
                ring._written = rid + 1
            pending = self.pending
            pending[rid] = e
            if len(pending) > self._pending_cap:
                self._prune_pending()
            if self._timing:
                e.start_perf_ns = perf_counter_ns()
            return e
        except Exception as exc:
            self.fail(exc)
            return None

    def issued(self, e: Entry | None, work: Any) -> Any:
        """The backend accepted the call and returned ``work``; track its completion.

        Returns the work to give back to the caller (the same object, or a
        :class:`~commscope.flight.record.work.TrackedWork` around it).
        """
        if e is None:
            return work
        try:
            if not e.polled:  # a device's op stays scheduled until its device finishes it
                e.state = STARTED
                e.time_discovered_started_ns = time_ns()
                info = e.group
                if not e.is_p2p and e.collective_seq_id > info.last_started:
                    info.last_started = e.collective_seq_id
        except Exception as exc:
            self.fail(exc)
            return work
        return self._track(e, work)

    def _track(self, e: Entry, work: Any) -> Any:
        """Follow a started entry to completion (see :meth:`issued`)."""
        try:
            if e.polled:
                # A synchronous NCCL call (``async_op=False``) returns no work: it ran
                # on the caller's stream, so a device event recorded there now tells
                # when it completes on the device.
                watch = work if work is not None else stream_mark(e.device)
                if watch is not None:
                    polled = self.polled
                    polled[e.record_id] = (e, watch)
                    if len(polled) >= 1024:
                        # Without a watchdog (or between its rounds) check here too, so
                        # completed works are let go and the dict stays small.
                        self.poll()
                    return work
            if work is None:
                self.complete(e)
                return work
            if _WRAP_WORKS:
                tracked = TrackedWork(work, e, self)
                self.unwaited[e.record_id] = weakref.ref(tracked)
                return tracked
            return self._follow_unwrapped(e, work)
        except Exception as exc:
            self.fail(exc)
            return work

    def _follow_unwrapped(self, e: Entry, work: Any) -> Any:
        """On torch 2.6 (no ``PyWorkHolder``, see :mod:`commscope.compat`) C++ does not keep
        a Work made in Python alive, so a :class:`TrackedWork` handed to a functional
        collective would be waited on as an empty Work, forever. The backend's own work
        goes back instead; its future says when it completed, and a work without a
        future (gloo's send, recv and reduce_scatter_tensor there) is polled, held until
        it completes, as NCCL's works are."""
        try:
            future = work.get_future()
        except (RuntimeError, AttributeError):
            self.polled[e.record_id] = (e, work)
            if len(self.polled) >= 1024:
                self.poll()
            return work
        future.add_done_callback(partial(self._on_future_cb, e))
        return work

    def not_issued(self, e: Entry | None) -> None:
        """The backend raised instead of returning a work: the entry ends here."""
        if e is not None:
            self.complete(e, failed=True)

    def _on_future(self, e: Entry, fut: Any) -> None:
        # Runs in the backend's thread (or inline when the work was already done).
        try:
            fut.value()
        except Exception:
            self.complete(e, failed=True)
            return
        self.complete(e)

    def complete(self, e: Entry, failed: bool = False) -> None:
        """Retire an entry: completed, or (``failed``) ended with an error.

        A failed collective (a timeout, a dead peer) is retired but not completed, as
        NCCL's recorder reports an aborted one: its ``state`` stays where it was, it
        gets no ``duration_ms``, and ``failed`` is set in the dump.
        """
        try:
            if e.retired:
                return
            e.retired = True
            self.pending.pop(e.record_id, None)
            self.unwaited.pop(e.record_id, None)
            if failed:
                e.failed = True
                self.failed_collectives += 1
                return
            e.time_discovered_completed_ns = done = time_ns()
            if e.polled:
                self.device_done_ns = done
            if self._timing and e.state == STARTED:
                e.duration_ms = (perf_counter_ns() - e.start_perf_ns) / 1e6
            e.state = COMPLETED
            if not e.is_p2p:
                info = e.group
                if e.collective_seq_id > info.last_completed:
                    info.last_completed = e.collective_seq_id
        except Exception as exc:
            self.fail(exc)

    def adopt(self, e: Entry, work: Any) -> None:
        """A :class:`TrackedWork` was dropped before its work completed (an async op
        nobody waits on): poll the real work until it completes, then let it go, as
        the backend itself holds it until then."""
        self.unwaited.pop(e.record_id, None)
        if not e.retired:
            self.adopted.add(e.record_id)
            self.polled[e.record_id] = (e, work)

    def check_unwaited(self, record_ids: Sequence[int] | None = None) -> None:
        """Ask the works handed out and not waited on yet (all, or those of
        ``record_ids``) whether they completed; a completed one retires its entry."""
        for rid in list(self.unwaited) if record_ids is None else record_ids:
            ref = self.unwaited.get(rid)
            tracked = ref() if ref is not None else None
            if tracked is None:
                self.unwaited.pop(rid, None)
                continue
            try:
                tracked.is_completed()
            except Exception:
                pass  # the caller's own calls on the work will tell

    def poll(self) -> None:
        """Check poll-mode works (NCCL); release the completed ones."""
        for rid, (e, work) in list(self.polled.items()):
            try:
                done = work.is_completed()
            except Exception:
                done, failed = True, True
            else:
                failed = False
            if not done:
                continue
            if not failed:
                if rid in self.adopted:  # a host-side work: wait() on it returns at once
                    self.adopted.discard(rid)
                    failed = _wait_failed(work)
                else:
                    try:
                        failed = work_failed(work)
                    except Exception:
                        failed = False
            duration = None
            if self._timing and not failed:
                try:  # the backend's own device-side timing (NCCL with timing on)
                    duration = float(work._get_duration())
                except Exception:
                    duration = None  # keep the wall time complete() measures
            if self.polled.pop(rid, None) is None:
                continue  # the other thread polling (watchdog or caller) retired it
            if type(work) is StreamMark and not failed:
                release_mark(work)
            self.complete(e, failed=failed)
            if duration is not None and duration >= 0:
                e.duration_ms = duration

    # ------------------------------------------------------------------ helpers

    def _shapes(self, items: Sequence[Any]) -> tuple[list[Any], list[str]]:
        sizes: list[Any] = []
        dtypes: list[str] = []
        names = self._dtypes
        for x in items:
            if isinstance(x, (list, tuple)):
                if not x:
                    continue
                first = x[0]
                shape = first.shape
                if all(t.shape == shape for t in x):
                    sizes.append((len(x), *shape))
                    dtypes.append(names.get(first.dtype) or self._dtype_name(first.dtype))
                    continue
                for t in x:
                    sizes.append(t.shape)
                    dtypes.append(names.get(t.dtype) or self._dtype_name(t.dtype))
            else:
                sizes.append(x.shape)
                dtype = x.dtype
                dtypes.append(names.get(dtype) or self._dtype_name(dtype))
        return sizes, dtypes

    def _dtype_name(self, dtype: Any) -> str:
        name = normalize_dtype_name(dtype)
        self._dtypes[dtype] = name
        return name

    def _thread_info(self, ident: int) -> tuple[str, str]:  # first call from a thread
        info = (threading.current_thread().name, str(ident))
        self._threads[ident] = info
        return info

    def _prune_pending(self) -> None:
        # Works nobody waits on and that have no future (an isend never waited for)
        # cannot be tracked to completion; forget the oldest so the set stays bounded.
        excess = len(self.pending) - self._pending_cap // 2
        for rid in list(self.pending)[:excess]:
            self.pending.pop(rid, None)

    def overdue_creations(self, now_ns: int, timeout_s: float | None) -> list[Creation]:
        """Group creations unfinished for longer than ``timeout_s`` (default: the
        group's own timeout)."""
        out = []
        for c in self.creations.pending():
            limit_ns = int(timeout_s * 1e9) if timeout_s is not None else c.timeout_ns
            if now_ns - c.start_ns > limit_ns:
                out.append(c)
        return out

    def overdue(self, now_ns: int, timeout_s: float | None) -> list[Entry]:
        """Pending entries older than their timeout (``timeout_s`` overrides it). On a
        device backend (NCCL) the default is :data:`DEVICE_TIMEOUT_SHARE` of the group's
        timeout: at the group's timeout PyTorch's NCCL watchdog may abort the process,
        and the dump must be on disk before that."""
        out = []
        for e in list(self.pending.values()):
            if timeout_s is not None:
                limit_ns = int(timeout_s * 1e9)
            elif e.polled:
                limit_ns = int(e.timeout_ms * 1_000_000 * DEVICE_TIMEOUT_SHARE)
            else:
                limit_ns = e.timeout_ms * 1_000_000
            if now_ns - e.time_created_ns > limit_ns:
                out.append(e)
        if out and self.unwaited:  # an async op nobody waited on may be done already
            self.check_unwaited([e.record_id for e in out if e.record_id in self.unwaited])
            out = [e for e in out if not e.retired]
        return out

    def fail(self, exc: BaseException) -> None:
        """Log the first internal failure with its traceback and stop recording."""
        self.active = False
        if self._failed:
            return
        self._failed = True
        logger.error(
            "commscope flight recorder stopped recording after an internal error "
            "(training is not affected): %r",
            exc,
            exc_info=exc,
        )
