"""One line per stuck place, above the findings; and the slowest ranks of each group.

For every finding that blocks the job (root cause first), at most two lines:

* its culprits, where they are, and what they did not do: ``rank 3 (hostB) at
  train.py:148 in _train — never reached all_reduce #3 of mesh_dp``;
* the ranks that wait on them, and in what: ``ranks 0-2 wait in all_reduce #5 of
  default_pg``.

Where a culprit is comes from its dump: where its main thread was when it dumped (the
user's frame), else the record the finding names. The long sentences stay in the
findings below; these lines only point.

The "slowest ranks" section (:func:`slowest_rows`, :func:`slowest_lines`) reads the
arrival figures of :mod:`commscope.analyze.align.arrivals`: per group, who came last
most often, by how much, and what the others lost waiting; on several hosts, per host,
and a whole host that is slow is told as one (``hostB (ranks 2-3) arrives last in 97 %
of all_reduce of default_pg, median lag 41 ms``). Who is called a straggler is decided
there, with the same thresholds as the finding.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from commscope.analyze.align.arrivals import (
    DEFAULT_THRESHOLDS,
    STRAGGLER_MS,
    Arrivals,
    Thresholds,
)
from commscope.analyze.model import Finding, Group, HostMap, LoadResult
from commscope.analyze.text import frame_text, place_text, rank_list

__all__ = ["stuck_lines", "slowest_rows", "slowest_lines", "group_name", "call_text"]


@dataclass
class _Job:
    """What the lines are made from (the parts of an analysis they read)."""

    findings: list[Finding]
    load: LoadResult
    groups: dict[str, Group]
    hosts: HostMap


_MAX_LINES = 8
"""Stuck places shown; more are counted in one last line."""


def group_name(g: Group | None, key: str = "") -> str:
    """What the stuck lines call a group: its description, else its (short) name;
    ``key`` (else ``its group``) when the group is unknown."""
    if g is None:
        return key or "its group"
    if g.desc and g.desc != "undefined":
        return g.desc
    return g.display


def call_text(f: Finding) -> str:
    """``all_reduce #5 of mesh_dp``: the collective a finding is about."""
    what = f.op or "a collective"
    seq = f" #{f.collective_seq_id}" if f.collective_seq_id else ""
    return f"{what}{seq} of {group_name(f.group)}"


def _doing(f: Finding) -> str:
    """What the culprits did, or did not do, in a few words."""
    kind = f.kind
    one = len(f.culprit_ranks) == 1
    if kind == "missing_rank":
        return f"never reached {call_text(f)}"
    if kind == "crashed_rank":
        return "crashed"
    if kind == "p2p_unmatched":
        what = {"send": "recv", "recv": "send"}.get(f.op or "", "send/recv")
        return f"never posted the matching {what} in {group_name(f.group)}"
    if kind in ("p2p_deadlock", "cross_group_deadlock"):
        return ("closes a cycle of waits (findings below)" if one
                else "wait for each other in a cycle (findings below)")
    if kind == "stalled_collective":
        return f"stuck inside {call_text(f)}"
    if kind == "dumps_elsewhere":
        return "dumps on another host (not here)"
    if kind.endswith("_mismatch"):
        what = kind.removesuffix("_mismatch").replace("_", " ")
        return f"{'disagrees' if one else 'disagree'} about {call_text(f)} ({what})"
    return f"{kind.replace('_', ' ')} in {call_text(f)}"


def _where(a: _Job, f: Finding, rank: int) -> str:
    frames = f.details.get("frames") if isinstance(f.details, dict) else None
    d = a.load.dumps.get(rank)
    if d is not None and f.kind == "crashed_rank" and d.exception is not None \
            and d.exception[2] is not None:
        return place_text(d.exception[2])  # where it raised
    if d is not None and d.main_place is not None and f.kind in ("missing_rank",
                                                                  "crashed_rank"):
        return place_text(d.main_place)  # where it is instead of the call
    if isinstance(frames, dict) and frames.get(rank) is not None:
        return frame_text(frames[rank])
    return ""


