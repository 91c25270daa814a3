"""Read the records of one dump into columns, fast when the file is well formed.

Algorithm (:func:`record_columns`):

1. **Fast path**: pull the 16 fields every 2.x record has with one C-level
   ``itemgetter`` pass, transposed into columns; the five signature columns (name,
   sizes, dtypes) are zipped straight into a ``marshal`` key per record. Each column's
   set of types is checked at once (``set(map(type, column))``) and the range of its
   integers by ``array("q")`` conversion. Any surprise sends the whole file to step 2;
   nothing is trusted on the fast path that was not checked.
2. **Slow path**: check record by record. A record without a usable sequence number,
   group or profiling name is dropped; a bad optional field falls back to its default
   (older schemas: ``seq_id``, ``sizes``, no ``retired``); each kind of problem is
   counted and reported once per file.

3. **Failed collectives** (commscope dumps): a record with ``failed: true`` ended with
   an error (a gloo timeout, a dead peer). It is retired but did not complete, as
   NCCL reports an aborted work, so it counts as not finished: the rank was blocked in
   it until it failed. Its status carries the ``FAILED`` bit instead of ``RETIRED``
   (the diagnosis tells the victims of a crash by it).

Either way the result is 19 columns indexed by the ``R_*`` constants. On the fast path
the ``duration_ms`` and ``peer`` columns are ``None`` (the analysis does not need the
first, and reads the second for p2p records only), the five signature columns are
``None`` and ``R_KEY`` holds the signature keys; on the slow path ``R_KEY`` is ``None``
and the caller makes the keys from the signature columns.
"""

from __future__ import annotations

import marshal
from array import array
from collections import Counter
from collections.abc import Sequence
from itertools import chain, repeat
from operator import itemgetter, methodcaller
from typing import Any

from commscope.analyze.model import COMPLETED, FAILED, STARTED
from commscope.analyze.read.signature import tag_name

__all__ = [
    "STATE_BITS", "record_columns", "slow_columns", "short", "end_times", "reader_columns",
    "RawFields",
    "R_RECORD", "R_PGID", "R_PG", "R_SEQ", "R_P2PSEQ", "R_NAME", "R_CREATED", "R_IN",
    "R_IDT", "R_OUT", "R_ODT", "R_STATE", "R_RETIRED", "R_ISP2P", "R_TSTART", "R_TDONE",
    "R_DUR", "R_PEER", "R_KEY",
]

STATE_BITS = {"scheduled": 0, "started": STARTED, "completed": STARTED | COMPLETED}
(R_RECORD, R_PGID, R_PG, R_SEQ, R_P2PSEQ, R_NAME, R_CREATED, R_IN, R_IDT, R_OUT, R_ODT,
 R_STATE, R_RETIRED, R_ISP2P, R_TSTART, R_TDONE, R_DUR, R_PEER, R_KEY) = range(19)
_N_COLS = 19
_get_fields = itemgetter(
    "profiling_name", "input_sizes", "output_sizes", "input_dtypes", "output_dtypes",
    "record_id", "pg_id", "collective_seq_id", "p2p_seq_id", "time_created_ns",
    "process_group", "state", "retired", "is_p2p", "time_discovered_started_ns",
    "time_discovered_completed_ns")
"""The 16 fields every 2.x record has: the five signature fields first."""
_get_failed = itemgetter("failed")
_get_failed_or_none = methodcaller("get", "failed")


def _failed_column(entries: list[Any]) -> list[Any] | None:
    """Each record's ``failed`` flag (commscope dumps), or ``None`` when no record failed."""
    if not isinstance(entries[0], dict) or "failed" not in entries[0]:
        return None  # PyTorch's native dumps have no such field
    try:
        flags = list(map(_get_failed, entries))
    except (KeyError, TypeError):
        flags = list(map(_get_failed_or_none, entries))
    return flags if True in flags else None

_INT = {int}
_INT_NONE = {int, type(None)}
_NONE = type(None)
_BOOL = {bool}
_STATES = set(STATE_BITS)
_I64 = 2**63 - 1
assert array("q").itemsize == 8  # the columnar reader hands over int64 bytes


