"""Attach to a running job's store and fetch every rank's progress record.

Algorithm (:class:`StoreSource`):

1. The address comes from ``--store HOST:PORT`` (with ``--token``) or from the watch
   file ``commscope run`` writes (``commscope_traces/watch.json``: address, token, world
   size). A TCPStore *client* is opened (``is_master=False``, a short timeout): watching
   never creates, changes or deletes anything the job uses.
2. The token selects the key namespace (:func:`commscope.flight.out.progress.token_id`). No
   ``meta`` key under it: if some job publishes in this store (the ``jobs`` counter),
   the token is wrong and the watcher is refused; otherwise nothing publishes here.
3. One refresh fetches every rank's heartbeat in one round trip (``multi_get``), then,
   in one more, only the records whose version changed since the last refresh (a
   stuck job's records do not change). A ``multi_get`` waits for keys that do not
   exist yet, so it runs only when ``check(keys)`` says all exist; otherwise the ranks
   not there yet are found by bisection with ``check`` (a few round trips). A rank
   whose beat count has not grown for a while (this watcher's clock, so clocks of
   other hosts do not matter) is *quiet*; one first seen with an old record, since
   that record's time (moved onto rank 0's clock, through the offsets measured).
4. Groups (``config/<r>``) are fetched once, and again for a rank whose record shows a
   group it did not have.
5. A record that does not parse is named and skipped; a store that goes away (the job
   ended, or the host serving it died) raises :class:`WatchError` with one sentence
   naming that host, never a traceback, within the client's timeout (5 s).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from commscope.flight.out import progress
from commscope.flight.record.clock import measure_offset
from commscope.watch.address import (
    DEFAULT_WATCH_FILE,
    Address,
    WatchError,
    check_listening,
    parse_address,
    reachable_host,
    read_watch_file,
)

__all__ = ["WatchError", "Address", "read_watch_file", "parse_address", "StoreSource",
           "quiet_native_stderr", "record_offset_ns",
           "Fetched", "Beat", "DEFAULT_WATCH_FILE"]

_CONNECT_TRY_S = 1.0
_CHUNK = 1024
"""Keys per store call: TCPStore's check and multi_get cost grows faster than linearly
with the keys of one call (16 384 beats: 0.44 s in one multi_get, 0.05 s in 16)."""


@dataclass(frozen=True)
class Beat:
    """What a rank's heartbeat says, and what this watcher saw of it."""

    beats: int
    version: int
    """The version of the rank's record (changes only with its content)."""
    time_ns: int
    """The rank's own clock when it last published."""
    quiet_s: float
    """Seconds (this watcher's clock) since the beat count last grew; 0 on first sight.
    A rank first seen with an old record counts as quiet since that record's time (its
    clock moved onto rank 0's, as this watcher's), so a rank already silent when the
    watcher attached stays silent on the next refreshes."""


@dataclass
class Fetched:
    """One refresh: every rank's record that could be read."""

    records: dict[int, dict[str, Any]]
    configs: dict[int, dict[str, Any]]
    missing: list[int]
    """Ranks that never published."""
    bad: list[tuple[int, str]] = field(default_factory=list)
    """(rank, why) for values that do not parse."""
    meta: dict[str, Any] = field(default_factory=dict)
    beats: dict[int, Beat] = field(default_factory=dict)
    changed: set[int] = field(default_factory=set)
    """Ranks whose record was fetched anew this refresh (their content changed)."""
    clock_offset_ns: int = 0
    """The watcher's clock minus rank 0's (0 when not measured)."""


