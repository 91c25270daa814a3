"""Requests through the job's store that make a rank dump: proven, and rate-limited.

Anyone who reaches the job's TCPStore can write any key in it (torch's store has no
authentication), so a request counts only with a proof that its writer knows the job's
secret: an HMAC-SHA256, keyed with the secret, of the request's number and what it
asks (:func:`commscope.flight.out.progress.proof`). Two kinds of request travel this way:

* ``commscope dump`` bumps ``commscope_watch/<id>/dump`` and writes the proof of that
  number to ``commscope_watch/<id>/dump_proof/<n>``; keyed with the watch token, which
  the watcher has (:mod:`commscope.flight.out.progress`);
* a rank that hit a timeout, a failed collective or an uncaught exception bumps
  ``commscope_flight/dump_request_count`` and writes ``"<rank>|<reason>|<proof>"`` to
  ``commscope_flight/dump_request/<n>``, keyed with the rank's request secret (the watch
  token, or, in a job without one, a secret the ranks agreed on:
  :func:`commscope.flight.record.job.request_secret`); every rank then dumps
  (:mod:`commscope.flight.out.watchdog`).

:class:`ProvenRequests` reads one counter (algorithm in its docstring); a request
without a valid proof is ignored, and the first one a process meets is logged as a
warning naming the key (never a secret). :class:`RateLimit` bounds the dumps requests
may cause.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

__all__ = ["ProvenRequests", "RateLimit", "warn_once", "PROOF_GRACE_S", "WINDOW"]

logger = logging.getLogger(__name__)

PROOF_GRACE_S = 2.0
"""How long a request number may stay without its value (the writer bumps the counter,
then writes the value: two store calls) before it counts as unproven."""
WINDOW = 8
"""How many of the newest request numbers a look reads (a counter that jumped by more
since the last look is not read number by number)."""

_warned: set[str] = set()


def warn_once(kind: str, message: str, *args: Any) -> None:
    """Log ``message`` as a warning the first time this process meets ``kind``."""
    if kind in _warned:
        return
    _warned.add(kind)
    logger.warning(message, *args)


class ProvenRequests:
    """The newest proven request of one counter, and the unproven ones refused.

    Algorithm (:meth:`look`, once per round of the reading thread):

    1. Nothing to do while the counter is not above the last number handled (``seen``).
    2. Read the values of the newest :data:`WINDOW` numbers above ``seen``, newest first,
       skipping numbers already handled.
    3. A value whose proof holds is accepted; only the newest accepted one is returned
       (one dump answers every request it covers). A value whose proof does not hold is
       refused. A number with no value yet is waited for (its writer may be between its
       two store calls) and refused once it stayed empty :data:`PROOF_GRACE_S`.
    4. Once no number is waited for, ``seen`` moves up to the counter.

    A refusal is logged once per process and kind (:func:`warn_once`).
    """

    def __init__(self, kind: str, seen: int = 0) -> None:
        self.kind = kind
        self.seen = seen
        self.refused = 0
        """How many request numbers this reader refused."""
        self._done: set[int] = set()
        self._empty_since: dict[int, float] = {}

    def look(self, count: int, read: Callable[[int], bytes | None],
             accept: Callable[[int, bytes], Any], key_of: Callable[[int], str],
             now: float | None = None) -> Any:
        """What the newest proven request above ``seen`` says (``accept``'s answer), or
        ``None``. ``read(n)`` returns request ``n``'s value (``None`` when absent),
        ``accept(n, value)`` what it asks when its proof holds (``None`` otherwise),
        ``key_of(n)`` the key named in the warning."""
        if count <= self.seen:
            return None
        now = time.monotonic() if now is None else now
        low = max(self.seen, count - WINDOW)
        found: Any = None
        waiting = False
        for n in range(count, low, -1):
            if n in self._done:
                continue
            raw = read(n)
            if raw is None:
                since = self._empty_since.setdefault(n, now)
                if now - since < PROOF_GRACE_S:
                    waiting = True
                    continue
                self._refuse(key_of(n), "nothing was written there")
            else:
                asked = accept(n, bytes(raw))
                if asked is None:
                    self._refuse(key_of(n), "its proof does not match the job's token")
                elif found is None:
                    found = asked
            self._done.add(n)
        if waiting:
            self._done = {n for n in self._done if n > low}
        else:
            self.seen = count
            self._done.clear()
        self._empty_since = {n: t for n, t in self._empty_since.items() if n > self.seen}
        return found

    def _refuse(self, key: str, why: str) -> None:
        self.refused += 1
        warn_once(f"unproven {self.kind}",
                  "commscope flight: ignored a %s at %s: %s (a request must carry the proof "
                  "of the job's token: someone who reaches the job's store wrote this one, "
                  "or a rank with another token or an older commscope); later ones are "
                  "ignored without a word", self.kind, key, why)


class RateLimit:
    """At most ``most`` events in any ``per_s`` seconds (a sliding window)."""

    def __init__(self, most: int, per_s: float) -> None:
        self.most = most
        self.per_s = per_s
        self._times: list[float] = []

    def allow(self, now: float | None = None) -> bool:
        """Whether one more event fits now (and count it if it does)."""
        now = time.monotonic() if now is None else now
        self._times = [t for t in self._times if now - t < self.per_s]
        if len(self._times) >= self.most:
            return False
        self._times.append(now)
        return True
