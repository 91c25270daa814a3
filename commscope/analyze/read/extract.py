"""Turn one unpickled dump into a compact :class:`~commscope.analyze.model.RankDump`.

Algorithm (:func:`extract_dump`):

1. Check the top level: a dict with ``version``/``entries`` (or a pre-2.0 bare list of
   entries); anything else is a foreign file (:class:`DumpError`). Top-level fields of
   the wrong type are noted as problems and ignored. The rank is the file's own
   ``rank`` field when present, else the number in the file name.
2. Read the records into columns (:func:`commscope.analyze.read.records.record_columns`).
3. Intern signatures within the file (``marshal`` key → local id, C-level
   ``dict.fromkeys``); decode each distinct one once.
4. Split records into p2p ops and per-group **dense** :class:`Track` columns: index
   ``i`` is sequence number ``lo + i``; a sequence number the rank skipped inside its
   range is a ``GAP``; records sharing one sequence number (coalesced) become one
   composite signature. A hostile sequence number far from the rest cannot blow up
   the dense range: only the newest cluster (gaps ≤ 64) is kept, the rest reported.
5. :func:`finish_sigs` (in the parent process) maps local ids onto the shared
   :class:`SigTable` and fills each track's match-key column.
"""

from __future__ import annotations

import marshal
import re
from array import array
from collections import Counter
from dataclasses import replace
from itertools import compress, islice, repeat
from operator import add, lt
from typing import Any

from commscope.analyze.model import (
    COMPLETED,
    DEVICE_BACKENDS,
    GAP,
    RETIRED,
    TIMED_TAIL,
    Creation,
    P2POp,
    RankDump,
    RankPlace,
    Sig,
    SigTable,
    Track,
)
from commscope.analyze.read.kind import detect_kind, looks_active_only
from commscope.analyze.read.places import blocked_call, split_at_handler, user_place
from commscope.analyze.read.prints import read_prints
from commscope.analyze.read.records import (
    R_CREATED,
    R_IDT,
    R_IN,
    R_ISP2P,
    R_KEY,
    R_NAME,
    R_ODT,
    R_OUT,
    R_P2PSEQ,
    R_PEER,
    R_PG,
    R_PGID,
    R_RECORD,
    R_RETIRED,
    R_SEQ,
    R_STATE,
    R_TSTART,
    STATE_BITS,
    record_columns,
    short,
    slow_columns,
)
from commscope.analyze.read.records import end_times as record_end_times
from commscope.analyze.read.signature import coalesced_key, decode_sig, match_key, sig_key
from commscope.collectives import ALL_TO_ALL

__all__ = ["DumpError", "Declined", "extract_dump", "finish_sigs", "COMMSCOPE_FORMAT_PREFIX"]

COMMSCOPE_FORMAT_PREFIX = "commscope.flight/"
_RANKS_TEXT = re.compile(r"^\[\s*(\d+\s*(?:,\s*\d+\s*)*)?\]$")
_MAX_GAP = 64
MAX_WORLD_SIZE = 1 << 22
"""A ``world_size`` beyond this (4 194 304 ranks) is no real job's: ignored, not allocated."""
_DONE = RETIRED | COMPLETED
_P2P_OPS = ("send", "recv")


class DumpError(Exception):
    """A file that cannot be used at all; the message says why."""


class Declined(Exception):
    """The columns of the columnar reader could not be used: read the file again the
    standard way (which says what is wrong with it, if anything)."""


_RANKS_CACHE: dict[str, tuple[int, ...] | None] = {}


def _parse_ranks(text: Any) -> tuple[int, ...] | None:
    """``"[0, 1, 2]"`` → ``(0, 1, 2)``. Every rank of a job repeats the same strings (the
    default group of 4 096 ranks is 24 KB of text), so parsed lists are cached and
    shared: one tuple object, however many dumps hold it."""
    if type(text) is str:
        if text in _RANKS_CACHE:
            return _RANKS_CACHE[text]
        ranks = None
        if len(text) < 10_000_000 and _RANKS_TEXT.match(text):
            ranks = tuple(sorted({int(x) for x in re.findall(r"\d+", text)}))
        if len(_RANKS_CACHE) < 100_000:
            _RANKS_CACHE[text] = ranks
        return ranks
    if isinstance(text, list) and all(type(x) is int and x >= 0 for x in text):
        return tuple(sorted(set(text)))
    return None