class StoreSource:
    """Reads a job's progress records from its TCPStore (see module doc)."""

    def __init__(self, address: Address, timeout_s: float = 5.0, store: Any = None) -> None:
        self.address = address
        self.tid = progress.token_id(address.token)
        self._timeout_s = timeout_s
        self._store = store
        self.meta: dict[str, Any] = {}
        self.world_size: int | None = address.world_size
        self._configs: dict[int, dict[str, Any]] = {}
        self._config_groups: dict[int, set[str]] = {}
        self._records: dict[int, dict[str, Any]] = {}
        self._versions: dict[int, int] = {}
        self._seen: dict[int, tuple[int, float]] = {}
        self.clock_offset_ns = 0
        """This watcher's clock minus rank 0's, measured once when attaching."""
        """Rank → (beat count, when this watcher saw it change)."""

    # ------------------------------------------------------------------ connecting

    def connect(self) -> None:
        """Open the client and check the token (steps 1-2)."""
        if self._store is None:
            try:
                from torch.distributed import TCPStore
            except ImportError as exc:  # pragma: no cover - torch is a dependency
                raise WatchError(f"commscope watch needs torch.distributed ({exc})") from None
            host = reachable_host(self.address.host, self.address.port) or self.address.host
            # A store's first handshake is sometimes lost and the client then waits out
            # its whole timeout (seen: 5 s, one connect in ten, against torchrun's store):
            # short attempts, a few of them, then the real timeout for every call.
            attempts = max(1, int(self._timeout_s / _CONNECT_TRY_S))
            for attempt in range(attempts):
                try:
                    with quiet_native_stderr():
                        self._store = TCPStore(host, self.address.port, is_master=False,
                                               timeout=timedelta(seconds=_CONNECT_TRY_S),
                                               wait_for_workers=False)
                    self._store.set_timeout(timedelta(seconds=self._timeout_s))
                    break
                except Exception as exc:
                    # a job that ends while we connect (its dying process still held the
                    # port when we looked) is told as ended, not as a timeout
                    check_listening(self.address)
                    if attempt == attempts - 1:
                        raise WatchError(f"cannot reach the job's store at {self.address}: "
                                         f"{_short(exc)} (has the job ended?)") from None
        meta_key = progress.meta_key(self.tid)
        if not self._exists([meta_key]):
            if self._exists([progress.JOBS_KEY]):
                raise WatchError(f"refused: a commscope job publishes at {self.address}, but "
                                 "not under this token (take the token from the job's "
                                 "watch file)")
            raise WatchError(f"no commscope job publishes at {self.address} yet (is the "
                             "flight recorder on, with COMMSCOPE_WATCH_INTERVAL_S > 0?)")
        try:
            self.meta = json.loads(self._get(meta_key))
        except (ValueError, TypeError):
            self.meta = {}
        world = self.meta.get("world_size") if isinstance(self.meta, dict) else None
        if type(world) is int and world > 0:
            self.world_size = world
        if not self.world_size:
            raise WatchError(f"the job at {self.address} does not say its world size")
        offset = measure_offset(self._store, self.tid)  # rank 0 answers: one round trip
        self.clock_offset_ns = offset.offset_ns if offset is not None else 0

    # ------------------------------------------------------------------ store calls

    def _call(self, what: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:
            raise WatchError(f"the job's store at {self.address} stopped answering ({what}: "
                             f"{_short(exc)}): the job has ended, or {self.address.host}, "
                             "the host that serves it, is down") from None

    def _exists(self, keys: list[str]) -> bool:
        return all(self._call("check", self._store.check, keys[i:i + _CHUNK])
                   for i in range(0, len(keys), _CHUNK))

    def _get(self, key: str) -> bytes:
        return bytes(self._call("get", self._store.get, key))

    def _multi_get(self, keys: list[str]) -> list[bytes]:
        if not keys:
            return []
        if hasattr(self._store, "multi_get"):
            out: list[bytes] = []
            for i in range(0, len(keys), _CHUNK):  # the store's cost grows faster than
                out += map(bytes, self._call(    # linearly with one call's key count
                    "multi_get", self._store.multi_get, keys[i:i + _CHUNK]))
            return out
        return [self._get(k) for k in keys]

    def _present(self, keys: list[str]) -> list[int]:
        """Indices of ``keys`` that exist (step 3: bisection with ``check``)."""
        out: list[int] = []
        todo = [(0, len(keys))]
        while todo:
            a, b = todo.pop()
            if a >= b:
                continue
            if self._exists(keys[a:b]):
                out.extend(range(a, b))
            elif b - a > 1:
                mid = (a + b) // 2
                todo += [(a, mid), (mid, b)]
        return sorted(out)

    # ------------------------------------------------------------------ refreshing

    def fetch(self) -> Fetched:
        """Every rank's newest record, and the groups (steps 3-5): all heartbeats in one
        round trip, then only the records whose version changed in another."""
        if self._store is None:
            self.connect()
        assert self.world_size is not None
        now = time.monotonic()
        ranks = list(range(self.world_size))
        keys = [progress.beat_key(self.tid, r) for r in ranks]
        present = list(range(len(keys))) if self._exists(keys) else self._present(keys)
        raw_beats = self._multi_get([keys[i] for i in present])
        bad: dict[int, str] = {}
        beats: dict[int, Beat] = {}
        for i, raw in zip(present, raw_beats):
            r = ranks[i]
            try:
                count, version, t = progress.decode_beat(raw)
            except progress.RecordError as exc:
                bad[r] = str(exc)
                continue
            seen = self._seen.get(r)
            if seen is None or count != seen[0]:
                self._seen[r] = (count, now)
                quiet = 0.0
            else:
                quiet = now - seen[1]
            beats[r] = Beat(count, version, t, quiet)
        first = [r for r, b in beats.items() if b.quiet_s == 0.0
                 and self._seen.get(r, (None, None))[1] == now and r not in self._records]
        stale = [r for r, b in beats.items() if self._versions.get(r) != b.version]
        values = self._multi_get([progress.rank_key(self.tid, r) for r in stale])
        for r, raw in zip(stale, values):
            try:
                rec = progress.decode(raw)
                if rec.get("rank") != r:
                    raise progress.RecordError(f"holds rank {rec.get('rank')!r}")
            except progress.RecordError as exc:
                bad[r] = str(exc)
                self._records.pop(r, None)
                self._versions.pop(r, None)
                continue
            self._records[r] = rec
            self._versions[r] = beats[r].version
        records = {r: self._records[r] for r in beats if r in self._records and r not in bad}
        watcher_ns = time.time_ns() - self.clock_offset_ns  # on rank 0's clock
        for r in first:  # quiet since its record's time, not since we first looked
            if r in records:
                age_s = (watcher_ns - (beats[r].time_ns - record_offset_ns(records[r]))) / 1e9
                self._seen[r] = (beats[r].beats, now - max(0.0, age_s))
        self._refresh_configs({r: records[r] for r in stale if r in records})
        missing = [r for r in ranks if r not in records and r not in bad]
        return Fetched(records=records, configs=dict(self._configs), missing=missing,
                       bad=sorted(bad.items()), meta=self.meta, beats=beats,
                       changed=set(stale) & set(records), clock_offset_ns=self.clock_offset_ns)

    def _refresh_configs(self, records: dict[int, dict[str, Any]]) -> None:
        stale = []
        for r, rec in records.items():
            groups = {str(e[2]) for e in rec.get("entries", [])
                      if isinstance(e, list) and len(e) == len(progress.ENTRY_FIELDS)}
            if r not in self._configs or not groups <= self._config_groups.get(r, set()):
                stale.append(r)
        if not stale:
            return
        keys = [progress.config_key(self.tid, r) for r in stale]
        present = [stale[i] for i in self._present(keys)]
        values = self._multi_get([progress.config_key(self.tid, r) for r in present])
        for r, raw in zip(present, values):
            try:
                config = json.loads(bytes(raw).decode("utf-8"))
            except (UnicodeDecodeError, ValueError):
                continue
            if isinstance(config, dict):
                self._configs[r] = config
                self._config_groups[r] = {str(k) for k in config}

    def dump_notes(self, ranks: Sequence[int] | None = None) -> dict[int, dict[str, Any]]:
        """Rank → where it wrote its newest dump (``host``, ``path``, ``reason``,
        ``count``), for the ranks (default: all) that have noted one; a note that does
        not parse is skipped."""
        if self._store is None:
            self.connect()
        assert self.world_size is not None
        wanted = list(range(self.world_size)) if ranks is None else list(ranks)
        keys = [progress.dumped_key(self.tid, r) for r in wanted]
        present = self._present(keys)
        out: dict[int, dict[str, Any]] = {}
        for i, raw in zip(present, self._multi_get([keys[i] for i in present])):
            try:
                out[wanted[i]] = progress.decode_dumped(raw)
            except progress.RecordError:
                continue
        return out

    def key_count(self) -> int:
        """How many keys the store holds: one cheap call whose change says that some key
        was added (a first dump note, say) without asking for each."""
        return int(self._call("num_keys", self._store.num_keys))

    def request_dump(self) -> int:
        """Ask every rank to write its flight-recorder dump now (each rank sees it when
        it next publishes); return the request's number. The request carries its proof
        (:func:`commscope.flight.out.progress.dump_proof`, keyed with the token), without
        which no rank dumps; a rank dumps on request at most once every
        :data:`~commscope.flight.out.progress.DUMP_REQUEST_EVERY_S`, so a request soon
        after another is answered when that time has passed."""
        n = int(self._call("add", self._store.add, progress.dump_key(self.tid), 1))
        self._call("set", self._store.set, progress.dump_time_key(self.tid, n),
                   str(time.time_ns()))
        self._call("set", self._store.set, progress.dump_proof_key(self.tid, n),
                   progress.dump_proof(self.address.token, self.tid, n))
        return n


@contextmanager
def quiet_native_stderr() -> Iterator[None]:
    """Send what C++ code writes to file descriptor 2 nowhere while the block runs.

    torch's store client logs each failed connect at error level, with a C++ stack
    (``TORCH_CPP_LOG_LEVEL`` cannot silence errors): the failure itself reaches us as an
    exception, which we word in one sentence.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as sink:
            os.dup2(sink.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def record_offset_ns(rec: dict[str, Any] | None) -> int:
    """A record's clock offset to rank 0's (``commscope_clock``), 0 when it has none."""
    clock = rec.get("commscope_clock") if isinstance(rec, dict) else None
    off = clock.get("offset_ns") if isinstance(clock, dict) else None
    return off if type(off) is int and abs(off) < 2**62 else 0


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:160]
