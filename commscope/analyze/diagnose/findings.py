"""From aligned groups to one wait-for graph, and from the graph to findings and a verdict.

Algorithm (:func:`diagnose`):

1. Stale dumps (ours carry ``dump_time_ns``): a rank whose dump is much older than the
   others' and whose history stops before theirs stopped early
   (:func:`commscope.analyze.diagnose.timing.stale_dumps`).
2. Disagreements inside groups (:func:`commscope.analyze.diagnose.mismatch.mismatch_findings`):
   op / order / size / dtype / skipped collective.
3. **The wait-for graph** (:mod:`commscope.analyze.diagnose.waits`) over every rank's unfinished
   work: a collective waits for the members that never reached it or left no dump (the
   root of a broadcast, reduce, gather or scatter also when another member finished it:
   a non-root finishes with its own part), a send for the peer's matching recv, a recv
   for the send.
4. **Crashed ranks** (``crashed_rank``, :mod:`commscope.analyze.diagnose.crashes`): an expected
   rank without a dump, with a stale dump, or whose dump was written because it raised
   an exception that is not a communication error (the text of the exception is
   quoted), or on a signal no other rank got, before any other rank dumped (torchrun's
   SIGTERM to the survivors of a failure is not a cause). Ranks whose collective failed
   with the dead rank, or who raised a communication error, are its *victims*: listed
   as waiting, never as culprits.
5. **Cycles** (:mod:`commscope.analyze.diagnose.cycles`): every strongly connected component is
   a deadlock. A rank that skipped a collective and went on
   (:mod:`commscope.analyze.diagnose.skips`) is named as ``missing_rank``; a cycle only through
   send/recv is a ``p2p_deadlock``; a cycle through a send/recv and collectives is the
   ``p2p_unmatched`` of the rank that never posted the partner op; a cycle through
   collectives of several groups is a ``cross_group_deadlock`` that names the rank(s)
   whose order differs from the majority's (the group most ranks wait in is the order
   they agree on).
6. **Roots**: ranks others wait for that wait for nobody. At a group's frontier the
   ones that never issued the collective are ``missing_rank``; the peer of an
   unfinished send/recv that never posted its partner is ``p2p_unmatched``. When the
   root's dump carries thread stacks (commscope's do), the finding says where its main
   thread is now; a PyTorch-native dump has none, and the finding says so.
7. Everyone who reaches a culprit in the graph, transitively, waits behind it; so does
   everyone who reaches the ranks of a blocking disagreement of step 2.
8. ``stalled_collective`` when nothing above explains a stop and everyone is inside the
   same unfinished collective (with evidence of age).
9. **Coverage**: a rank with unfinished work that no blocking finding names (as
   culprit or waiter) gets a ``stalled_collective`` of its own, judged by the op's age
   on the rank's own clock when other members finished it: stuck (blocking) when the
   rank dumped on its own timeout or had been in it ``stall_s`` or longer, caught
   finishing it (a note, verdict ``healthy``) when younger; when its dump has no time
   (PyTorch's native dumps), caught finishing if every member issued it alike (gloo
   finishes a call all its members posted with the same sizes), else undecided
   (verdict ``incomplete``). Unfinished work nobody finished is stuck, unless every
   member issued it alike and no dump has a time (undecided). A collective followed on
   its rank by a finished one of its group, both issued alike by every member, is not
   unfinished (:func:`commscope.analyze.diagnose.timing.open_work`: only its mark lags).
10. Remarks: ``unreadable_dump``, ``truncated_history``, ``straggler``; ``healthy`` when
    there is nothing at all. Dumps of a running job asked for on demand, with no wait
    older than ``stall_s``: the waits give way to one ``healthy`` note
    (:func:`commscope.analyze.diagnose.timing.caught_running`).
11. Order: blocking disagreements whose shape is known, crashes, other roots (missing
    ranks, unmatched p2p, blocking mismatches), cycles, stalls, then survived
    disagreements (desync), unreadable dumps, undecidable history, remarks; within a
    tier by sequence number, group and ranks. The verdict is the worst of the
    findings' (below: ``crash`` if a rank crashed, else ``hang`` if anything blocks,
    else ``desync``, else ``incomplete`` when dumps are unreadable or history
    undecidable, else ``healthy``).

The verdict (:func:`verdict`), from one table of (finding, dump reason) -> verdict:

1. Every finding has a *role*: its kind, told apart where one kind can mean several
   things (:func:`role`): a mismatch others wait behind, one the job went through, one
   that killed its peers; a rank stuck in an op, or caught finishing it.
2. Every role has one verdict (:data:`VERDICT_TABLE`), whatever the dumps were written
   for; the table's columns, the dump reasons
   (:func:`commscope.analyze.diagnose.timing.reason_class`), only mark with ``None``
   the roles the analyzer never makes for that reason (a running job caught
   mid-collective is only ever told from dumps asked for on demand).
3. The verdict of an analysis is the worst of its findings' (:data:`SEVERITY`:
   ``crash`` > ``hang`` > ``desync`` > ``incomplete`` > ``healthy``), ``healthy`` when
   there are none. A finding that says "not a hang" has a role whose verdict is
   ``healthy``, so no verdict ever contradicts the findings it comes from.

The dump reason and the ages of the unfinished ops decide which findings are made (steps
9 and 10), never what one of them weighs. ``docs/analyze.md`` shows the table ("The
verdict"); a test reads it there and compares it with :data:`VERDICT_TABLE` cell by cell.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from commscope.analyze.align.match import P2PIssue
from commscope.analyze.diagnose.context import Context
from commscope.analyze.diagnose.crashes import (
    crash_findings,
    crash_reasons,
    deaths_here,
    is_comm_error,
    killed_by_mismatch,
)
from commscope.analyze.diagnose.creations import creation_findings, creation_waits
from commscope.analyze.diagnose.cycles import cycle_finding
from commscope.analyze.diagnose.hosts import elsewhere_findings, elsewhere_ranks
from commscope.analyze.diagnose.mismatch import (
    MISMATCH_KINDS,
    mismatch_findings,
    pending_mismatch_ranks,
    print_findings,
)
from commscope.analyze.diagnose.queues.graph import queue_waits
from commscope.analyze.diagnose.queues.roots import queue_findings
from commscope.analyze.diagnose.skips import find_skip, skip_finding
from commscope.analyze.diagnose.splits import split_findings
from commscope.analyze.diagnose.timing import (
    ON_DEMAND_STALL_S,
    REASONS,
    caught_running,
    open_work,
    pending_age_ns,
    posted_alike,
    stale_dumps,
    stalled_findings,
    straggler_findings,
)
from commscope.analyze.diagnose.waits import (
    Wait,
    WaitGraph,
    build_waits,
    find_cycles,
    reaching,
)
from commscope.analyze.diagnose.wording import (
    now_text,
    nows_text,
    record_op,
    record_status,
    wait_verb,
)
from commscope.analyze.model import COMPLETED, RETIRED, Finding
from commscope.analyze.text import frame_text, ms, place_text, plural, ranks_phrase

__all__ = ["diagnose", "verdict", "MISMATCH_KINDS", "KINDS", "is_comm_error", "SEVERITY",
           "ROLES", "VERDICT_TABLE", "role", "role_verdict", "finding_verdict"]

_DONE = RETIRED | COMPLETED
KINDS = (
    "missing_rank", "size_mismatch", "dtype_mismatch", "op_mismatch", "order_mismatch",
    "root_mismatch", "reduce_op_mismatch", "split_mismatch", "fingerprint_mismatch",
    "p2p_unmatched", "p2p_deadlock", "crashed_rank", "cross_group_deadlock", "device_stopped",
    "truncated_history", "straggler", "stalled_collective", "unreadable_dump",
    "dumps_elsewhere", "thread_died", "healthy",
)
_CYCLE_KINDS = ("cross_group_deadlock", "p2p_deadlock")
_WAIT_KINDS = ("missing_rank", "p2p_unmatched", "stalled_collective", *_CYCLE_KINDS)
"""Findings read from unfinished work alone (a wait), not from ranks disagreeing."""


def _tier(f: Finding) -> int:
    if f.blocking and f.kind in (*MISMATCH_KINDS, "missing_rank") and "shape" in f.details:
        return 1
    if f.kind == "crashed_rank":
        return 2
    if f.kind in ("truncated_history", "stalled_collective") and f.details.get("undecided"):
        return 7
    if f.kind == "stalled_collective" and f.details.get("caught"):
        return 8
    if f.details.get("cycle_root"):
        return 4
    if f.blocking and f.kind in ("missing_rank", "p2p_unmatched", "device_stopped",
                                 *MISMATCH_KINDS):
        return 3
    if f.kind in _CYCLE_KINDS:
        return 4
    if f.kind == "stalled_collective":
        return 5
    if f.kind in (*MISMATCH_KINDS, "missing_rank", "p2p_unmatched"):
        return 6
    if f.kind == "unreadable_dump":
        return 7
    if f.kind == "dumps_elsewhere":
        return 3 if f.blocking else 7
    return 8


def _sort_key(f: Finding) -> tuple[object, ...]:
    seq = f.collective_seq_id if f.collective_seq_id is not None else 1 << 62
    return (_tier(f), seq, f.culprit_ranks, f.group.name if f.group else "", f.kind)


# ---------------------------------------------------------------------- the verdict

SEVERITY = ("healthy", "incomplete", "desync", "hang", "crash")
"""The verdicts, mildest first: an analysis takes the worst of its findings'."""

