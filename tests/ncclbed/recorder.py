"""The device side's flight recorder: PyTorch's NCCL recorder, as its dumps show it.

One :class:`FlightRecorder` per device process holds a ring of :class:`Work` entries, the
groups' configuration and their status rows, and writes dumps in PyTorch's NCCL schema
(format ``2.10``; ``../shared/spec/nccl_flight_recorder.md`` says where each rule comes
from):

* an entry is made at **enqueue** on the host thread (:meth:`FlightRecorder.record`):
  ``time_created_ns`` is the CPU clock then; ``last_enqueued_collective`` moves once the
  launch returned (:meth:`FlightRecorder.enqueued`), in the counter the work used
  (collective or p2p);
* the device stamps a work's events when its stream reaches it (start: only with timing
  on) and when it finishes (end); coalesced per-op entries have no events;
* the watchdog (:meth:`FlightRecorder.poll`, every 100 ms) retires the works whose end
  event fired: their discovery times are the poll's time, ``last_completed_collective``
  is **assigned** the retired work's seq, ``last_started_collective`` follows started
  works with timing on (else stays -1);
* a dump (:meth:`FlightRecorder.dump`) queries every entry's events once more
  (``update_state``): a finished but unretired op becomes ``completed``, a running one
  ``started`` (timing on); once the device's context is broken (a sticky error) every
  query fails and nothing changes any more. ``only_active`` drops the entries whose
  completion was discovered; ``pg_config`` and ``pg_status`` are never filtered.
"""

from __future__ import annotations

import json
import pickle
import threading
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Work", "FlightRecorder", "NCCL_VERSION", "FORMAT_VERSION", "WATCHDOG_POLL_S"]

FORMAT_VERSION = "2.10"
NCCL_VERSION = "2.27.5"
WATCHDOG_POLL_S = 0.1
"""PyTorch's ``kWatchdogThreadSleepMillis`` (2025): how often completions are noticed."""


@dataclass(slots=True)
class Work:
    """One flight-recorder entry and the device-side truth behind it."""

    record_id: int
    pg_id: int
    pg_name: str
    pg_desc: str
    collective_seq_id: int
    p2p_seq_id: int
    op_id: int
    profiling_name: str
    time_created_ns: int
    input_sizes: list[list[int]]
    input_dtypes: list[str]
    output_sizes: list[list[int]]
    output_dtypes: list[str]
    timeout_ms: int
    is_p2p: bool
    frames: list[dict[str, Any]]
    thread_name: str
    thread_id: str
    events: bool = True
    """False for a coalesced group's per-op entries: no events, never retired."""
    counter: str = "collective"
    """Which of the group's counters its ``pg_status`` rows use: ``collective`` or ``p2p``."""
    start_event_ns: int | None = None
    """When the stream reached it (its start event fired; recorded with timing on only)."""
    end_event_ns: int | None = None
    """When it finished on the device (its end event fired)."""
    discovered_started_ns: int | None = None
    discovered_completed_ns: int | None = None
    retired: bool = False
    duration_ms: float | None = None

    @property
    def status_seq(self) -> int:
        """The number ``pg_status`` rows carry for this work."""
        return self.p2p_seq_id if self.counter == "p2p" else self.collective_seq_id


@dataclass(slots=True)
class _Group:
    pg_id: int
    name: str
    desc: str
    ranks: list[int]
    status: list[int] = field(default_factory=lambda: [-1, -1, -1])
    """last enqueued, started, completed."""
    recorded: bool = False