def _waits_in(a: _Job, rank: int) -> tuple[str, str] | None:
    """``all_reduce #5 of default_pg``: the oldest unfinished collective of ``rank`` (where
    its progress stops; later ones may be issued asynchronously behind it)."""
    d = a.load.dumps.get(rank)
    if d is None:
        return None
    for group, seq, index in d.pending:
        if seq < 0:  # a send or recv
            op = next((o for o in d.p2p if o.index == index), None)
            if op is None:
                continue
            peer = f" {'to' if op.op == 'send' else 'from'} rank {op.peer}" \
                if op.peer is not None else ""
            return f"{op.op}{peer}", group_name(a.groups.get(group))
        t = d.tracks.get(group)
        if t is None or not t.lo <= seq <= t.hi:
            continue
        sid = t.sig[seq - t.lo]
        op = a.load.sigs.sigs[sid].op if 0 <= sid < len(a.load.sigs.sigs) else "a collective"
        return f"{op} #{seq}", group_name(a.groups.get(group))
    return None


def _who(a: _Job, ranks: list[int]) -> str:
    if len(ranks) == 1:
        host = a.hosts.host(ranks[0]) if len(a.hosts.hosts()) > 1 else None
        return f"rank {ranks[0]}" + (f" ({host})" if host else "")
    hosts = {a.hosts.host(r) for r in ranks} - {None}
    on = f" (on {', '.join(sorted(h for h in hosts if h))})" if len(a.hosts.hosts()) > 1 \
        and 0 < len(hosts) <= 3 else ""
    return f"ranks {rank_list(ranks)}{on}"


def stuck_lines(findings: list[Finding], load: LoadResult, groups: dict[str, Group],
                hosts: HostMap) -> list[str]:
    """The summary lines of an analysis's findings (``[]`` when nothing blocks)."""
    a = _Job(findings, load, groups, hosts)
    lines: list[str] = []
    blocking = [f for f in a.findings if f.blocking]
    for f in blocking[:_MAX_LINES]:
        culprits = sorted(f.culprit_ranks)
        if culprits:
            places = {r: _where(a, f, r) for r in culprits}
            same = len(set(places.values())) == 1
            at = places[culprits[0]] if same else ""
            lines.append(f"{_who(a, culprits)}{f' at {at}' if at else ''} — {_doing(f)}")
        victims = sorted(set(f.victims) - set(culprits))
        if victims:
            lines.append(f"{_who(a, victims)} died in {call_text(f)} (its victims)")
        waiting = sorted(set(f.waiting_ranks) - set(culprits) - set(victims))
        if waiting and f.details.get("dead_culprit"):  # they came through the call
            verb = "waits" if len(waiting) == 1 else "wait"
            lines.append(f"{_who(a, waiting)} {verb} on "
                         f"{'it' if len(culprits) == 1 else 'them'} further on")
        elif waiting:
            # each where it waits: in the call itself, or further on, behind someone
            # who waits in it
            by_place: dict[str, dict[str, list[int]]] = {}
            for r in waiting:
                what, group = _waits_in(a, r) or (call_text(f).split(" of ")[0],
                                                  group_name(f.group))
                by_place.setdefault(what, {}).setdefault(group, []).append(r)
            own = call_text(f).split(" of ")[0]
            for what, groups in sorted(by_place.items(),
                                       key=lambda kv: (kv[0] != own, min(min(v) for v in
                                                                         kv[1].values()))):
                ranks = sorted(r for v in groups.values() for r in v)
                names = sorted(groups, key=lambda g: min(groups[g]))
                of = ", ".join(names) if len(names) <= 3 else \
                    f"{len(names)} groups ({', '.join(names[:2])}, ...)"
                verb = "waits" if len(ranks) == 1 else "wait"
                lines.append(f"{_who(a, ranks)} {verb} in {what} of {of}")
    if len(blocking) > _MAX_LINES:
        lines.append(f"... and {len(blocking) - _MAX_LINES} more stuck places (findings below)")
    return lines


