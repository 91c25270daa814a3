"""Who is in which group, and every group's collectives lined up across its ranks.

Membership (:func:`build_groups`):

1. The expected ranks are ``range(world_size)`` when given, else from the dumps'
   ``world_size`` field, gloo's ``''`` hint, valid ``pg_config`` lists and every rank
   seen (loaded or named by an unreadable file), gaps filled from 0.
2. A group's ranks come from ``pg_config`` when a dump holds a trustworthy list for it
   (a real name and a non-empty list; gloo 2.13's ``''`` key is never one); the
   default group (desc ``default_pg``) is the whole world; otherwise the ranks that
   recorded anything in it (and their p2p peers). A rank with records in a group is
   always a member.

Alignment (:func:`align_group`), per group, by ``collective_seq_id`` (never by
``record_id``, which differs between ranks in different sets of groups):

1. Each rank's track covers ``[lo, hi]``. Cut the sequence axis at every ``lo`` and
   ``hi + 1``; in each segment the covering ranks are fixed.
2. In a segment, compare the ranks' match-key slices as bytes (C speed) and bucket
   identical ones; with one bucket all agree. Otherwise walk the positions where
   buckets differ and record a :class:`Mismatch`: ranks per match key, the majority,
   and the culprits (ranks off the majority). A tie is broken by evidence: the key
   seen more often in this group's history is taken as the intended one; if still
   tied, every side is named.
3. The **frontier** is the first sequence number some rank with a dump never reached
   (``min hi + 1``): who has it, who lacks it, who is still waiting in it. Ranks whose
   ring wrapped without a record of the group are *unknown*, never "missing".
4. Ranks whose window starts later than another member's because their ring wrapped
   are listed as truncated: those older collectives were compared among the others
   only.

p2p (:func:`match_p2p`): per group and ordered pair (src, dst), the k-th send of src
to dst pairs with the k-th recv of dst from src, in ``p2p_seq_id`` order. When either
side's ring wrapped, ops older than both sides' oldest record are set aside first.
Leftovers are unmatched; a matched pair with different sizes or dtypes is a mismatch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import pairwise

from commscope.analyze.align.progress import RankProgress
from commscope.analyze.model import (
    COMPLETED,
    GAP,
    RETIRED,
    Group,
    LoadResult,
    P2POp,
    RankDump,
    Track,
)

__all__ = [
    "Mismatch",
    "Frontier",
    "GroupView",
    "P2PIssue",
    "expected_ranks",
    "build_groups",
    "is_hash_name",
    "short_names",
    "align_group",
    "align_all",
    "match_p2p",
    "p2p_channels",
    "MAX_MISMATCHES_PER_GROUP",
]

DONE = RETIRED | COMPLETED
MAX_MISMATCHES_PER_GROUP = 200


@dataclass(slots=True)
class Mismatch:
    """Ranks of one group disagree about collective ``seq``."""

    seq: int
    by_key: dict[int, list[int]]
    """Match-key id → ranks that issued it."""
    majority: int | None
    culprits: list[int]
    agreeing: list[int]
    pending: bool
    """Some of these ranks have not finished it (part of a hang, not a survived bug)."""
    tie: bool = False


@dataclass(slots=True)
class Frontier:
    """The first collective of a group that some rank (with a dump) never issued."""

    seq: int
    have: list[int]
    lack: list[int]
    waiting: list[int]
    """Ranks with an unfinished collective of this group at or after ``seq``."""
    completed_by: list[int]
    """Ranks whose record says ``completed`` (definitive) at ``seq``."""


@dataclass(slots=True)
class GroupView:
    """One group lined up across its ranks."""

    group: Group
    spans: dict[int, tuple[int, int]]
    """Rank → (lo, hi) of its track; ranks with a dump but no record have (1, 0)."""
    nodump: list[int]
    unknown: list[int]
    """Members whose ring wrapped with no record of this group: cannot be judged."""
    mismatches: list[Mismatch] = field(default_factory=list)
    more_mismatches: int = 0
    frontier: Frontier | None = None
    truncated: dict[int, int] = field(default_factory=dict)
    """Rank → first sequence number it kept, for wrapped ranks that start late."""
    checked: int = 0
    """Collective sequence numbers compared across at least two ranks."""

    @property
    def min_hi(self) -> int:
        """The last sequence number every rank with a dump reached."""
        return min((hi for _, hi in self.spans.values()), default=0)

    @property
    def max_hi(self) -> int:
        """The newest sequence number any rank reached."""
        return max((hi for _, hi in self.spans.values()), default=0)


@dataclass(slots=True)
class P2PIssue:
    """A send or recv without its partner, or a pair that disagrees."""

    kind: str
    """``unmatched`` or ``mismatch``."""
    group: str
    op: P2POp
    rank: int
    peer: int | None
    partner: P2POp | None = None


# ------------------------------------------------------------------ membership


def expected_ranks(load: LoadResult, world_size: int | None = None) -> list[int]:
    """Every rank that should have a dump (see module doc, step 1)."""
    if world_size:
        return list(range(world_size))
    seen: set[int] = set(load.dumps)
    seen.update(u.rank for u in load.unreadable if u.rank is not None)
    sizes = [d.world_size for d in load.dumps.values() if d.world_size]
    if sizes:
        return list(range(max(max(sizes), max(seen, default=-1) + 1)))
    lists = {}
    for d in load.dumps.values():  # the same tuple objects repeat on every rank
        if d.world_hint:
            lists[id(d.world_hint)] = d.world_hint
        for ranks in d.config.values():
            lists[id(ranks)] = ranks
    for ranks in lists.values():
        if ranks:
            seen.add(max(ranks))
    return list(range(max(seen) + 1)) if seen else []


def _is_default(name: str, desc: str) -> bool:
    return desc == "default_pg" or (name == "0" and desc in ("", "undefined"))


def build_groups(load: LoadResult, world: list[int]) -> dict[str, Group]:
    """Every group seen in any dump, with its members (see module doc)."""
    descs: dict[str, Counter[str]] = {}
    recorded: dict[str, set[int]] = {}
    configured: dict[str, dict[int, tuple[int, ...]]] = {}
    for rank, d in load.dumps.items():
        for name in list(d.tracks) + [op.group for op in d.p2p]:
            recorded.setdefault(name, set()).add(rank)
        for op in d.p2p:
            if op.peer is not None:
                recorded.setdefault(op.group, set()).add(op.peer)
        for name, desc in d.group_desc.items():
            descs.setdefault(name, Counter())[desc] += 1
        for name, ranks in d.config.items():
            configured.setdefault(name, {})[id(ranks)] = ranks
    hint = next((d.world_hint for _, d in sorted(load.dumps.items()) if d.world_hint), None)
    groups: dict[str, Group] = {}
    shorts = short_names(set(recorded) | set(configured))
    for name in sorted(set(recorded) | set(configured)):
        counts = descs.get(name, Counter())
        desc = min(counts, key=lambda k: (-counts[k], k)) if counts else ""
        members = set(recorded.get(name, ()))
        if name in configured:
            how = "pg_config"
            for ranks in configured[name].values():
                members.update(ranks)
        elif _is_default(name, desc):
            how = "world"
            members |= set(world) | set(hint or ())
        else:
            how = "entries"
        groups[name] = Group(key=name, name=name, desc=desc, ranks=tuple(sorted(members)),
                             membership=how, short=shorts.get(name, ""))
    return groups


def is_hash_name(name: str) -> bool:
    """A 40-hex-digit sha1, as PyTorch names groups made with local synchronization."""
    return len(name) == 40 and all(c in "0123456789abcdef" for c in name.lower())


def short_names(names: Iterable[str], digits: int = 8) -> dict[str, str]:
    """Hash name → its shortest prefix (``digits`` or more) no other name starts with."""
    by_prefix: dict[str, list[str]] = {}
    for n in set(names):
        by_prefix.setdefault(n[:digits], []).append(n)
    out: dict[str, str] = {}
    for same in by_prefix.values():
        for h in same:
            if not is_hash_name(h):
                continue
            n = digits
            while n < len(h) and any(x != h and x.startswith(h[:n]) for x in same):
                n += 1
            out[h] = h[:n]
    return out


# ------------------------------------------------------------------- alignment


def _tie_break(view_tracks: dict[int, Track], keys: list[int]) -> list[int]:
    """Keys ordered by how often the group's history uses them (most first)."""
    freq = {k: sum(t.mk.count(k) for t in view_tracks.values() if t.mk is not None) for k in keys}
    return sorted(keys, key=lambda k: (-freq[k], k))