class FlightRecorder:
    """The ring, the groups and their status rows of one device (see module doc)."""

    def __init__(self, capacity: int, timing: bool) -> None:
        self.capacity = capacity
        self.timing = timing
        self.ring: list[Work | None] = [None] * capacity if capacity else []
        self.next_id = 0
        self.groups: dict[int, _Group] = {}
        self.broken = False
        """The device's context is broken (a sticky error): every event query fails."""
        self.lock = threading.Lock()
        self._live: list[Work] = []
        """Works with events that the watchdog has not retired (its work list)."""

    # ------------------------------------------------------------------ host side

    def add_group(self, pg_id: int, name: str, ranks: list[int]) -> None:
        """A communicator was created for group ``name`` (its ``pg_config`` row)."""
        with self.lock:
            self.groups[pg_id] = _Group(pg_id, name, "undefined", list(ranks))

    def set_desc(self, pg_id: int, desc: str) -> None:
        """The group's description, set by ``new_group(group_desc=...)`` after creation."""
        with self.lock:
            self.groups[pg_id].desc = desc

    def record(self, work: Work) -> None:
        """Keep a new entry (made at enqueue, before the launch)."""
        with self.lock:
            self.next_id = max(self.next_id, work.record_id + 1)
            if self.capacity:
                self.ring[work.record_id % self.capacity] = work
            self.groups[work.pg_id].recorded = True
            if work.events:
                self._live.append(work)

    def enqueued(self, work: Work) -> None:
        """The launch returned: ``last_enqueued_collective`` moves to this work."""
        with self.lock:
            if work.events:
                self.groups[work.pg_id].status[0] = work.status_seq

    # ---------------------------------------------------------------- device side

    def poll(self, now_ns: int | None = None) -> None:
        """One watchdog round: retire finished works, note started ones (see module doc)."""
        with self.lock:
            if self.broken:
                return
            now = now_ns or time.time_ns()
            keep = []
            for w in self._live:
                group = self.groups[w.pg_id]
                if self.timing and w.start_event_ns is not None:
                    group.status[1] = w.status_seq
                if w.end_event_ns is None:
                    keep.append(w)
                    continue
                self._update_state(w, now)
                w.retired = True
                if self.timing and w.start_event_ns is not None:
                    w.duration_ms = (w.end_event_ns - w.start_event_ns) / 1e6
                group.status[2] = w.status_seq
            self._live = keep

    def oldest_live(self) -> Work | None:
        """The oldest work the watchdog still follows (its timeout is checked)."""
        with self.lock:
            return self._live[0] if self._live else None

    def _update_state(self, w: Work, now: int) -> None:
        if not w.events or self.broken:
            return
        if self.timing and w.start_event_ns is not None and w.discovered_started_ns is None:
            w.discovered_started_ns = now
        if w.end_event_ns is not None and w.discovered_completed_ns is None:
            w.discovered_completed_ns = now
            if self.timing and w.discovered_started_ns is None:
                w.discovered_started_ns = now

    # ---------------------------------------------------------------------- dumps

    def entries(self) -> list[Work]:
        """The ring's entries, oldest first."""
        with self.lock:
            if not self.capacity:
                return []
            first = max(0, self.next_id - self.capacity)
            return [w for rid in range(first, self.next_id)
                    if (w := self.ring[rid % self.capacity]) is not None
                    and w.record_id == rid]

    def dump(self, *, only_active: bool, stacks: bool, json_nulls: bool = True,
             zero_times: bool = False) -> dict[str, Any]:
        """The dump dict PyTorch's NCCL recorder writes (``_dump_nccl_trace``).

        ``zero_times``: unset discovery times as ``0`` (PyTorch's own JSON dump) instead
        of ``None``; ``json_nulls`` is only a reminder that a pickle-derived JSON keeps
        ``null``.
        """
        now = time.time_ns()
        items = self.entries()
        with self.lock:
            for w in items:
                self._update_state(w, now)
            entries = []
            for w in items:
                if only_active and w.discovered_completed_ns is not None:
                    continue
                entries.append(self._entry(w, stacks, zero_times))
            config = {g.name: {"name": g.name, "desc": g.desc, "ranks": str(g.ranks)}
                      for g in self.groups.values()}
            status = {str(g.pg_id): {"last_enqueued_collective": g.status[0],
                                     "last_started_collective": g.status[1],
                                     "last_completed_collective": g.status[2]}
                      for g in self.groups.values() if g.recorded}
        return {"version": FORMAT_VERSION, "comm_lib_version": NCCL_VERSION,
                "pg_config": config, "pg_status": status, "entries": entries}

    def _entry(self, w: Work, stacks: bool, zero_times: bool) -> dict[str, Any]:
        if w.discovered_completed_ns is not None:
            state = "completed"
        elif w.discovered_started_ns is not None:
            state = "started"
        else:
            state = "scheduled"
        unset = 0 if zero_times else None
        out: dict[str, Any] = {}
        if stacks:
            out["frames"] = list(w.frames)
        out.update({
            "record_id": w.record_id, "pg_id": w.pg_id,
            "process_group": (w.pg_name, w.pg_desc),
            "thread_id": w.thread_id, "thread_name": w.thread_name,
            "collective_seq_id": w.collective_seq_id, "p2p_seq_id": w.p2p_seq_id,
            "op_id": w.op_id, "profiling_name": w.profiling_name,
            "time_created_ns": w.time_created_ns,
        })
        if w.duration_ms is not None:
            out["duration_ms"] = w.duration_ms
        out.update({
            "input_sizes": w.input_sizes, "input_dtypes": w.input_dtypes,
            "output_sizes": w.output_sizes, "output_dtypes": w.output_dtypes,
            "state": state,
            "time_discovered_started_ns": w.discovered_started_ns if
            w.discovered_started_ns is not None else unset,
            "time_discovered_completed_ns": w.discovered_completed_ns if
            w.discovered_completed_ns is not None else unset,
            "retired": w.retired, "timeout_ms": w.timeout_ms, "is_p2p": w.is_p2p,
        })
        return out


def pickle_bytes(dump: dict[str, Any]) -> bytes:
    """The dump as PyTorch writes it: one protocol-2 pickle of plain data."""
    return pickle.dumps(dump, protocol=2)


def nvrx_json(dump: dict[str, Any], *, gpu_ok: bool = True) -> str:
    """The dump as an NVRx-style collector writes it: the pickle's dict through
    ``json.dump`` (tuples become lists, ``None`` stays ``null``), with the collector's
    health checks added."""
    data = dict(dump)
    data["health_check_results"] = {
        "gpu": {"status": "Healthy" if gpu_ok else "Failed", "output": ""},
        "nic": {"status": "Healthy", "output": ""},
    }
    return json.dumps(data, indent=4)