_ALL_BUT_NONE = tuple(r for r in REASONS if r != "none")
_ROWS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    # role, its verdict, the dump reasons it can come with
    ("healthy", "healthy", REASONS),
    ("healthy, caught running", "healthy", ("on demand",)),
    ("straggler", "healthy", REASONS),
    ("thread_died", "healthy", _ALL_BUT_NONE),
    ("truncated_history", "healthy", REASONS),
    ("stalled_collective, caught finishing", "healthy", REASONS),
    ("stalled_collective, age unknown", "incomplete", REASONS),
    ("truncated_history, undecided", "incomplete", REASONS),
    ("unreadable_dump", "incomplete", REASONS),
    ("dumps_elsewhere", "incomplete", _ALL_BUT_NONE),
    ("*_mismatch, nobody waits", "desync", REASONS),
    ("missing_rank, nobody waits", "desync", REASONS),
    ("*_mismatch, ranks wait", "hang", REASONS),
    ("missing_rank, ranks wait", "hang", REASONS),
    ("p2p_unmatched", "hang", REASONS),
    ("device_stopped", "hang", REASONS),
    ("p2p_deadlock", "hang", REASONS),
    ("cross_group_deadlock", "hang", REASONS),
    ("stalled_collective, stuck", "hang", REASONS),
    ("dumps_elsewhere, ranks wait", "hang", _ALL_BUT_NONE),
    ("crashed_rank", "crash", REASONS),
    ("*_mismatch, killed its peers", "crash", REASONS),
)

