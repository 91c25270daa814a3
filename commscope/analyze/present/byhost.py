"""The job told by host: rank lists with their hosts, and where each host's ranks stand.

A job of 512 hosts x 8 ranks is better told as "all 8 ranks of hostC wait in all_reduce
#812 of mesh_dp" than as a list of 4 000 ranks. Every view that names ranks (the text
report, the HTML report, the live watch) asks this module, so they fold alike. When the
job ran on one host (or the dumps do not say), nothing here adds a word.

Algorithm (:func:`host_lines`):

1. Each rank's state in a few words (:func:`rank_states`): the oldest unfinished op it
   waits in (its group named by its description when several groups share one, so the
   dp groups of a mesh fold together), the group it waits to create, where it is when a
   finding blames it and it is in no collective, that it left no dump (crashed, its dump
   on another host, unreadable), or that it has no unfinished work.
2. Per host, its ranks by state. A host whose ranks all share one state is *whole*.
3. Whole hosts in the same state fold into one line naming the hosts compactly
   (:func:`host_names`: ``node[000-004,006-511]``); every other host gets a line of its
   own, one clause per state (``node005: rank 41 is in no collective, at train.py:7 in
   load_batch; ranks 40, 42-47 wait in all_reduce #812 of mesh_dp``), except that hosts
   which split alike by local rank fold too (``511 hosts (...): local rank 1 waits in
   all_reduce #812 of mesh_dp; local ranks 0, 2-7 wait in all_reduce #813 of mesh_tp``).
4. Lines with a rank the findings blame come first, then by first rank; at most
   ``limit`` lines, the rest counted.

:func:`ranks_with_hosts` writes a rank list with its hosts the same way (``0-7 (all of
hostA)``, ``3 (hostB, pid 4242)``); :func:`host_names` compresses host names as Slurm's
hostlists do; :func:`host_section` is the HTML report's hosts.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from commscope.analyze.analysis import Analysis
from commscope.analyze.model import HostMap
from commscope.analyze.text import place_text, plural, rank_list, ranks_phrase

__all__ = ["HostView", "State", "host_names", "ranks_with_hosts", "rank_states", "host_lines",
           "fold_by_host", "host_section"]

_NUMBERED = re.compile(r"^(.*?)(\d+)$")


def host_names(names: Sequence[str], limit: int = 8) -> str:
    """Host names, compressed as Slurm's hostlists: ``node[000-004,006-511]``,
    ``gpu[1-3], login1``, ``hostA, hostB``; past ``limit`` parts the rest is cut and the
    hosts counted (``hostA, hostB, ... (26 hosts)``)."""
    families: dict[tuple[str, int], list[tuple[int, str]]] = {}
    padded = {m.group(1) for m in map(_NUMBERED.match, names)
              if m and len(m.group(2)) > 1 and m.group(2)[0] == "0"}
    parts: list[tuple[str, int]] = []  # (prefix, width) in order of first appearance
    for name in dict.fromkeys(names):
        m = _NUMBERED.match(name)
        if m is None:
            parts.append((name, -1))
            continue
        prefix, digits = m.group(1), m.group(2)
        key = (prefix, len(digits) if prefix in padded else 0)
        if key not in families:
            families[key] = []
            parts.append(key)
        families[key].append((int(digits), digits))
    texts: list[str] = []
    for prefix, width in parts:
        if width < 0:
            texts.append(prefix)
            continue
        numbers = sorted(families[(prefix, width)])
        if len(numbers) == 1:
            texts.append(prefix + numbers[0][1])
            continue
        runs: list[str] = []
        start = prev = numbers[0]
        for item in [*numbers[1:], None]:
            if item is not None and item[0] == prev[0] + 1:
                prev = item
                continue
            runs.append(start[1] if start == prev else f"{start[1]}-{prev[1]}")
            if item is not None:
                start = prev = item
        shown = ",".join(runs[:limit]) + (",..." if len(runs) > limit else "")
        texts.append(f"{prefix}[{shown}]")
    n = len(dict.fromkeys(names))
    if len(texts) > limit:
        return f"{', '.join(texts[:limit])}, ... ({n} hosts)"
    return ", ".join(texts)


@dataclass
class HostView:
    """Where every rank ran, shaped for wording: host → ranks, rank → host, pids."""

    by_host: dict[str, list[int]]
    """Host → its ranks (sorted), hosts in order of their first rank."""
    host_of: dict[int, str]
    """Rank → its host (ranks no dump or record places are absent)."""
    pid_of: dict[int, int] = field(default_factory=dict)
    """Rank → its pid, where known."""

    @classmethod
    def of(cls, hosts: HostMap) -> HostView:
        """The view of an analysis' :class:`~commscope.analyze.model.HostMap`."""
        by_host = hosts.hosts()
        return cls(by_host=by_host,
                   host_of={r: h for h, ranks in by_host.items() for r in ranks},
                   pid_of={r: p.pid for r, p in hosts.places.items() if p.pid is not None})

    @classmethod
    def from_rows(cls, rows: Iterable[tuple[int, str | None, int | None]]) -> HostView:
        """The view of ``(rank, host, pid)`` rows (the live watch's ranks)."""
        by_host: dict[str, list[int]] = {}
        host_of: dict[int, str] = {}
        pid_of: dict[int, int] = {}
        for rank, host, pid in sorted(rows, key=lambda row: row[0]):
            if host:
                by_host.setdefault(host, []).append(rank)
                host_of[rank] = host
            if pid is not None:
                pid_of[rank] = pid
        return cls(by_host=by_host, host_of=host_of, pid_of=pid_of)

    @property
    def several(self) -> bool:
        """The job ran on more than one host: only then do views name hosts."""
        return len(self.by_host) > 1

    def label(self, rank: int) -> str:
        """``hostB, pid 4242`` (what is known), or ``""``."""
        host = self.host_of.get(rank)
        if host is None:
            return ""
        pid = self.pid_of.get(rank)
        return host + (f", pid {pid}" if pid is not None else "")

    def split(self, ranks: Iterable[int]) -> tuple[list[str], dict[str, list[int]], list[int]]:
        """``ranks`` as (hosts they fill whole, host → ranks of hosts they fill in part,
        ranks on no known host)."""
        mine: dict[str, list[int]] = {}
        unplaced = []
        for r in sorted(set(ranks)):
            host = self.host_of.get(r)
            if host is None:
                unplaced.append(r)
            else:
                mine.setdefault(host, []).append(r)
        whole = [h for h, rs in mine.items() if len(rs) == len(self.by_host[h])]
        filled = set(whole)
        part = {h: rs for h, rs in mine.items() if h not in filled}
        return whole, part, unplaced


