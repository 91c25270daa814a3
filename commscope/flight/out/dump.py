"""Dump files: what goes in them, how they are named and how they are written.

One file per rank, ``<prefix><global rank>``, a pickle of plain dicts, lists, tuples,
strings, numbers, booleans and ``None`` in PyTorch's schema "2.10" (so PyTorch's own
``fr_trace`` reads it), or the same dict as JSON (``.json``), optionally gzipped
(``.gz``). A file is written to a hidden temporary name in the same directory
(``.commscope-<pid>-<thread>-<n>.tmp``, which contains no rank-file prefix), flushed, fsynced and
renamed over the final name: a process killed mid-dump leaves either the previous complete
file or none, never a partial one.
"""

from __future__ import annotations

import contextlib
import gzip
import itertools
import json
import os
import pickle
import re
import socket
import threading
import time
from typing import Any

from commscope import __version__
from commscope.flight.out.handlers import handler_list, issued_in_handlers, signal_handler_codes
from commscope.flight.out.threads import exception_record, thread_stacks
from commscope.flight.record.agree.fingerprint import fields as fingerprint_fields
from commscope.flight.record.entry import COMPLETED, entry_to_dict
from commscope.flight.record.groups import device_backends
from commscope.flight.record.recorder import Recorder

__all__ = [
    "SCHEMA_VERSION",
    "FORMAT",
    "build_dump",
    "dump_path",
    "incident_reason",
    "later_path",
    "serialize",
    "write_atomic",
    "Dumper",
]

SCHEMA_VERSION = "2.10"
"""PyTorch 2.13's flight-recorder schema string (``fr_trace`` insists all files agree)."""
FORMAT = "commscope.flight/1"
"""How :mod:`commscope.analyze` tells our dumps from PyTorch-native ones."""
PICKLE_PROTOCOL = 4


def _rank(rec: Recorder) -> int:
    if rec.global_rank >= 0:
        return rec.global_rank
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def _comm_lib_version(rec: Recorder) -> str:
    if any("nccl" in g.backends.values() for g in rec.groups):
        try:
            import torch

            return ".".join(str(v) for v in torch.cuda.nccl.version())
        except Exception:
            return ""
    return ""


def build_dump(
    rec: Recorder,
    reason: str,
    *,
    include_collectives: bool = True,
    include_stack_traces: bool = True,
    only_active: bool = False,
    exception: BaseException | None = None,
) -> dict[str, Any]:
    """The dump dict of this rank right now (see ``docs/flight.md``, "Dump format").

    ``only_active`` keeps only entries not yet completed; ``include_collectives=False``
    leaves ``entries`` empty; ``include_stack_traces=False`` leaves every ``frames``
    empty and ``commscope_threads`` out. ``exception``: the exception that triggered
    the dump (``commscope_exception``). Never raises for a half-updated entry: fields
    are read as they are.
    """
    if rec.unwaited:
        rec.check_unwaited()  # async ops handed out and not waited on: done already?
    if rec.polled:
        rec.poll()  # device-side works (NCCL): learn what completed since the last poll
    groups = list(rec.groups)
    out: dict[str, Any] = {
        "version": SCHEMA_VERSION,
        "commscope_format": FORMAT,
        "commscope_version": __version__,
        "rank": _rank(rec),
        "world_size": rec.world_size,
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "dump_reason": reason,
        "dump_time_ns": time.time_ns(),
        "pg_config": {g.name: g.config() for g in groups},
        "pg_status": {str(g.pg_id): g.status() for g in groups},
        "comm_lib_version": _comm_lib_version(rec),
        "commscope_only_active": only_active,
        "commscope_pg_ids": {g.name: g.pg_id for g in groups},
        "commscope_device_backends": sorted(device_backends()),
        "entries": [],
    }
    if include_stack_traces:
        out["commscope_threads"] = thread_stacks(rec.config.max_frames)
        handlers = signal_handler_codes()
        if handlers:
            # where a stack passes through one of these, a signal interrupted the program
            out["commscope_signal_handlers"] = handler_list(handlers)
    if exception is not None:
        out["commscope_exception"] = exception_record(exception, rec.config.max_frames)
    if rec.job is not None:
        out["commscope_job"] = dict(rec.job)
    if rec.place is not None:
        out["commscope_place"] = dict(rec.place)
    if rec.thread_deaths:
        out["commscope_thread_deaths"] = list(rec.thread_deaths)
    if rec.clock is not None:
        out["commscope_clock"] = rec.clock.to_dict()
    table = rec.hosts.table if rec.hosts is not None else None
    if table is not None:
        out["commscope_hosts"] = table
    prints = fingerprint_fields(rec.groups)
    if prints is not None:
        out["commscope_fingerprints"] = prints
    cache: dict[Any, Any] = {}
    creations = rec.creations.snapshot()
    if only_active:
        creations = [c for c in creations if c.pending]
    out["commscope_group_creations"] = [c.to_dict(cache, include_stack_traces)
                                        for c in creations]
    if include_collectives:
        entries = rec.ring.snapshot()
        if only_active:
            entries = [e for e in entries if e.state != COMPLETED]
        out["entries"] = [entry_to_dict(e, cache, include_stack_traces) for e in entries]
        handlers = signal_handler_codes()
        if handlers:
            marked = issued_in_handlers(entries, handlers)
            if marked:
                # record id -> signal: issued from a signal handler (Lightning's SIGTERM
                # handler broadcasts), not where the rank's program stopped
                out["commscope_signal_records"] = marked
    return out