def _mismatch(seq: int, by_key: dict[int, list[int]], tracks: dict[int, Track]) -> Mismatch:
    sizes = sorted(((len(r), k) for k, r in by_key.items()), reverse=True)
    top = [k for n, k in sizes if n == sizes[0][0]]
    tie = False
    if len(top) > 1:
        ranked = _tie_break(tracks, top)
        if len(ranked) > 1 and _freq_equal(tracks, ranked[0], ranked[1]):
            tie = True
        majority = ranked[0]
    else:
        majority = top[0]
    involved = sorted(r for rs in by_key.values() for r in rs)
    if tie:
        culprits, agreeing, major = involved, [], None
    else:
        agreeing = sorted(by_key[majority])
        culprits = sorted(r for k, rs in by_key.items() if k != majority for r in rs)
        major = majority
    pending = False
    for r in involved:
        t = tracks[r]
        if not t.status[seq - t.lo] & DONE:
            pending = True
            break
    return Mismatch(seq=seq, by_key={k: sorted(v) for k, v in sorted(by_key.items())},
                    majority=major, culprits=culprits, agreeing=agreeing, pending=pending,
                    tie=tie)


def _freq_equal(tracks: dict[int, Track], a: int, b: int) -> bool:
    fa = sum(t.mk.count(a) for t in tracks.values() if t.mk is not None)
    fb = sum(t.mk.count(b) for t in tracks.values() if t.mk is not None)
    return fa == fb