def _hosts_clause(view: HostView, ranks: list[int], max_hosts: int) -> tuple[str, bool]:
    """The hosts of ``ranks`` in words, and whether that is compact (no host left
    uncounted): whole hosts together, then the other hosts one by one, those that hold
    the same local ranks together (``local rank 1 of 63 hosts: node[000-062]``)."""
    whole, part, _ = view.split(ranks)
    clauses = []
    if len(whole) == 1:
        clauses.append(f"all of {whole[0]}")
    elif whole:
        clauses.append(f"all of {len(whole)} hosts: {host_names(whole, 4)}")
    alike: dict[tuple[int, ...], list[str]] = {}
    for host, rs in part.items():
        index = {r: i for i, r in enumerate(view.by_host[host])}
        alike.setdefault(tuple(index[r] for r in rs), []).append(host)
    if len(alike) < len(part) and len(alike) <= max_hosts:
        for local, hosts in alike.items():
            if len(hosts) == 1:
                clauses.append(f"{hosts[0]}: {rank_list(part[hosts[0]], 3)}")
            else:
                clauses.append(f"local {ranks_phrase(local)} of {len(hosts)} hosts: "
                               f"{host_names(hosts, 4)}")
        return "; ".join(clauses), True
    for host, rs in list(part.items())[:max_hosts]:
        clauses.append(f"{host}: {rank_list(rs, 3)}")
    if len(part) > max_hosts:
        clauses.append(f"{plural(len(part) - max_hosts, 'more host')} in part")
    return "; ".join(clauses), len(part) <= max_hosts