def _threads_and_exception(data: dict[str, Any], dump: RankDump) -> None:
    """Commscope's ``commscope_threads`` (the main thread's place) and
    ``commscope_exception``; anything malformed is ignored."""
    threads = data.get("commscope_threads")
    if isinstance(threads, list):
        dump.threads = True
        handlers = _handlers(data)
        main = next((t for t in threads[:256] if isinstance(t, dict) and t.get("main") is True),
                    None)
        if main is not None:
            frames = main.get("frames")
            inside, program, at = split_at_handler(frames, handlers)
            if at >= 0:  # a signal handler runs on top of the interrupted program
                dump.handler = (handlers[(inside[-1].get("name"), inside[-1].get("filename"))],
                                user_place(inside))
            dump.main_place = user_place(program)
            dump.main_blocked = blocked_call(program) if at >= 0 else blocked_call(frames)
        for t in threads[:256]:
            if not isinstance(t, dict) or t.get("main") is True:
                continue
            frames = t.get("frames")
            if blocked_call(frames) and len(dump.blocked_threads) < 8:
                dump.blocked_threads.append((str(t.get("name", "?"))[:80], user_place(frames)))
    exc = data.get("commscope_exception")
    if isinstance(exc, dict) and type(exc.get("type")) is str:
        message = exc.get("message")
        dump.exception = (exc["type"][:200], message[:500] if type(message) is str else "",
                          user_place(exc.get("frames")))


def _thread_deaths(data: dict[str, Any], dump: RankDump) -> None:
    """Threads that died while the process went on (``commscope_thread_deaths``)."""
    items = data.get("commscope_thread_deaths")
    if not isinstance(items, list):
        return
    for item in items[-16:]:
        if isinstance(item, dict) and type(item.get("type")) is str:
            message = item.get("message")
            dump.thread_deaths.append((
                str(item.get("thread") or "?")[:80], item["type"][:200],
                message[:500] if type(message) is str else "", user_place(item.get("frames"))))


def _job(data: dict[str, Any], dump: RankDump) -> None:
    job = data.get("commscope_job")
    if isinstance(job, dict) and type(job.get("id")) is str:
        def num(key: str) -> int | None:
            v = job.get(key)
            return v if type(v) is int and 0 <= v < 2**63 else None

        dump.job = (job["id"][:100], num("restart"), num("started_ns"), num("world_size"))


def _place(data: dict[str, Any], dump: RankDump, problems: list[str]) -> None:
    """Where the rank ran (``commscope_place``, else ``hostname``/``pid``) and the job's
    host table it carries (``commscope_hosts``)."""
    place = data.get("commscope_place")

    def num(value: Any) -> int | None:
        return value if type(value) is int and 0 <= value < 2**31 else None

    def text(value: Any) -> str | None:
        return value[:4096] if type(value) is str and value else None

    if isinstance(place, dict) and text(place.get("host")):
        dump.place = RankPlace(host=str(text(place["host"]))[:255], pid=num(place.get("pid")),
                               dump_dir=text(place.get("dump_dir")),
                               node_rank=num(place.get("node_rank")),
                               local_rank=num(place.get("local_rank")))
    elif place is not None:
        problems.append(f"commscope_place is {short(place)}, ignored")
    elif dump.hostname:
        dump.place = RankPlace(host=dump.hostname[:255], pid=dump.pid)
    table = data.get("commscope_hosts")
    if table is not None and not isinstance(table, dict):
        problems.append(f"commscope_hosts is {short(table)}, ignored")
    elif table is not None and (dump.place is None or dump.place.local_rank in (None, 0)
                                or dump.rank == 0):
        # every rank carries the same table: one per host is kept (a folder of one host
        # holds its first rank's), decoded once for the whole job by HostMap
        dump.host_table = table


def _creations(data: dict[str, Any], dump: RankDump, problems: list[str]) -> None:
    items = data.get("commscope_group_creations")
    if items is None:
        return
    if not isinstance(items, list):
        problems.append(f"commscope_group_creations is {short(items)}, ignored")
        return
    for item in items[:4096]:
        try:
            ranks = _parse_ranks(item["ranks"])
            if ranks is None or type(item["seq"]) is not int:
                raise TypeError
            dump.creations.append(Creation(
                seq=item["seq"], name=str(item.get("name") or "")[:200],
                desc=str(item.get("desc") or "")[:200], ranks=ranks,
                done=item.get("state") != "started",
                started_ns=int(item.get("time_started_ns") or 0),
                place=user_place(item.get("frames")),
            ))
        except (TypeError, KeyError, ValueError):
            problems.append(f"a group creation is {short(item)}, ignored")


def _signal_records(data: dict[str, Any]) -> dict[int, str]:
    marked = data.get("commscope_signal_records")
    if not isinstance(marked, dict):
        return {}
    out = {}
    for key, sig in list(marked.items())[:100_000]:
        try:
            out[int(key)] = str(sig)[:40]
        except (TypeError, ValueError):
            continue
    return out