def _compare_segment(view: GroupView, tracks: dict[int, Track], ranks: list[int],
                     a: int, b: int) -> None:
    variants: dict[bytes, list[int]] = {}
    slices: dict[bytes, object] = {}
    for r in ranks:
        t = tracks[r]
        part = t.mk[a - t.lo: b - t.lo]  # type: ignore[index]
        key = part.tobytes()
        variants.setdefault(key, []).append(r)
        slices.setdefault(key, part)
    view.checked += b - a
    if len(variants) == 1:
        return
    parts = [(slices[k], rs) for k, rs in variants.items()]
    ref = parts[0][0]
    for pos in range(b - a):
        first = ref[pos]  # type: ignore[index]
        if all(p[pos] == first for p, _ in parts):  # type: ignore[index]
            continue
        by_key: dict[int, list[int]] = {}
        for p, rs in parts:
            k = p[pos]  # type: ignore[index]
            if k != GAP:
                by_key.setdefault(k, []).extend(rs)
        if len(by_key) < 2:
            continue
        if len(view.mismatches) >= MAX_MISMATCHES_PER_GROUP:
            view.more_mismatches += 1
            continue
        view.mismatches.append(_mismatch(a + pos, by_key, tracks))


def align_group(group: Group, load: LoadResult,
                progress: dict[int, RankProgress] | None = None) -> GroupView:
    """Line up one group's collectives across its members (see module doc)."""
    tracks: dict[int, Track] = {}
    spans: dict[int, tuple[int, int]] = {}
    nodump: list[int] = []
    unknown: list[int] = []
    for r in group.ranks:
        d = load.dumps.get(r)
        if d is None:
            nodump.append(r)
            continue
        t = d.tracks.get(group.key)
        issued = _issued(progress, r, group.key)
        if t is not None and len(t):
            tracks[r] = t
            spans[r] = (t.lo, max(t.hi, issued))
        elif issued:
            spans[r] = (issued + 1, issued)  # issued that far; nothing unfinished kept
        elif d.wrapped:
            unknown.append(r)
        else:
            spans[r] = (1, 0)  # a member that issued no collective of it (p2p only, or none)
    view = GroupView(group=group, spans=spans, nodump=nodump, unknown=unknown)
    if tracks:
        cuts = sorted({t.lo for t in tracks.values()} | {t.hi + 1 for t in tracks.values()})
        for a, b in pairwise(cuts):
            covering = [r for r, t in tracks.items() if t.lo <= a and t.hi >= b - 1]
            if len(covering) >= 2:
                _compare_segment(view, tracks, covering, a, b)
        first = min(t.lo for t in tracks.values())
        for r, t in tracks.items():
            if t.lo > first and load.dumps[r].wrapped:
                view.truncated[r] = t.lo
    view.mismatches.sort(key=lambda m: m.seq)
    view.frontier = _frontier(view, tracks)
    return view