def ranks_with_hosts(ranks: Iterable[int], view: HostView, limit: int = 12,
                     max_hosts: int = 3, *, compact_only: bool = False) -> str:
    """``rank_list`` with the hosts the ranks ran on, when the job spans hosts: ``3
    (hostB, pid 4242)``, ``0-7 (all of hostA)``, ``0-2 (all of hostA; hostB: 2)``,
    ``0-40, 42-4095 (all of 511 hosts: node[000-004,006-511]; node005: 40, 42-47)``,
    ``1, 9, 17, ... (63 ranks) (local rank 1 of 63 hosts: node[000-004,006-063])``; on
    one host, the plain list. ``compact_only``: the plain list too when the hosts cannot
    be told without leaving some uncounted."""
    values = sorted(set(ranks))
    text = rank_list(values, limit)
    if not values or not view.several:
        return text
    if len(values) == 1:
        label = view.label(values[0])
        return f"{text} ({label})" if label else text
    clause, compact = _hosts_clause(view, values, max_hosts)
    if not clause or (compact_only and not compact):
        return text
    return f"{text} ({clause})"


@dataclass(frozen=True)
class State:
    """What a rank is doing, worded for one rank and for several."""

    one: str
    """``waits in all_reduce #812 of mesh_dp``."""
    many: str
    """``wait in all_reduce #812 of mesh_dp``."""
    blamed: bool = False
    """A finding names it as a culprit or as crashed: its lines come first."""


def _group_words(a: Analysis) -> Callable[[str], str]:
    """Group key → how a state names it: the description when several groups share it
    (the dp groups of a mesh: they fold together), else the group's short mention."""
    counts: dict[str, int] = {}
    for g in a.groups.values():
        if g.desc and g.desc != "undefined":
            counts[g.desc] = counts.get(g.desc, 0) + 1

    def words(key: str) -> str:
        g = a.groups.get(key)
        if g is None:
            return f"group {key}"
        if g.desc and counts.get(g.desc, 0) > 1:
            return g.desc
        return g.ref()
    return words


def rank_states(a: Analysis) -> dict[int, State]:
    """Step 1: every expected rank's state (see module doc)."""
    crashed = {r for f in a.findings if f.kind == "crashed_rank" for r in f.culprit_ranks}
    blamed = crashed | {r for f in a.findings if f.blocking for r in f.culprit_ranks}
    away = {r for f in a.findings if f.kind == "dumps_elsewhere"
            for r in f.details.get("ranks", ())}
    unreadable = {u.rank for u in a.unreadable if u.rank is not None}
    words = _group_words(a)
    sigs = a.load.sigs.sigs
    out: dict[int, State] = {}
    for r in sorted(set(a.expected) | set(a.load.dumps)):
        d = a.load.dumps.get(r)
        hit = r in blamed
        if d is None:
            if r in away:
                out[r] = State("has its dump there, not here",
                               "have their dumps there, not here")
            elif r in unreadable:
                out[r] = State("left an unreadable dump", "left unreadable dumps", hit)
            elif r in crashed:
                out[r] = State("left no dump (crashed)", "left no dump (crashed)", True)
            else:
                out[r] = State("left no dump", "left no dump", hit)
            continue
        if r in crashed:
            raised = f": raised {d.exception[0]}" if d.exception else ""
            out[r] = State(f"crashed{raised}", f"crashed{raised}", True)
            continue
        if d.pending:
            key, seq, index = d.pending[0]
            t = d.tracks.get(key)
            if seq >= 0 and t is not None and t.lo <= seq <= t.hi and t.sig[seq - t.lo] >= 0:
                what = f"{sigs[t.sig[seq - t.lo]].op} #{seq}"
            elif seq >= 0:
                what = f"#{seq}"
            else:
                op = next((o for o in d.p2p if o.index == index), None)
                what = (f"{op.op} {'to' if op.op == 'send' else 'from'} rank {op.peer}"
                        if op is not None and op.peer is not None else "a send/recv")
            where = f"{what} of {words(key)}"
            out[r] = State(f"waits in {where}", f"wait in {where}", hit)
            continue
        making = next((c for c in d.creations if not c.done), None)
        if making is not None:
            name = making.desc or making.name
            out[r] = State(f"waits to create group {name}", f"wait to create group {name}",
                           hit)
        elif hit:
            at = f", at {place_text(d.main_place)}" if d.main_place else ""
            out[r] = State(f"is in no collective{at}", f"are in no collective{at}", True)
        else:
            out[r] = State("has no unfinished work", "have no unfinished work")
    return out


