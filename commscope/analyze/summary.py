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
from commscope.analyze.text import frame_text, ms, place_text, plural, rank_list

__all__ = ["stuck_lines", "culprit_line", "who_text", "slowest_rows", "slowest_lines",
           "group_name", "call_text"]


@dataclass
class _Job:
    """What the lines are made from (the parts of an analysis they read)."""

    findings: list[Finding]
    load: LoadResult
    groups: dict[str, Group]
    hosts: HostMap


_MAX_LINES = 10
"""Stuck places shown; more are counted in one last line."""


def group_name(g: Group | None, key: str = "") -> str:
    """What the stuck lines call a group: its description, else its (short) name;
    ``key`` (else ``its group``) when the group is unknown."""
    if g is None:
        return key or "its group"
    if g.desc and g.desc != "undefined":
        return g.desc
    return g.display


_CREATIONS = ("new_group", "init_process_group")
"""A finding's op when a rank never created a group (no collective of it yet)."""


def call_text(f: Finding) -> str:
    """``all_reduce #5 of mesh_dp``: the collective a finding is about (``a collective of
    mesh_dp`` when neither its op nor its number is known; ``the creation of experts``
    when the call is the group's creation)."""
    if f.op in _CREATIONS:
        return f"the creation of {group_name(f.group)} ({f.op})"
    seq = f" #{f.collective_seq_id}" if f.collective_seq_id else ""
    what = f.op or ("collective" if seq else "a collective")
    return f"{what}{seq} of {group_name(f.group)}"


def _doing(f: Finding, load: LoadResult | None = None) -> str:
    """What the culprits did, or did not do, in a few words (``load``: their dumps, for
    the exception a crashed rank raised)."""
    kind = f.kind
    one = len(f.culprit_ranks) == 1
    side = f.details.get("side") if isinstance(f.details, dict) else None
    if kind == "device_stopped":
        if f.details.get("failed"):
            return f"device stopped (its work on {call_text(f)} ended with an error)"
        return f"device stopped (its peers finished {call_text(f)}, not it)" \
            if f.collective_seq_id else "device stopped"
    if kind == "missing_rank":
        if side == "thread":
            return f"thread stopped: never issued {call_text(f)}"
        return f"never reached {call_text(f)}"
    if kind == "crashed_rank":
        raised = [load.dumps[r].exception for r in f.culprit_ranks
                  if load is not None and r in load.dumps and load.dumps[r].exception]
        if raised and raised[0] is not None:
            kind_name, text = raised[0][0], " ".join(raised[0][1].split())
            text = text if len(text) <= 80 else text[:77] + "..."
            return f"raised {kind_name}: {text}" if text else f"raised {kind_name}"
        gone = [r for r in f.culprit_ranks if load is not None and r not in load.dumps]
        return "crashed (no dump)" if gone and len(gone) == len(f.culprit_ranks) else "crashed"
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


def _where(load: LoadResult, f: Finding, rank: int) -> str:
    """Where a culprit is, as the user's line: where it raised, where its main thread
    was when it dumped, else the record the finding names (``""`` when none is known)."""
    if f.kind == "device_stopped":
        return ""  # its thread went on: where it issued says nothing of the device
    frames = f.details.get("frames") if isinstance(f.details, dict) else None
    d = load.dumps.get(rank)
    if d is not None and f.kind == "crashed_rank" and d.exception is not None \
            and d.exception[2] is not None:
        name, filename, line, _ = d.exception[2]  # where it raised (the line: said after)
        return frame_text((name, filename, line))
    if d is not None and d.main_place is not None and f.kind in ("missing_rank",
                                                                  "crashed_rank"):
        return place_text(d.main_place)  # where it is instead of the call
    if isinstance(frames, dict) and frames.get(rank) is not None:
        return frame_text(frames[rank])
    return ""


def culprit_line(f: Finding, load: LoadResult, hosts: HostMap) -> str:
    """``rank 3 (hostB) at train.py:148 in _train — never reached all_reduce #3 of
    mesh_dp``: a finding's culprits, where they are (when they are all at one place) and
    what they did not do (``""`` for a finding without culprits)."""
    culprits = sorted(f.culprit_ranks)
    if not culprits:
        return ""
    places = {_where(load, f, r) for r in culprits}
    at = places.pop() if len(places) == 1 else ""
    return f"{who_text(culprits, hosts)}{f' at {at}' if at else ''} — {_doing(f, load)}"


def _waits_in(a: _Job, rank: int) -> tuple[str, str, str] | None:
    """``("all_reduce #5", "default_pg", "")`` or ``("recv", "mesh_pp", "from rank 3")``:
    the oldest unfinished op of ``rank`` (where its progress stops; later ones may be
    issued asynchronously behind it), its group, and its peer."""
    d = a.load.dumps.get(rank)
    if d is None:
        return None
    for group, seq, index in d.pending:
        if seq < 0:  # a send or recv
            op = next((o for o in d.p2p if o.index == index), None)
            if op is None or not op.settled:
                continue
            peer = f"{'to' if op.op == 'send' else 'from'} rank {op.peer}" \
                if op.peer is not None else ""
            return op.op, group_name(a.groups.get(group)), peer
        t = d.tracks.get(group)
        if t is None or not t.lo <= seq <= t.hi:
            continue
        sid = t.sig[seq - t.lo]
        op = a.load.sigs.sigs[sid].op if 0 <= sid < len(a.load.sigs.sigs) else "collective"
        return f"{op} #{seq}", group_name(a.groups.get(group)), ""
    return None


