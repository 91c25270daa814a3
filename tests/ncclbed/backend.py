"""The host side: a ``torch.distributed`` backend whose calls return at once, as NCCL's do.

:func:`start` forks this rank's device process (:mod:`.device`) and registers the
backend ``fakenccl``; ``dist.init_process_group("fakenccl", ...)`` and ``new_group``
then build :class:`BedGroup` objects (one per group this rank is a member of, numbered
in creation order as ProcessGroupNCCL numbers its ``pg_id``). Every call of a group:

1. counts as NCCL counts (:class:`BedGroup`): a collective bumps ``collective_seq_id``,
   a send/recv bumps ``p2p_seq_id`` and carries the current collective count, every op
   bumps ``op_id``; inside ``batch_isend_irecv`` the batch takes one ``p2p_seq_id``,
   each op an entry without events, and a closing ``nccl:coalesced`` entry owns the
   batch's events; p2p names hold group-local ranks (``nccl:send 0->1``);
2. is recorded on the calling thread with its stack (innermost frame first, from the
   ``torch.distributed`` function down to the user's ``<module>``) and sent to the
   device, which queues it on its stream;
3. returns a :class:`BedWork` whose ``wait()`` returns at once (on a GPU it only makes
   the current stream wait), whose future is already complete (a CUDA future completes
   at enqueue), and whose ``is_completed()`` asks the device.

The host blocks only in :func:`synchronize` (``.item()``, ``torch.cuda.synchronize``)
and in ``barrier`` (NCCL's barrier syncs the device); a sync raises the device's sticky
error once it has one. Faults: :func:`bad_kernel` (launch a kernel that breaks the
device), :func:`hold_gil` (a thread that holds the GIL in one long C call),
:func:`compute` (device work between collectives).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from multiprocessing import Pipe
from multiprocessing.connection import Connection
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.futures import Future

from tests.ncclbed.device import DeviceConfig, Events, run_device
from tests.ncclbed.recorder import Work

__all__ = ["BACKEND", "BedGroup", "BedWork", "start", "synchronize", "compute",
           "bad_kernel", "hold_gil", "request_dumps", "device_pid"]

BACKEND = "fakenccl"

_DTYPE_NAMES = {torch.float32: "Float", torch.float64: "Double", torch.float16: "Half",
                torch.bfloat16: "BFloat16", torch.int32: "Int", torch.int64: "Long",
                torch.uint8: "Byte", torch.bool: "Bool"}


class _Host:
    """This process's link to its device and the counters shared by its groups."""

    def __init__(self, conn: Connection, probe: Connection, pid: int, timeout_ms: int,
                 events: Events) -> None:
        self.events = events
        self.conn = conn
        self.probe = probe
        self.device_pid = pid
        self.timeout_ms = timeout_ms
        self.lock = threading.Lock()
        self.next_pg_id = 0
        self.next_record_id = 0
        self.error: str | None = None
        self.sync_token = 0

    def send(self, *msg: Any) -> None:
        with self.lock:
            self.conn.send(msg)

    def request(self, msg: tuple[Any, ...], want: str) -> tuple[Any, ...]:
        """Send ``msg`` and wait for the reply ``want``; an unasked-for sticky error
        (the device broke while nobody waited) is kept and raised by the next sync."""
        with self.lock:
            self.conn.send(msg)
            while True:
                got = self.conn.recv()
                if got[0] == "error":
                    self.error = got[1]
                    if want == "synced":
                        raise RuntimeError(got[1])
                    continue
                if got[0] == want:
                    return got


_HOST: _Host | None = None


def _host() -> _Host:
    if _HOST is None:
        raise RuntimeError("ncclbed.start() was not called in this process")
    return _HOST


def start(rank: int, world: int, store_path: str, dump_dir: str, *, timeout_s: float = 5.0,
          buffer_size: int = 2000, timing: bool = False) -> None:
    """Fork this rank's device process and register the ``fakenccl`` backend. Call it
    before any thread is started in this process (the device is a fork)."""
    global _HOST
    here, there = Pipe(duplex=True)
    probe_here, probe_there = Pipe(duplex=True)
    events = Events.make()
    cfg = DeviceConfig(rank=rank, world=world, store_path=store_path, dump_dir=dump_dir,
                       buffer_size=buffer_size, timing=timing)
    pid = os.fork()
    if pid == 0:  # the device
        here.close()
        probe_here.close()
        try:
            run_device(cfg, there, probe_there, events)
        finally:
            os._exit(0)
    there.close()
    probe_there.close()
    _HOST = _Host(here, probe_here, pid, int(timeout_s * 1000), events)
    threading.Thread(target=_answer_probes, args=(probe_here,), name="gil-probe",
                     daemon=True).start()
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])
    c10d.batch_isend_irecv = _batch_isend_irecv
    dist.batch_isend_irecv = _batch_isend_irecv