ROLES = tuple(name for name, _, _ in _ROWS)
"""Every role a finding can have (:func:`role`), the rows of :data:`VERDICT_TABLE`."""

VERDICT_TABLE: dict[str, dict[str, str | None]] = {
    name: {reason: (v if reason in where else None) for reason in REASONS}
    for name, v, where in _ROWS
}
"""Role → dump reason → the finding's verdict (``None``: never made for that reason)."""

_ROLE_VERDICT = {name: v for name, v, _ in _ROWS}


def role(f: Finding) -> str:
    """The row of :data:`VERDICT_TABLE` for finding ``f`` (its kind, told apart by what
    it says: whether ranks wait behind it, whether it killed its peers, whether a rank
    still in an op was caught finishing it). A kind the table does not know weighs as a
    wait when it blocks, else as a remark the dumps cannot decide."""
    kind = f.kind
    if kind == "healthy":
        return "healthy, caught running" if "caught_running" in f.details else "healthy"
    if kind in MISMATCH_KINDS:
        if f.details.get("killed"):
            return "*_mismatch, killed its peers"
        return "*_mismatch, ranks wait" if f.blocking else "*_mismatch, nobody waits"
    if kind == "missing_rank":
        return "missing_rank, ranks wait" if f.blocking else "missing_rank, nobody waits"
    if kind == "stalled_collective":
        if f.blocking:
            return "stalled_collective, stuck"
        if f.details.get("caught"):
            return "stalled_collective, caught finishing"
        return "stalled_collective, age unknown"
    if kind == "truncated_history":
        return "truncated_history, undecided" if f.details.get("undecided") else kind
    if kind == "dumps_elsewhere":
        return "dumps_elsewhere, ranks wait" if f.blocking else kind
    if kind in _ROLE_VERDICT:
        return kind
    return "stalled_collective, stuck" if f.blocking else "stalled_collective, age unknown"


def role_verdict(name: str, reason: str | None = None) -> str | None:
    """The verdict of role ``name`` (:data:`VERDICT_TABLE`); with ``reason`` (a column),
    ``None`` where the analyzer never makes that role for it."""
    if reason is None:
        return _ROLE_VERDICT[name]
    return VERDICT_TABLE[name][reason]


def finding_verdict(f: Finding) -> str:
    """The verdict finding ``f`` stands for on its own."""
    return _ROLE_VERDICT[role(f)]


def verdict(findings: Iterable[Finding]) -> str:
    """The worst verdict of ``findings`` ("The verdict" in the module doc); ``healthy``
    for none."""
    worst = 0
    for f in findings:
        worst = max(worst, SEVERITY.index(finding_verdict(f)))
    return SEVERITY[worst]


# ---------------------------------------------------------------------- roots


def _behind_disagreements(findings: list[Finding], graph: WaitGraph) -> None:
    """Step 7 for the disagreements found before the graph (mismatches, splits): the
    ranks that wait on a blocking one's ranks, down a chain of waits (a dp peer of a tp
    rank stuck in a call its group disagrees about), wait behind it."""
    for f in findings:
        if not f.blocking:
            continue
        inside = set(f.culprit_ranks) | set(f.waiting_ranks)
        behind = reaching(inside, graph) - set(f.culprit_ranks)
        if behind:
            f.waiting_ranks = sorted(set(f.waiting_ranks) | behind)


def _root_waits(ctx: Context) -> list[Wait]:
    """The root of a rooted collective (broadcast, reduce, gather, scatter) at a group's
    frontier waits for every member that never reached it, though other members
    finished it: a non-root finishes once its own part went to or came from the root,
    so its finishing says nothing of the members that never came (the wait graph takes
    a finished member as proof that everyone joined, true only of the symmetric ops)."""
    out = []
    for key in sorted(ctx.views):
        f = ctx.views[key].frontier
        if f is None or not f.completed_by or not f.waiting or not f.lack:
            continue
        sig = next((s for r in f.have if (s := ctx.sig(r, key, f.seq)) is not None), None)
        root = sig.root if sig is not None else None
        if root is None or root not in f.waiting or root in f.completed_by:
            continue
        if record_status(ctx, root, key, f.seq) & _DONE:
            continue
        out.extend(Wait(root, q, key, f.seq, "collective") for q in f.lack)
    return out


