"""The device process of one rank: its stream, its watchdog, its heartbeat monitor.

What the GPU and ProcessGroupNCCL's C++ threads are for a real rank, in a process of its
own so that nothing the host does to its Python interpreter (a thread holding the GIL,
a hung main thread) stops it:

* the **receiver** thread takes the host's messages in order: a group's communicator to
  create (eagerly: the host waits until every member made it), an op recorded at
  enqueue (put in the flight recorder, then on the stream), a host sync, a query;
* the **stream** thread runs the queue in issue order: compute kernels (a sleep),
  collectives and send/recv on gloo groups of the device processes (so an op finishes
  only once every member's stream reached it), a coalesced batch of send/recv as one
  unit, the host's sync fences, and a faulting kernel, after which the device's context
  is broken: the stream stops for good and every event query fails (a sticky error);
* the **watchdog** thread retires finished works every 100 ms and, when the oldest work
  it follows is older than its timeout (or failed), raises the job's dump signal
  through the store and dumps, as ``TORCH_NCCL_DUMP_ON_TIMEOUT`` does;
* the **heartbeat monitor** thread dumps once when another rank (or the launcher, as an
  NVRx-style collector does) raised the dump signal; a host's failure raises it
  :data:`COLLECT_DELAY_S` later (the collector's monitor interval).

A dump is written in every form the scenarios compare (:data:`VARIANTS`), atomically.
Its stacks need the host's interpreter (symbolising takes the GIL): the monitor pings
the host first and, as PyTorch retries without stacks after a timeout, leaves them out
when the host does not answer.
"""

from __future__ import annotations

import os
import queue
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any

import torch
import torch.distributed as dist

from tests.ncclbed.recorder import WATCHDOG_POLL_S, FlightRecorder, Work, nvrx_json, pickle_bytes

__all__ = ["DeviceConfig", "Events", "run_device", "VARIANTS", "SIGNAL_KEY", "dump_path"]

SIGNAL_KEY = "bed/dump_signal"
"""Store key the first rank (or the launcher) to see a fault sets: every device dumps."""

VARIANTS = ("full", "active", "nvrx")
"""The dump forms written at once: ``full`` (PyTorch's pickle, every entry, stacks),
``active`` (the same, only entries whose completion was not discovered: ``onlyActive``
or ``TORCH_INCLUDE_ONLY_ACTIVE=1``) and ``nvrx`` (an NVRx-style collector's
``_dump_<rank>.json``: active only, no stacks)."""

_DTYPES = {"Float": torch.float32, "Double": torch.float64, "Half": torch.float16,
           "BFloat16": torch.bfloat16, "Int": torch.int32, "Long": torch.int64,
           "Byte": torch.uint8, "Bool": torch.bool}
_GIL_PROBE_S = 1.0
COLLECT_DELAY_S = 2.0
"""How long after a rank's failure the collector asks every rank for its dump (NVRx's
monitor notices a failure within its interval, about a second or two)."""


@dataclass(frozen=True)
class DeviceConfig:
    """How one device behaves and where it writes."""

    rank: int
    world: int
    store_path: str
    dump_dir: str
    buffer_size: int = 2000
    timing: bool = False
    dump_on_timeout: bool = True


def dump_path(dump_dir: str, variant: str, rank: int) -> str:
    """Where a device writes one form of its dump."""
    name = f"_dump_{rank}.json" if variant == "nvrx" else f"nccl_trace_rank_{rank}"
    return os.path.join(dump_dir, variant, name)


@dataclass
class Events:
    """What the host may ask of the device without waiting (CUDA event queries):
    ``done[rid % len(done)] > rid`` once work ``rid`` finished; ``broken`` once the
    device's context broke (shared memory, written by the device only)."""

    done: Any
    broken: Any

    @staticmethod
    def make(slots: int = 65536) -> Events:
        """Fresh shared arrays (made before the device is forked)."""
        import multiprocessing

        return Events(multiprocessing.RawArray("q", slots), multiprocessing.RawValue("b", 0))

    def finished(self, rid: int) -> bool:
        """Whether work ``rid`` finished (a query that never blocks)."""
        return self.done[rid % len(self.done)] > rid


