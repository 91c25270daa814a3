"""Dump triggers: the per-rank watchdog thread, the job-wide request, signals, exceptions.

The watchdog wakes every ``poll_interval_s`` (0.5 s by default) and

1. polls device-side works (NCCL) for completion;
2. looks for entries pending longer than the timeout (``enable(timeout_s=)``,
   ``COMMSCOPE_FR_TIMEOUT_S``, else the group's own timeout); on a new one it dumps
   (reason ``"timeout"``) and posts a dump request in the job's store;
3. dumps after a collective ended with an error (a gloo timeout, a dead peer, a device
   error NCCL reports: ``"collective error"``) and posts a dump request, as for a
   timeout; and before a process group is aborted (``_abort_process_group``, what a
   fault-tolerance wrapper calls on a failed job: ``"abort"``) while work is unfinished;
4. reads the store: a request posted by any rank makes this rank dump too
   (``"request from rank R"``) — within one poll interval, so well under 2 s —
   unless it dumped in the last 5 s itself (two ranks timing out together). A request
   counts only with its proof (HMAC-SHA256 keyed with the rank's request secret, over
   the request's number, rank and reason: :func:`request_proof`); anything else in
   those keys, written by whoever reaches the store, is ignored and logged once
   (:mod:`commscope.flight.out.requests`). At most :data:`INCIDENT_DUMPS` dumps on other
   ranks' requests every :data:`INCIDENT_DUMPS_PER_S` seconds; the ones beyond are
   skipped (logged once).

A gloo or NCCL wait releases the GIL, so the watchdog runs while the main thread is
stuck. Signals: SIGTERM and SIGUSR1 get a Python handler that dumps and then hands
over to the previous handler (SIGTERM with the default action terminates as before;
SIGUSR1 with the default action only dumps). Because Python runs handlers only when
the main thread executes bytecode, which a thread stuck in a collective never does, a
wakeup pipe (``signal.set_wakeup_fd``) lets the watchdog see the signal at once: it
dumps, and if the main thread has not run the handler within 2 s it applies the
default action itself. Uncaught exceptions (main thread or any thread) dump before
the previous ``excepthook`` runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import select
import signal
import socket
import sys
import threading
import time
from types import FrameType
from typing import Any

from commscope.flight.out import fatal, progress
from commscope.flight.out.dump import Dumper, incident_reason
from commscope.flight.out.handlers import chain_handler
from commscope.flight.out.publish import Publisher, root_store
from commscope.flight.out.requests import ProvenRequests, RateLimit, warn_once
from commscope.flight.out.threads import exception_record
from commscope.flight.record.clock import (
    REMEASURE_S,
    clock_namespace,
    measure_offset,
    root_client,
)
from commscope.flight.record.recorder import Recorder

__all__ = ["Watchdog", "REQUEST_COUNT_KEY", "request_key", "request_value", "request_proof",
           "INCIDENT_DUMPS", "INCIDENT_DUMPS_PER_S"]

logger = logging.getLogger(__name__)

REQUEST_COUNT_KEY = "commscope_flight/dump_request_count"
_HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
_SIGNAL_DEDUP_S = 2.0
_ERROR_DUMP_INTERVAL_S = 10.0
_REQUEST_GRACE_S = 5.0
INCIDENT_DUMPS = 3
"""Dumps a rank writes on other ranks' requests, at most, in :data:`INCIDENT_DUMPS_PER_S`."""
INCIDENT_DUMPS_PER_S = 60.0


def request_key(n: int) -> str:
    """The store key holding dump request number ``n`` (:func:`request_value`)."""
    return f"commscope_flight/dump_request/{n}"


def request_proof(secret: str, n: int, rank: int | str, reason: str) -> str:
    """The proof of request number ``n``: hex HMAC-SHA256, keyed with ``secret``, of
    ``"commscope request|<n>|<rank>|<reason>"``."""
    return progress.proof(secret, "commscope request", n, rank, reason)


def request_value(secret: str, n: int, rank: int, reason: str) -> str:
    """What request number ``n`` holds: ``"<rank>|<reason>|<proof>"``."""
    return f"{rank}|{reason}|{request_proof(secret, n, rank, reason)}"


def _private_store(store: Any) -> Any:
    """A store client the watchdog can use without waiting behind the main thread.

    TCP stores are cloned (a new connection); a FileStore is shared as it is: cloning
    one would count as an extra worker and make torch delete the file early.
    """
    root = root_store(store)
    if type(root).__name__ == "FileStore":
        return store
    try:
        return store.clone()
    except Exception:
        return store