def _handlers(data: dict[str, Any]) -> dict[tuple[str, str], str]:
    """``(function, file) -> signal`` of the signal handlers the dump names."""
    items = data.get("commscope_signal_handlers")
    out: dict[tuple[str, str], str] = {}
    if isinstance(items, list):
        for h in items[:64]:
            if isinstance(h, dict) and type(h.get("name")) is str \
                    and type(h.get("filename")) is str:
                out[(h["name"], h["filename"])] = str(h.get("signal", "a signal"))[:40]
    return out


def _top_level(data: dict[str, Any], dump: RankDump, problems: list[str]) -> None:
    for key, attr, types in (
        ("world_size", "world_size", (int,)), ("hostname", "hostname", (str,)),
        ("pid", "pid", (int,)), ("dump_reason", "dump_reason", (str,)),
        ("dump_time_ns", "dump_time_ns", (int,)),
    ):
        if key in data and data[key] is not None:
            value = data[key]
            if type(value) in types and (type(value) is not int or 0 <= value < 2**63):
                setattr(dump, attr, value)
            else:
                problems.append(f"{key} is {short(value)}, ignored")
    if dump.world_size is not None and not 1 <= dump.world_size <= MAX_WORLD_SIZE:
        problems.append(f"world_size is {dump.world_size}, expected 1-{MAX_WORLD_SIZE}; ignored")
        dump.world_size = None
    for key in ("comm_lib_version", "nccl_version"):
        version = data.get(key)
        if type(version) is str and version:
            dump.lib_version = version[:40]
            break
    _threads_and_exception(data, dump)
    _job(data, dump)
    _thread_deaths(data, dump)
    read_prints(data, dump, problems)
    _place(data, dump, problems)
    _creations(data, dump, problems)
    config = data.get("pg_config")
    if isinstance(config, dict):
        for name, value in config.items():
            if not isinstance(value, dict):
                continue
            ranks = _parse_ranks(value.get("ranks"))
            desc = value.get("desc")
            if type(name) is str and name and type(desc) is str and desc:
                dump.group_desc.setdefault(name, desc[:200])  # also groups with no record
            if name == "" and ranks:
                dump.world_hint = ranks  # gloo 2.13: the default group's ranks under ''
            elif type(name) is str and name and ranks and value.get("name", name) == name:
                dump.config[name] = ranks
    elif config is not None:
        problems.append(f"pg_config is {short(config)}, expected a dict; ignored")
    ids = data.get("commscope_pg_ids")  # ours: every group's pg_id, entries or not
    if isinstance(ids, dict):
        for name, pg_id in list(ids.items())[:100_000]:
            if type(name) is str and type(pg_id) is int and pg_id >= 0:
                dump.group_pg_id.setdefault(name, pg_id)
    status = data.get("pg_status")
    if isinstance(status, dict):
        for key, value in status.items():
            try:
                pg_id = int(key)
                dump.pg_status[pg_id] = tuple(  # type: ignore[assignment]
                    int(value[k]) for k in ("last_enqueued_collective",
                                            "last_started_collective",
                                            "last_completed_collective"))
            except (TypeError, ValueError, KeyError, OverflowError):
                problems.append(f"pg_status[{short(key)}] is {short(value)}, ignored")