def device_pid() -> int:
    """The pid of this rank's device process."""
    return _host().device_pid


def _answer_probes(conn: Connection) -> None:
    """Answer the device's pings: it needs the interpreter to symbolise stacks."""
    while True:
        try:
            conn.recv()
            conn.send("pong")
        except (EOFError, OSError):
            return


def _create(opts: Any, _backend_options: Any) -> BedGroup:
    host = _host()
    ranks = list(opts.global_ranks_in_group) or list(range(opts.group_size))
    pg_id = host.next_pg_id
    host.next_pg_id += 1
    name = str(opts.group_id)
    timeout = opts.timeout
    timeout_ms = int(timeout.total_seconds() * 1000) if timeout else host.timeout_ms
    host.request(("group", pg_id, name, ranks, opts.group_rank, timeout_ms), "ok")
    return BedGroup(host, pg_id, name, sorted(ranks), opts.group_rank, timeout_ms)


# --------------------------------------------------------------------------- works


class BedWork(dist.Work):
    """What a call returns: done for the CPU at once, done on the device later."""

    def __init__(self, host: _Host, record_id: int, result: Any = None) -> None:
        super().__init__()
        self._host = host
        self._record_id = record_id
        """The work whose events tell this one's completion (a batch's op: the batch's)."""
        self._future: Future[Any] = Future()
        self._future.set_result(result)

    def wait(self, timeout: timedelta | None = None) -> bool:
        """Returns at once: on a GPU it only makes the current stream wait."""
        return True

    def is_completed(self) -> bool:
        """Whether the device finished the op, asked without waiting (a CUDA event
        query); raises the device's sticky error once it has one."""
        events = self._host.events
        if events.broken.value:
            raise RuntimeError("CUDA error: device-side assert triggered (the device's "
                               "context is broken)")
        return events.finished(self._record_id)

    def is_success(self) -> bool:
        """No error was seen."""
        return self._host.error is None

    def exception(self) -> Any:
        """None: errors surface at a host sync."""
        return None

    def get_future(self) -> Future[Any]:
        """Already complete, as a CUDA future is at enqueue."""
        return self._future

    def synchronize(self) -> None:
        """Nothing for the CPU to wait for."""


# --------------------------------------------------------------------------- groups


def _sizes(tensors: Sequence[Any]) -> tuple[list[list[int]], list[str]]:
    sizes, dtypes = [], []
    for t in tensors:
        sizes.append(list(t.shape))
        dtypes.append(_DTYPE_NAMES.get(t.dtype, "Float"))
    return sizes, dtypes


_HERE = os.path.dirname(os.path.abspath(__file__))
_C10D_BATCH = c10d.batch_isend_irecv
"""torch's own ``batch_isend_irecv``, which the bed's stands in for (in stacks too)."""


def _frames() -> list[dict[str, Any]]:
    """The caller's stack as NCCL's recorder keeps it: innermost first, from the
    ``torch.distributed`` function to the user's outermost frame. The bed's own frames
    are left out (its ``batch_isend_irecv`` shows as torch's), and so is the launcher
    below the rank's function (a script's ``<module>`` would be there)."""
    f: Any = sys._getframe(2)
    out = []
    while f is not None and len(out) < 64:
        code = f.f_code
        if code.co_name == "_host_main":
            break
        if os.path.dirname(os.path.abspath(code.co_filename)) == _HERE:
            if code.co_name == "_batch_isend_irecv":
                out.append({"name": "batch_isend_irecv", "filename": c10d.__file__,
                            "line": _C10D_BATCH.__code__.co_firstlineno})
        else:
            out.append({"name": code.co_name, "filename": code.co_filename,
                        "line": f.f_lineno})
        f = f.f_back
    return out