def _frontier_findings(ctx: Context, graph: WaitGraph, explained: set[int]) -> list[Finding]:
    """``missing_rank``: ranks that never joined a group's frontier collective. One cause,
    one finding: a rank that several groups wait for (a 2-D mesh: its tp peer and its dp
    peer) is one finding that lists every group waiting for it."""
    by_culprits: dict[tuple[int, ...], list[tuple[Any, ...]]] = {}
    for key in sorted(ctx.views):
        view = ctx.views[key]
        f = view.frontier
        if f is None or f.completed_by:
            continue
        culprits = [q for q in f.lack if not graph.stuck(q) and q not in explained]
        if not culprits:
            continue
        ref = next((r for r in f.have if ctx.sig(r, key, f.seq)), None)
        sig = ctx.sig(ref, key, f.seq) if ref is not None else None
        by_culprits.setdefault(tuple(culprits), []).append((view, f, sig))
    findings = []
    for culprit_key, parts in by_culprits.items():
        culprits = list(culprit_key)
        who = ranks_phrase(culprits)
        parts.sort(key=lambda p: (p[1].seq, p[0].group.name))
        direct = sorted({r for _, f, _ in parts for r in f.waiting})
        waiting = sorted(reaching(set(culprits), graph) | set(direct))
        behind = [r for r in waiting if r not in direct]
        texts = []
        for view, f, sig in parts:
            what = f"{sig.op} #{f.seq} ({sig.sizes_text()})" if sig else f"collective #{f.seq}"
            if f.waiting:
                verb = "waits" if len(f.waiting) == 1 else "wait"
                wait_text = f"which {ranks_phrase(f.waiting)} {verb} in"
            else:
                wait_text = (f"which {ranks_phrase(f.have)} recorded as finished (so {who}'s "
                             "dump may be older than theirs, or the collective failed)")
            texts.append(f"{what} of {view.group.label()}, {wait_text}")
        if behind:
            texts[-1] += f" (and {ranks_phrase(behind)} behind them)"
        view, f, sig = parts[0]
        frame = ctx.last_activity(culprits[0])[1]
        findings.append(Finding(
            kind="missing_rank", group=view.group, collective_seq_id=f.seq,
            op=sig.op if sig else None, culprit_ranks=culprits, waiting_ranks=waiting,
            blocking=any(p[1].waiting for p in parts),
            message=(f"{who.capitalize()}{ctx.on_hosts(culprits)} never joined "
                     f"{'; nor '.join(texts)}; "
                     f"{nows_text(ctx, culprits)}."),
            details={"frames": {culprits[0]: frame},
                     "groups": [p[0].group.name for p in parts]},
        ))
    return findings


def _p2p_findings(ctx: Context, graph: WaitGraph, explained: set[int],
                  mismatches_only: bool = False) -> list[Finding]:
    """Send/recv pairs that disagree, and (gloo) ops whose peer never posted the partner;
    ``mismatches_only``: the disagreements only, between two full dumps (a device
    backend: who waits for a partner is the queue graph's, and an active-only dump's
    pairs are not the channel's history)."""
    findings = []
    seen: set[tuple[str, int, int]] = set()
    lonely: dict[int, list[P2PIssue]] = {}
    for issue in ctx.p2p:
        op, r, q = issue.op, issue.rank, issue.peer
        if q is None or (issue.group, r, q) in seen:
            continue
        if mismatches_only and (issue.kind != "mismatch" or not _full(ctx, r)
                                or not _full(ctx, q)):
            continue
        g = ctx.groups[issue.group]
        sig = ctx.load.sigs.sigs[op.sig]
        frame = ctx.frames.frame(r, op.index)
        if issue.kind == "mismatch" and issue.partner is not None:
            other = ctx.load.sigs.sigs[issue.partner.sig]
            kind = "size_mismatch" if sig.input_sizes != (other.output_sizes or other.input_sizes) \
                else "dtype_mismatch"
            pending = not (op.status & _DONE and issue.partner.status & _DONE)
            seen.add((issue.group, r, q))
            findings.append(Finding(
                kind=kind, group=g, collective_seq_id=None, op="send/recv",
                culprit_ranks=sorted({r, q}), waiting_ranks=sorted(reaching({r, q}, graph)),
                blocking=pending,
                message=(f"Rank {r} sends {sig.sizes_text()} to rank {q} in {g.label()} "
                         f"(p2p #{op.p2p_seq}, at {frame_text(frame)}) but rank {q}'s matching "
                         f"recv takes {other.sizes_text()}."),
            ))
            continue
        if op.status & _DONE or q not in ctx.load.dumps or q in explained or graph.stuck(q):
            continue
        seen.add((issue.group, r, q))
        lonely.setdefault(q, []).append(issue)
    for q, issues in sorted(lonely.items()):
        findings.append(_unmatched_finding(ctx, graph, q, issues))
    return findings