K = TypeVar("K")


@dataclass
class HostFold(Generic[K]):
    """One line of :func:`fold_by_host`: hosts in one state, hosts alike, or one host."""

    hosts: list[str]
    """One host, or the hosts that fold together."""
    parts: list[tuple[K, list[int]]]
    """(key, ranks) in this line, in order of first rank; one part when every rank of
    the line shares one key. In a line of hosts alike (``local``), the ranks are local:
    each rank's place among its host's ranks (``LOCAL_RANK`` under torchrun)."""
    ranks: list[int] = field(default_factory=list)
    """Every rank of the line."""
    local: bool = False

    @property
    def whole(self) -> bool:
        """Every rank of the line's hosts shares one key."""
        return len(self.parts) == 1 and not self.local


def fold_by_host(view: HostView, key_of: Callable[[int], K],
                 ranks: Iterable[int]) -> list[HostFold[K]]:
    """Steps 2-3 for any per-rank key (a :class:`State`, a live row's look): whole hosts
    with the same key fold into one line; hosts all of whose ranks are present and that
    split alike by local rank (local rank 1 waits in dp, the others in tp, on every host)
    fold into one ``local`` line; every other host is a line of its own. Lines in order
    of their first rank; ranks on no known host are left out."""
    wanted = set(ranks)
    folded: dict[object, HostFold[K]] = {}
    lines: list[tuple[int, HostFold[K]]] = []
    for host, members in view.by_host.items():
        present = [r for r in members if r in wanted]
        if not present:
            continue
        parts: dict[K, list[int]] = {}
        for r in present:
            parts.setdefault(key_of(r), []).append(r)
        complete = len(present) == len(members)
        if complete and len(parts) == 1:
            pattern: object = ("whole", next(iter(parts)))
        elif complete:
            index = {r: i for i, r in enumerate(members)}
            pattern = ("alike", tuple((k, tuple(index[r] for r in rs))
                                      for k, rs in parts.items()))
        else:
            lines.append((present[0], HostFold([host], list(parts.items()), present)))
            continue
        fold = folded.get(pattern)
        if fold is None:
            if pattern[0] == "whole":
                fold = HostFold([], [(next(iter(parts)), [])])
            else:
                fold = HostFold([], [(k, list(rs)) for k, rs in pattern[1]], local=True)
            folded[pattern] = fold
            lines.append((present[0], fold))
        fold.hosts.append(host)
        fold.ranks.extend(present)
        if pattern[0] == "whole":
            fold.parts[0][1].extend(present)
    out = []
    for _, fold in sorted(lines, key=lambda item: item[0]):
        if fold.local and len(fold.hosts) == 1:  # a host alike no other: its own ranks
            members = view.by_host[fold.hosts[0]]
            fold = HostFold(fold.hosts, [(k, [members[i] for i in rs]) for k, rs in fold.parts],
                            fold.ranks)
        out.append(fold)
    return out


def _clause(state: State, ranks: list[int], whole: bool, local: bool) -> str:
    verb = state.one if len(ranks) == 1 else state.many
    if whole and len(ranks) > 1:
        return f"{'both' if len(ranks) == 2 else f'all {len(ranks)}'} ranks {verb}"
    if local:
        return f"local {ranks_phrase(ranks)} {verb}"
    return f"{ranks_phrase(ranks)} {verb}"