def dump_path(prefix: str, rank: int, dump_format: str = "pickle", compress: bool = False) -> str:
    """``<prefix><rank>``, plus ``.json`` for JSON and ``.gz`` when compressed."""
    path = f"{prefix}{rank}"
    if dump_format == "json":
        path += ".json"
    if compress:
        path += ".gz"
    return path


LATER_DIR = "commscope_later"
"""Folder, beside the dumps, of the dumps written after the first one of an incident."""
_CALM_REASONS = ("api", "request from commscope dump", "signal SIGUSR1")


def incident_reason(reason: str) -> bool:
    """Whether a dump of this reason starts an incident (see :meth:`Dumper.dump`); a
    thread's death does not (the rank may go on, or hang later: that keeps its file)."""
    return reason not in _CALM_REASONS and not reason.startswith("exception in thread")


def later_path(prefix: str, rank: int, reason: str, dump_format: str = "pickle",
               compress: bool = False) -> str:
    """``<dir>/commscope_later/<rank>.<reason>.pkl`` (``.json``, ``.gz``): a name with
    neither the dump prefix in it nor a number at its end, so that PyTorch's ``fr_trace``
    (which reads every file whose name contains the prefix) never takes it for a rank's
    dump, and ours sets the folder aside."""
    slug = re.sub(r"[^a-z0-9]+", "-", reason.lower()).strip("-") or "dump"
    name = f"{rank}.{slug}.{'json' if dump_format == 'json' else 'pkl'}"
    if compress:
        name += ".gz"
    return os.path.join(os.path.dirname(prefix), LATER_DIR, name)


def serialize(data: dict[str, Any], dump_format: str = "pickle", compress: bool = False) -> bytes:
    """The bytes of a dump file: pickle (protocol 4) or UTF-8 JSON, maybe gzipped."""
    if dump_format == "json":
        raw = json.dumps(data, separators=(",", ":")).encode("utf-8")
    elif dump_format == "pickle":
        raw = pickle.dumps(data, protocol=PICKLE_PROTOCOL)
    else:
        raise ValueError(f"dump_format must be 'pickle' or 'json', got {dump_format!r}")
    return gzip.compress(raw, compresslevel=6) if compress else raw


_WRITES = itertools.count()


def write_atomic(path: str, data: bytes) -> str:
    """Write ``data`` to ``path`` so that no reader ever sees a partial file.

    Creates the directory when missing. Returns the absolute path.
    """
    path = os.path.abspath(path)
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    # The temporary name must not contain the file's own name: PyTorch's fr_trace
    # takes every file whose name contains the prefix ("rank_") and parses the rest
    # as a rank, so a leftover "rank_3.tmp" (process killed mid-dump) would break it.
    # One name per write: two threads of a rank may dump at once (the watchdog's timeout
    # dump and a signal handler's), and a shared name lets one replace the other's file.
    tmp = os.path.join(directory, f".commscope-{os.getpid()}-{threading.get_ident()}-"
                                  f"{next(_WRITES)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    try:
        dir_fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return path
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)
    return path


class Dumper:
    """Writes this rank's dump file; one dump at a time, from any thread."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        self._lock = threading.Lock()
        self.last_path: str | None = None
        self.last_reason: str | None = None
        self.count = 0
        self.owner: int | None = None
        """The thread writing a dump right now (``None`` when idle)."""
        self.incident: str | None = None
        """The reason of the first incident dump (the one the rank's file keeps)."""
        self.exception: BaseException | None = None
        """The uncaught exception a dump was written for: every later dump of this
        process keeps it (a rank that raised and is then stopped by torchrun's SIGTERM
        still says why it went down)."""

    def path(self, dump_format: str | None = None) -> str:
        """Where this rank's dump goes."""
        cfg = self.rec.config
        return dump_path(
            cfg.dump_prefix, _rank(self.rec), dump_format or cfg.dump_format, cfg.compress
        )

    def dump(self, reason: str, path: str | None = None, dump_format: str | None = None,
             exception: BaseException | None = None, fatal: bool = False) -> str:
        """Write the dump now and return its absolute path (``exception``: what
        triggered it, kept in the file; ``fatal``: it ends the process, so every later
        dump keeps it too).

        The first dump of an incident (any reason but an ``api`` call, a ``commscope
        dump`` request or SIGUSR1, which ask for a dump on demand: a timeout, an error,
        SIGTERM, an exception, another rank's request) keeps the rank's file; later
        dumps of this process go beside it, into ``commscope_later/<rank>.<reason>.<ext>``
        (:func:`later_path`), so the state at the hang is never replaced by the state on
        the way down.
        """
        cfg = self.rec.config
        fmt = dump_format or cfg.dump_format
        with self._lock:
            self.owner = threading.get_ident()
            try:
                if path is None:
                    path = self.path(fmt)
                    if self.incident is not None:
                        path = later_path(cfg.dump_prefix, _rank(self.rec), reason, fmt,
                                          cfg.compress)
                    elif incident_reason(reason):
                        self.incident = reason
                if exception is not None and fatal and self.exception is None:
                    self.exception = exception
                kept = exception or self.exception
                built = build_dump(self.rec, reason, exception=kept)
                if "commscope_place" in built:
                    built["commscope_place"]["path"] = os.path.abspath(path)
                data = serialize(built, fmt, cfg.compress)
                written = write_atomic(path, data)
                self.last_path, self.last_reason = written, reason
                self.count += 1
            finally:
                self.owner = None
        return written