def slowest_rows(arrivals: dict[str, Arrivals], groups: dict[str, Group], hosts: HostMap,
                 straggler_ms: float = STRAGGLER_MS, n: int = 3,
                 thresholds: Thresholds | None = None) -> list[dict[str, Any]]:
    """The "slowest ranks" section: per group with enough timed collectives, its ranks
    that came last most often (``n`` at most) with their lags, the share of its members'
    wall time lost waiting for late arrivals, its ops, and, on several hosts, the hosts
    whose ranks came last with their lags, and the ranks whose clocks could not be
    aligned (nobody is then a straggler). Groups losing the most first. ``straggler``
    marks a rank, or a host, that the straggler finding names (``thresholds``, default
    the measured ones, with its lag replaced by ``straggler_ms``: see
    :meth:`~commscope.analyze.align.arrivals.Arrivals.stragglers`)."""
    th = replace(thresholds or DEFAULT_THRESHOLDS, lag_ms=straggler_ms)
    several = len(hosts.hosts()) > 1
    rows = []
    for key, got in arrivals.items():
        if got.samples < th.min_timed or not got.last:
            continue
        g = groups.get(key)
        slow_hosts, slow_ranks = got.stragglers(hosts.host if several else None, th)
        ranks = []
        for r in got.slowest(n):
            ranks.append({
                "rank": r, "host": hosts.host(r), "last": got.last[r],
                "share": round(got.last[r] / got.samples, 3),
                "lag_median_ms": round(got.lag_ms(r), 3),
                "lag_p90_ms": round(got.lag_ms(r, 0.9), 3),
                "straggler": r in slow_ranks,
            })
        slow = {h.host for h in slow_hosts}
        by_host = [{"host": h.host, "ranks": h.ranks, "last": h.last,
                    "share": round(h.last / got.samples, 3),
                    "lag_median_ms": round(h.lag_ms(), 3),
                    "lag_p90_ms": round(h.lag_ms(0.9), 3),
                    "straggler": h.host in slow}
                   for h in (got.by_host(hosts.host) if several else []) if h.last][:n]
        rows.append({
            "group": group_name(g, key),
            "group_ranks": list(g.ranks) if g is not None else list(got.ranks),
            "samples": got.samples, "first_seq": got.lo, "last_seq": got.hi,
            "ops": sorted(got.ops, key=lambda op: (-got.ops[op], op)),
            "lost_share": round(got.lost_share(), 4), "ranks": ranks, "hosts": by_host,
            "unaligned_ranks": list(got.unaligned),
        })
    rows.sort(key=lambda row: (-row["lost_share"], row["group"]))
    return rows


def _straggles(row: dict[str, Any]) -> bool:
    return any(x["straggler"] for x in row["ranks"]) or any(
        h.get("straggler") for h in row["hosts"])


def _host_line(row: dict[str, Any], h: dict[str, Any]) -> str:
    """``hostB (ranks 2-3) arrives last in 97 % of all_reduce of default_pg, median lag
    41 ms, p90 60 ms``."""
    ops = row.get("ops") or []
    what = ops[0] if len(ops) == 1 else \
        f"the {row['samples']} timed collectives ({', '.join(ops[:3])}{', ...' * (len(ops) > 3)})"
    return (f"{h['host']} (ranks {rank_list(h['ranks'])}) arrives last in "
            f"{h['share'] * 100:.0f} % of {what} of {row['group']}, median lag "
            f"{h['lag_median_ms']:.0f} ms, p90 {h['lag_p90_ms']:.0f} ms (slow host)")


def slowest_lines(rows: list[dict[str, Any]], limit: int = 4) -> list[str]:
    """The rows of :func:`slowest_rows` with a straggler (a rank or a host) as text lines
    (the groups losing the most first); ``[]`` when no group has one, so a healthy job's
    ordinary jitter prints nothing (the JSON keeps every row)."""
    lines = []
    rows = [row for row in rows if _straggles(row)]
    for row in rows[:limit]:
        lost = f"{row['lost_share'] * 100:.1f} % of its ranks' time lost waiting"
        parts = [f"rank {x['rank']}{' (' + x['host'] + ')' if x['host'] and row['hosts'] else ''}"
                 f" last at {x['last']}/{row['samples']}, lag median {x['lag_median_ms']:.2f} ms"
                 f" p90 {x['lag_p90_ms']:.2f} ms{' (straggler)' if x['straggler'] else ''}"
                 for x in row["ranks"]]
        lines.append(f"{row['group']} (#{row['first_seq']}-#{row['last_seq']}): {lost}; "
                     + "; ".join(parts))
        slow = [h for h in row["hosts"] if h.get("straggler")]
        lines += ["  " + _host_line(row, h) for h in slow]
        if not slow and len(row["hosts"]) > 1:
            lines.append("  by host: " + ", ".join(
                f"{h['host']} last at {h['last']}/{row['samples']}" for h in row["hosts"]))
    if len(rows) > limit:
        lines.append(f"... and {len(rows) - limit} more groups (see --json)")
    return lines
