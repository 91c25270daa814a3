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
* ``commscope_watch/<id>/beat/<r>``: rank ``r``'s heartbeat, ``"<beats>:<version>:<time_ns>"``,
  rewritten every interval: how many times it published, which version of its record
  is current, and its clock. A watcher fetches all beats (a few bytes each) and only the
  records whose version changed;
* ``commscope_watch/<id>/rank/<r>``: rank ``r``'s progress record, rewritten only when
  its content changed (a stuck job's records do not change: refreshes stay cheap);
* ``commscope_watch/<id>/config/<r>``: rank ``r``'s groups (``pg_config``), written when
  they change (they are big at scale and rarely change);
* ``commscope_watch/<id>/dump``: a counter ``commscope dump`` bumps to ask every rank for
  its flight-recorder dump (each rank looks at it when it publishes);
* ``commscope_watch/<id>/dump_proof/<n>``: the proof that request ``n`` comes from
  someone who holds the token, :func:`dump_proof` (hex HMAC-SHA256, keyed with the
  token, of ``"commscope dump|<id>|<n>"``), written right after the counter was bumped
  to ``n``. A rank dumps only for a request whose proof holds (checked with
  ``hmac.compare_digest``); anything else is ignored and logged once per process
  (:mod:`commscope.flight.out.requests`). Dumps on request are rate-limited: at most one
  every :data:`DUMP_REQUEST_EVERY_S` per rank; requests inside that time are answered
  together by one dump when it has passed;
* ``commscope_watch/<id>/dumped/<r>``: where rank ``r`` wrote its newest dump, rewritten
  after each one: ``{"host", "path", "reason", "count", "bytes", "time_ns"}``
  (``count`` counts the rank's dumps, ``bytes`` is the file's size), so
  ``commscope dump`` and a job's log can list every dump of every host as
  ``host:path`` without reading another host's disk.

The ranks' own requests (a rank that timed out asks every other rank to dump) travel
through ``commscope_flight/dump_request_count`` and ``commscope_flight/dump_request/<n>``
= ``"<rank>|<reason>|<proof>"``, the proof keyed with the rank's request secret
(:mod:`commscope.flight.out.watchdog`).

Whoever reaches the store can list and read every key above (torch's store has no
authentication; docs/watch.md, "Security", lists what a record holds); the token itself
is never written here, only its :func:`token_id`, and without it no request counts.

A progress record is a dump in miniature, read by the analyzer like a file once
:func:`as_dump` has expanded it: the rank, the time, per group the last enqueued and
completed sequence numbers (``progress``), its newest records, the newest record of each
of its groups and every unfinished one (``entries``, as lists in :data:`ENTRY_FIELDS`
order, frames cut to :data:`RECORD_FRAMES` and shared through ``frame_table``), the main
thread's current stack (``commscope_threads``), and the step the user marked
(``commscope_step``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

__all__ = [
    "ROOT",
    "JOBS_KEY",
    "VERSION",
    "RECORD_ENTRIES",
    "RECORD_FRAMES",
    "RecordError",
    "token_id",
    "meta_key",
    "rank_key",
    "config_key",
    "dump_key",
    "dump_proof_key",
    "dump_time_key",
    "dump_proof",
    "proof",
    "is_proof",
    "DUMP_REQUEST_EVERY_S",
    "dumped_key",
    "decode_dumped",
    "beat_key",
    "encode_beat",
    "decode_beat",
    "encode",
    "decode",
    "as_dump",
    "entry_dict",
    "ENTRY_FIELDS",
]

ROOT = "commscope_watch"
JOBS_KEY = f"{ROOT}/jobs"
VERSION = 1
RECORD_ENTRIES = 4
"""The newest records a progress record carries besides the unfinished ones."""
RECORD_FRAMES = 4
"""Frames kept per published record (the user's frame is almost always among them)."""
MAX_RECORD_BYTES = 1 << 20
"""A record larger than this is not parsed (a corrupt or hostile value)."""


class RecordError(ValueError):
    """A published value that is not a progress record."""


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


def beat_key(tid: str, rank: int) -> str:
    """Where rank ``rank`` writes its heartbeat."""
    return f"{ROOT}/{tid}/beat/{rank}"


def encode_beat(beats: int, version: int, time_ns: int) -> bytes:
    """A heartbeat value."""
    return f"{beats}:{version}:{time_ns}".encode()


def decode_beat(raw: bytes | bytearray | memoryview | None) -> tuple[int, int, int]:
    """``(beats, version, time_ns)`` of a heartbeat; raises :class:`RecordError`."""
    try:
        parts = bytes(raw or b"").decode("ascii").split(":")
        beats, version, t = (int(x) for x in parts)
    except (UnicodeDecodeError, ValueError):
        raise RecordError(
            f"heartbeat {bytes(raw or b'')[:40]!r} is not beats:version:time") from None
    if beats < 0 or version < 0 or t < 0:
        raise RecordError("heartbeat with a negative field")
    return beats, version, t


def config_key(tid: str, rank: int) -> str:
    """Where rank ``rank`` publishes its groups."""
    return f"{ROOT}/{tid}/config/{rank}"


def dump_key(tid: str) -> str:
    """The counter ``commscope dump`` bumps to ask every rank to dump."""
    return f"{ROOT}/{tid}/dump"


def dump_proof_key(tid: str, n: int) -> str:
    """Where the proof of ``commscope dump``'s request number ``n`` is written."""
    return f"{ROOT}/{tid}/dump_proof/{n}"


def dump_time_key(tid: str, n: int) -> str:
    """When (``time_ns`` on the asker's clock) request number ``n`` was made: a rank
    that looks for requests the first time answers those made after it started."""
    return f"{ROOT}/{tid}/dump_time/{n}"


DUMP_REQUEST_EVERY_S = 5.0
"""A rank writes at most one dump on ``commscope dump``'s request in this many seconds;
the requests inside that time are answered together by one dump once it has passed."""


def proof(secret: str, *parts: object) -> str:
    """The proof that whoever wrote ``parts`` holds ``secret``: hex HMAC-SHA256, keyed
    with ``secret``, of the parts joined by ``|``."""
    message = "|".join(str(p) for p in parts).encode("utf-8")
    return hmac.new(secret.encode("utf-8"), message, hashlib.sha256).hexdigest()


def is_proof(value: bytes | str, expected: str) -> bool:
    """Whether a value read from the store is the ``expected`` proof (constant time)."""
    given = value.encode("utf-8", "replace") if isinstance(value, str) else bytes(value)
    return hmac.compare_digest(given.strip(), expected.encode("ascii"))


def dump_proof(token: str, tid: str, n: int) -> str:
    """The proof ``commscope dump`` writes beside its request number ``n``."""
    return proof(token, "commscope dump", tid, n)


def dumped_key(tid: str, rank: int) -> str:
    """Where rank ``rank`` says where it wrote its newest dump."""
    return f"{ROOT}/{tid}/dumped/{rank}"


def decode_dumped(raw: bytes | bytearray | memoryview | None) -> dict[str, Any]:
    """A rank's note of its newest dump; raises :class:`RecordError` for anything else."""
    try:
        value = json.loads(bytes(raw or b"")[:65536].decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise RecordError("dump note is not JSON") from None
    if not (isinstance(value, dict) and isinstance(value.get("host"), str)
            and isinstance(value.get("path"), str) and type(value.get("count")) is int):
        raise RecordError("not a dump note (host, path, count)")
    return value


def encode(record: dict[str, Any]) -> bytes:
    """Compact JSON bytes of a record."""
    return json.dumps(record, separators=(",", ":"), default=str).encode("utf-8")


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


ENTRY_FIELDS = ("record_id", "pg_id", "pg_name", "pg_desc", "collective_seq_id",
                "p2p_seq_id", "profiling_name", "time_created_ns", "input_sizes",
                "input_dtypes", "output_sizes", "output_dtypes", "state", "retired", "is_p2p",
                "peer", "failed", "frames")
"""A published record is a list in this order (keys would be most of its bytes);
``output_sizes`` / ``output_dtypes`` are ``null`` when equal to the inputs, and
``frames`` are indices into the record's ``frame_table``."""


_N_FIELDS = len(ENTRY_FIELDS)
_AGREE_FIELDS = ("root", "reduce_op", "input_split_sizes", "output_split_sizes")
"""``commscope_agree`` maps a record id to these, what every rank must pass alike
(:mod:`commscope.flight.record.agree.arguments`); kept beside the entry lists so that a reader
of an older version still reads those lists."""


def entry_dict(item: Any, frame_table: list[Any]) -> dict[str, Any] | None:
    """One published record as a dump record (``None`` when it is not a valid list)."""
    if not isinstance(item, list) or len(item) != _N_FIELDS:
        return None
    (record_id, pg_id, pg_name, pg_desc, seq, p2p_seq, name, created, ins, in_dt, outs,
     out_dt, state, retired, is_p2p, peer, failed, refs) = item
    n = len(frame_table)
    frames = [frame_table[i] for i in refs if type(i) is int and 0 <= i < n] \
        if isinstance(refs, list) else []
    return {"frames": frames, "record_id": record_id, "pg_id": pg_id,
            "process_group": (pg_name, pg_desc), "collective_seq_id": seq,
            "p2p_seq_id": p2p_seq, "profiling_name": name, "time_created_ns": created,
            "input_sizes": ins, "input_dtypes": in_dt,
            "output_sizes": ins if outs is None else outs,
            "output_dtypes": in_dt if out_dt is None else out_dt, "state": state,
            "time_discovered_started_ns": None, "time_discovered_completed_ns": None,
            "retired": retired, "is_p2p": is_p2p, "peer": peer, "failed": failed}


def as_dump(record: dict[str, Any], config: dict[str, Any] | None) -> dict[str, Any]:
    """The dump dict the analyzer reads for one progress record (see module doc)."""
    out = {k: v for k, v in record.items()
           if k not in ("commscope_watch", "entries", "frame_table", "commscope_agree")}
    table = record.get("frame_table") if isinstance(record.get("frame_table"), list) else []
    entries = record.get("entries") if isinstance(record.get("entries"), list) else []
    out["entries"] = [e for e in (entry_dict(x, table) for x in entries) if e is not None]
    agree = record.get("commscope_agree")
    if isinstance(agree, dict):
        for e in out["entries"]:
            found = agree.get(str(e["record_id"]))
            if isinstance(found, list) and len(found) == 4:
                for name, value in zip(_AGREE_FIELDS, found):
                    if value is not None:
                        e[name] = value
    out.setdefault("version", "2.10")
    out["commscope_format"] = "commscope.flight/1"
    out["dump_reason"] = "watch"
    ids, prog = record.get("commscope_pg_ids"), record.get("progress")
    if isinstance(ids, dict) and isinstance(prog, dict) and "pg_status" not in out:
        # how far each group got, keyed as a dump keys it (the record keeps few entries)
        out["pg_status"] = {
            str(ids[name]): {"last_enqueued_collective": item[1],
                             "last_started_collective": -1,
                             "last_completed_collective": item[2]}
            for name, item in prog.items()
            if type(ids.get(name)) is int and isinstance(item, list) and len(item) == 3}
    if config is not None:
        out["pg_config"] = config
    return out