class Watchdog:
    """The per-rank trigger machinery; :meth:`start` once, :meth:`stop` on disable."""

    def __init__(self, rec: Recorder, dumper: Dumper) -> None:
        self.rec = rec
        self.dumper = dumper
        self.config = rec.config
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._store: Any = None
        self._store_source: Any = None
        self._requests = ProvenRequests("dump request of another rank")
        self._incident_limit = RateLimit(INCIDENT_DUMPS, INCIDENT_DUMPS_PER_S)
        self._reported: set[int] = set()
        self._errors_seen = 0
        self._last_dump = -1e9
        self._last_error_dump = 0.0
        self._pipe: tuple[int, int] | None = None
        self._old_wakeup_fd: int | None = None
        self._prev_handlers: dict[int, Any] = {}
        self._reported_creations: set[int] = set()
        self._last_signal_dump: dict[int, tuple[float, threading.Event | None]] = {}
        self._handler_ran: dict[int, float] = {}
        self._deferred_signals: list[int] = []
        interval = getattr(self.config, "watch_interval_s", 0)
        self.publisher: Publisher | None = Publisher(rec, interval) if interval else None
        self._signal_lock = threading.Lock()
        self._prev_excepthook: Any = None
        self._prev_thread_excepthook: Any = None
        self._next_clock = 0.0
        self._clock_store: Any = None
        self._clock_tries = 0

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Install signal handlers and hooks (main thread only) and start the thread."""
        cfg = self.config
        if cfg.handle_signals and threading.current_thread() is threading.main_thread():
            self._install_signals()
        if cfg.dump_on_exception:
            self._install_excepthooks()
        if cfg.watchdog:
            self._thread = threading.Thread(
                target=self._run, name="commscope-flight-watchdog", daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        """Stop the thread and restore the previous signal handlers and hooks."""
        self._stop.set()
        if self._pipe is not None:
            with contextlib.suppress(OSError):
                os.write(self._pipe[1], b"\0")
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._uninstall_signals()
        self._uninstall_excepthooks()

    def forget_in_child(self) -> None:
        """After ``fork()`` in the child: drop the parent's handlers, hooks and pipe.

        A forked child (a DataLoader worker) must neither dump the parent's ring over
        the parent's file nor write signal bytes into the parent's wakeup pipe.
        """
        self._stop.set()
        self._thread = None
        with contextlib.suppress(ValueError, OSError):
            if threading.current_thread() is threading.main_thread():
                signal.set_wakeup_fd(-1)
        self._pipe = None
        self._uninstall_signals()
        self._uninstall_excepthooks()

    # ------------------------------------------------------------------ the loop

    def _run(self) -> None:
        interval = self.config.poll_interval_s
        while not self._stop.is_set():
            if self._pipe is not None:
                try:
                    ready, _, _ = select.select([self._pipe[0]], [], [], interval)
                except (OSError, ValueError):
                    ready = []
                    self._stop.wait(interval)
                if ready:
                    self._read_signals()
            else:
                self._stop.wait(interval)
            if self._stop.is_set():
                break
            try:
                self.tick()
            except Exception as exc:
                logger.warning("commscope flight watchdog: %r", exc)

    def tick(self) -> None:
        """One round of checks (also callable directly, e.g. from tests)."""
        rec = self.rec
        if rec.polled:
            rec.poll()
        if self.config.dump_on_timeout:
            now = time.time_ns()
            overdue = rec.overdue(now, self.config.timeout_s)
            fresh = [e for e in overdue if e.record_id not in self._reported]
            # a group creation that never ends (a member never came) is a hang too
            stuck = rec.overdue_creations(now, self.config.timeout_s)
            fresh_creations = [c for c in stuck if c.seq not in self._reported_creations]
            if fresh or fresh_creations:
                self._reported.update(e.record_id for e in overdue)
                self._reported_creations.update(c.seq for c in stuck)
                self._safe_dump("timeout")
                self._post_request("timeout")
        if rec.failed_collectives > self._errors_seen:
            self._errors_seen = rec.failed_collectives
            now = time.monotonic()
            if now - self._last_error_dump > _ERROR_DUMP_INTERVAL_S:
                self._last_error_dump = now
                self._safe_dump("collective error")
                self._post_request("collective error")
        self._check_requests()
        if rec.hosts is not None and not rec.hosts.done:
            rec.hosts.tick(self._get_store())
        self._clock_tick()
        if self.publisher is not None:
            self.publisher.tick()
            if self.publisher.take_dump_request():
                self._safe_dump("request from commscope dump")

    def dump_before_abort(self) -> None:
        """A process group is being aborted (a fault-tolerance wrapper's doing): dump
        first, while the records of unfinished work still say where the job stopped."""
        rec = self.rec
        if rec.polled:
            rec.poll()
        if rec.pending:
            self._safe_dump("abort")

    def _safe_dump(self, reason: str, exception: BaseException | None = None,
                   fatal: bool = False) -> str | None:
        if incident_reason(reason):  # a dump on demand does not answer an incident
            self._last_dump = time.monotonic()
        try:
            path = self.dumper.dump(reason, exception=exception, fatal=fatal)
            logger.warning("commscope flight: wrote %s:%s (%s)", socket.gethostname(), path,
                           reason)
            if self.publisher is not None:
                self.publisher.note_dump(path, reason, self.dumper.count)
            return path
        except Exception as exc:
            logger.warning("commscope flight: dump failed (%s): %r", reason, exc)
            return None
        finally:
            while (self._deferred_signals and self.dumper.owner is None
                   and threading.current_thread() is threading.main_thread()):
                self._on_signal(self._deferred_signals.pop(0), None)

    # ------------------------------------------------------------------ store

    def _clock_tick(self) -> None:
        """Measure this clock's offset to rank 0's when due (at start, then every
        ``REMEASURE_S``; while rank 0 does not answer yet, every second, after 30 tries
        every 10 s)."""
        rec = self.rec
        now = time.monotonic()
        if (rec.global_rank <= 0 or rec.store is None or rec.watch_token is None
                or now < self._next_clock):
            return
        if self._clock_store is None:
            self._clock_store = root_client(rec.store)
        offset = measure_offset(self._clock_store, clock_namespace(rec.watch_token or ""))
        if offset is not None:
            rec.clock = offset
        if offset is not None:
            self._next_clock = now + REMEASURE_S
        else:  # rank 0 not answering yet: look again soon, then less often
            self._clock_tries += 1
            self._next_clock = now + (1.0 if self._clock_tries < 30 else 10.0)

    def _get_store(self) -> Any:
        source = self.rec.store
        if source is None:
            return None
        if source is not self._store_source:
            self._store_source = source
            self._store = _private_store(source)
        return self._store

    def _post_request(self, reason: str) -> None:
        store = self._get_store()
        secret = self.rec.request_secret
        if store is None or secret is None:
            return
        try:
            n = int(store.add(REQUEST_COUNT_KEY, 1))
            store.set(request_key(n), request_value(secret, n, self.rec.global_rank, reason))
            self._requests.seen = max(self._requests.seen, n)
        except Exception as exc:
            logger.warning("commscope flight: could not post a dump request: %r", exc)

    def _check_requests(self) -> None:
        store = self._get_store()
        secret = self.rec.request_secret
        if store is None or secret is None:
            return
        try:
            if not store.check([REQUEST_COUNT_KEY]):
                return
            n = int(store.get(REQUEST_COUNT_KEY))
            if n <= self._requests.seen:
                return

            def read(i: int) -> bytes | None:
                key = request_key(i)
                return bytes(store.get(key)) if store.check([key]) else None

            requester = self._requests.look(
                n, read, lambda i, raw: self._requester(secret, i, raw), request_key)
        except Exception:
            return  # a store that went away: next round
        if requester is None:
            return
        if time.monotonic() - self._last_dump < _REQUEST_GRACE_S:
            return  # this rank has just dumped (its own timeout): keep that file
        if not self._incident_limit.allow():
            warn_once("incident requests limited",
                      "commscope flight: skipped a dump asked for by rank %s: this rank "
                      "dumped %d times on other ranks' requests in the last %g s (the "
                      "limit); later ones are skipped without a word", requester,
                      INCIDENT_DUMPS, INCIDENT_DUMPS_PER_S)
            return
        self._safe_dump(f"request from rank {requester}")

    def _requester(self, secret: str, n: int, raw: bytes) -> int | None:
        """The rank that posted request ``n`` when its proof holds, else ``None``."""
        text = raw.decode("utf-8", "replace")
        head, _, given = text.rpartition("|")
        rank, _, reason = head.partition("|")
        if not rank.isdigit() or not 0 <= int(rank) < max(self.rec.world_size, 1):
            return None
        if not progress.is_proof(given, request_proof(secret, n, rank, reason)):
            return None
        return int(rank)

    # ------------------------------------------------------------------ signals

    def _install_signals(self) -> None:
        for sig in _HANDLED_SIGNALS:
            try:
                self._prev_handlers[sig] = signal.signal(sig, self._on_signal)
            except (ValueError, OSError):
                continue
            chain_handler(sig, self._prev_handlers[sig])
        try:
            r, w = os.pipe()
            os.set_blocking(r, False)
            os.set_blocking(w, False)
            old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except (ValueError, OSError):
            return
        if old != -1:
            # Someone else (an event loop) listens already: leave theirs in place.
            signal.set_wakeup_fd(old)
            os.close(r)
            os.close(w)
            return
        self._pipe = (r, w)
        self._old_wakeup_fd = old

    def _uninstall_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, prev in self._prev_handlers.items():
            with contextlib.suppress(ValueError, OSError, TypeError):
                if signal.getsignal(sig) == self._on_signal:
                    signal.signal(sig, prev)
        self._prev_handlers.clear()
        if self._pipe is not None:
            with contextlib.suppress(ValueError, OSError):
                signal.set_wakeup_fd(-1)
            for fd in self._pipe:
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._pipe = None

    def _signal_dump(self, signum: int) -> None:
        # The watchdog (wakeup pipe) and the main thread (Python handler) both see a
        # signal; one dumps, the other waits for that dump to be on disk, so the main
        # thread never hands over to a handler that exits while the file is half done.
        with self._signal_lock:
            now = time.monotonic()
            started, done = self._last_signal_dump.get(signum, (-1e9, None))
            mine = now - started >= _SIGNAL_DEDUP_S or done is None
            if mine:
                done = threading.Event()
                self._last_signal_dump[signum] = (now, done)
        assert done is not None
        if not mine:
            done.wait(10)
            return
        try:
            self._safe_dump(f"signal {signal.Signals(signum).name}")
        finally:
            done.set()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.dumper.owner == threading.get_ident():
            # The signal interrupted this thread's own dump (an exception being dumped
            # when torchrun's SIGTERM arrives): finish that file first, then act on it.
            self._deferred_signals.append(signum)
            return
        self._handler_ran[signum] = time.monotonic()
        self._signal_dump(signum)
        prev = self._prev_handlers.get(signum, signal.SIG_DFL)
        if callable(prev):
            prev(signum, frame)
        elif prev == signal.SIG_DFL and signum != signal.SIGUSR1:
            fatal.disarm()  # leaving on a signal, not a fatal error: no empty fatal log
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def _read_signals(self) -> None:
        assert self._pipe is not None
        try:
            data = os.read(self._pipe[0], 512)
        except (BlockingIOError, OSError):
            return
        for signum in set(data):
            if signum not in _HANDLED_SIGNALS or signum not in self._prev_handlers:
                continue
            arrived = time.monotonic()
            self._signal_dump(signum)
            prev = self._prev_handlers.get(signum)
            if signum == signal.SIGTERM and prev == signal.SIG_DFL:
                threading.Thread(
                    target=self._default_action_if_stuck,
                    args=(signum, arrived),
                    name="commscope-flight-sigterm",
                    daemon=True,
                ).start()

    def _default_action_if_stuck(self, signum: int, arrived: float) -> None:
        # The main thread runs our handler (which terminates) as soon as it executes
        # Python again. If it is stuck in C++ (a hung collective), do it from here.
        time.sleep(_SIGNAL_DEDUP_S)
        if self._handler_ran.get(signum, -1e9) >= arrived:
            return
        fatal.disarm()
        try:
            libc = ctypes.CDLL(None)
            libc.signal(ctypes.c_int(signum), ctypes.c_void_p(0))  # SIG_DFL
            os.kill(os.getpid(), signum)
            time.sleep(1)
        finally:
            os._exit(128 + signum)

    # ------------------------------------------------------------------ exceptions

    def _install_excepthooks(self) -> None:
        self._prev_excepthook = sys.excepthook
        self._prev_thread_excepthook = threading.excepthook
        sys.excepthook = self._excepthook
        threading.excepthook = self._thread_excepthook

    def _uninstall_excepthooks(self) -> None:
        if self._prev_excepthook is not None and sys.excepthook == self._excepthook:
            sys.excepthook = self._prev_excepthook
        if (
            self._prev_thread_excepthook is not None
            and threading.excepthook == self._thread_excepthook
        ):
            threading.excepthook = self._prev_thread_excepthook
        self._prev_excepthook = self._prev_thread_excepthook = None

    def _excepthook(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not SystemExit or exc.code not in (0, None):
            self._safe_dump("exception", exc, fatal=True)
            self._post_request("exception")
        hook = self._prev_excepthook or sys.__excepthook__
        hook(exc_type, exc, tb)

    def _thread_excepthook(self, args: Any) -> None:
        if args.exc_type is not SystemExit:
            # a thread's death, not the process's: every later dump names it, and this
            # dump does not start an incident (the rank's hang, if one follows, keeps the
            # rank's file)
            name = getattr(args.thread, "name", None) or "?"
            record = exception_record(args.exc_value, self.config.max_frames) or {}
            self.rec.note_thread_death({**record, "thread": str(name)[:80],
                                        "time_ns": time.time_ns()})
            self._safe_dump(f"exception in thread {str(name)[:80]}")
        hook = self._prev_thread_excepthook or threading.__excepthook__
        hook(args)