def extract_dump(data: Any, path: str, name_rank: int | None, *,
                 end_times: bool = False, fast: tuple[list[Any], Any] | None = None) -> RankDump:
    """Build the :class:`RankDump` of one file's unpickled content (see module doc).

    ``end_times`` also keeps each record's completion time (``RankDump.ends``), which
    the timeline exports draw. ``fast``: the checked columns and optional fields the
    columnar reader made of the records (``data`` is then the file's top-level dict);
    raises :class:`Declined` when they cannot be used after all.
    """
    if isinstance(data, list):
        if data and not any(isinstance(e, dict) for e in data[:100]):
            raise DumpError(f"foreign file: a list of {type(data[0]).__name__}, not "
                            "flight-recorder records")
        data = {"version": "1.0", "entries": data}
    if not isinstance(data, dict):
        raise DumpError(f"foreign file: holds {type(data).__name__} {short(data)}, expected "
                        "a dict with 'version' and 'entries'")
    if "entries" not in data and "version" not in data:
        keys = ", ".join(sorted(repr(k) for k in list(data)[:6]))
        raise DumpError(f"foreign file: a dict without 'version' or 'entries' (keys: {keys})")
    fmt = data.get("commscope_format")
    ours = type(fmt) is str and fmt.startswith(COMMSCOPE_FORMAT_PREFIX)
    source = "commscope" if ours else "pytorch"
    inner = data.get("rank")
    problems: list[str] = []
    if type(inner) is int and 0 <= inner < 2**31:
        rank = inner
    elif name_rank is not None:
        rank = name_rank
        if "rank" in data:
            problems.append(f"rank is {short(inner)}, expected an int >= 0; the name's "
                            f"rank {name_rank} is used")
    else:
        raise DumpError("no rank: the file has no 'rank' field and its name no rank number")
    version = data.get("version")
    if type(version) is not str:
        problems.append(f"version is {short(version)}, expected text like '2.10'")
        version = "?"
    dump = RankDump(rank=rank, path=path, source=source, version=version)
    _top_level(data, dump, problems)
    entries = data.get("entries", [])
    if not isinstance(entries, list):
        problems.append(f"entries is {short(entries)}, expected a list; no records used")
        entries = []
    counted: Counter[str] = Counter()
    in_handler = _signal_records(data)
    positions: list[int] | None = None
    file_entries = entries
    if in_handler:
        if fast is not None:
            raise Declined  # rare: the standard path sets those records aside
        entries, positions = _set_aside_handler_records(entries, in_handler, dump)
    if fast is not None:
        if "commscope_p2p_ordinals" in data:
            raise Declined  # a progress record's: the standard path reads them
        (cols, entries), kept = fast, None
    else:
        cols, kept = record_columns(entries, counted)
    mark = len(problems)
    try:
        _build(dump, cols, problems, entries)
    except OverflowError:  # an integer beyond 64 bits slipped through the fast path
        if fast is not None:
            raise Declined from None
        del problems[mark:]
        dump.tracks.clear()
        dump.p2p.clear()
        dump.pending.clear()
        counted.clear()
        cols, kept = slow_columns(entries, counted)
        _build(dump, cols, problems, entries)
    if entries and dump.n_entries == 0 and not in_handler:
        # a file that reads but none of whose records does: not the rank's history (an
        # empty one would make it a culprit of every collective), an unusable dump
        detail = "; ".join(f"{n} {text}" for text, n in sorted(counted.items())[:2])
        raise DumpError(f"unusable: none of its {len(entries)} records is valid "
                        f"({detail or 'all dropped'})")
    if "commscope_p2p_channels" in data:
        _p2p_channels(data, dump, entries, problems)
    if positions is not None:  # indices must point into the file's own list
        kept = [positions[k] for k in kept] if kept is not None else positions
        entries = file_entries
    problems += [f"{n} record(s): {text}" for text, n in sorted(counted.items())]
    if end_times or (ours and _device_named(data, dump.backend)):
        # commscope's device dumps carry their time: when each record finished is what
        # tells a stopped device from a dump taken a moment before its peers'
        dump.ends = record_end_times(cols, entries, kept)
    if kept is not None:
        _renumber(dump, kept)
    if dump.started_seen and _device_named(data, dump.backend):
        ends = dump.ends if dump.ends is not None else record_end_times(cols, entries, kept)
        _device_times(dump, entries, ends)
    _align_clock(data, dump, problems)
    dump.kind = detect_kind(dump, data)
    if dump.kind.active_only:
        dump.wrapped = False  # its first record_id is its oldest unfinished entry's
    dump.problems = problems
    return dump


def _device_times(dump: RankDump, entries: list[Any], ends: array) -> None:
    """Each track's ``duration`` and ``done`` columns on a device backend with timing:
    how long the device spent in each of its newest :data:`TIMED_TAIL` collectives
    (``duration_ms``, from its CUDA events) and when its completion was seen (``ends``:
    by position in the file); 0 when not
    recorded. The analyzer times arrivals from them (a call's ``time_created_ns`` there
    is its enqueue). A dump without any duration keeps ``None``."""
    for t in dump.tracks.values():
        tail = list(t.index)[-TIMED_TAIL:]  # the straggler figures read no more
        durs = array("q", bytes(8 * len(tail)))
        done = array("q", bytes(8 * len(tail)))
        for j, i in enumerate(tail):
            e = entries[i] if 0 <= i < len(entries) else None
            dur = e.get("duration_ms") if isinstance(e, dict) else None
            if type(dur) in (int, float) and 0 <= dur < 1e9:
                durs[j] = int(dur * 1e6)
                done[j] = ends[i] if i < len(ends) else 0
        if any(durs):
            t.duration, t.done = durs, done


def _device_named(data: dict[str, Any], backend: str) -> bool:
    """Whether ``backend`` is a device backend, by the dump's own word or the known ones."""
    named = data.get("commscope_device_backends")
    return backend in DEVICE_BACKENDS or (isinstance(named, list) and backend in named[:64])


_CLOCK_NOISE_NS = 1_000_000
"""Offsets within this (or within their own uncertainty) are left as they are."""