def _full(ctx: Context, rank: int) -> bool:
    """The rank's dump holds its whole history (a full dump whose ring did not wrap)."""
    d = ctx.load.dumps.get(rank)
    return d is not None and d.kind is not None and d.kind.active_only is False \
        and not d.wrapped


def _unmatched_finding(ctx: Context, graph: WaitGraph, q: int,
                       issues: list[P2PIssue]) -> Finding:
    """One ``p2p_unmatched`` for a peer that never posted the partner of every op in
    ``issues`` (one per waiting rank, oldest first)."""
    issues = sorted(issues, key=lambda i: (i.op.created, i.rank))
    waits = []
    frames: dict[int, object] = {}
    for issue in issues:
        op, r = issue.op, issue.rank
        sig = ctx.load.sigs.sigs[op.sig]
        frame = ctx.frames.frame(r, op.index)
        frames[r] = frame
        partner = "recv" if op.op == "send" else "send"
        direction = "to" if op.op == "send" else "from"
        waits.append(f"rank {r} waits in {op.op} {direction} rank {q} ({sig.sizes_text()}, p2p "
                     f"#{op.p2p_seq} of {ctx.groups[issue.group].label()}, at "
                     f"{frame_text(frame)}) for a {partner} rank {q} never posted")
    direct = {i.rank for i in issues}
    waiting = sorted(reaching({q}, graph) | direct)
    behind = [x for x in waiting if x not in direct]
    behind_text = f"; {ranks_phrase(behind)} {wait_verb(behind)} behind them" if behind else ""
    first = issues[0]
    frames[q] = ctx.last_activity(q)[1]
    text = "; ".join(waits)
    return Finding(
        kind="p2p_unmatched", group=ctx.groups[first.group], collective_seq_id=None,
        op=first.op.op, culprit_ranks=[q], waiting_ranks=waiting, blocking=True,
        message=(f"{text[0].upper()}{text[1:]}{behind_text}; {now_text(ctx, q)}."),
        details={"frames": frames},
    )


# ---------------------------------------------------------------------- coverage


def _uncovered_findings(ctx: Context, findings: list[Finding],
                        stall_s: float = ON_DEMAND_STALL_S) -> list[Finding]:
    """Step 9: unfinished work that no blocking finding names. When other members
    finished the op, a rank still in it was caught finishing it (a note: not a hang),
    unless it dumped on its own timeout (its watchdog saw the op past the recorder's
    timeout) or had been in it ``stall_s`` or longer (its own clock): then it is stuck
    there. When its dump has no time (PyTorch's native dumps), which of the two cannot
    be told, unless every member issued it alike: gloo finishes such a call, so it was
    caught finishing; and when no member finished a call they all issued alike, with no
    time, caught in flight or a stuck transport cannot be told (never a hang)."""
    covered: set[int] = set()
    for f in findings:
        if f.blocking:
            covered.update(f.culprit_ranks)
            covered.update(f.waiting_ranks)
    by_place: dict[tuple[str, int], list[int]] = {}
    work = {r: open_work(ctx, r) for r in ctx.load.dumps}
    for r in sorted(ctx.load.dumps):
        if r in covered or not work[r]:
            continue
        group, seq, _ = work[r][0]
        by_place.setdefault((group, seq), []).append(r)
    out = []
    for (group, seq), ranks in sorted(by_place.items()):
        g = ctx.groups.get(group)
        r0 = ranks[0]
        d = ctx.load.dumps[r0]
        index = work[r0][0][2]
        frame = ctx.frames.frame(r0, index)
        if seq >= 0:
            what = f"{ctx.op_at(r0, group, seq)} of {g.label() if g else 'group ' + group}"
        else:
            op = next((o for o in d.p2p if o.index == index), None)
            what = (f"{op.op} {'to' if op.op == 'send' else 'from'} rank {op.peer} "
                    f"(p2p #{op.p2p_seq}) of {ctx.group_ref(group)}") if op else "a send/recv"
        verb = "was" if len(ranks) == 1 else "were"
        reasons = sorted({ctx.load.dumps[r].dump_reason or "?" for r in ranks})
        done_by = _finished_elsewhere(ctx, group, seq, ranks)
        ages = [pending_age_ns(ctx, r, work[r]) for r in ranks]
        age = max((a or 0 for a in ages), default=0)
        timed_out = any(ctx.load.dumps[r].dump_reason == "timeout" for r in ranks)
        if done_by and not timed_out and age < stall_s * 1e9:
            they = "it" if len(ranks) == 1 else "they"
            head = (f"{ranks_phrase(ranks).capitalize()} had not finished {what} when "
                    f"{they} dumped, though {ranks_phrase(done_by)} finished it: ")
            alike = posted_alike(ctx, group, seq)
            if all(a is not None for a in ages):
                details: dict[str, Any] = {"caught": {r: a for r, a in zip(ranks, ages)}}
                tail = (f"the dump caught {they} finishing it (inside it for {ms(age)}, "
                        f"under the {stall_s:g} s stall threshold), not a hang.")
            elif alike:
                details = {"caught": {r: a for r, a in zip(ranks, ages)}}
                tail = (f"every member issued it alike, and gloo finishes a collective all "
                        f"its members posted with the same sizes, so the dump caught "
                        f"{'it' if len(ranks) == 1 else 'them'} finishing: not a hang (a "
                        "PyTorch-native dump carries no time to say how long it had been "
                        "inside).")
            else:
                details = {"undecided": True}
                tail = ("most likely the dump caught it finishing, but with no dump time "
                        "to say how long it had been inside, stuck or finishing cannot be "
                        "told.")
            out.append(Finding(
                kind="stalled_collective", group=g, collective_seq_id=seq if seq >= 0 else None,
                op=record_op(ctx, r0, group, seq) if seq >= 0 else None,
                culprit_ranks=[], waiting_ranks=ranks, blocking=False,
                details=details, message=head + tail,
            ))
            continue
        if not done_by and not timed_out and all(a is None for a in ages) \
                and posted_alike(ctx, group, seq):
            they = "it" if len(ranks) == 1 else "they"
            out.append(Finding(
                kind="stalled_collective", group=g, collective_seq_id=seq,
                op=record_op(ctx, r0, group, seq), culprit_ranks=[], waiting_ranks=ranks,
                blocking=False, details={"undecided": True},
                message=(f"{ranks_phrase(ranks).capitalize()} had not finished {what} when "
                         f"{they} dumped, and no member had; every member issued it alike, "
                         "and gloo finishes a collective all its members posted with the "
                         "same sizes unless its transport is stuck: with no dump time (a "
                         "PyTorch-native dump) to say how long they had been inside, caught "
                         "in flight or stuck cannot be told. Two dumps a minute apart tell "
                         "which."),
            ))
            continue
        if done_by:
            why = (f", though {ranks_phrase(done_by)} finished it"
                   + (f" and {'its' if len(ranks) == 1 else 'their'} watchdog dumped on "
                      "timeout" if timed_out else " long before")
                   + ": stuck there, not finishing.")
        else:
            why = (", and no other rank's records explain the wait: the transport is slow "
                   "or stuck, or the dump was taken while the op was finishing.")
        out.append(Finding(
            kind="stalled_collective", group=g, collective_seq_id=seq if seq >= 0 else None,
            op=record_op(ctx, r0, group, seq) if seq >= 0 else (what.split()[0]),
            culprit_ranks=[], waiting_ranks=ranks, blocking=True,
            message=(f"{ranks_phrase(ranks).capitalize()} {verb} still inside {what}"
                     f"{f' for {ms(age)}' if age else ''} when "
                     f"{'it' if len(ranks) == 1 else 'they'} dumped (reason: "
                     f"{', '.join(reasons)}), at {frame_text(frame)}{why}"),
        ))
    return out