class _Device:
    def __init__(self, cfg: DeviceConfig, conn: Connection, probe: Connection,
                 events: Events) -> None:
        self.events = events
        self.cfg = cfg
        self.conn = conn
        self.probe = probe
        self.fr = FlightRecorder(cfg.buffer_size, cfg.timing)
        self.stream: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self.pgs: dict[int, Any] = {}
        self.send_lock = threading.Lock()
        self.error: str | None = None
        """The sticky error, once the faulting kernel ran."""
        self.fences: list[int] = []
        self.dumped = threading.Event()
        self.signalled = False
        self.store = dist.FileStore(cfg.store_path, -1)

    # ------------------------------------------------------------------ receiver

    def reply(self, *msg: Any) -> None:
        with self.send_lock:
            self.conn.send(msg)

    def receive(self) -> None:
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                return  # the host is gone: its process died, the device stays to dump
            kind = msg[0]
            if kind == "group":
                _, pg_id, name, ranks, group_rank, _timeout_ms = msg
                self.fr.add_group(pg_id, name, ranks)
                store = dist.PrefixStore(f"bed/group/{name}/", self.store)
                self.pgs[pg_id] = dist.ProcessGroupGloo(
                    store, group_rank, len(ranks), timedelta(hours=1))
                self.reply("ok")
            elif kind == "desc":
                self.fr.set_desc(msg[1], msg[2])
            elif kind == "op":
                works, spec = msg[1], msg[2]
                for w in works:
                    self.fr.record(w)
                self.stream.put(("op", works, spec))
                for w in works:
                    self.fr.enqueued(w)
            elif kind == "record":  # a coalesced op's own entry: no events, no stream work
                for w in msg[1]:
                    self.fr.record(w)
            elif kind in ("kernel", "bad_kernel"):
                self.stream.put(msg)
            elif kind == "sync":
                if self.error is not None:
                    self.reply("error", self.error)
                else:
                    self.stream.put(("fence", msg[1]))
            elif kind == "query":
                self.reply("done", self._finished(msg[1]))
            elif kind == "fault":
                # a fault-tolerance wrapper learns of a rank's failure through its
                # monitor, seconds later: the job settles into its hang meanwhile
                threading.Timer(COLLECT_DELAY_S, self.raise_signal,
                                (f"exception on rank {self.cfg.rank}: {msg[1]}",)).start()
            elif kind == "dump":
                self.raise_signal("dump requested")

    def _finished(self, record_id: int) -> bool | str:
        if self.error is not None:
            return self.error
        for w in self.fr.entries():
            if w.record_id == record_id:
                return w.end_event_ns is not None
        return True

    # -------------------------------------------------------------------- stream

    def run_stream(self) -> None:
        while True:
            item = self.stream.get()
            kind = item[0]
            if kind == "kernel":
                time.sleep(item[1] / 1000)
            elif kind == "bad_kernel":
                self.break_context(item[1])
                return  # nothing on this device runs any more
            elif kind == "fence":
                self.reply("synced", item[1])
            elif kind == "op":
                works, spec = item[1], item[2]
                owner = works[-1]  # a batch's summary entry owns the events
                if self.cfg.timing:
                    owner.start_event_ns = time.time_ns()
                try:
                    self.execute(spec)
                except Exception:  # a peer's process died: an NCCL kernel hangs for good,
                    return  # until the watchdog's timeout (it follows the op still)
                owner.end_event_ns = time.time_ns()
                for w in works:
                    slot = w.record_id % len(self.events.done)
                    self.events.done[slot] = max(self.events.done[slot], w.record_id + 1)

    def break_context(self, what: str) -> None:
        self.error = f"CUDA error: {what}"
        self.events.broken.value = 1
        with self.fr.lock:
            self.fr.broken = True
        self.reply("error", self.error)  # a host waiting in a sync learns it now

    def execute(self, spec: tuple[Any, ...]) -> None:
        kind, pg_id = spec[0], spec[1]
        pg = self.pgs[pg_id]
        if kind == "batch":
            works = [self.p2p(pg, part) for part in spec[2]]
            for w in works:
                w.wait()
            return
        if kind in ("send", "recv"):
            self.p2p(pg, spec).wait()
            return
        make = _tensor
        if kind == "all_reduce":
            pg.allreduce([make(spec[2], spec[3])]).wait()
        elif kind == "barrier":
            pg.allreduce([torch.zeros(1)]).wait()
        elif kind == "broadcast":
            opts = dist.BroadcastOptions()
            opts.rootRank = spec[4]
            pg.broadcast([make(spec[2], spec[3])], opts).wait()
        elif kind == "all_gather_base":
            pg._allgather_base(make(spec[2], spec[4]), make(spec[3], spec[4])).wait()
        elif kind == "reduce_scatter_base":
            pg._reduce_scatter_base(make(spec[2], spec[4]), make(spec[3], spec[4])).wait()
        elif kind == "all_to_all":
            out, inp, dtype, out_splits, in_splits = spec[2], spec[3], spec[4], spec[5], spec[6]
            pg.alltoall_base(make(out, dtype), make(inp, dtype), out_splits, in_splits,
                             dist.AllToAllOptions()).wait()
        elif kind == "all_gather":
            n, shape, dtype = spec[2], spec[3], spec[4]
            pg.allgather([[make(shape, dtype) for _ in range(n)]], [make(shape, dtype)]).wait()
        else:
            raise ValueError(f"unknown op {kind}")

    @staticmethod
    def p2p(pg: Any, spec: tuple[Any, ...]) -> Any:
        kind, _, shape, dtype, peer = spec
        t = _tensor(shape, dtype)
        return pg.send([t], peer, 0) if kind == "send" else pg.recv([t], peer, 0)

    # ------------------------------------------------------------ watchdog, dumps

    def watchdog(self) -> None:
        while not self.fr.broken:
            time.sleep(WATCHDOG_POLL_S)
            self.fr.poll()
            oldest: Work | None = self.fr.oldest_live()
            if oldest is None or not self.cfg.dump_on_timeout:
                continue
            if time.time_ns() - oldest.time_created_ns > oldest.timeout_ms * 1_000_000:
                self.raise_signal(f"timeout on rank {self.cfg.rank}: {oldest.profiling_name} "
                                  f"#{oldest.collective_seq_id} of group {oldest.pg_name}")
                return

    def raise_signal(self, why: str) -> None:
        if not self.signalled:
            self.signalled = True
            try:
                if not self.store.check([SIGNAL_KEY]):
                    self.store.set(SIGNAL_KEY, why)
            except Exception:
                pass
        self.dump()

    def heartbeat(self) -> None:
        while not self.dumped.is_set():
            time.sleep(0.2)
            try:
                signalled = self.store.check([SIGNAL_KEY])
            except Exception:
                continue
            if signalled:
                self.dump()

    def host_answers(self) -> bool:
        """Whether the host's interpreter can symbolise stacks now (it answers a ping)."""
        try:
            self.probe.send("ping")
            return self.probe.poll(_GIL_PROBE_S) and self.probe.recv() == "pong"
        except (OSError, EOFError):
            return False

    def dump(self) -> None:
        if self.dumped.is_set():
            return
        self.dumped.set()
        stacks = self.host_answers()
        forms = {
            "full": pickle_bytes(self.fr.dump(only_active=False, stacks=stacks)),
            "active": pickle_bytes(self.fr.dump(only_active=True, stacks=stacks)),
            "nvrx": nvrx_json(self.fr.dump(only_active=True, stacks=False)).encode(),
        }
        for variant, data in forms.items():
            _write_atomic(dump_path(self.cfg.dump_dir, variant, self.cfg.rank), data)


def _tensor(shape: list[int], dtype: str) -> torch.Tensor:
    return torch.zeros(shape, dtype=_DTYPES.get(dtype, torch.float32))


def _write_atomic(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def run_device(cfg: DeviceConfig, conn: Connection, probe: Connection, events: Events,
               on_exit: Callable[[], None] | None = None) -> None:
    """The device process's body: start its threads, then wait to be killed."""
    torch.set_num_threads(1)
    dev = _Device(cfg, conn, probe, events)
    threads = [threading.Thread(target=f, name=n, daemon=True) for f, n in (
        (dev.receive, "receiver"), (dev.run_stream, "stream"), (dev.watchdog, "watchdog"),
        (dev.heartbeat, "heartbeat"))]
    for t in threads:
        t.start()
    try:
        while True:
            time.sleep(3600)
    except BaseException:
        traceback.print_exc()
    finally:
        if on_exit is not None:
            on_exit()
