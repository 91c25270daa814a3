"""What a recording rank publishes for ``commscope watch``, and where, in the job's store.

Every rank with the flight recorder on writes one small JSON *progress record* into the
job's own rendezvous store (the TCPStore torchrun already runs; no port of ours) every
``COMMSCOPE_WATCH_INTERVAL_S`` seconds (default 2, 0 = off), from the recorder's
watchdog thread with a store client of its own, so a collective never waits for it.

Keys (``<id>`` is :func:`token_id` of the job's watch token, ``COMMSCOPE_WATCH_TOKEN``,
which ``commscope run`` draws at random and writes, with the store's address, into the
watch file; without one the token is empty):

* ``commscope_watch/jobs``: a counter every publishing job bumps once (lets a watcher
  with a wrong token tell "refused" from "nothing publishes here");
* ``commscope_watch/<id>/meta``: rank 0's job description (world size, dump prefix);
* ``commscope_watch/<id>/rank/<r>``: rank ``r``'s latest progress record;
* ``commscope_watch/<id>/config/<r>``: rank ``r``'s groups (``pg_config``), written when
  they change (they are big at scale and rarely change);
* ``commscope_watch/<id>/dump``: a counter ``commscope dump`` bumps to ask every rank for
  its flight-recorder dump (each rank looks at it when it publishes).

A progress record is a dump in miniature, in the dump schema so that the analyzer reads
it like a file: the rank, the time, per group the last enqueued / started / completed
sequence numbers (``pg_status``), its newest records and every unfinished one
(``entries``, frames cut to :data:`RECORD_FRAMES`), the main thread's current stack
(``commscope_threads``), and the step the user marked (``commscope_step``).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

__all__ = [
    "ROOT",
    "JOBS_KEY",
    "VERSION",
    "RECORD_ENTRIES",
    "RECORD_FRAMES",
    "token_id",
    "meta_key",
    "rank_key",
    "config_key",
    "dump_key",
    "encode",
    "decode",
    "as_dump",
]

ROOT = "commscope_watch"
JOBS_KEY = f"{ROOT}/jobs"
VERSION = 1
RECORD_ENTRIES = 4
"""The newest records a progress record carries besides the unfinished ones."""
RECORD_FRAMES = 6
"""Frames kept per published record (the user's frame is almost always among them)."""
MAX_RECORD_BYTES = 1 << 20
"""A record larger than this is not parsed (a corrupt or hostile value)."""


def token_id(token: str) -> str:
    """The key namespace of a token: 16 hex digits of its SHA-256 (the token itself is
    never written to the store)."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()[:16]


def meta_key(tid: str) -> str:
    """Where rank 0 describes the job."""
    return f"{ROOT}/{tid}/meta"


def rank_key(tid: str, rank: int) -> str:
    """Where rank ``rank`` publishes its progress record."""
    return f"{ROOT}/{tid}/rank/{rank}"


def config_key(tid: str, rank: int) -> str:
    """Where rank ``rank`` publishes its groups."""
    return f"{ROOT}/{tid}/config/{rank}"


def dump_key(tid: str) -> str:
    """The counter ``commscope dump`` bumps to ask every rank to dump."""
    return f"{ROOT}/{tid}/dump"


def encode(record: dict[str, Any]) -> bytes:
    """Compact JSON bytes of a record."""
    return json.dumps(record, separators=(",", ":"), default=str).encode("utf-8")


class RecordError(ValueError):
    """A published value that is not a progress record."""


def decode(raw: bytes | bytearray | memoryview | None) -> dict[str, Any]:
    """Parse one published value; raises :class:`RecordError` with the reason."""
    if raw is None:
        raise RecordError("missing")
    data = bytes(raw)
    if len(data) > MAX_RECORD_BYTES:
        raise RecordError(f"{len(data)} bytes, more than a record can be")
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RecordError(f"not JSON ({exc.__class__.__name__}: {str(exc)[:80]})") from None
    if not isinstance(value, dict) or value.get("commscope_watch") != VERSION:
        raise RecordError("not a commscope watch record (version missing or different)")
    return value


def as_dump(record: dict[str, Any], config: dict[str, Any] | None) -> dict[str, Any]:
    """The dump dict the analyzer reads for one progress record (see module doc)."""
    out = {k: v for k, v in record.items() if k != "commscope_watch"}
    out.setdefault("version", "2.10")
    out["commscope_format"] = "commscope.flight/1"
    out["dump_reason"] = "watch"
    if config is not None:
        out["pg_config"] = config
    return out