def who_text(ranks: list[int], hosts: HostMap) -> str:
    """``rank 6 (hostA)``, ``ranks 2, 3 (on hostB)``: ranks, with their hosts when the
    job spans several (up to three hosts named)."""
    several = len(hosts.hosts()) > 1
    if len(ranks) == 1:
        host = hosts.host(ranks[0]) if several else None
        return f"rank {ranks[0]}" + (f" ({host})" if host else "")
    names = sorted({h for h in (hosts.host(r) for r in ranks) if h})
    on = f" (on {', '.join(names)})" if several and 0 < len(names) <= 3 else ""
    return f"ranks {rank_list(ranks, 8)}{on}"


@dataclass
class _Waiting:
    """Ranks that wait alike: in one op (the groups and peers told together)."""

    ranks: list[int]
    what: str
    groups: list[str]
    peers: list[str]
    device: bool


def _peer_text(peers: list[str]) -> str:
    """``from ranks 4-7``: the peers of alike send/recv waits, told once."""
    if not peers:
        return ""
    if len(peers) == 1:
        return f" {peers[0]}"
    word = peers[0].split()[0]
    nums = [int(p.rsplit(" ", 1)[-1]) for p in peers if p.rsplit(" ", 1)[-1].isdigit()]
    return f" {word} ranks {rank_list(nums, 6)}" if nums else ""


def _groups_text(names: list[str]) -> str:
    """``dp_0, dp_1`` or ``4 groups (dp_0, dp_1, ...)``."""
    names = list(dict.fromkeys(names))
    return ", ".join(names) if len(names) <= 3 else \
        f"{len(names)} groups ({', '.join(names[:2])}, ...)"


def _waiting_line(a: _Job, w: _Waiting) -> str:
    one = len(w.ranks) == 1
    where = f"{w.what}{_peer_text(sorted(set(w.peers)))} of {_groups_text(w.groups)}"
    if w.device:  # a device's queue: its oldest op holds it, its thread waits nowhere
        return f"{who_text(w.ranks, a.hosts)} — oldest unfinished op {where}"
    return f"{who_text(w.ranks, a.hosts)} {'waits' if one else 'wait'} in {where}"


def stuck_lines(findings: list[Finding], load: LoadResult, groups: dict[str, Group],
                hosts: HostMap, limit: int = _MAX_LINES) -> list[str]:
    """The summary lines of an analysis's findings (``[]`` when nothing blocks): each
    blocking finding's culprits where they are, then the ranks that wait on them, each
    where it waits; every line told once (alike waits folded: the same op of the same
    group, peers listed together), at most ``limit`` lines, the rest counted."""
    a = _Job(findings, load, groups, hosts)
    lines: list[str] = []
    waits: dict[tuple[str, bool], _Waiting] = {}
    order: list[str | tuple[str, bool]] = []
    told: set[int] = set()
    blocking = [f for f in a.findings if f.blocking]
    for f in blocking:
        culprits = sorted(f.culprit_ranks)
        if culprits:
            line = culprit_line(f, load, hosts)
            if line not in order:
                order.append(line)
            told.update(culprits)
        victims = sorted(set(f.victims) - set(culprits))
        if victims:
            order.append(f"{who_text(victims, a.hosts)} died in {call_text(f)} (its victims)")
            told.update(victims)
        waiting = sorted(set(f.waiting_ranks) - set(culprits) - set(victims) - told)
        if waiting and f.details.get("dead_culprit"):  # they came through the call
            verb = "waits" if len(waiting) == 1 else "wait"
            order.append(f"{who_text(waiting, a.hosts)} {verb} on "
                         f"{'it' if len(culprits) == 1 else 'them'} further on")
            told.update(waiting)
            continue
        for r in waiting:
            d = load.dumps.get(r)
            device = bool(d is not None and d.kind is not None and d.kind.device)
            what, group, peer = _waits_in(a, r) or (call_text(f).split(" of ")[0],
                                                    group_name(f.group), "")
            key = (what, device)
            if key not in waits:
                waits[key] = _Waiting([], what, [], [], device)
                order.append(key)
            waits[key].ranks.append(r)
            waits[key].groups.append(group)
            if peer:
                waits[key].peers.append(peer)
            told.add(r)
    for item in order:
        lines.append(item if isinstance(item, str) else _waiting_line(a, waits[item]))
    if len(lines) > limit:
        rest = len(lines) - (limit - 1)
        lines = [*lines[:limit - 1],
                 f"... and {plural(rest, 'more stuck place')} (findings below)"]
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
            f"{ms(h['lag_median_ms'] * 1e6)}, p90 {ms(h['lag_p90_ms'] * 1e6)} (slow host)")


def slowest_lines(rows: list[dict[str, Any]], limit: int = 4) -> list[str]:
    """The rows of :func:`slowest_rows` with a straggler (a rank or a host) as text lines
    (the groups losing the most first); ``[]`` when no group has one, so a healthy job's
    ordinary jitter prints nothing (the JSON keeps every row)."""
    lines = []
    rows = [row for row in rows if _straggles(row)]
    for row in rows[:limit]:
        lost = f"{row['lost_share'] * 100:.1f} % of its ranks' time lost waiting"
        parts = [f"rank {x['rank']}{' (' + x['host'] + ')' if x['host'] and row['hosts'] else ''}"
                 f" last at {x['last']}/{row['samples']}, lag median {ms(x['lag_median_ms'] * 1e6)}"
                 f" p90 {ms(x['lag_p90_ms'] * 1e6)}{' (straggler)' if x['straggler'] else ''}"
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
