"""From one refresh of progress records to the live view: progress, lag and a verdict.

The verdict comes from the same analysis as ``commscope analyze``: each progress record
is a dump in miniature, loaded by the same extractor and diagnosed by the same wait-for
graph. Only the loading differs.

Algorithm (:func:`snapshot`):

1. A rank whose newest record is older than ``silent_s`` (default: 3 intervals, at least
   5 s) is *silent*: its process is gone or frozen (the publisher runs on the watchdog
   thread, which keeps running while the main thread waits in a collective). Silent
   and never-published ranks count as ranks without a dump.
2. Each record becomes a :class:`~commscope.analyze.model.RankDump` through
   :func:`commscope.analyze.read.extract.extract_dump`; records that do not parse are named.
3. *Stuck*: some rank's oldest unfinished op is older than ``stall_s`` (default: 2
   intervals, at least 1 s), or a rank is silent. Then the analysis runs and its
   blocking findings are the verdict (``stuck 40 s: rank 3 in load_batch; ranks 0-2
   wait in all_reduce #812 of group mesh_dp``). Remarks that only reflect a record's
   short window (wrapped rings, stragglers) are left out.
4. Otherwise the job runs; per group, a rank is *behind* when its record is at least as
   new as the leader's yet it has enqueued fewer collectives (a sound lower bound: the
   leader's count only grows), reported as ``rank 5 behind by 3 collectives on dp``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from commscope.analyze.analysis import analyze_loaded
from commscope.analyze.model import Finding, LoadResult, SigTable, Unreadable
from commscope.analyze.read.extract import DumpError, extract_dump, finish_sigs
from commscope.analyze.read.places import user_frame, user_place
from commscope.analyze.text import frame_text, place_text, rank_list, ranks_phrase
from commscope.flight.out import progress
from commscope.watch.source import Fetched

__all__ = ["Thresholds", "LiveCache", "snapshot", "FORMAT"]

FORMAT = "commscope.watch/1"
_HIDDEN_KINDS = ("truncated_history", "straggler", "healthy")


@dataclass(frozen=True)
class Thresholds:
    """When a wait counts as a stall and a record as silent."""

    interval_s: float = 2.0
    stall_s: float | None = None
    silent_s: float | None = None

    @property
    def stall(self) -> float:
        """Seconds an op may stay unfinished before the job counts as stuck."""
        return self.stall_s if self.stall_s is not None else max(2 * self.interval_s, 1.0)

    @property
    def silent(self) -> float:
        """Seconds without a new record before a rank counts as gone."""
        return self.silent_s if self.silent_s is not None else max(3 * self.interval_s, 5.0)


def _unfinished(rec: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in rec.get("entries", []) if isinstance(e, dict)
            and not e.get("retired") and e.get("state") != "completed"]


def _creating(rec: dict[str, Any]) -> list[dict[str, Any]]:
    """The group creations a rank is blocked in, shaped as unfinished entries (a rank
    waiting for a member that never comes to create a group is stuck like one in a
    collective)."""
    out = []
    for c in rec.get("commscope_group_creations") or []:
        if isinstance(c, dict) and c.get("state") == "started":
            out.append({"profiling_name": f"create:new_group {c.get('desc') or c.get('name')}",
                        "time_created_ns": c.get("time_started_ns"),
                        "process_group": [str(c.get("name")), str(c.get("desc"))],
                        "frames": c.get("frames"), "creating": True})
    return out


def _where(entry: dict[str, Any]) -> str:
    return frame_text(user_frame(entry.get("frames")))


def _op_text(entry: dict[str, Any]) -> str:
    name = str(entry.get("profiling_name", "?")).partition(":")[2] or "?"
    if entry.get("creating"):
        return name
    if entry.get("is_p2p"):
        return f"{name.split()[0]} (p2p #{entry.get('p2p_seq_id')})"
    return f"{name} #{entry.get('collective_seq_id')}"


def _rank_rows(dumps: dict[int, dict[str, Any]], fetched: Fetched, now_ns: int,
               th: Thresholds) -> list[dict[str, Any]]:
    rows = []
    for r, rec in sorted(dumps.items()):
        beat = fetched.beats.get(r)
        t = beat.time_ns if beat else rec.get("dump_time_ns")
        age = (now_ns - t) / 1e9 if isinstance(t, int) else None
        quiet = beat.quiet_s if beat else 0.0
        pending = _unfinished(rec) + _creating(rec)
        oldest = min(pending, key=lambda e: e.get("time_created_ns") or 0) if pending else None
        main = (rec.get("commscope_threads") or [{}])[0]
        place = user_place(main.get("frames")) if isinstance(main, dict) else None
        rows.append({
            "rank": r,
            "age_s": round(age, 2) if age is not None else None,
            "silent": quiet > th.silent or (quiet == 0.0 and age is not None
                                            and age > th.silent),
            "step": rec.get("commscope_step"),
            "published": beat.beats if beat else None,
            "where_now": place_text(place) if place else None,
            "oldest_unfinished": None if oldest is None else {
                "op": _op_text(oldest),
                "group": str((oldest.get("process_group") or ["?"])[0]),
                "age_s": round((now_ns - (oldest.get("time_created_ns") or now_ns)) / 1e9, 2),
                "where": _where(oldest),
            },
        })
    return rows


def _group_rows(fetched: Fetched) -> list[dict[str, Any]]:
    per: dict[str, dict[int, tuple[int, int, int]]] = {}
    descs: dict[str, str] = {}
    for r, rec in fetched.records.items():
        prog = rec.get("progress")
        beat = fetched.beats.get(r)
        t = beat.time_ns if beat else (rec.get("dump_time_ns") or 0)
        if not isinstance(prog, dict):
            continue
        for name, item in prog.items():
            if isinstance(item, list) and len(item) == 3 and all(type(x) is int for x in item[1:]):
                descs[name] = str(item[0])
                per.setdefault(name, {})[r] = (item[1], item[2], t)
    rows = []
    for name, ranks in sorted(per.items(), key=lambda kv: (len(kv[0]), kv[0])):
        leader = max(ranks, key=lambda r: (ranks[r][0], -ranks[r][2]))
        lead_enq, _, lead_t = ranks[leader]
        behind = {r: lead_enq - enq for r, (enq, _, t) in ranks.items()
                  if enq < lead_enq and t >= lead_t}
        rows.append({
            "name": name, "desc": descs.get(name, ""), "ranks": rank_list(ranks, 6),
            "enqueued_max": lead_enq,
            "completed_min": min(c for _, c, _ in ranks.values()),
            "lag": max(behind.values(), default=0),
            "behind": {str(r): n for r, n in sorted(behind.items())},
        })
    return rows


class LiveCache:
    """What one watch keeps between refreshes: each rank's record as a dump and as a
    loaded :class:`~commscope.analyze.model.RankDump`, by record version, and one
    signature table for all of them. A stuck job's records do not change, so a refresh
    re-reads only the ranks that moved."""

    def __init__(self) -> None:
        self.table = SigTable()
        self.dumps: dict[int, tuple[int, dict[str, Any]]] = {}
        self.loaded: dict[int, tuple[int, Any]] = {}

    def as_dump(self, fetched: Fetched, r: int) -> dict[str, Any]:
        """Rank ``r``'s record expanded into the dump schema (cached by version)."""
        version = _version(fetched, r)
        hit = self.dumps.get(r)
        if hit is None or hit[0] != version or version < 0 or r in fetched.changed:
            hit = (version, progress.as_dump(fetched.records[r], fetched.configs.get(r)))
            self.dumps[r] = hit
            self.loaded.pop(r, None)
        return hit[1]

    def load(self, fetched: Fetched, r: int, data: dict[str, Any]) -> Any:
        """Rank ``r``'s RankDump (raises DumpError); cached by version."""
        version = _version(fetched, r)
        hit = self.loaded.get(r)
        if hit is None or hit[0] != version or version < 0:
            d = extract_dump(data, f"store: rank {r}", r)
            finish_sigs(d, self.table)
            hit = (version, d)
            self.loaded[r] = hit
        beat = fetched.beats.get(r)
        if beat is not None:
            hit[1].dump_time_ns = beat.time_ns
        return hit[1]