class BedGroup(dist.ProcessGroup):
    """One group of the bed (see module doc)."""

    def __init__(self, host: _Host, pg_id: int, name: str, ranks: list[int],
                 group_rank: int, timeout_ms: int) -> None:
        super().__init__(group_rank, len(ranks))
        self._timeout_ms = timeout_ms
        self._host = host
        self._pg_id = pg_id
        self._name = name
        self._desc = "undefined"
        self._ranks = ranks
        self._coll = 0
        self._p2p = 0
        self._op = 0
        self._batch: list[tuple[Work, tuple[Any, ...]]] | None = None
        self._batch_works: list[BedWork] = []

    # ------------------------------------------------------------ identity

    def _set_group_name(self, name: str) -> None:
        self._name = name

    def _set_group_desc(self, desc: str) -> None:
        self._desc = desc
        self._host.send("desc", self._pg_id, desc)

    @property
    def group_name(self) -> str:
        """The group's name (``'0'`` for the default group)."""
        return self._name

    @property
    def group_desc(self) -> str:
        """The group's description (Megatron's ``TENSOR_MODEL_PARALLEL_GROUP``...)."""
        return self._desc

    def getBackendName(self) -> str:
        """``fakenccl``."""
        return BACKEND

    def name(self) -> str:
        """``fakenccl``."""
        return BACKEND

    # ------------------------------------------------------------ recording

    def _work(self, op: str, inputs: Sequence[Any], outputs: Sequence[Any], *,
              p2p: bool = False, events: bool = True, new_op: bool = True) -> Work:
        host = self._host
        if new_op:
            self._op += 1
        if not p2p:
            self._coll += 1
        elif self._batch is None:
            self._p2p += 1
        in_sizes, in_dtypes = _sizes(inputs)
        out_sizes, out_dtypes = _sizes(outputs)
        rid = host.next_record_id
        host.next_record_id += 1
        thread = threading.current_thread()
        return Work(
            record_id=rid, pg_id=self._pg_id, pg_name=self._name, pg_desc=self._desc,
            collective_seq_id=self._coll, p2p_seq_id=self._p2p, op_id=self._op,
            profiling_name=f"nccl:{op}", time_created_ns=time.time_ns(),
            input_sizes=in_sizes, input_dtypes=in_dtypes, output_sizes=out_sizes,
            output_dtypes=out_dtypes, timeout_ms=self._timeout_ms, is_p2p=p2p,
            frames=_frames(), thread_name=thread.name, thread_id=str(thread.ident),
            events=events, counter="p2p" if p2p else "collective",
        )

    def _issue(self, work: Work, spec: tuple[Any, ...]) -> BedWork:
        self._host.send("op", [work], spec)
        return BedWork(self._host, work.record_id)

    # ------------------------------------------------------------ collectives

    def allreduce(self, tensors: list[Any], opts: Any = None) -> BedWork:
        """``all_reduce``: queued on the device."""
        t = tensors[0]
        w = self._work("all_reduce", tensors, tensors)
        return self._issue(w, ("all_reduce", self._pg_id, list(t.shape), _dtype(t)))

    def broadcast(self, tensors: list[Any], opts: Any = None) -> BedWork:
        """``broadcast`` from the group rank ``opts.rootRank``."""
        t = tensors[0]
        root = opts.rootRank if opts is not None else 0
        w = self._work("broadcast", tensors, tensors)
        return self._issue(w, ("broadcast", self._pg_id, list(t.shape), _dtype(t), root))

    def all_gather_single(self, output: Any, inp: Any, opts: Any = None) -> BedWork:
        """``all_gather_into_tensor`` (NCCL names it ``_all_gather_base``)."""
        w = self._work("_all_gather_base", [inp], [output])
        return self._issue(w, ("all_gather_base", self._pg_id, list(output.shape),
                               list(inp.shape), _dtype(inp)))

    _allgather_base = all_gather_single

    def reduce_scatter_single(self, output: Any, inp: Any, opts: Any = None) -> BedWork:
        """``reduce_scatter_tensor`` (NCCL names it ``_reduce_scatter_base``)."""
        w = self._work("_reduce_scatter_base", [inp], [output])
        return self._issue(w, ("reduce_scatter_base", self._pg_id, list(output.shape),
                               list(inp.shape), _dtype(inp)))

    _reduce_scatter_base = reduce_scatter_single

    def all_to_all_single(self, output: Any, inp: Any, out_splits: list[int],
                          in_splits: list[int], opts: Any = None) -> BedWork:
        """``all_to_all_single`` (NCCL names it ``all_to_all``)."""
        w = self._work("all_to_all", [inp], [output])
        return self._issue(w, ("all_to_all", self._pg_id, list(output.shape), list(inp.shape),
                               _dtype(inp), list(out_splits), list(in_splits)))

    alltoall_base = all_to_all_single

    def allgather(self, outputs: list[list[Any]], inputs: list[Any],
                  opts: Any = None) -> BedWork:
        """``all_gather`` into a list."""
        t = inputs[0]
        w = self._work("all_gather", inputs, outputs[0])
        return self._issue(w, ("all_gather", self._pg_id, len(outputs[0]), list(t.shape),
                               _dtype(t)))

    def barrier(self, opts: Any = None) -> BedWork:
        """NCCL's barrier: a one-element all_reduce, then a device sync (the CPU waits)."""
        one = torch.zeros(1)
        w = self._work("all_reduce_barrier", [one], [one])
        work = self._issue(w, ("barrier", self._pg_id))
        synchronize()
        return work

    # ------------------------------------------------------------ send / recv

    def send(self, tensors: list[Any], dst: int, tag: int = 0) -> BedWork:
        """Send to group rank ``dst`` (a coalesced op inside ``batch_isend_irecv``)."""
        return self._p2p_op("send", tensors[0], dst)

    def recv(self, tensors: list[Any], src: int, tag: int = 0) -> BedWork:
        """Receive from group rank ``src``."""
        return self._p2p_op("recv", tensors[0], src)

    def _p2p_op(self, kind: str, t: Any, peer: int) -> BedWork:
        me = self.rank()
        name = f"send {me}->{peer}" if kind == "send" else f"recv {me}<-{peer}"
        spec = (kind, self._pg_id, list(t.shape), _dtype(t), peer)
        if self._batch is not None:
            w = self._work(name, [t], [t], p2p=True, events=False)
            self._host.send("record", [w])
            self._batch.append((w, spec))
            work = BedWork(self._host, w.record_id)
            self._batch_works.append(work)  # completes with the batch (its events)
            return work
        w = self._work(name, [t], [t], p2p=True)
        return self._issue(w, spec)

    def begin_batch(self) -> None:
        """Start a coalesced batch: one ``p2p_seq_id`` for all of its ops."""
        self._p2p += 1
        self._batch = []
        self._batch_works = []

    def end_batch(self) -> BedWork:
        """Close the batch with its ``nccl:coalesced`` entry, which owns its events."""
        parts = self._batch or []
        # the closing entry shares the batch's p2p_seq_id and takes no op id of its own
        w = self._work("coalesced", [], [], p2p=True, new_op=False)
        self._batch = None
        for work in self._batch_works:
            work._record_id = w.record_id
        return self._issue(w, ("batch", self._pg_id, [spec for _, spec in parts]))