def short(value: Any, limit: int = 40) -> str:
    """A value as a short repr for messages (containers of 20+ items by their size)."""
    text = repr(value) if not isinstance(value, (dict, list, tuple)) or len(value) < 20 else (
        f"<{type(value).__name__} of {len(value)}>")
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ----------------------------------------------------------------------- columns


def _fast_columns(entries: list[Any]) -> list[Any] | None:
    """All columns when every record is well formed, else ``None`` (see module doc).

    The five signature columns are not returned: ``R_KEY`` holds each record's signature
    key (``marshal`` of name, sizes and dtypes) and ``R_NAME`` .. ``R_ODT`` are ``None``.
    Every field is still checked, a whole column at a time: by its set of types, and
    integers by ``array("q")`` conversion too (the integer columns returned are those
    arrays).
    """
    if not entries:
        cols: list[Any] = [[] for _ in range(_N_COLS)]
        cols[R_KEY] = []
        return cols
    try:
        (name, in_sizes, out_sizes, in_dtypes, out_dtypes, record, pg_id, seq, p2p_seq,
         created, pg, state, retired, is_p2p, t_start, t_done) = zip(*map(_get_fields, entries))
        tagged = _tagged_names(name, entries)
        keys = list(map(marshal.dumps, zip(tagged, in_sizes, out_sizes, in_dtypes, out_dtypes),
                        repeat(2)))
    except (KeyError, TypeError, IndexError, AttributeError, ValueError):
        return None  # a missing field, a non-dict record, or sizes marshal cannot write
    return _checked_columns(name, record, pg_id, seq, p2p_seq, created, pg, state, retired,
                            is_p2p, t_start, t_done, keys)


_get_root = methodcaller("get", "root")
_get_reduce_op = methodcaller("get", "reduce_op")


def _tagged_names(names: Sequence[Any], entries: list[Any]) -> Sequence[Any]:
    """The profiling names as signature keys hold them (tagged with root and reduce op
    where the records have them: ``signature.tag_name``)."""
    roots = list(map(_get_root, entries))
    ops = list(map(_get_reduce_op, entries))
    if roots.count(None) == len(roots) and ops.count(None) == len(ops):
        return names
    return list(map(tag_name, names, roots, ops))


def _checked_columns(name: Sequence[Any], record: Sequence[Any], pg_id: Sequence[Any],
                     seq: Sequence[Any], p2p_seq: Sequence[Any], created: Sequence[Any],
                     pg: Sequence[Any], state: Sequence[Any], retired: Sequence[Any],
                     is_p2p: Sequence[Any], t_start: Sequence[Any], t_done: Sequence[Any],
                     keys: list[bytes]) -> list[Any] | None:
    """The fast path's columns from the raw field columns, or ``None`` when any value
    is not what a well-formed record holds (see :func:`_fast_columns`)."""
    try:
        if set(map(type, chain(record, pg_id, seq, p2p_seq, created))) != _INT:
            return None  # a bool, float, text or None where an int belongs
        # array("q") raises OverflowError for an int beyond 64 bits: the slow path
        # reports it.
        seq_arr = array("q", seq)
        record_arr = array("q", record)
        pg_id_arr = array("q", pg_id)
        p2p_arr = array("q", p2p_seq)
        created_arr = array("q", created)
        if min(seq_arr) < 0:
            return None
        times = set(map(type, chain(t_start, t_done)))
        if not times <= _INT_NONE:
            return None
        if _NONE in times:  # None where an op has not started or finished yet
            array("q", filter(None, chain(t_start, t_done)))
        else:
            array("q", t_start)
            array("q", t_done)
        if not set(state) <= _STATES:
            return None
        if not set(map(type, chain(retired, is_p2p))) <= _BOOL:
            return None
        try:
            groups = set(pg)
        except TypeError:  # lists (JSON): make them tuples
            if not set(map(type, pg)) <= {tuple, list}:
                return None
            pg = tuple(map(tuple, pg))
            groups = set(pg)
        for group in groups:
            if type(group) is not tuple or len(group) != 2 or type(group[0]) is not str \
                    or type(group[1]) is not str:
                return None
        # A record whose profiling name is not text goes to the slow path (which drops
        # it): checked on the distinct names only.
        if not set(map(type, set(name))) <= {str}:
            return None
    except (TypeError, ValueError, OverflowError):
        return None
    cols = [record_arr, pg_id_arr, pg, seq_arr, p2p_arr, None, created_arr, None, None, None, None,
            state, retired, is_p2p, t_start, t_done, None, None, keys]
    return cols