def _in_flight_findings(ctx: Context, findings: list[Finding]) -> list[Finding]:
    """Step 9 on a device backend: ranks with unfinished work (a device queue) that no
    finding names. Nothing in their records explains a wait (no rank is behind in what
    it issued, no device holds an op its peers finished), so the dumps show work in
    flight: a job caught running, or a stop the records cannot see (a network stuck
    with every op posted). One note, undecided (verdict ``incomplete``)."""
    named: set[int] = set()
    for f in findings:
        named.update(f.culprit_ranks)
        named.update(f.waiting_ranks)
    ranks = sorted(r for r, p in ctx.progress.items() if p.queue and r not in named)
    if not ranks:
        return []
    from commscope.analyze.diagnose.queues.roots import item_text

    first = ctx.progress[ranks[0]].queue[0]
    return [Finding(
        kind="stalled_collective", group=ctx.groups.get(first.group),
        collective_seq_id=first.seq, op=None, culprit_ranks=[], waiting_ranks=ranks,
        blocking=False, details={"undecided": True, "side": "in flight"},
        message=(f"{ranks_phrase(ranks).capitalize()} had unfinished work when "
                 f"{'it' if len(ranks) == 1 else 'they'} dumped (rank {ranks[0]}'s oldest: "
                 f"{item_text(ctx, ranks[0], first)}), and no rank's records explain a "
                 "wait: every op was issued by all its members, and no device holds one its "
                 "peers finished. Work was in flight: the job was caught running, or it "
                 "stopped where the records cannot see (a network stuck with every op "
                 "posted). Two dumps a minute apart tell which."),
    )]


def _finished_elsewhere(ctx: Context, group: str, seq: int, ranks: list[int]) -> list[int]:
    """Other members that finished collective ``seq`` of ``group`` (empty for p2p)."""
    if seq < 0:
        return []
    view = ctx.views.get(group)
    if view is None:
        return []
    out = []
    for r, (lo, hi) in view.spans.items():
        if r in ranks or not lo <= seq <= hi:
            continue
        if record_status(ctx, r, group, seq) & _DONE:
            out.append(r)
    return sorted(out)


# ---------------------------------------------------------------------- remarks


