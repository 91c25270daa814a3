"""A recording rank's progress record for ``commscope watch``, published in the job's store.

The watchdog thread calls :meth:`Publisher.tick` on every round; every
``watch_interval_s`` it builds a small record (:mod:`commscope.flight.out.progress`) and writes
it with its own store client (a clone of the rendezvous TCPStore, never the one the main
thread uses), so publishing never waits behind or in front of a collective. Building a
record takes a snapshot of the ring (the ring's lock, a few microseconds) and formats
the newest and the unfinished records; nothing else of the hot path changes.

Every rank publishes under the job's one token, which the ranks of all hosts agree on
through the store (``rec.watch_token``, :func:`commscope.flight.record.job.agree_token`).
Rank 0 also writes the job's description, and the first rank of every host writes that
host's watch file (``COMMSCOPE_WATCH_FILE``, which ``commscope run`` sets, else
``watch.json`` beside the dumps) with the store's address and the token, readable by the
owner only, so ``commscope watch`` and ``commscope dump`` attach from any host.

On each round it also looks at ``commscope dump``'s request counter: a request counts
only with its proof (an HMAC keyed with the token, :mod:`commscope.flight.out.requests`),
and the rank dumps on request at most once every
:data:`~commscope.flight.out.progress.DUMP_REQUEST_EVERY_S`. What a record holds is
readable by whoever reaches the store (docs/watch.md, "Security").
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
import time
from typing import Any

from commscope.flight.out import progress
from commscope.flight.out.handlers import handler_list, issued_in_handlers, signal_handler_codes
from commscope.flight.out.requests import WINDOW, ProvenRequests, RateLimit
from commscope.flight.out.threads import walk_stack
from commscope.flight.record.agree.fingerprint import PUBLISHED
from commscope.flight.record.agree.fingerprint import fields as fingerprint_fields
from commscope.flight.record.entry import COMPLETED, frame_dicts
from commscope.flight.record.groups import device_backends
from commscope.flight.record.recorder import Recorder
from commscope.flight.record.stack import trim_to_user

__all__ = ["Publisher", "root_store", "store_address", "set_step", "TOKEN_ENV", "FILE_ENV"]

logger = logging.getLogger(__name__)
_START_SLACK_NS = 1_000_000_000
"""A request this much older than the rank's start still counts as made after it (the
asker's clock may be on another host)."""

TOKEN_ENV = "COMMSCOPE_WATCH_TOKEN"
FILE_ENV = "COMMSCOPE_WATCH_FILE"
_MAIN_FRAMES = 12
_MAX_UNFINISHED = 32
_P2P_HISTORY = 12
"""The newest send/recv records every progress record keeps."""
_step: dict[str, Any] = {"value": None}


def set_step(step: int | None) -> None:
    """Mark the training step this rank is in (shown by ``commscope watch``)."""
    _step["value"] = None if step is None else int(step)


def root_store(store: Any) -> Any:
    """The store under every ``PrefixStore`` wrapper (the rendezvous TCPStore)."""
    root = store
    while hasattr(root, "underlying_store"):
        root = root.underlying_store
    return root


def store_address(store: Any) -> str | None:
    """``host:port`` of a TCPStore, else ``None``."""
    root = root_store(store)
    if type(root).__name__ != "TCPStore":
        return None
    try:
        return f"{root.host}:{root.port}"
    except Exception:
        return None


class P2PChannels:
    """How many sends and recvs this rank has issued on each channel (group, op, peer),
    and each recent op's place on its channel (its ordinal), counted as the ring fills.

    A progress record holds a few records only; with these the watcher pairs the k-th
    send of one rank with the k-th recv of its peer as the analysis of full dumps does.
    When the ring dropped records between two looks (or had wrapped before the first),
    the counts are not the job's own any more and are left out."""

    def __init__(self) -> None:
        self.totals: dict[tuple[str, str, int], int] = {}
        self.ordinals: dict[int, int] = {}
        self.seen = -1
        self.exact = True

    def update(self, entries: list[Any]) -> None:
        """Count the records not seen before (``entries``: the ring, oldest first)."""
        if not self.exact or not entries:
            return
        if entries[0].record_id > self.seen + 1:
            self.exact = False  # records went by unseen: no count is whole any more
            return
        for e in entries:
            if e.record_id <= self.seen:
                continue
            if e.is_p2p and isinstance(e.peer, int) and e.peer >= 0:
                key = (e.pg_name, _p2p_op(e.profiling_name), e.peer)
                self.ordinals[e.record_id] = self.totals.get(key, 0)
                self.totals[key] = self.totals.get(key, 0) + 1
        self.seen = entries[-1].record_id
        oldest = entries[0].record_id
        if self.ordinals and min(self.ordinals) < oldest:
            self.ordinals = {k: v for k, v in self.ordinals.items() if k >= oldest}

    def fields(self, kept: list[Any]) -> dict[str, Any]:
        """``commscope_p2p_channels`` and ``commscope_p2p_ordinals`` for a record holding
        ``kept`` (nothing when the counts are not exact, or no send/recv was issued)."""
        if not self.exact or not self.totals:
            return {}
        ordinals = {str(e.record_id): self.ordinals[e.record_id] for e in kept
                    if e.record_id in self.ordinals}
        return {"commscope_p2p_channels": [[g, op, peer, n] for (g, op, peer), n
                                           in sorted(self.totals.items())],
                "commscope_p2p_ordinals": ordinals}