def _issued(progress: dict[int, RankProgress] | None, rank: int, group: str) -> int:
    """How far ``rank``'s thread issued ``group``'s collectives, where the progress model
    knows more than the records (a device backend's ``pg_status``); else 0."""
    if progress is None or rank not in progress or not progress[rank].device:
        return 0
    return progress[rank].issued(group)


def _p2p_groups(d: RankDump) -> set[str]:
    return {op.group for op in d.p2p}


def _frontier(view: GroupView, tracks: dict[int, Track]) -> Frontier | None:
    if not view.spans:
        return None
    low, high = view.min_hi, view.max_hi
    if low >= high:
        return None
    seq = low + 1
    have = sorted(r for r, (_, hi) in view.spans.items() if hi >= seq)
    lack = sorted(r for r, (_, hi) in view.spans.items() if hi < seq)
    waiting, completed_by = [], []
    for r in have:
        t = tracks.get(r)
        if t is None:
            continue  # issued it (pg_status) and kept no unfinished record of it: done
        start = max(seq, t.lo) - t.lo
        if any(not s & DONE for s in t.status[start:]):
            waiting.append(r)
        if t.lo <= seq <= t.hi and t.status[seq - t.lo] & COMPLETED:
            completed_by.append(r)
    return Frontier(seq=seq, have=have, lack=lack, waiting=waiting, completed_by=completed_by)


def align_all(load: LoadResult, groups: dict[str, Group],
              progress: dict[int, RankProgress] | None = None) -> dict[str, GroupView]:
    """:func:`align_group` for every group (``progress``: how far each rank issued, where
    its records alone do not show it)."""
    return {key: align_group(g, load, progress) for key, g in groups.items()}


# ------------------------------------------------------------------------- p2p


def _peer(op: P2POp, group: Group) -> int | None:
    if op.peer is not None:
        return op.peer
    local = op.local_dst if op.op == "send" else op.local_src
    if local is None or not 0 <= local < len(group.ranks):
        return None
    return group.ranks[local]


def p2p_channels(load: LoadResult, ranks: Iterable[int]
                 ) -> dict[tuple[str, int, int], tuple[list[P2POp], list[P2POp]]]:
    """``(group, src, dst) → (sends of src to dst, recvs of dst from src)``, each in
    ``p2p_seq_id`` order, over the ops of ``ranks`` whose peer is known."""
    sends: dict[tuple[str, int, int], list[P2POp]] = {}
    recvs: dict[tuple[str, int, int], list[P2POp]] = {}
    for rank in sorted(ranks):
        for op in load.dumps[rank].p2p:
            if op.peer is None:
                continue
            if op.op == "send":
                sends.setdefault((op.group, rank, op.peer), []).append(op)
            else:
                recvs.setdefault((op.group, op.peer, rank), []).append(op)
    return {key: (sorted(sends.get(key, []), key=_by_p2p_seq),
                  sorted(recvs.get(key, []), key=_by_p2p_seq))
            for key in sorted(set(sends) | set(recvs))}