def _align_clock(data: dict[str, Any], dump: RankDump, problems: list[str]) -> None:
    """Move every time of the dump onto rank 0's clock (``commscope_clock``: the rank's
    measured offset), so times compared across ranks of different hosts mean the same
    instant. An offset within the measurement's noise is left alone (one host)."""
    clock = data.get("commscope_clock")
    if clock is None:
        return
    off = clock.get("offset_ns") if isinstance(clock, dict) else None
    unc = clock.get("uncertainty_ns") if isinstance(clock, dict) else None
    if type(off) is not int or type(unc) is not int or not (abs(off) < 2**62 and unc >= 0):
        problems.append(f"commscope_clock is {short(clock)}, ignored")
        return
    dump.clock_offset_ns, dump.clock_uncertainty_ns = off, unc
    if abs(off) <= max(unc, _CLOCK_NOISE_NS):
        return
    import numpy as np

    def shifted(col: array) -> array:
        values = np.frombuffer(col, dtype=np.int64)
        moved = np.where(values > 0, values - off, values)
        return array("q", moved.tobytes())

    for t in dump.tracks.values():
        t.created = shifted(t.created)
        if t.done is not None:
            t.done = shifted(t.done)
    if dump.ends is not None:
        dump.ends = shifted(dump.ends)
    for op in dump.p2p:
        if op.created > 0:
            op.created -= off
    for rows in dump.prints.values():
        rows.arrived_ns = [t - off for t in rows.arrived_ns]
    for name in ("dump_time_ns", "first_created_ns", "last_created_ns"):
        value = getattr(dump, name)
        if value:
            setattr(dump, name, value - off)
    dump.creations = [replace(c, started_ns=c.started_ns - off) if c.started_ns else c
                      for c in dump.creations]


def _p2p_channels(data: dict[str, Any], dump: RankDump, entries: list[Any],
                  problems: list[str]) -> None:
    """A progress record's channel counts (``commscope_p2p_channels``) and each kept
    send/recv's ordinal on its channel (``commscope_p2p_ordinals``)."""
    rows, ordinals = data.get("commscope_p2p_channels"), data.get("commscope_p2p_ordinals")
    if not isinstance(rows, list) or not isinstance(ordinals, dict):
        problems.append("commscope_p2p_channels/ordinals are not a list and a dict: not used")
        return
    totals: dict[tuple[str, str, int], int] = {}
    for row in rows:
        if (isinstance(row, list) and len(row) == 4 and isinstance(row[0], str)
                and row[1] in ("send", "recv") and type(row[2]) is int and type(row[3]) is int):
            totals[(row[0], row[1], row[2])] = row[3]
    dump.p2p_totals = totals
    for op in dump.p2p:
        entry = entries[op.index] if 0 <= op.index < len(entries) else None
        rid = entry.get("record_id") if isinstance(entry, dict) else None
        k = ordinals.get(str(rid))
        if type(k) is int and k >= 0:
            op.ordinal = k


def _set_aside_handler_records(entries: list[Any], marked: dict[int, str],
                               dump: RankDump) -> tuple[list[Any], list[int]]:
    """The records issued from a signal handler leave the rank's history (the rest is
    what its program did); each is noted in ``dump.handler_ops``. Returns the other
    records and their positions in the file."""
    kept, positions = [], []
    for i, e in enumerate(entries):
        sig = marked.get(e.get("record_id")) if isinstance(e, dict) else None
        if sig is None:
            kept.append(e)
            positions.append(i)
            continue
        pg = e.get("process_group")
        name = str(pg[0]) if isinstance(pg, (list, tuple)) and pg else "?"
        seq = e.get("collective_seq_id")
        dump.handler_ops.append((sig, name, seq if type(seq) is int else -1, i))
    return kept, positions