class RawFields:
    """Stands in for the records list when the columns came from the columnar reader:
    ``raw[i]`` is a dict of record ``i``'s optional fields that are read one record at
    a time (``peer`` of p2p records, ``duration_ms`` for completion times, the split
    sizes of all_to_all records)."""

    def __init__(self, peer: list[Any], duration: list[Any],
                 splits: list[Any] | None = None) -> None:
        self.peer = peer
        self.duration = duration
        self.splits = splits

    def __getitem__(self, i: int) -> dict[str, Any]:
        out = {"peer": self.peer[i], "duration_ms": self.duration[i]}
        pair = self.splits[i] if self.splits is not None else None
        if pair is not None:
            out["input_split_sizes"], out["output_split_sizes"] = pair
        return out

    def __len__(self) -> int:
        return len(self.peer)


def _int64s(raw: bytes) -> array:
    column = array("q")
    column.frombytes(raw)
    return column


def reader_columns(result: tuple[Any, ...]) -> tuple[list[Any], RawFields]:
    """The 19 columns from what ``_fastread.read_columns`` returned (which checked every
    record as :func:`_checked_columns` does, more strictly), and the records' optional
    fields (``peer``, ``duration_ms``)."""
    (_top, record, pg_id, seq, p2p_seq, created, pg, state, retired, is_p2p, t_start,
     t_done, keys, failed, peer, duration, splits, first_has_failed) = result
    cols = [_int64s(record), _int64s(pg_id), pg, _int64s(seq), _int64s(p2p_seq), None,
            _int64s(created), None, None, None, None, state, retired, is_p2p, t_start, t_done,
            None, None, keys]
    # As _failed_column: only when the first record has the field, and some are True.
    if first_has_failed and True in failed:
        cols[R_RETIRED] = [FAILED if f is True else r for r, f in zip(cols[R_RETIRED], failed)]
    return cols, RawFields(peer, duration, splits)


def _opt_int(e: dict[str, Any], key: str, default: Any, problems: Counter[str],
             allow_none: bool = False) -> Any:
    """An optional integer field: absent → ``default``; present and wrong → a problem."""
    if key not in e:
        return default
    value = e[key]
    if value is None and allow_none:
        return default
    if type(value) is not int or not -_I64 <= value <= _I64:
        problems[f"{key} is {short(value)}, expected an int"] += 1
        return default
    return value


def _norm_entry(e: Any, i: int, problems: Counter[str]) -> tuple[Any, ...] | None:
    """One record checked field by field; ``None`` (and a counted problem) if unusable."""
    if not isinstance(e, dict):
        problems[f"a record is {type(e).__name__}, expected a dict"] += 1
        return None
    seq = e.get("collective_seq_id", e.get("seq_id"))
    if type(seq) is not int or not 0 <= seq <= _I64:
        problems[f"collective_seq_id is {short(seq)}, expected an int >= 0 (record dropped)"] += 1
        return None
    pg = e.get("process_group")
    pg_id = _opt_int(e, "pg_id", -1, problems)
    if isinstance(pg, (list, tuple)) and len(pg) == 2 and all(type(x) is str for x in pg):
        group = (pg[0], pg[1])
    elif type(pg) is str:
        problems[f"process_group is {short(pg)}, expected (name, desc); used as the name"] += 1
        group = (pg, "")
    elif pg is None and pg_id >= 0:
        if "process_group" in e:
            problems["process_group is None, expected (name, desc); pg_id used"] += 1
        group = (str(pg_id), "")
    else:
        problems[f"process_group is {short(pg)}, expected (name, desc) (record dropped)"] += 1
        return None
    name = e.get("profiling_name")
    if type(name) is not str:
        problems[f"profiling_name is {short(name)}, expected text (record dropped)"] += 1
        return None
    state = e.get("state", "scheduled")
    if type(state) is not str or state not in STATE_BITS:
        problems[f"state is {short(state)}, expected scheduled/started/completed"] += 1
        state = "scheduled"
    retired = e.get("retired", state == "completed")
    if type(retired) is not bool:
        problems[f"retired is {short(retired)}, expected true/false"] += 1
        retired = state == "completed"
    if e.get("failed") is True:  # ended with an error: retired, never finished
        retired = FAILED
    is_p2p = e.get("is_p2p", False)
    if type(is_p2p) is not bool:
        problems[f"is_p2p is {short(is_p2p)}, expected true/false"] += 1
        is_p2p = False
    times = []
    for key in ("time_discovered_started_ns", "time_discovered_completed_ns"):
        times.append(_opt_int(e, key, None, problems, allow_none=True))
    dur = e.get("duration_ms")
    if dur is not None and (type(dur) not in (int, float) or not 0 <= dur < 1e12):
        problems[f"duration_ms is {short(dur)}, expected a number of milliseconds"] += 1
        dur = None
    peer = _opt_int(e, "peer", None, problems, allow_none=True)
    return (
        _opt_int(e, "record_id", -1, problems), pg_id, group, seq,
        _opt_int(e, "p2p_seq_id", 0, problems),
        tag_name(name, e.get("root"), e.get("reduce_op")),
        _opt_int(e, "time_created_ns", 0, problems),
        e.get("input_sizes", e.get("sizes", [])), e.get("input_dtypes", []),
        e.get("output_sizes", []), e.get("output_dtypes", []), state, retired, is_p2p,
        times[0], times[1], dur, peer,
    )


