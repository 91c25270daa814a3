"""Dump triggers: the per-rank watchdog thread, the job-wide request, signals, exceptions.

The watchdog wakes every ``poll_interval_s`` (0.5 s by default) and

1. polls device-side works (NCCL) for completion;
2. looks for entries pending longer than the timeout (``enable(timeout_s=)``,
   ``COMMSCOPE_FR_TIMEOUT_S``, else the group's own timeout); on a new one it dumps
   (reason ``"timeout"``) and posts a dump request in the job's store;
3. dumps after a collective ended with an error (a gloo timeout, a dead peer:
   ``"collective error"``) and posts a dump request, as for a timeout;
4. reads the store: a request posted by any rank makes this rank dump too
   (``"request from rank R"``) — within one poll interval, so well under 2 s —
   unless it dumped in the last 5 s itself (two ranks timing out together).

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

from commscope.flight.out import fatal
from commscope.flight.out.dump import Dumper
from commscope.flight.out.handlers import chain_handler
from commscope.flight.out.publish import Publisher, root_store
from commscope.flight.record.recorder import Recorder

__all__ = ["Watchdog", "REQUEST_COUNT_KEY", "request_key"]

logger = logging.getLogger(__name__)

REQUEST_COUNT_KEY = "commscope_flight/dump_request_count"
_HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
_SIGNAL_DEDUP_S = 2.0
_ERROR_DUMP_INTERVAL_S = 10.0
_REQUEST_GRACE_S = 5.0


def request_key(n: int) -> str:
    """The store key holding dump request number ``n`` (``"<rank>|<reason>"``)."""
    return f"commscope_flight/dump_request/{n}"


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
        self._seen_requests = 0
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
        if self.publisher is not None:
            self.publisher.tick()
            if self.publisher.take_dump_request():
                self._safe_dump("request from commscope dump")

    def _safe_dump(self, reason: str, exception: BaseException | None = None,
                   fatal: bool = False) -> str | None:
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
        if store is None:
            return
        try:
            n = int(store.add(REQUEST_COUNT_KEY, 1))
            store.set(request_key(n), f"{self.rec.global_rank}|{reason}")
            self._seen_requests = max(self._seen_requests, n)
        except Exception as exc:
            logger.warning("commscope flight: could not post a dump request: %r", exc)

    def _check_requests(self) -> None:
        store = self._get_store()
        if store is None:
            return
        try:
            if not store.check([REQUEST_COUNT_KEY]):
                return
            n = int(store.get(REQUEST_COUNT_KEY))
        except Exception:
            return
        if n <= self._seen_requests:
            return
        key = request_key(n)
        try:
            if not store.check([key]):
                return  # posted but not filled in yet: next round
            payload = store.get(key).decode("utf-8", "replace")
        except Exception:
            payload = "?|?"
        self._seen_requests = n
        if time.monotonic() - self._last_dump < _REQUEST_GRACE_S:
            return  # this rank has just dumped (its own timeout): keep that file
        requester = payload.split("|", 1)[0]
        self._safe_dump(f"request from rank {requester}")

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
            self._safe_dump("exception", args.exc_value)
        hook = self._prev_thread_excepthook or threading.__excepthook__
        hook(args)