def _build(dump: RankDump, cols: list[Any], problems: list[str], entries: list[Any]) -> None:
    n = len(cols[R_SEQ])
    dump.n_entries = n
    dump.sig_keys, dump.local_sigs = [], []
    if n == 0:
        return
    keys = cols[R_KEY]
    if keys is None:  # the slow path: keys from the checked signature columns
        fields = (cols[R_NAME], cols[R_IN], cols[R_OUT], cols[R_IDT], cols[R_ODT])
        try:
            keys = list(map(marshal.dumps, zip(*fields), repeat(2)))
        except (ValueError, TypeError, RecursionError):
            keys = [_safe_key(*v) for v in zip(*fields)]
    uniq = dict.fromkeys(keys)
    local = {k: i for i, k in enumerate(uniq)}
    sid = list(map(local.__getitem__, keys))
    sigs = [_decoded(k) for k in uniq]
    counts = Counter(sid) if any(s.problem for s in sigs) else Counter()
    for i, s in enumerate(sigs):
        if s.problem:
            problems.append(f"{counts[i]} record(s): {s.problem} (sizes not compared)")
    dump.sig_keys, dump.local_sigs = list(uniq), sigs
    status = list(map(add, map(STATE_BITS.__getitem__, cols[R_STATE]), cols[R_RETIRED]))
    pg_set = set(cols[R_PG])
    names = [pg[0] for pg in cols[R_PG]] if len(pg_set) > 1 else [cols[R_PG][0][0]] * n
    for name, desc in sorted(pg_set):
        dump.group_desc.setdefault(name, desc)
    pg_pairs = set(zip(names, cols[R_PGID])) if len(pg_set) > 1 else {(names[0], cols[R_PGID][0])}
    for name, pg_id in sorted(pg_pairs):
        if pg_id >= 0:
            dump.group_pg_id.setdefault(name, pg_id)
    sig_p2p = [s.op in _P2P_OPS for s in sigs]
    is_p2p = None
    if any(cols[R_ISP2P]) or any(sig_p2p):
        is_p2p = [a or sig_p2p[s] for a, s in zip(cols[R_ISP2P], sid)]
    last_name = sigs[sid[-1]].profiling_name
    dump.backend = last_name.partition(":")[0] if ":" in last_name else ""
    records = cols[R_RECORD]
    dump.done_seen = any(b & _DONE for b in status)
    dump.started_seen = any(cols[R_TSTART])
    dump.ids_contiguous = records[-1] - records[0] == n - 1
    dump.active_hint = looks_active_only(records, [bool(b & _DONE) for b in status],
                                         len(dump.pg_status))
    buckets: dict[str, list[int]] = {}
    if is_p2p is None and len(pg_set) == 1:
        dump.tracks[names[0]] = _track(None, cols, sid, status, dump, problems)
    else:
        for i, name in enumerate(names):
            if is_p2p is not None and is_p2p[i]:
                continue
            buckets.setdefault(name, []).append(i)
    for name, idx in buckets.items():
        dump.tracks[name] = _track(idx, cols, sid, status, dump, problems)
    if is_p2p is not None:
        members, unsettled = _batches(dump, cols, names, sid, sigs, is_p2p, status)
        for i in compress(range(n), is_p2p):
            sig = sigs[sid[i]]
            parsed = _p2p_parts(sig)
            if parsed is None:
                continue
            peer = cols[R_PEER][i] if cols[R_PEER] is not None else _peer_of(entries[i])
            dump.p2p.append(P2POp(
                group=names[i], p2p_seq=cols[R_P2PSEQ][i], op=sig.op,
                peer=peer if type(peer) is int and peer >= 0 else None,
                local_src=parsed[0], local_dst=parsed[1], sig=sid[i], status=status[i],
                created=cols[R_CREATED][i], index=i, batch=i in members,
                settled=i not in unsettled,
            ))
    seqs = cols[R_SEQ]
    if len(entries) == n and any(s.op == ALL_TO_ALL for s in sigs):
        _read_splits(dump, entries, sid, sigs, names, seqs)
    for i in _unfinished(status):
        p2p = is_p2p is not None and is_p2p[i]
        dump.pending.append((names[i], -1 if p2p else seqs[i], i))
    last_p2p = is_p2p is not None and is_p2p[-1]
    dump.last = (names[-1], -1 if last_p2p else seqs[-1], n - 1)
    dump.first_record_id = cols[R_RECORD][0]
    dump.first_created_ns = cols[R_CREATED][0]
    dump.last_created_ns = max(cols[R_CREATED])
    dump.wrapped = cols[R_RECORD][0] > 0


def _batches(dump: RankDump, cols: list[Any], names: list[str], sid: list[int],
             sigs: list[Sig], is_p2p: list[bool], status: list[int]
             ) -> tuple[set[int], set[int]]:
    """Coalesced batches of send/recv (``batch_isend_irecv`` on NCCL): each op has an
    entry of its own that never completes (it has no events), and the batch's closing
    entry (``nccl:coalesced``, same group and ``p2p_seq_id``) owns the batch's events.
    Each op's status becomes its batch's (``status`` is changed in place); in an
    active-only dump a batch whose closing entry is gone finished (it was dropped as
    finished, while its ops' entries, which never finish, stayed). Fills
    ``dump.batches``; returns the positions of the batches' ops, and those of lone
    entries of an active-only dump whose state cannot be told (:func:`_lone_done`)."""
    p2p_seq = cols[R_P2PSEQ]
    closing: dict[tuple[str, int], int] = {}
    ops: dict[tuple[str, int], list[int]] = {}
    for i in compress(range(len(sid)), is_p2p):
        key = (names[i], p2p_seq[i])
        if sigs[sid[i]].op in _P2P_OPS:
            ops.setdefault(key, []).append(i)
        elif "coalesced" in sigs[sid[i]].profiling_name:
            closing[key] = i
    members: set[int] = set()
    unsettled: set[int] = set()
    dropped_as_done = bool(dump.active_hint) and dump.backend != "gloo"
    records = cols[R_RECORD]
    kept = set(records) if dropped_as_done else set()
    for key, positions in ops.items():
        end = closing.get(key)
        if end is not None or len(positions) > 1:
            members.update(positions)
        if end is not None:
            for i in positions:
                status[i] = status[end]
        elif dropped_as_done and (len(positions) > 1 or _lone_done(
                dump, cols, names, key, records[positions[-1]], kept)):
            for i in positions:
                status[i] |= _DONE
        elif dropped_as_done and not status[positions[0]] & _DONE:
            unsettled.update(positions)
    for key, end in closing.items():
        dump.batches[key] = (status[end], end)
    return members, unsettled


