"""How far this rank's clock is from rank 0's, measured through the job's store.

Hosts' clocks differ (by milliseconds under NTP, by seconds or minutes when it breaks),
and every time compared across ranks (a dump "written N s before" the others, who
arrived last at a collective, a rank gone silent) would believe them. So every rank
measures its offset to one reference clock, rank 0's (the store's host under torchrun:
its node serves the workers' store), and dumps and progress records carry it
(``commscope_clock``); the analyzer and the live view compare aligned times only.

Protocol (:class:`ClockService` on rank 0, :func:`measure_offset` anywhere), through
the job's store, with no collective:

1. The asker takes a ticket (``add("commscope/clock/ticket", 1)`` → ``k``), notes its
   clock ``t1``, writes ``commscope/clock/ask/<k>`` and waits for
   ``commscope/clock/answer/<k>``, then notes ``t2``.
2. Rank 0's service thread waits for ``ask/<k>`` for ``k = 1, 2, ...`` in turn (a
   blocking ``wait``, so it answers at once, no polling) and writes its own clock as the
   answer. A ticket whose ask never comes (its asker died between taking it and
   asking) is marked dead by the next asker whose own answer does not come.
3. The asker's offset is ``answer - (t1 + t2) / 2``, accurate to ``(t2 - t1) / 2`` (half
   the round trip, the answer lying somewhere inside it). The best of :data:`_SAMPLES`
   tries (the shortest round trip) is kept.

Each rank measures when its default group exists and again every
:data:`REMEASURE_S` (clocks drift). A watcher (``commscope watch``) measures its own
offset the same way. Measured on loopback: a round trip of about 1 ms.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["ClockOffset", "ClockService", "measure_offset", "start_clock_service",
           "root_client", "clock_namespace", "REMEASURE_S"]

logger = logging.getLogger(__name__)

_KEYS = "commscope_watch/{ns}/clock/"
"""Clock keys live at the store's root, under the job's watch namespace (the watch
token's id), where every rank and every watcher of the job finds them."""
_SAMPLES = 3
_DEAD = "dead"
_STOP = "stop"
_WAIT_S = 2.0
REMEASURE_S = 300.0
"""How often a rank measures its offset again."""


@dataclass(frozen=True, slots=True)
class ClockOffset:
    """The offset of a clock to the reference clock (rank 0's), as measured."""

    offset_ns: int
    """Subtract it from a time of this clock to get rank 0's time."""
    uncertainty_ns: int
    """Half the round trip of the measurement: the offset is right within this."""
    measured_ns: int
    """When it was measured (this clock)."""

    def to_dict(self) -> dict[str, Any]:
        """``commscope_clock`` as dumps and progress records carry it."""
        return {"reference": "rank 0", "offset_ns": self.offset_ns,
                "uncertainty_ns": self.uncertainty_ns, "measured_ns": self.measured_ns}


def measure_offset(store: Any, namespace: str, samples: int = _SAMPLES,
                   wait_s: float = _WAIT_S) -> ClockOffset | None:
    """Step 1 and 3: this clock's offset to rank 0's, the best of ``samples`` round trips
    through ``store`` (the job's root store) under the job's ``namespace``; ``None``
    when rank 0 does not answer (no service yet, a store without ``wait``)."""
    keys = _Keys(namespace)
    best: ClockOffset | None = None
    try:
        if not store.check([keys.service]):
            return None  # rank 0 has not started answering (yet): never wait for it
    except Exception:
        return None
    for _ in range(samples):
        try:
            k = int(store.add(keys.ticket, 1))
            t1 = time.time_ns()
            store.set(keys.ask(k), str(t1))
            if not _wait(store, keys.answer(k), wait_s):
                _unblock(store, keys, k)  # an earlier asker died between ticket and ask
                if not _wait(store, keys.answer(k), wait_s):
                    return best
            t2 = time.time_ns()
            answer = bytes(store.get(keys.answer(k))).decode("ascii")
        except Exception as exc:
            logger.debug("commscope clock: no answer from rank 0: %r", exc)
            return best
        if not answer.isdigit():
            continue
        half = (t2 - t1) // 2
        sample = ClockOffset(offset_ns=(t1 + half) - int(answer), uncertainty_ns=half,
                             measured_ns=t2)
        if best is None or sample.uncertainty_ns < best.uncertainty_ns:
            best = sample
    return best


class _Keys:
    """The clock keys of one job."""

    def __init__(self, namespace: str) -> None:
        base = _KEYS.format(ns=namespace)
        self.ticket = base + "ticket"
        self.service = base + "service"
        self._ask, self._answer = base + "ask/", base + "answer/"

    def ask(self, k: int) -> str:
        return f"{self._ask}{k}"

    def answer(self, k: int) -> str:
        return f"{self._answer}{k}"


def _wait(store: Any, key: str, wait_s: float) -> bool:
    from datetime import timedelta

    try:
        store.wait([key], timedelta(seconds=wait_s))
        return True
    except Exception:
        return False


def _unblock(store: Any, keys: _Keys, k: int) -> None:
    """Mark the asks of the tickets before ``k`` that never came as dead, so the service
    (waiting for them in turn) moves on."""
    for j in range(max(1, k - 64), k):
        try:
            if not store.check([keys.answer(j)]):
                store.compare_set(keys.ask(j), "", _DEAD)
        except Exception:
            return


class ClockService:
    """Step 2, on rank 0: answers every ask with rank 0's clock, in ticket order, from a
    thread of its own with a store client of its own. It waits for each ask without a
    timeout (a timed-out store wait makes torch log two lines each time): an asker
    that finds an earlier ticket unanswered marks it dead, and :meth:`stop` wakes it
    with an ask of its own."""

    def __init__(self, store: Any, namespace: str) -> None:
        self.store = store
        self.keys = _Keys(namespace)
        self.answered = 0
        self._next = 1
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="commscope-clock", daemon=True)

    def start(self) -> ClockService:
        """Say in the store that asks are answered, then start answering (in this order:
        once the thread waits on its client, no other thread may use that client)."""
        try:
            self.store.set(self.keys.service, "1")
        except Exception as exc:
            logger.debug("commscope clock: could not announce the service: %r", exc)
        self._thread.start()
        return self

    def stop(self, waker: Any, timeout_s: float = 1.0) -> None:
        """Stop answering and wait (bounded) for the thread: called before the
        interpreter ends, so no thread is inside a store call while it does. ``waker``:
        a client of the same store that the calling thread may use (a store client
        serves one thread at a time; the service's own one is inside its wait)."""
        self._stop.set()
        try:
            waker.compare_set(self.keys.ask(self._next), "", _STOP)
        except Exception:
            pass
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        from datetime import timedelta

        while not self._stop.is_set():
            k = self._next
            try:
                self.store.wait([self.keys.ask(k)], timedelta(days=7))
                ask = bytes(self.store.get(self.keys.ask(k))).decode("ascii", "replace")
            except Exception as exc:  # the store went away: the job is ending
                logger.debug("commscope clock: service ends: %r", exc)
                return
            if ask == _STOP:
                return
            now = time.time_ns()
            try:
                self.store.set(self.keys.answer(k), str(now) if ask != _DEAD else _DEAD)
            except Exception as exc:
                logger.debug("commscope clock: could not answer ticket %d: %r", k, exc)
                return
            self.answered += ask != _DEAD
            self._next = k + 1