def slow_columns(entries: list[Any], problems: Counter[str]) -> tuple[list[Any], list[int] | None]:
    """The 19 columns, checked record by record (the slow path of the module doc)."""
    cols, kept = _slow_columns(entries, problems)
    return cols, (None if len(kept) == len(entries) else kept)


def _slow_columns(entries: list[Any], problems: Counter[str]) -> tuple[list[Any], list[int]]:
    rows, kept = [], []
    for i, e in enumerate(entries):
        row = _norm_entry(e, i, problems)
        if row is not None:
            rows.append(row)
            kept.append(i)
    if not rows:
        return [[] for _ in range(18)] + [None], kept
    return [list(c) for c in zip(*rows)] + [None], kept


def record_columns(
    entries: list[Any], problems: Counter[str]
) -> tuple[list[Any], list[int] | None]:
    """The 19 ``R_*`` columns of ``entries`` and, when records were dropped, the original
    position of each kept one (``None``: all kept, in order). Bad records are counted in
    ``problems``."""
    cols = _fast_columns(entries)
    if cols is not None:
        failed = _failed_column(entries) if entries else None
        if failed is not None:
            cols[R_RETIRED] = [FAILED if f is True else r for r, f in zip(cols[R_RETIRED], failed)]
        return cols, None
    cols, kept = _slow_columns(entries, problems)
    return cols, (None if len(kept) == len(entries) else kept)


def _duration_end(entry: Any, created: int) -> int:
    """``time_created_ns + duration_ms`` of one record, or 0 when it has no usable one."""
    dur = entry.get("duration_ms") if isinstance(entry, dict) else None
    if type(dur) in (int, float) and 0 < created < 2**62 and 0 <= dur < 1e9:
        return created + int(dur * 1e6)
    return 0


def end_times(cols: list[Any], entries: list[Any], kept: list[int] | None) -> array:
    """When each record of the file ended (ns; 0: not recorded), by position in the file.

    The recorded completion (``time_discovered_completed_ns``) when there is one, else
    ``time_created_ns + duration_ms`` (gloo with timing on), else 0. ``cols`` are the
    checked columns of :func:`record_columns` and ``kept`` its kept positions; dropped
    records get 0.
    """
    created = cols[R_CREATED]
    done = [t if t is not None and t > 0 else 0 for t in cols[R_TDONE]]
    durations = cols[R_DUR]
    for j in [j for j, t in enumerate(done) if not t]:  # usually none, or all (gloo)
        if durations is not None:  # the slow path checked the column already
            dur = durations[j]
            ok = dur is not None and 0 < created[j] < 2**62 and dur < 1e9
            done[j] = created[j] + int(dur * 1e6) if ok else 0
        else:
            done[j] = _duration_end(entries[j], created[j])
    if kept is None:
        return array("q", done)
    out = array("q", bytes(8 * len(entries)))
    for j, pos in enumerate(kept):
        out[pos] = done[j]
    return out