def _unreadable_findings(ctx: Context) -> list[Finding]:
    findings = []
    for u in ctx.load.unreadable:
        if u.rank is None or u.rank in ctx.load.dumps or u.rank not in ctx.expected:
            continue
        findings.append(Finding(
            kind="unreadable_dump", group=None, collective_seq_id=None, op=None,
            culprit_ranks=[], waiting_ranks=[],  # a note: the file is at fault, not the rank
            message=(f"Rank {u.rank}'s dump {os.path.basename(u.file)} could not be read "
                     f"({u.error}), so where rank {u.rank} stopped is unknown."),
            details={"ranks": [u.rank]},
        ))
    return findings


def _thread_findings(ctx: Context) -> list[Finding]:
    """``thread_died``: a thread of a rank died of an uncaught exception while its process
    went on; a remark (the rank is alive, never called crashed for it), one per rank."""
    out = []
    for r, d in sorted(ctx.load.dumps.items()):
        if not d.thread_deaths:
            continue
        name, kind, text, place = d.thread_deaths[-1]
        at = f" at {place_text(place)}" if place else ""
        more = (f" ({len(d.thread_deaths) - 1} other thread death(s) before it)"
                if len(d.thread_deaths) > 1 else "")
        out.append(Finding(
            kind="thread_died", group=None, collective_seq_id=None, op=None,
            culprit_ranks=[], waiting_ranks=[],
            message=(f"Rank {r}{ctx.on_hosts([r])}'s thread {name} died of {kind}: "
                     f"{text[:200]}{at}{more}; the process went on (a thread's death is not "
                     "the rank's)."),
            details={"rank": r, "thread": name},
        ))
    return out


def _truncated_findings(ctx: Context) -> list[Finding]:
    findings = []
    for key in sorted(ctx.views):
        view = ctx.views[key]
        g = view.group
        if view.truncated:
            ranks = sorted(view.truncated)
            start = max(view.truncated.values())
            kept = sorted({ctx.load.dumps[r].n_entries for r in ranks})
            size = f"{kept[0]}" if len(kept) == 1 else f"{kept[0]}-{kept[-1]}"
            one = len(ranks) == 1
            findings.append(Finding(  # a note: it blames nobody (its ranks in details)
                kind="truncated_history", group=g, collective_seq_id=start, op=None,
                culprit_ranks=[], waiting_ranks=[],
                message=(f"{ranks_phrase(ranks).capitalize()} kept only {'its' if one else 'their'}"
                         f" newest {size} records ({'its' if one else 'their'} ring wrapped), so "
                         f"collectives of {g.label()} before #{start} were compared among the "
                         "other ranks only and are never called missing."),
                details={"ranks": ranks},
            ))
        if view.unknown:
            f = view.frontier
            unknown = sorted(view.unknown)
            one = len(unknown) == 1
            they, are = ("it", "is") if one else ("they", "are")
            at = f" whether {they} reached #{f.seq}" if f else f" where {they} {are} in it"
            rings = "its wrapped ring holds" if one else "their wrapped rings hold"
            findings.append(Finding(
                kind="truncated_history", group=g, collective_seq_id=f.seq if f else None,
                op=None, culprit_ranks=[], waiting_ranks=[],
                message=(f"{ranks_phrase(unknown).capitalize()} "
                         f"{'belongs' if one else 'belong'} to {g.label()} but "
                         f"{rings} no record of it, so{at} cannot be decided."),
                details={"undecided": True, "ranks": unknown},
            ))
    return findings


def _healthy(ctx: Context) -> Finding:
    checked = sum(v.checked for v in ctx.views.values())
    p2p = sum(len(d.p2p) for d in ctx.load.dumps.values())
    pairs = f" and {plural(p2p, 'send/recv record')} paired" if p2p else ""
    return Finding(
        kind="healthy", group=None, collective_seq_id=None, op=None, culprit_ranks=[],
        waiting_ranks=[],
        message=(f"All {plural(len(ctx.load.dumps), 'rank')} with dumps agree on every recorded "
                 f"collective ({checked} sequence numbers compared across "
                 f"{plural(len(ctx.views), 'group')}{pairs}) and none has unfinished work."),
    )


# ---------------------------------------------------------------------- the whole