def root_client(store: Any) -> Any:
    """A client of the store under every prefix of ``store``, for a thread of its own:
    a TCP store is cloned; a FileStore is shared as it is (each call opens the file)."""
    root = store
    while hasattr(root, "underlying_store"):
        root = root.underlying_store
    if type(root).__name__ == "FileStore":
        return root
    try:
        return root.clone()
    except Exception:
        return root


def clock_namespace(token: str) -> str:
    """The job's key namespace for a watch token: 16 hex digits of its SHA-256 (the
    watch keys' own, ``commscope.flight.out.progress.token_id``)."""
    import hashlib

    return hashlib.sha256(token.encode("utf-8")).hexdigest()[:16]


def start_clock_service(rec: Any) -> None:
    """On rank 0, once the default group's store is known: answer every rank's clock
    asks from now on (rank 0's own offset is 0 by definition), and stop before the
    interpreter ends (only in the process that started it: a forked child has no such
    thread)."""
    import atexit
    import os

    namespace = clock_namespace(rec.watch_token or "")
    service = ClockService(root_client(rec.store), namespace).start()
    rec.clock_service = service
    rec.clock = ClockOffset(offset_ns=0, uncertainty_ns=0, measured_ns=time.time_ns())
    owner, waker = os.getpid(), root_client(rec.store)

    def _stop() -> None:
        if os.getpid() == owner:
            service.stop(waker)

    atexit.register(_stop)