def _p2p_op(profiling_name: str) -> str:
    """``send`` or ``recv`` of a profiling name such as ``gloo:send 0->1``."""
    name = profiling_name.partition(":")[2] or profiling_name
    return name.split(" ", 1)[0]


def _first_on_host() -> bool:
    """Whether this process is its host's first rank (``LOCAL_RANK`` 0, or Slurm's and
    Open MPI's local id 0); with no launcher saying, every rank counts as first (they
    then write the same watch file, atomically)."""
    for name in ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"):
        text = os.environ.get(name)
        if text is not None:
            return text.strip() == "0"
    return True


class Publisher:
    """Publishes this rank's progress record every ``interval_s`` (see module doc)."""

    def __init__(self, rec: Recorder, interval_s: float) -> None:
        self.rec = rec
        self.interval_s = interval_s
        self.token = os.environ.get(TOKEN_ENV, "")
        """This host's token until the ranks agree on the job's (``rec.watch_token``)."""
        self.tid = progress.token_id(self.token)
        self._store: Any = None
        self._store_source: Any = None
        self._last = -1e9
        self._count = 0
        self._config_sig: Any = None
        self._requests: ProvenRequests | None = None
        self._started_ns = time.time_ns()
        """When this rank began (its recorder's publisher was made): requests made
        before it are an earlier attempt's; later ones it answers, even when its first
        look at the store comes after them."""
        """``commscope dump``'s requests (under this token) read so far."""
        self._requests_key = ""
        self._dump_limit = RateLimit(1, progress.DUMP_REQUEST_EVERY_S)
        self.dump_requested = False
        self.errors = 0
        self.busy_s = 0.0
        self._version = 0
        self._last_content = b""
        """Wall time spent publishing so far (building, encoding, the store calls)."""
        self._channels = P2PChannels()
        self._note: dict[str, Any] | None = None
        self._thread: threading.Thread | None = None
        """The watchdog thread, which alone uses this publisher's store client."""

    def _client(self) -> Any:
        source = self.rec.store
        if source is None:
            return None
        agreed = self.rec.watch_token
        if agreed and agreed != self.token:
            # every host's ranks publish under the one token they agreed on
            self.token, self.tid = agreed, progress.token_id(agreed)
            self._store_source = None
        if source is not self._store_source:
            self._store_source = source
            root = root_store(source)
            try:
                self._store = root.clone() if type(root).__name__ == "TCPStore" else root
            except Exception:
                self._store = root
            self._announce()
        return self._store

    def _announce(self) -> None:
        store = self._store
        if store is None:
            return
        if _first_on_host():
            self._write_file()  # every host gets its own watch file
        if self.rec.global_rank != 0:
            return
        try:
            store.add(progress.JOBS_KEY, 1)
            meta = {"world_size": self.rec.world_size, "interval_s": self.interval_s,
                    "dump_prefix": os.path.abspath(self.rec.config.dump_prefix),
                    "host": socket.gethostname(), "started_ns": time.time_ns()}
            store.set(progress.meta_key(self.tid), json.dumps(meta))
        except Exception as exc:
            logger.debug("commscope watch: could not announce the job: %r", exc)

    def _write_file(self) -> None:
        address = store_address(self._store_source)
        if address is None:
            return  # a FileStore or HashStore: nothing another process could attach to
        path = os.environ.get(FILE_ENV) or os.path.join(
            os.path.dirname(os.path.abspath(self.rec.config.dump_prefix)), "watch.json")
        data = {"store": address, "token": self.token, "world_size": self.rec.world_size,
                "dump_prefix": os.path.abspath(self.rec.config.dump_prefix),
                "host": socket.gethostname(), "rank": self.rec.global_rank,
                "pid": os.getpid(), "written_ns": time.time_ns()}
        try:
            directory = os.path.dirname(os.path.abspath(path))
            os.makedirs(directory, exist_ok=True)
            tmp = os.path.join(directory, f".commscope-watch-{os.getpid()}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(data, f)
            os.replace(tmp, path)
        except OSError as exc:
            logger.warning("commscope watch: could not write %s: %r", path, exc)

    def tick(self, now: float | None = None) -> bool:
        """Publish when due; return whether a record was written."""
        now = time.monotonic() if now is None else now
        if now - self._last < self.interval_s:
            return False
        self._last = now
        store = self._client()
        if store is None or self.rec.global_rank < 0:
            return False
        try:
            start = time.perf_counter()
            rank = self.rec.global_rank
            self._thread = threading.current_thread()
            self._flush_note()
            self._publish_config(store)
            content = progress.encode(self.record())
            if content != self._last_content:
                self._version += 1
                store.set(progress.rank_key(self.tid, rank), content)
                self._last_content = content
            self._count += 1
            store.set(progress.beat_key(self.tid, rank),
                      progress.encode_beat(self._count, self._version, time.time_ns()))
            self._look_for_dump_request(store)
            self.busy_s += time.perf_counter() - start
            return True
        except Exception as exc:  # a store that went away: try again next time
            self.errors += 1
            if self.errors in (1, 10, 100):
                logger.warning("commscope watch: could not publish (%d failures): %r",
                               self.errors, exc)
            return False

    def _look_for_dump_request(self, store: Any) -> None:
        key = progress.dump_key(self.tid)
        n = int(store.add(key, 0)) if store.check([key]) else 0
        requests = self._requests
        tid, token = self.tid, self.token
        if requests is None or self._requests_key != key:
            # requests made before this rank started (or under another token) are old
            # news; those made since (it may look the first time well after starting)
            # are not. A request with no time (an older asker) counts as old.
            seen = n
            while seen > max(0, n - WINDOW):
                time_key = progress.dump_time_key(tid, seen)
                asked = bytes(store.get(time_key)) if store.check([time_key]) else b""
                if not asked.isdigit() or int(asked) < self._started_ns - _START_SLACK_NS:
                    break
                seen -= 1
            requests = self._requests = ProvenRequests("`commscope dump` request", seen=seen)
            self._requests_key = key
            if seen == n:
                return

        def read(i: int) -> bytes | None:
            proof_key = progress.dump_proof_key(tid, i)
            return bytes(store.get(proof_key)) if store.check([proof_key]) else None

        def proven(i: int, raw: bytes) -> bool | None:
            return progress.is_proof(raw, progress.dump_proof(token, tid, i)) or None

        def named(i: int) -> str:
            return f"{progress.dump_proof_key(tid, i)} (request {i})"

        if requests.look(n, read, proven, named):
            self.dump_requested = True

    def note_dump(self, path: str, reason: str, count: int) -> None:
        """Say, through the store, where this rank wrote its newest dump (``host:path``).
        Written at once from the watchdog thread (the one thread that uses this client),
        else at its next round."""
        try:
            size: int | None = os.path.getsize(path)
        except OSError:
            size = None
        self._note = {"host": socket.gethostname(), "path": path, "reason": reason,
                      "count": count, "bytes": size, "time_ns": time.time_ns()}
        if threading.current_thread() is self._thread:
            self._flush_note()

    def _flush_note(self) -> None:
        note, store = self._note, self._store
        if note is None or store is None or self.rec.global_rank < 0:
            return
        try:
            store.set(progress.dumped_key(self.tid, self.rec.global_rank),
                      json.dumps(note, separators=(",", ":")))
            self._note = None
        except Exception as exc:
            logger.debug("commscope watch: could not note the dump: %r", exc)

    def take_dump_request(self, now: float | None = None) -> bool:
        """Whether to dump now for ``commscope dump`` (a proven request came since the
        last dump on request): at most once every
        :data:`~commscope.flight.out.progress.DUMP_REQUEST_EVERY_S`; a request inside that
        time waits for it to pass, and every request that came meanwhile is answered by
        that one dump."""
        if not self.dump_requested or not self._dump_limit.allow(now):
            return False
        self.dump_requested = False
        return True

    def _publish_config(self, store: Any) -> None:
        groups = list(self.rec.groups)
        sig = tuple((g.name, g.pg_id) for g in groups)
        if sig == self._config_sig:
            return
        config = {g.name: g.config() for g in groups}
        for g in groups:
            if g.pg_id == 0 and len(config[g.name].get("ranks", "")) > 64:
                # the default group is the whole world (the analyzer knows): not 24 KB a
                # rank at 4 096 ranks
                config[g.name] = {**config[g.name], "ranks": "[]"}
        store.set(progress.config_key(self.tid, self.rec.global_rank), json.dumps(config))
        self._config_sig = sig

    def record(self) -> dict[str, Any]:
        """The progress record of this rank now (see :mod:`commscope.flight.out.progress`);
        nothing in it changes while the rank stands still (no clock, no counter)."""
        rec = self.rec
        entries = rec.ring.snapshot()
        n = len(entries)
        chosen = set(range(max(0, n - progress.RECORD_ENTRIES), n))
        unfinished = [i for i in range(n) if not entries[i].retired
                      and entries[i].state != COMPLETED]
        chosen.update(unfinished[:_MAX_UNFINISHED])
        # the newest record of every group (its frontier), found from the end
        seen: set[tuple[str, bool]] = set()
        wanted = len(rec.groups) * 2
        for i in range(n - 1, -1, -1):
            key = (entries[i].pg_name, entries[i].is_p2p)
            if key not in seen:
                seen.add(key)
                chosen.add(i)
                if len(seen) >= wanted:
                    break
        # the newest send/recv ops: a pipeline stage's schedule shows where it broke
        p2p = [i for i in range(n - 1, -1, -1) if entries[i].is_p2p][:_P2P_HISTORY]
        chosen.update(p2p)
        self._channels.update(entries)
        keep = [entries[i] for i in sorted(chosen)]
        cache: dict[Any, Any] = {}
        table: list[dict[str, Any]] = []
        index: dict[int, int] = {}
        out_entries = []
        agree: dict[str, list[Any]] = {}
        for e in keep:
            if e.agree is not None:
                root, op, in_splits, out_splits = e.agree
                agree[str(e.record_id)] = [root, op, in_splits and list(in_splits),
                                           out_splits and list(out_splits)]
            refs = []
            for frame in frame_dicts(trim_to_user(e.frames, progress.RECORD_FRAMES), cache):
                at = index.get(id(frame))
                if at is None:
                    at = index[id(frame)] = len(table)
                    table.append(frame)
                refs.append(at)
            ins = [[int(d) for d in sz] for sz in e.input_sizes]
            outs = [[int(d) for d in sz] for sz in e.output_sizes]
            in_dt, out_dt = list(e.input_dtypes), list(e.output_dtypes)
            out_entries.append([
                e.record_id, e.pg_id, e.pg_name, e.pg_desc, e.collective_seq_id,
                e.p2p_seq_id, e.profiling_name, e.time_created_ns, ins, in_dt,
                None if outs == ins else outs, None if out_dt == in_dt else out_dt,
                e.state, e.retired, e.is_p2p, e.peer, e.failed, refs,
            ])
        main = threading.main_thread().ident
        frame = sys._current_frames().get(main) if main is not None else None
        handlers = signal_handler_codes()
        signals: dict[str, Any] = {}
        if handlers:  # a collective issued from a signal handler is not where it stopped
            signals["commscope_signal_handlers"] = handler_list(handlers)
            marked = issued_in_handlers(keep, handlers)
            if marked:
                signals["commscope_signal_records"] = marked
        channels = self._channels.fields(keep)
        if agree:  # beside the entries: an older reader's fixed-length entry lists stay
            signals["commscope_agree"] = agree
        prints = fingerprint_fields(rec.groups, bits=32, last=PUBLISHED)
        if prints is not None:
            signals["commscope_fingerprints"] = prints
        return {**signals, **channels,
            "commscope_watch": progress.VERSION,
            "rank": rec.global_rank,
            "world_size": rec.world_size,
            "pid": os.getpid(),
            "hostname": socket.gethostname(),
            "interval_s": self.interval_s,
            "progress": {g.name: [g.desc, g.last_enqueued, g.last_completed]
                         for g in rec.groups},
            "commscope_pg_ids": {g.name: g.pg_id for g in rec.groups},
            "entries": out_entries,
            "frame_table": table,
            "commscope_threads": [{"name": "MainThread", "main": True,
                                   "frames": walk_stack(frame, _MAIN_FRAMES)}],
            "commscope_step": _step["value"],
            "commscope_device_backends": sorted(device_backends()),
            "commscope_device_done_ns": rec.device_done_ns or None,
            "commscope_clock": rec.clock.to_dict() if rec.clock is not None else None,
            # the groups being created now (a member that never comes blocks them)
            "commscope_group_creations": [
                c.to_dict(cache) for c in rec.creations.pending()[:_MAX_UNFINISHED]],
        }