def _version(fetched: Fetched, r: int) -> int:
    beat = fetched.beats.get(r)
    return beat.version if beat is not None else -1


def _load(fetched: Fetched, as_dumps: dict[int, dict[str, Any]], silent: set[int],
          cache: LiveCache) -> tuple[LoadResult, dict[str, list[Any]]]:
    dumps = {}
    memory: dict[str, list[Any]] = {}
    unreadable = [Unreadable(f"store: rank {r}", why, r) for r, why in fetched.bad]
    for r, data in sorted(as_dumps.items()):
        if r in silent:
            continue
        path = f"store: rank {r}"
        try:
            dumps[r] = cache.load(fetched, r, data)
        except DumpError as exc:
            unreadable.append(Unreadable(path, str(exc), r))
            continue
        memory[path] = data.get("entries", [])
    return LoadResult(dumps=dumps, unreadable=unreadable, sigs=cache.table,
                      root="store"), memory


def _headline(f: Finding, stuck_s: float, rows: dict[int, dict[str, Any]]) -> str:
    who = ranks_phrase(f.culprit_ranks) if f.culprit_ranks else "no single rank"
    where = ""
    if len(f.culprit_ranks) == 1:
        row = rows.get(f.culprit_ranks[0])
        if row and row["oldest_unfinished"] is None and row["where_now"]:
            where = f" in {row['where_now']}"
        elif row and row["oldest_unfinished"]:
            where = f" waits in {row['oldest_unfinished']['op']}"
        elif row is None or row.get("silent"):
            where = " gone (no recent record)"
    what = ""
    direct = list(f.waiting_ranks)
    if f.op and f.group is not None:
        seq = f" #{f.collective_seq_id}" if f.collective_seq_id is not None else ""
        what = f" in {f.op}{seq} of {f.group.ref()}"
        if f.collective_seq_id is not None:
            direct = [r for r in f.waiting_ranks if _waits_in(rows.get(r), f)] or direct
    behind = [r for r in f.waiting_ranks if r not in direct]
    waiting = ""
    if direct:
        verb = "waits" if len(direct) == 1 else "wait"
        waiting = f"; {ranks_phrase(direct)} {verb}{what}"
    if behind:
        waiting += f", {ranks_phrase(behind)} behind {'it' if len(direct) == 1 else 'them'}"
    return f"stuck {stuck_s:.0f} s: [{f.kind}] {who}{where}{waiting}"