def _dtype(t: Any) -> str:
    return _DTYPE_NAMES.get(t.dtype, "Float")


def _batch_isend_irecv(p2p_op_list: list[Any]) -> list[BedWork]:
    """``batch_isend_irecv`` coalesced as on NCCL (one work for the batch)."""
    group = p2p_op_list[0].group or c10d._get_default_group()
    if not isinstance(group, BedGroup):
        return [op.op(op.tensor, op.peer, op.group, op.tag) for op in p2p_op_list]
    group.begin_batch()
    try:
        for op in p2p_op_list:
            op.op(op.tensor, op.peer, op.group, op.tag)
    finally:
        work = group.end_batch()
    return [work]


# --------------------------------------------------------------------------- host API


def synchronize() -> None:
    """Wait until the device finished everything queued so far (``.item()``,
    ``torch.cuda.synchronize()``); raises the device's sticky error."""
    host = _host()
    if host.error is not None:
        raise RuntimeError(host.error)
    host.sync_token += 1
    host.request(("sync", host.sync_token), "synced")


def compute(ms: float) -> None:
    """Queue a compute kernel of ``ms`` milliseconds on the device (returns at once)."""
    _host().send("kernel", ms)


def bad_kernel(what: str = "an illegal memory access was encountered") -> None:
    """Queue a kernel that breaks the device's context when the stream reaches it."""
    _host().send("bad_kernel", what)


def hold_gil(seconds: float = 600.0) -> threading.Thread:
    """Start a thread that holds the GIL in one long C-level call (the main thread stops
    at its next bytecode; the device goes on)."""

    def hog() -> None:
        sum(range(int(seconds * 5e7)))

    t = threading.Thread(target=hog, name="gil-holder", daemon=True)
    t.start()
    return t


def request_dumps(why: str = "dump requested") -> None:
    """Ask every device to dump now (what a collector such as NVRx's does)."""
    _host().send("dump", why)


def report_exception(text: str) -> None:
    """Tell the device the host raised: it raises the job's dump signal."""
    _host().send("fault", text[:500])