def diagnose(ctx: Context, straggler_ms: float | None = None,
             stall_s: float = ON_DEMAND_STALL_S) -> list[Finding]:
    """All findings, root cause first (see module doc)."""
    ctx.stale = {r: gap for r, gap in stale_dumps(ctx).items() if _behind(ctx, r)}
    splits = split_findings(ctx)
    findings = print_findings(ctx, mismatch_findings(ctx) + splits)
    in_mismatch = pending_mismatch_ranks(ctx).union(
        *({*f.culprit_ranks, *f.waiting_ranks} for f in splits if f.blocking))
    device = ctx.device
    if device:  # calls returned at once: the waits are those of the device queues
        queues = queue_waits(ctx, ctx.progress, in_mismatch, creation_waits(ctx.load))
        graph = queues.graph
    else:
        graph = build_waits(ctx.views, ctx.p2p, in_mismatch, ctx.load,
                            [*creation_waits(ctx.load), *_root_waits(ctx)])
    if not device:
        _behind_disagreements(findings, graph)
    created, creating = creation_findings(ctx, graph)
    findings += created
    ctx.away = elsewhere_ranks(ctx, deaths_here(ctx))
    away = {r for ranks in ctx.away.values() for r in ranks}
    reasons = {r: why for r, why in crash_reasons(ctx, graph).items()
               if r not in creating and r not in away}
    findings = killed_by_mismatch(ctx, graph, reasons, findings)
    findings += crash_findings(ctx, graph, reasons)
    findings += elsewhere_findings(ctx, graph, ctx.away)
    explained: set[int] = set(reasons) | creating | away
    if device:
        findings += _p2p_findings(ctx, graph, explained, mismatches_only=True)
        # a rank a disagreement already blames is told there (one cause, one finding)
        explained |= {r for f in findings if f.blocking for r in f.culprit_ranks}
        findings += queue_findings(ctx, queues, ctx.progress, explained, stall_s)
    else:
        for cycle in find_cycles(graph):
            if explained & {w.waiter for w in cycle}:
                continue
            skip = find_skip(ctx, cycle)
            found = (skip_finding(ctx, skip, cycle, graph) if skip
                     else cycle_finding(ctx, cycle, graph))
            if skip:
                found.details["cycle_root"] = True
            findings.append(found)
            explained.update(w.waiter for w in cycle)
        findings += _frontier_findings(ctx, graph, explained)
        findings += _p2p_findings(ctx, graph, explained)
    if not device and not any(f.blocking for f in findings):
        findings += stalled_findings(ctx)
    if device:
        findings += _in_flight_findings(ctx, findings)
    else:
        findings += _uncovered_findings(ctx, findings, stall_s)
    findings += _unreadable_findings(ctx)
    findings += _thread_findings(ctx)
    findings += _truncated_findings(ctx)
    if straggler_ms != float("inf"):
        findings += straggler_findings(ctx, straggler_ms)
    findings += _nothing_to_read(ctx, findings)
    running = caught_running(ctx, stall_s)
    if running is not None:  # a running job dumped on demand: its waits are in flight
        findings = [f for f in findings if f.kind not in _WAIT_KINDS] + [running]
    findings.sort(key=_sort_key)
    findings = _fold_consequences(findings)
    if not findings:
        findings.append(_healthy(ctx))
    return findings


_NOTES = ("healthy", "straggler", "thread_died", "truncated_history", "unreadable_dump",
          "dumps_elsewhere")
"""Kinds that blame nobody for the job's state: never folded under a fault."""


def _fold_consequences(findings: list[Finding]) -> list[Finding]:
    """One root cause, one finding: a later finding whose culprits are all victims of an
    earlier fault (ranks it killed or took down with it) is that fault's consequence. It
    is listed under the fault (its message and ``details["consequences"]``), never as a
    fault of its own, so no finding blames a rank another one calls a victim."""
    out: list[Finding] = []
    owners: list[tuple[Finding, set[int]]] = []
    for f in findings:
        blamed = set(f.culprit_ranks)
        owner = next((o for o, victims in owners if blamed and blamed <= victims), None)
        if owner is not None and f.kind not in _NOTES:
            owner.details.setdefault("consequences", []).append(f.kind)
            owner.message += (f" As a consequence, {ranks_phrase(sorted(blamed))} "
                              f"{'shows' if len(blamed) == 1 else 'show'} a {f.kind} of "
                              f"{f.group.label() if f.group is not None else 'the job'}"
                              f"{f' at #{f.collective_seq_id}' if f.collective_seq_id else ''}"
                              ", which is not a fault of its own.")
            continue
        out.append(f)
        if f.victims:
            owners.append((f, set(f.victims)))
    return out


def _behind(ctx: Context, rank: int) -> bool:
    """The rank's history stops before another member's in some group."""
    return any(rank in v.spans and v.spans[rank][1] < v.max_hi for v in ctx.views.values())


def _nothing_to_read(ctx: Context, findings: list[Finding]) -> list[Finding]:
    """When no dump (or no record) was read, say so instead of calling the job healthy."""
    if not ctx.load.dumps:
        if any(f.kind == "unreadable_dump" for f in findings):
            return []
        files = len(ctx.load.unreadable)
        return [Finding(
            kind="unreadable_dump", group=None, collective_seq_id=None, op=None,
            culprit_ranks=[], waiting_ranks=[],
            message=(f"None of the {plural(files, 'file')} could be read as a dump, so "
                     "nothing can be said about the job."),
        )]
    if all(d.n_entries == 0 and not d.creations for d in ctx.load.dumps.values()):
        return [Finding(
            kind="truncated_history", group=None, collective_seq_id=None, op=None,
            culprit_ranks=[], waiting_ranks=[],
            message=(f"The {plural(len(ctx.load.dumps), 'dump')} hold no record at all, so "
                     "nothing can be decided: the recorder was off (TORCH_FR_BUFFER_SIZE=0), "
                     "the job stopped before its first recorded call, or it issued only "
                     "calls the recorder leaves out (PyTorch's recorder on gloo never records "
                     "send/recv; commscope's does)."),
            details={"undecided": True, "no_records": True},
        )]
    return []