def _lone_done(dump: RankDump, cols: list[Any], names: list[str], key: tuple[str, int],
               record_id: int, kept: set[int]) -> bool:
    """Whether a lone send/recv entry of an active-only dump (a batch of one whose closing
    entry is gone, or an op of its own) finished. A launched batch's closing entry is
    dropped only once it finished; an op of its own is dropped then too. So it finished
    when the record right after it was dropped while a later one was kept (work on one
    device stream finishes in order), or when its group's ``pg_status`` row says so (in
    a group that ran no collective across the records kept, every send/recv there
    carrying the same collective count, the row counts p2p work)."""
    if record_id + 1 not in kept and record_id < cols[R_RECORD][-1]:
        return True
    name, seq = key
    row = dump.pg_status.get(dump.group_pg_id.get(name, -1))
    if row is None or name in dump.tracks:
        return False
    carried = {cols[R_SEQ][i] for i, g in enumerate(names) if g == name}
    return len(carried) == 1 and row[2] >= seq


def _split_list(value: Any) -> tuple[int, ...] | None:
    if not isinstance(value, (list, tuple)) or not 0 < len(value) <= 4096:
        return None
    if not all(type(x) is int and 0 <= x < 2**62 for x in value):
        return None
    return tuple(value)


def _read_splits(dump: RankDump, entries: Any, sid: list[int], sigs: list[Sig],
                 names: list[str], seqs: Any) -> None:
    """``dump.splits`` from the all_to_all records that carry split sizes (a split list
    that is not a list of ints >= 0 is left out, as if not recorded)."""
    wanted = {i for i, s in enumerate(sigs) if s.op == ALL_TO_ALL}
    for i, s in enumerate(sid):
        if s not in wanted:
            continue
        e = entries[i]
        if not isinstance(e, dict) or ("input_split_sizes" not in e
                                       and "output_split_sizes" not in e):
            continue
        ins = _split_list(e.get("input_split_sizes"))
        outs = _split_list(e.get("output_split_sizes"))
        if ins is not None or outs is not None:
            dump.splits[(names[i], seqs[i])] = (ins, outs)


_PENDING_TABLE = bytes(0 if b & _DONE else 1 for b in range(256))


def _unfinished(status: list[int]) -> list[int]:
    """Positions whose status has no done bit (usually a handful, at the end)."""
    flags = bytes(status).translate(_PENDING_TABLE)  # statuses are 0..15
    out = []
    i = flags.find(1)
    while i >= 0:
        out.append(i)
        i = flags.find(1, i + 1)
    return out


def _renumber(dump: RankDump, kept: list[int]) -> None:
    """Point record indices back at positions in the file after records were dropped."""
    for track in dump.tracks.values():
        track.index = array("l", [kept[i] if i >= 0 else -1 for i in track.index])
    for op in dump.p2p:
        op.index = kept[op.index]
    dump.pending = [(g, s, kept[i]) for g, s, i in dump.pending]
    if dump.last is not None:
        g, s, i = dump.last
        dump.last = (g, s, kept[i])


_DECODED: dict[bytes, Sig] = {}


def _decoded(key: bytes) -> Sig:
    """:func:`decode_sig`, remembered: every rank of a job repeats the same few."""
    sig = _DECODED.get(key)
    if sig is None:
        sig = decode_sig(key)
        if len(_DECODED) < 65_536:
            _DECODED[key] = sig
    return sig


def _peer_of(entry: Any) -> int | None:
    peer = entry.get("peer") if isinstance(entry, dict) else None
    return peer if type(peer) is int and 0 <= peer < 2**31 else None


def _safe_key(*fields: Any) -> bytes:
    try:
        return sig_key(*fields)
    except (ValueError, TypeError, RecursionError):
        name = fields[0] if type(fields[0]) is str else "unknown"
        return sig_key(name, None, None, None, None)


def _p2p_parts(sig: Sig) -> tuple[int | None, int | None] | None:
    from commscope.collectives import parse_profiling_name

    if sig.op not in _P2P_OPS:
        return None
    parsed = parse_profiling_name(sig.profiling_name)
    return parsed.src, parsed.dst