def host_lines(a: Analysis, limit: int = 12,
               states: dict[int, State] | None = None) -> list[str]:
    """The job by host (see module doc): ``[]`` when it ran on one host."""
    view = HostView.of(a.hosts)
    if not view.several:
        return []
    states = states if states is not None else rank_states(a)
    unknown = State("?", "?")
    folds = fold_by_host(view, lambda r: states.get(r, unknown), states)
    lines: list[tuple[bool, int, int, str]] = []
    for i, fold in enumerate(folds):
        parts = sorted(fold.parts, key=lambda p: (not p[0].blamed, p[1][0]))
        body = "; ".join(_clause(k, rs, fold.whole, fold.local) for k, rs in parts)
        hosts = (fold.hosts[0] if len(fold.hosts) == 1
                 else f"{len(fold.hosts)} hosts ({host_names(fold.hosts)})")
        lines.append((not parts[0][0].blamed, i, len(fold.hosts), f"{hosts}: {body}"))
    lines.sort()
    out = [text for _, _, _, text in lines[:limit]]
    if len(lines) > limit:
        rest = lines[limit:]
        out.append(f"... and {plural(sum(n for _, _, n, _ in rest), 'more host')} "
                   "(--json: hosts)")
    return out


_MAX_HOST_ROWS = 64


def _pids_text(ranks: list[int], pids: dict[str, int]) -> str:
    """A host's pids in rank order: ``4242``, ``4242-4249`` (one after another), else the
    first few and a count."""
    values = [pids[str(r)] for r in ranks if str(r) in pids]
    if not values:
        return ""
    if len(values) == 1:
        return str(values[0])
    if values == list(range(values[0], values[0] + len(values))):
        return f"{values[0]}-{values[-1]}"
    shown = ", ".join(map(str, values[:4]))
    return shown + (f", ... ({len(values)} pids)" if len(values) > 4 else "")


def host_section(a: Analysis, rows: list[dict[str, Any]], exclude: list[str]
                 ) -> dict[str, Any] | None:
    """The HTML report's hosts: one row per host (``rows``: the JSON's ``hosts``, in
    order of their first rank); past :data:`_MAX_HOST_ROWS` hosts only those with
    something to say (a rank crashed or blamed, dumps not here), the others counted and
    named in one line, and at most :data:`_MAX_HOST_ROWS` rows; the job by host
    (:func:`host_lines`); ``exclude``, the hosts to leave out on a restart. ``None``
    when the dumps say nothing of hosts."""
    if not rows:
        return None
    shown, quiet = [], []
    for row in rows:
        ranks, here, crashed = row["ranks"], set(row["dumps_here"]), set(row["crashed_ranks"])
        missing = [r for r in ranks if r not in here]
        notes = []
        if crashed:
            notes.append(f"crashed: {rank_list(crashed, 4)}")
        culprits = [r for r in row["culprit_ranks"] if r not in crashed]
        if culprits:
            notes.append(f"culprit: {rank_list(culprits, 4)}")
        if not row["dumps_here"]:
            notes.append("no dump here")
        elif missing:
            notes.append(f"missing: {rank_list(missing, 4)}")
        item = {"host": row["host"], "ranks": rank_list(ranks, 6),
                "pids": _pids_text(ranks, row["pids"]), "dump_dir": row["dump_dir"] or "",
                "dumps_here": f"{len(row['dumps_here'])}/{len(ranks)}",
                "notes": "; ".join(notes), "blamed": bool(crashed or culprits)}
        (quiet if not notes and len(rows) > _MAX_HOST_ROWS else shown).append(item)
    return {
        "rows": shown[:_MAX_HOST_ROWS],
        "more": len(shown) - len(shown[:_MAX_HOST_ROWS]),
        "quiet": len(quiet),
        "quiet_names": host_names([q["host"] for q in quiet], 6) if quiet else "",
        "by_host": host_lines(a, limit=40),
        "exclude": exclude,
    }