def _by_p2p_seq(op: P2POp) -> int:
    return op.p2p_seq


def match_p2p(load: LoadResult, groups: dict[str, Group]) -> list[P2PIssue]:
    """Pair every send with its recv (see module doc); return what did not pair."""
    for d in load.dumps.values():
        for op in d.p2p:
            group = groups.get(op.group)  # build_groups made one for every p2p group
            if group is not None:
                op.peer = _peer(op, group)
    issues: list[P2PIssue] = []
    for key, (s_ops, r_ops) in p2p_channels(load, load.dumps).items():
        gname, src, dst = key
        if src not in load.dumps or dst not in load.dumps:
            continue  # the side without a dump is reported as crashed, not unmatched
        counted = _by_ordinal(load, key, s_ops, r_ops)
        if counted is not None:
            issues += counted
            continue
        if load.dumps[src].wrapped or load.dumps[dst].wrapped:
            since = max(load.dumps[src].first_created_ns or 0,
                        load.dumps[dst].first_created_ns or 0)
            s_ops = [o for o in s_ops if o.created >= since]
            r_ops = [o for o in r_ops if o.created >= since]
        for s_op, r_op in zip(s_ops, r_ops):
            if load.sigs.sigs[s_op.sig].input_sizes != _recv_sizes(load, r_op) or (
                _dtypes(load, s_op) != _dtypes(load, r_op)
            ):
                issues.append(P2PIssue("mismatch", gname, s_op, src, dst, partner=r_op))
        for op in s_ops[len(r_ops):]:
            issues.append(P2PIssue("unmatched", gname, op, src, dst))
        for op in r_ops[len(s_ops):]:
            issues.append(P2PIssue("unmatched", gname, op, dst, src))
    return issues


def _by_ordinal(load: LoadResult, key: tuple[str, int, int], s_ops: list[P2POp],
                r_ops: list[P2POp]) -> list[P2PIssue] | None:
    """The issues of one channel when both sides counted their ops since the job began
    (progress records: a few records each, and every op's place on its channel): the
    k-th send pairs with the k-th recv, and an op beyond what the peer ever posted is
    unmatched. ``None`` when either side has no counts (dumps: their records are the
    history)."""
    gname, src, dst = key
    sent, got = load.dumps[src].p2p_totals, load.dumps[dst].p2p_totals
    if sent is None or got is None or any(o.ordinal is None for o in (*s_ops, *r_ops)):
        return None
    n_sent, n_got = sent.get((gname, "send", dst), 0), got.get((gname, "recv", src), 0)
    issues = []
    recvs = {o.ordinal: o for o in r_ops}
    for s_op in s_ops:
        r_op = recvs.get(s_op.ordinal)
        if r_op is not None and (
                load.sigs.sigs[s_op.sig].input_sizes != _recv_sizes(load, r_op)
                or _dtypes(load, s_op) != _dtypes(load, r_op)):
            issues.append(P2PIssue("mismatch", gname, s_op, src, dst, partner=r_op))
        if s_op.ordinal is not None and s_op.ordinal >= n_got:
            issues.append(P2PIssue("unmatched", gname, s_op, src, dst))
    for r_op in r_ops:
        if r_op.ordinal is not None and r_op.ordinal >= n_sent:
            issues.append(P2PIssue("unmatched", gname, r_op, dst, src))
    return issues


def _recv_sizes(load: LoadResult, op: P2POp) -> object:
    sig = load.sigs.sigs[op.sig]
    return sig.output_sizes or sig.input_sizes


def _dtypes(load: LoadResult, op: P2POp) -> object:
    sig = load.sigs.sigs[op.sig]
    return (sig.input_dtypes or sig.output_dtypes or ())[:1]


def members_with_dumps(group: Group, load: LoadResult) -> Iterable[int]:
    """Members of ``group`` that left a readable dump."""
    return (r for r in group.ranks if r in load.dumps)
