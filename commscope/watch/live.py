"""From one refresh of progress records to the live view: progress, lag and a verdict.

The verdict comes from the same analysis as ``commscope analyze``: each progress record
is a dump in miniature, loaded by the same extractor and diagnosed by the same wait-for
graph. Only the loading differs.

Algorithm (:func:`snapshot`):

1. A rank whose newest record is older than ``silent_s`` (default: 3 intervals, at least
   5 s) is *silent*: its process is gone or frozen (the publisher runs on the watchdog
   thread, which keeps running while the main thread waits in a collective). Silent
   and never-published ranks count as ranks without a dump. When every rank of a host
   is silent (each record names its host), the host is told once
   (:func:`lost_hosts`): ``hostB: ranks 2-3 silent since 12:03:10`` (the newest of
   their records, on this watcher's clock, through rank 0's), or ``gone since`` when
   the others' work failed on them (a peer that closes its connections has died).
2. Each record becomes a :class:`~commscope.analyze.model.RankDump` through
   :func:`commscope.analyze.read.extract.extract_dump`; records that do not parse are named.
3. *Stuck*: some rank's oldest unfinished op is older than ``stall_s`` (default: 2
   intervals, at least 1 s), or a rank is silent. Then the analysis runs and its
   blocking findings are the verdict (``stuck 40 s: rank 3 in load_batch; ranks 0-2
   wait in all_reduce #812 of group mesh_dp``). Remarks that only reflect a record's
   short window (wrapped rings, stragglers) are left out. A crash of every rank of a
   silent host is headed and worded by host (``stuck 9 s: [crashed_rank] hostB: ranks
   2-3 silent since 12:03:10 (no record for 9 s: frozen, or gone); ranks 0, 1 wait in
   all_reduce #65 of group 0``).
4. *Desync* (any time): the ranks' running fingerprints of a group part
   (:func:`print_splits`, a few comparisons per rank when they do not): the analysis
   runs and names the group, the first collective where they differ within the folds
   the records keep, the ranks on each side and what differs, even while the job runs
   on (``desyncs``; the state ``desync`` when nothing is stuck).
5. *Slowest ranks* (any time): the folds also carry when each rank issued each
   collective; kept over refreshes, the newest :data:`LIVE_WINDOW` that every member
   published are timed as ``commscope analyze`` times a dump's (who came last, how
   often, by how much, what the others lost), with the same thresholds (``slowest``;
   a straggler is added to a running job's headline).
6. Otherwise the job runs; per group, a rank is *behind* when its record is at least as
   new as the leader's yet it has enqueued fewer collectives (a sound lower bound: the
   leader's count only grows), reported as ``rank 5 behind by 3 collectives on dp``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from commscope.analyze.align.arrivals import Arrivals, note_clocks, tally
from commscope.analyze.align.prints import PrintSplit, compare_prints
from commscope.analyze.analysis import analyze_loaded
from commscope.analyze.diagnose.findings import MISMATCH_KINDS
from commscope.analyze.diagnose.hosts import host_phrase
from commscope.analyze.model import (
    Finding,
    Group,
    HostMap,
    LoadResult,
    RankDump,
    RankPlace,
    SigTable,
    Unreadable,
)
from commscope.analyze.present.waitgraph import wait_graph
from commscope.analyze.read.extract import DumpError, extract_dump, finish_sigs
from commscope.analyze.read.places import user_frame, user_place
from commscope.analyze.read.prints import read_prints
from commscope.analyze.summary import slowest_rows
from commscope.analyze.text import frame_text, place_text, rank_list, ranks_phrase
from commscope.flight.out import progress
from commscope.watch.source import Fetched, record_offset_ns

__all__ = ["Thresholds", "LiveCache", "snapshot", "FORMAT", "silent_ranks", "lost_hosts",
           "lost_text"]

FORMAT = "commscope.watch/1"
HISTORY = 256
"""Arrivals kept per group and rank across refreshes."""
LIVE_WINDOW = 48
"""The newest collectives every member published that the live "slowest ranks" read:
as many as the thresholds were measured on (``bench/straggler_thresholds.py``), so a
rank that turns slow is named within about that many steps, and one that recovers
drops out as fast."""
_CLOCK_NOISE_NS = 1_000_000
"""A clock offset within this (or its own uncertainty) is left alone, as the analyzer
does."""
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
        off = _offset(rec)  # every time below on rank 0's clock, now_ns too
        age = (now_ns - (t - off)) / 1e9 if isinstance(t, int) else None
        quiet = beat.quiet_s if beat else 0.0
        pending = _unfinished(rec) + _creating(rec)
        oldest = min(pending, key=lambda e: e.get("time_created_ns") or 0) if pending else None
        since = _head_since(rec, oldest)
        main = (rec.get("commscope_threads") or [{}])[0]
        place = user_place(main.get("frames")) if isinstance(main, dict) else None
        host, pid = rec.get("hostname"), rec.get("pid")
        rows.append({
            "rank": r,
            "host": host[:255] if isinstance(host, str) and host else None,
            "pid": pid if type(pid) is int else None,
            "age_s": round(age, 2) if age is not None else None,
            "silent": quiet > th.silent or (quiet == 0.0 and age is not None
                                            and age > th.silent),
            "step": rec.get("commscope_step"),
            "published": beat.beats if beat else None,
            "where_now": place_text(place) if place else None,
            "oldest_unfinished": None if oldest is None else {
                "op": _op_text(oldest),
                "group": str((oldest.get("process_group") or ["?"])[0]),
                "age_s": round((now_ns - ((since or now_ns + off) - off)) / 1e9, 2),
                "where": _where(oldest),
            },
        })
    return rows


def _head_since(rec: dict[str, Any], oldest: dict[str, Any] | None) -> int | None:
    """Since when ``rec``'s oldest unfinished op holds the rank up (its own clock): on
    gloo, since it was issued (the thread waits in it); on a device backend (NCCL),
    whose queue runs behind its thread, since the device last finished anything, if
    that came later (its frontier moves: work queued behind a running op is no stall)."""
    if oldest is None:
        return None
    created = oldest.get("time_created_ns") or None
    done = rec.get("commscope_device_done_ns")
    name = str(oldest.get("profiling_name") or "")
    device = rec.get("commscope_device_backends")
    if type(done) is int and isinstance(device, list) and name.partition(":")[0] in device:
        return max(created or 0, done) or None
    return created


def _group_rows(fetched: Fetched) -> list[dict[str, Any]]:
    per: dict[str, dict[int, tuple[int, int, int]]] = {}
    descs: dict[str, str] = {}
    for r, rec in fetched.records.items():
        prog = rec.get("progress")
        beat = fetched.beats.get(r)
        t = (beat.time_ns if beat else (rec.get("dump_time_ns") or 0)) - _offset(rec)
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
        self.prints: dict[int, tuple[int, RankDump]] = {}
        self.arrived: dict[str, dict[int, dict[int, tuple[int, str]]]] = {}
        """Group name → rank → sequence number → (arrival ns on rank 0's clock, op)."""
        self._timed: tuple[frozenset[int], dict[str, Arrivals]] | None = None
        """The last :meth:`arrivals` result, while no record brought new arrivals."""
        self._splits: tuple[frozenset[int], list[PrintSplit]] | None = None
        """The last :func:`print_splits` result, while no record changed."""
        self._rows: list[dict[str, Any]] | None = None
        """The last "slowest ranks" rows, for the arrivals of :attr:`_timed`."""
        self.agreed: dict[str, int] = {}
        """Group name → the newest sequence number at which this watch saw every member's
        fingerprint agree (narrows a split older than the records' folds)."""
        self.told: dict[tuple[str, tuple[int, ...]], Finding] = {}
        """The first exact desync seen per (group, culprits): a later refresh whose
        kept folds no longer reach back to it tells it by this one."""

    def remember(self, desyncs: list[Finding]) -> list[Finding]:
        """``desyncs`` with each split older than the kept folds (a
        ``fingerprint_mismatch``) replaced by the exact one an earlier refresh saw for the
        same group and ranks."""
        out = []
        for f in desyncs:
            key = (f.group.key if f.group else "", tuple(sorted(f.culprit_ranks)))
            if f.details.get("fingerprint") and f.kind == "fingerprint_mismatch":
                known = self.told.get(key)
                agreed = self.agreed.get(key[0])
                if known is not None:
                    f = known
                elif agreed is not None and f.collective_seq_id is not None \
                        and agreed < f.collective_seq_id:
                    f = replace(f, message=(
                        f"{f.message} This watch saw them agree up to #{agreed}: the first "
                        f"collective they differ at is one of #{agreed + 1}-"
                        f"#{f.collective_seq_id}."))
            elif key not in self.told:
                self.told[key] = f
            out.append(f)
        return out

    def fingerprints(self, fetched: Fetched, r: int, data: dict[str, Any]) -> RankDump:
        """Rank ``r``'s running fingerprints alone (a bare RankDump; cached by version)."""
        version = _version(fetched, r)
        hit = self.prints.get(r)
        if hit is None or hit[0] != version or version < 0 or r in fetched.changed:
            d = RankDump(rank=r, path=f"store: rank {r}", source="commscope", version="")
            read_prints(data, d, [])
            host, pid = data.get("hostname"), data.get("pid")
            if isinstance(host, str) and host:
                d.place = RankPlace(host=host[:255], pid=pid if type(pid) is int else None)
            clock = data.get("commscope_clock")
            off = clock.get("offset_ns") if isinstance(clock, dict) else None
            unc = clock.get("uncertainty_ns") if isinstance(clock, dict) else None
            if type(off) is int and type(unc) is int and abs(off) < 2**62 and unc >= 0:
                d.clock_offset_ns, d.clock_uncertainty_ns = off, unc
                if abs(off) > max(unc, _CLOCK_NOISE_NS):  # onto rank 0's clock
                    for rows in d.prints.values():
                        rows.arrived_ns = [t - off for t in rows.arrived_ns]
            hit = self.prints[r] = (version, d)
            self._note_arrivals(d)
            self._timed = self._splits = None
        return hit[1]

    def _note_arrivals(self, d: RankDump) -> None:
        """Keep rank ``d.rank``'s arrivals from its record's folds (the first fold of a
        sequence number is its arrival), the newest :data:`HISTORY` per group."""
        table = d.print_table
        for name, rows in d.prints.items():
            seen = self.arrived.setdefault(name, {}).setdefault(d.rank, {})
            for seq, when, what in zip(rows.seqs, rows.arrived_ns, rows.what):
                if seq not in seen:
                    seen[seq] = (when, table[what].op if 0 <= what < len(table) else "?")
            if len(seen) > HISTORY:
                for seq in sorted(seen)[:len(seen) - HISTORY]:
                    del seen[seq]

    def arrivals(self, ranks_now: set[int]) -> dict[str, Arrivals]:
        """Group name → the arrival figures of its newest collectives every member has
        published (:func:`commscope.analyze.align.arrivals.tally`), over the refreshes of
        this watch; only ranks in ``ranks_now`` (not silent) count."""
        if self._timed is not None and self._timed[0] == frozenset(ranks_now):
            return self._timed[1]  # a stuck job's records do not change
        out: dict[str, Arrivals] = {}
        for name, by_rank in self.arrived.items():
            ranks = sorted(r for r in by_rank if r in ranks_now)
            if len(ranks) < 2:
                continue
            common = set.intersection(*(set(by_rank[r]) for r in ranks))
            seqs = sorted(common)[-LIVE_WINDOW:]
            if not seqs:
                continue
            got = Arrivals(ranks=ranks, lo=seqs[0], hi=seqs[-1])
            columns = [[by_rank[r][s][0] for s in seqs] for r in ranks]
            tally(got, columns, [by_rank[ranks[0]][s][1] for s in seqs])
            out[name] = got
        self._timed = (frozenset(ranks_now), out)
        return out

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
            prints = self.prints.get(r)
            if prints is not None and prints[0] == version and version >= 0:
                # read once (by :meth:`fingerprints`, clock already aligned), not twice
                d = extract_dump({k: v for k, v in data.items()
                                  if k != "commscope_fingerprints"}, f"store: rank {r}", r)
                fp = prints[1]
                d.prints, d.print_table, d.print_bits = fp.prints, fp.print_table, fp.print_bits
            else:
                d = extract_dump(data, f"store: rank {r}", r)
            finish_sigs(d, self.table)
            hit = (version, d)
            self.loaded[r] = hit
        beat = fetched.beats.get(r)
        if beat is not None:  # on rank 0's clock, like the record's times
            hit[1].dump_time_ns = beat.time_ns - _offset(fetched.records.get(r))
        return hit[1]


def _offset(rec: dict[str, Any] | None) -> int:
    """A record's clock offset to rank 0's (``commscope_clock``), 0 when it has none."""
    return record_offset_ns(rec)


def _hosts_to_exclude(findings: list[Finding], fetched: Fetched) -> list[str]:
    """The hosts of the ranks the findings call crashed (dead, frozen, silent), from their
    records' hostnames, in order of first mention."""
    out: list[str] = []
    for f in findings:
        if f.kind != "crashed_rank":
            continue
        for r in f.culprit_ranks:
            host = (fetched.records.get(r) or {}).get("hostname")
            if isinstance(host, str) and host and host not in out:
                out.append(host[:255])
    return out


def print_splits(fetched: Fetched, as_dumps: dict[int, dict[str, Any]], silent: set[int],
                 cache: LiveCache) -> list[PrintSplit]:
    """The groups whose members' running fingerprints part, from the records alone (no
    analysis: a few comparisons per rank when nothing differs). A group's members are
    the ranks whose records carry it (a group's name is the same on every member)."""
    dumps = {r: cache.fingerprints(fetched, r, data) for r, data in as_dumps.items()
             if r not in silent}
    if cache._splits is not None and cache._splits[0] == frozenset(dumps):
        return cache._splits[1]  # no record changed since the last refresh
    members: dict[str, list[int]] = {}
    for r in sorted(dumps):
        for name in dumps[r].prints:
            members.setdefault(name, []).append(r)
    groups = {name: Group(key=name, name=name, desc="", ranks=tuple(ranks),
                          membership="entries")
              for name, ranks in members.items() if len(ranks) > 1}
    splits = compare_prints(LoadResult(dumps=dumps, unreadable=[], sigs=SigTable()),
                            groups) if groups else []
    split_groups = {sp.group for sp in splits}
    for name, g in groups.items():  # where they agree: remembered to narrow a later split
        if name not in split_groups:
            newest = min(dumps[r].prints[name].seqs[-1] for r in g.ranks)
            if all(newest in dumps[r].prints[name].seqs for r in g.ranks):  # compared
                cache.agreed[name] = max(newest, cache.agreed.get(name, 0))
    cache._splits = (frozenset(dumps), splits)
    return splits


def _slowest(cache: LiveCache, groups: list[dict[str, Any]], silent: set[int]
             ) -> list[dict[str, Any]]:
    """The "slowest ranks" rows (as ``commscope analyze``'s JSON has them) from the
    arrivals the records' fingerprints carried over this watch's refreshes, with the
    analyzer's thresholds."""
    dumps = {r: d for r, (_, d) in cache.prints.items() if r not in silent}
    timed = cache._timed
    arrivals = cache.arrivals(set(dumps))
    if timed is not None and cache._timed is timed and cache._rows is not None:
        return cache._rows  # nothing new arrived since the last refresh
    hosts = HostMap(dumps)
    for got in arrivals.values():  # one clock, or no claim (as the analyzer does)
        note_clocks(got, dumps, hosts.host)
    descs = {g["name"]: g["desc"] for g in groups}
    named = {name: Group(key=name, name=name, desc=descs.get(name) or "undefined",
                         ranks=tuple(got.ranks), membership="entries")
             for name, got in arrivals.items()}
    cache._rows = slowest_rows(arrivals, named, hosts)
    return cache._rows


def _slow_phrase(rows: list[dict[str, Any]]) -> str:
    """``rank 2 arrives last at 47/48 all_reduce of default_pg (median lag 81 ms)``
    for the group losing the most to a straggler (a rank or a host), else ``""``."""
    for row in rows:
        for h in row["hosts"]:
            if h.get("straggler"):
                return (f"{h['host']} (ranks {rank_list(h['ranks'])}) arrives last at "
                        f"{h['last']}/{row['samples']} of {row['group']} (median lag "
                        f"{h['lag_median_ms']:.0f} ms)")
        for x in row["ranks"]:
            if x["straggler"]:
                return (f"rank {x['rank']} arrives last at {x['last']}/{row['samples']} of "
                        f"{row['group']} (median lag {x['lag_median_ms']:.0f} ms)")
    return ""


def _desyncs(findings: list[Finding]) -> list[Finding]:
    """The disagreements a running job went through (nobody waits behind them)."""
    return [f for f in findings if not f.blocking
            and (f.kind in MISMATCH_KINDS or f.kind == "missing_rank")]


def _desync_headline(f: Finding) -> str:
    seq = f" #{f.collective_seq_id}" if f.collective_seq_id is not None else ""
    where = f" in {f.op or 'a collective'}{seq} of {f.group.ref()}" if f.group else ""
    who = ranks_phrase(f.culprit_ranks) if f.culprit_ranks else "no single rank"
    return f"desync: [{f.kind}] {who} differ{'s' if len(f.culprit_ranks) == 1 else ''}{where}"


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


def silent_ranks(fetched: Fetched, thresholds: Thresholds | None = None,
                 now_ns: int | None = None) -> dict[int, float]:
    """Rank → seconds since its newest record, for the ranks that count as silent: no
    new record seen for ``thresholds.silent`` seconds (this watcher's clock), or a
    newest record that old (its time moved onto rank 0's clock, as this watcher's
    ``now``). For callers that need no analysis (``commscope dump``'s wait)."""
    th = thresholds or Thresholds()
    now_ns = time.time_ns() - fetched.clock_offset_ns if now_ns is None else now_ns
    out: dict[int, float] = {}
    for r, rec in fetched.records.items():
        beat = fetched.beats.get(r)
        t = beat.time_ns if beat else rec.get("dump_time_ns")
        age = (now_ns - (t - _offset(rec))) / 1e9 if type(t) is int else 0.0
        quiet = beat.quiet_s if beat else 0.0
        if quiet > th.silent or age > th.silent:
            out[r] = round(max(quiet, age), 1)
    return out


def lost_hosts(fetched: Fetched, silent: Iterable[int],
               now_ns: int | None = None) -> list[dict[str, Any]]:
    """The hosts every rank of which is ``silent``, when the records name more than one
    host (each record's ``hostname``), in order of their first rank: ``host``,
    ``ranks``, ``since_ns`` (the newest record of any of them, moved onto rank 0's clock
    and then onto this watcher's), ``since`` (that time as ``HH:MM:SS``, local time),
    ``silent_s`` (seconds since), and ``how``: ``silent`` (set to ``gone`` by
    :func:`snapshot` when the others' work failed on them)."""
    quiet = set(silent)
    hosts: dict[str, list[int]] = {}
    for r, rec in fetched.records.items():
        host = rec.get("hostname")
        if isinstance(host, str) and host:
            hosts.setdefault(host[:255], []).append(r)
    if len(hosts) < 2:
        return []
    now_ns = time.time_ns() - fetched.clock_offset_ns if now_ns is None else now_ns
    out = []
    for host, ranks in hosts.items():
        if not set(ranks) <= quiet:
            continue
        times = []
        for r in ranks:
            beat = fetched.beats.get(r)
            t = beat.time_ns if beat else fetched.records[r].get("dump_time_ns")
            if type(t) is int:
                times.append(t - _offset(fetched.records[r]))
        last = max(times, default=now_ns)  # on rank 0's clock
        since_ns = last + fetched.clock_offset_ns  # on this watcher's
        out.append({"host": host, "ranks": sorted(ranks), "since_ns": since_ns,
                    "since": time.strftime("%H:%M:%S", time.localtime(since_ns / 1e9)),
                    "silent_s": round(max(0.0, (now_ns - last) / 1e9), 1), "how": "silent"})
    return sorted(out, key=lambda h: h["ranks"][0])


def lost_text(lost: dict[str, Any], short: bool = False) -> str:
    """``hostB: ranks 2-3 silent since 12:03:10 (no record for 9 s: frozen, or gone)``
    for one entry of :func:`lost_hosts` (``short``: without the parenthesis)."""
    head = f"{host_phrase(lost['host'], lost['ranks'])} {lost['how']} since {lost['since']}"
    if short:
        return head
    if lost["how"] == "gone":
        return f"{head} (no record for {lost['silent_s']:.0f} s, and the others' work failed)"
    return f"{head} (no record for {lost['silent_s']:.0f} s: frozen, or gone)"


def _covering(lost: list[dict[str, Any]], ranks: list[int]) -> list[dict[str, Any]]:
    """The lost hosts whose ranks are exactly ``ranks`` together; ``[]`` otherwise."""
    mine = [h for h in lost if set(h["ranks"]) & set(ranks)]
    covered = {r for h in mine for r in h["ranks"]}
    return mine if mine and covered == set(ranks) else []


def _by_host(f: Finding, lost: list[dict[str, Any]]) -> None:
    """Word a crash of every rank of some lost hosts by host (``hostB: ranks 2-3 gone
    since ...``), the rest of the analyzer's sentence kept; marks those hosts ``gone``
    when the others' work failed on them (the finding's victims)."""
    hosts = _covering(lost, f.culprit_ranks) if f.kind == "crashed_rank" else []
    rest = f.details.get("rest")
    if not hosts or not isinstance(rest, str):
        return
    if f.details.get("victims"):
        for h in hosts:
            h["how"] = "gone"
    f.message = "; ".join(lost_text(h) for h in hosts) + rest
    f.details["lost"] = hosts


def _headline(f: Finding, stuck_s: float, rows: dict[int, dict[str, Any]]) -> str:
    who = ranks_phrase(f.culprit_ranks) if f.culprit_ranks else "no single rank"
    lost = f.details.get("lost") or []
    if lost:
        who = "; ".join(lost_text(h, short=True) for h in lost)
        stuck_s = max(stuck_s, *(h["silent_s"] for h in lost))
    where = ""
    if len(f.culprit_ranks) == 1 and not lost:
        row = rows.get(f.culprit_ranks[0])
        if row is None:
            where = " gone (no recent record)"
        elif row.get("silent"):  # its last record's place is stale: say what is known
            age = row.get("age_s")
            where = (f" silent for {age:.0f} s (frozen, or gone)" if age is not None
                     else " gone (no recent record)")
        elif row["oldest_unfinished"] is None and row["where_now"]:
            where = f" in {row['where_now']}"
        elif row["oldest_unfinished"]:
            where = f" waits in {row['oldest_unfinished']['op']}"
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
        if lost and set(direct) <= set(f.details.get("victims") or ()):
            verb = "failed"  # their work failed on the lost host: nobody waits any more
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
    # the watcher's clock moved onto rank 0's, as every record's times are
    now_ns = time.time_ns() - fetched.clock_offset_ns if now_ns is None else now_ns
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
        "findings": [], "exclude_hosts": [], "stuck_s": None, "desyncs": [], "slowest": [],
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
    lost = lost_hosts(fetched, silent, now_ns)
    out["lost_hosts"] = lost
    split = bool(print_splits(fetched, as_dumps, silent, cache))
    out["slowest"] = _slowest(cache, groups, silent)
    analysis = None
    if stuck_s >= th.stall or silent or split:
        load, memory = _load(fetched, as_dumps, silent, cache)
        # a record's few entries say nothing about stragglers: not looked for
        analysis = analyze_loaded(load, world_size=world, in_memory=memory,
                                  straggler_ms=float("inf"))
        out["desyncs"] = [f.to_json() for f in cache.remember(_desyncs(analysis.findings))]
    if analysis is not None and (stuck_s >= th.stall or silent):
        shown = [f for f in analysis.findings if f.blocking or f.kind == "crashed_rank"]
        shown = [f for f in shown if f.kind not in _HIDDEN_KINDS]
        for f in shown:
            _by_host(f, lost)
        out["findings"] = [f.to_json() for f in shown]
        out["wait_graph"] = wait_graph(analysis, silent).to_json()  # who waits for whom
        # hosts whose ranks crashed, froze or went silent: what a restart leaves out (a
        # silent rank's record is not in the analysis: its host comes from the record)
        out["exclude_hosts"] = _hosts_to_exclude(shown, fetched)
        out["stuck_s"] = round(stuck_s, 1)
        if shown:
            out.update(state="stuck", headline=_headline(shown[0], stuck_s, by_rank))
            return out
        if stuck_s >= th.stall:
            out.update(state="slow", headline=(
                f"an op has been unfinished for {stuck_s:.0f} s, but every rank reached it: "
                "the transport is slow or the op is large"))
            return out
    lagging = [(g["lag"], g["name"], g["desc"], g["behind"]) for g in groups if g["lag"] > 0]
    desyncs = cache.remember(_desyncs(analysis.findings)) if analysis is not None else []
    if desyncs:
        out.update(state="desync", headline=_desync_headline(desyncs[0]))
    elif lagging:
        lag, _, desc, behind = max(lagging)
        worst = max(behind, key=lambda r: behind[r])
        label = desc or "its group"
        out.update(state="behind", headline=(
            f"rank {worst} behind by {lag} collective{'s' if lag != 1 else ''} on {label}"))
    else:
        out.update(state="healthy", headline="healthy: every rank is moving")
    slow = _slow_phrase(out["slowest"])
    if slow and out["state"] in ("healthy", "behind"):
        out["headline"] += f"; {slow}"
    if fetched.missing:
        out["headline"] += f"; {ranks_phrase(fetched.missing)} not publishing yet"
    if silent:
        alone = sorted(silent - {r for h in lost for r in h["ranks"]})
        parts = [lost_text(h) for h in lost] + ([f"{ranks_phrase(alone)} silent"] if alone
                                                else [])
        out["headline"] += "; " + "; ".join(parts)
    return out