def _track(idx: list[int] | None, cols: list[Any], sid: list[int], status: list[int],
           dump: RankDump, problems: list[str]) -> Track:
    """One group's track from the records at positions ``idx`` (``None``: all)."""
    seq_col = cols[R_SEQ]
    seqs = seq_col if idx is None else list(map(seq_col.__getitem__, idx))
    if seqs[-1] - seqs[0] == len(seqs) - 1 and all(map(lt, seqs, islice(seqs, 1, None))):
        if idx is None:
            created = cols[R_CREATED]
            return Track(lo=seqs[0], sig=array("l", sid), status=array("b", status),
                         created=created if type(created) is array else array("q", created),
                         index=range(len(sid)))
        return Track(
            lo=seqs[0], sig=array("l", map(sid.__getitem__, idx)),
            status=array("b", map(status.__getitem__, idx)),
            created=array("q", map(cols[R_CREATED].__getitem__, idx)), index=array("l", idx),
        )
    positions = list(range(len(sid))) if idx is None else idx
    lo, take, sig, stat = _densify(positions, seqs, sid, status, dump, problems)
    created = cols[R_CREATED]
    return Track(lo=lo, sig=sig, status=stat,
                 created=array("q", [0 if i is None else created[i] for i in take]),
                 index=array("l", [-1 if i is None else i for i in take]))


def _densify(idx: list[int], seqs: list[int], sid: list[int], status: list[int],
             dump: RankDump, problems: list[str]) -> tuple[int, list[Any], array, array]:
    by_seq: dict[int, list[int]] = {}
    for i, s in zip(idx, seqs):
        by_seq.setdefault(s, []).append(i)
    ordered = sorted(by_seq)
    start = len(ordered) - 1
    while start > 0 and ordered[start] - ordered[start - 1] <= _MAX_GAP:
        start -= 1
    if start > 0:
        dropped = sum(len(by_seq[s]) for s in ordered[:start])
        problems.append(f"{dropped} record(s) with collective_seq_id far below the rest "
                        f"(e.g. {ordered[0]} vs {ordered[start]}) ignored")
        ordered = ordered[start:]
    lo, hi = ordered[0], ordered[-1]
    sig = array("l")
    stat = array("b")
    take: list[Any] = []
    assert dump.sig_keys is not None and dump.local_sigs is not None
    for s in range(lo, hi + 1):
        members = by_seq.get(s)
        if not members:
            sig.append(GAP)
            stat.append(0)
            take.append(None)
        elif len(members) == 1:
            sig.append(sid[members[0]])
            stat.append(status[members[0]])
            take.append(members[0])
        else:
            key = coalesced_key(tuple(dump.sig_keys[sid[m]] for m in members))
            member_ids = tuple(sid[m] for m in members)
            try:
                cid = dump.sig_keys.index(key)
            except ValueError:
                cid = len(dump.sig_keys)
                dump.sig_keys.append(key)
                ops = {dump.local_sigs[m].op for m in member_ids}
                dump.local_sigs.append(Sig(
                    profiling_name=f"coalesced({len(members)})",
                    op=ops.pop() if len(ops) == 1 else "coalesced",
                    input_sizes=None, output_sizes=None, input_dtypes=None,
                    output_dtypes=None, members=member_ids,
                ))
            sig.append(cid)
            st = 7
            for m in members:
                st &= status[m]
            stat.append(st)
            take.append(members[0])
    return lo, take, sig, stat


def finish_sigs(dump: RankDump, table: SigTable) -> None:
    """Map the dump's local signature ids onto ``table`` and fill match-key columns."""
    keys, local = dump.sig_keys or [], dump.local_sigs or []
    remap: list[int] = []
    mk_of: list[int] = []
    for key, sig in zip(keys, local):
        gid = table.keys.get(key)
        if gid is None:
            if sig.members:
                members = tuple(remap[m] for m in sig.members)
                sig = replace(sig, members=members)
                parts = tuple(table.match_values[table.match_keys[m]] for m in members)
                value = match_key(sig, parts)
            else:
                value = match_key(sig)
            gid = table.add(key, sig, table.match_id(value))
        remap.append(gid)
        mk_of.append(table.match_keys[gid])
    remap.append(GAP)
    mk_of.append(GAP)
    mapping = (tuple(remap), tuple(mk_of))
    for track in dump.tracks.values():
        # Most ranks hold the very same columns: convert each distinct one once and
        # share the result (time and memory on thousands of ranks).
        key = (mapping, track.lo, track.sig.tobytes())
        shared = table.columns.get(key)
        if shared is None:
            local_ids = track.sig
            shared = (array("l", map(remap.__getitem__, local_ids)),
                      array("l", map(mk_of.__getitem__, local_ids)))
            if len(table.columns) < 4096:
                table.columns[key] = shared
        track.sig, track.mk = shared
    for op in dump.p2p:
        op.sig = remap[op.sig]
    dump.sig_keys = None
    dump.local_sigs = None