def _waits_in(row: dict[str, Any] | None, f: Finding) -> bool:
    old = row["oldest_unfinished"] if row else None
    return bool(old and f.group is not None and old["group"] == f.group.key
                and old["op"].endswith(f"#{f.collective_seq_id}"))


def snapshot(fetched: Fetched, *, thresholds: Thresholds | None = None,
             now_ns: int | None = None, store: str = "",
             cache: LiveCache | None = None) -> dict[str, Any]:
    """The live view of one refresh as a JSON-ready dict (see module doc); pass the same
    ``cache`` to every refresh of one watch."""
    th = thresholds or Thresholds()
    cache = cache or LiveCache()
    now_ns = time.time_ns() if now_ns is None else now_ns
    as_dumps = {r: cache.as_dump(fetched, r) for r in fetched.records}
    rows = _rank_rows(as_dumps, fetched, now_ns, th)
    by_rank = {row["rank"]: row for row in rows}
    silent = {row["rank"] for row in rows if row["silent"]}
    groups = _group_rows(fetched)
    ages = [row["oldest_unfinished"]["age_s"] for row in rows
            if row["oldest_unfinished"] and not row["silent"]]
    stuck_s = max(ages, default=0.0)
    world = len(rows) + len(fetched.missing)
    out: dict[str, Any] = {
        "format": FORMAT, "time_ns": now_ns, "store": store, "world_size": world,
        "interval_s": th.interval_s, "stall_s": th.stall, "ranks": rows, "groups": groups,
        "missing": fetched.missing, "silent": sorted(silent),
        "bad_records": [{"rank": r, "why": why} for r, why in fetched.bad],
        "findings": [], "stuck_s": None,
    }
    if not fetched.records:
        out.update(state="waiting", headline="no rank has published yet")
        return out
    if len(silent) == len(rows):
        newest = min(row["age_s"] or 0.0 for row in rows)
        out.update(state="gone", headline=(
            f"no rank has published for {newest:.0f} s: the job has ended, or every "
            "process is frozen"))
        return out
    if stuck_s >= th.stall or (silent and ages):
        load, memory = _load(fetched, as_dumps, silent, cache)
        # a record's few entries say nothing about stragglers: not looked for
        analysis = analyze_loaded(load, world_size=world, in_memory=memory,
                                  straggler_ms=float("inf"))
        shown = [f for f in analysis.findings if f.blocking or f.kind == "crashed_rank"]
        shown = [f for f in shown if f.kind not in _HIDDEN_KINDS]
        out["findings"] = [f.to_json() for f in shown]
        out["stuck_s"] = round(stuck_s, 1)
        if shown:
            out.update(state="stuck", headline=_headline(shown[0], stuck_s, by_rank))
            return out
        out.update(state="slow", headline=(
            f"an op has been unfinished for {stuck_s:.0f} s, but every rank reached it: "
            "the transport is slow or the op is large"))
        return out
    lagging = [(g["lag"], g["name"], g["desc"], g["behind"]) for g in groups if g["lag"] > 0]
    if lagging:
        lag, _, desc, behind = max(lagging)
        worst = max(behind, key=lambda r: behind[r])
        label = desc or "its group"
        out.update(state="behind", headline=(
            f"rank {worst} behind by {lag} collective{'s' if lag != 1 else ''} on {label}"))
    else:
        out.update(state="healthy", headline="healthy: every rank is moving")
    if fetched.missing:
        out["headline"] += f"; {ranks_phrase(fetched.missing)} not publishing yet"
    if silent:
        out["headline"] += f"; {ranks_phrase(sorted(silent))} silent"
    return out
