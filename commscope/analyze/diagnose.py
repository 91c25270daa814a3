"""From aligned groups to findings, root cause first, and a verdict.

Algorithm (:func:`diagnose`):

1. Stale dumps (ours carry ``dump_time_ns``): a rank whose dump is much older than the
   others' and whose history stops before theirs stopped early
   (:func:`commscope.analyze.timing.stale_dumps`).
2. Disagreements inside groups (:func:`commscope.analyze.mismatch.mismatch_findings`):
   op / order / size / dtype / skipped collective.
3. The wait graph (:mod:`commscope.analyze.waits`): cycles across groups are reported
   once each as ``cross_group_deadlock``, unless the ranks outside the cycle show that
   one link is a rank that skipped a collective and went on
   (:mod:`commscope.analyze.skips`): then it is that rank's ``missing_rank``.
4. ``crashed_rank``: an expected rank without any file, or with a stale one; the
   finding names the group and collective where the others stopped.
5. ``missing_rank``: at a group's frontier, ranks that never issued the collective the
   others wait in, and that are not themselves stuck (those are links of a chain or a
   cycle, explained by its end), crashed or stale.
6. ``p2p_unmatched``: an unfinished send/recv whose peer never posted its partner; a
   pair with different sizes is a ``size_mismatch`` / ``dtype_mismatch``.
7. ``stalled_collective`` when nothing above explains a stop and everyone is inside the
   same unfinished collective (with evidence of age).
8. Remarks: ``unreadable_dump``, ``truncated_history``, ``straggler``; ``healthy`` when
   there is nothing at all.
9. Order: cycles, blocking disagreements, crashes, missing ranks and p2p, stalls, then
   survived disagreements (desync), unreadable dumps, undecidable history, remarks;
   within a tier by sequence number, group and ranks. The verdict is ``crash`` if a
   rank crashed, else ``hang`` if anything blocks, else ``desync``, else
   ``incomplete`` when dumps are unreadable or history undecidable, else ``healthy``.
"""

from __future__ import annotations

import os

from commscope.analyze.context import Context
from commscope.analyze.match import GroupView
from commscope.analyze.mismatch import mismatch_findings, pending_mismatch_ranks
from commscope.analyze.model import COMPLETED, RETIRED, Finding
from commscope.analyze.skips import find_skip, skip_finding
from commscope.analyze.text import frame_text, ms, plural, ranks_phrase
from commscope.analyze.timing import stale_dumps, stalled_findings, straggler_findings
from commscope.analyze.waits import Wait, WaitGraph, build_waits, find_cycles, reaching

__all__ = ["diagnose", "verdict", "MISMATCH_KINDS", "KINDS"]

_DONE = RETIRED | COMPLETED
MISMATCH_KINDS = ("op_mismatch", "order_mismatch", "size_mismatch", "dtype_mismatch")
KINDS = (
    "missing_rank", "size_mismatch", "dtype_mismatch", "op_mismatch", "order_mismatch",
    "p2p_unmatched", "crashed_rank", "cross_group_deadlock", "truncated_history",
    "straggler", "stalled_collective", "unreadable_dump", "healthy",
)


def _tier(f: Finding) -> int:
    if f.kind == "cross_group_deadlock":
        return 0
    if f.blocking and f.kind in (*MISMATCH_KINDS, "missing_rank") and "shape" in f.details:
        return 1
    if f.kind == "crashed_rank":
        return 2
    if f.blocking and f.kind in ("missing_rank", "p2p_unmatched", *MISMATCH_KINDS):
        return 3
    if f.kind == "stalled_collective":
        return 4
    if f.kind in (*MISMATCH_KINDS, "missing_rank", "p2p_unmatched"):
        return 5
    if f.kind == "unreadable_dump":
        return 6
    if f.kind == "truncated_history" and f.details.get("undecided"):
        return 6
    return 7


def _sort_key(f: Finding) -> tuple[object, ...]:
    seq = f.collective_seq_id if f.collective_seq_id is not None else 1 << 62
    return (_tier(f), seq, f.group.name if f.group else "", f.culprit_ranks, f.kind)


def verdict(findings: list[Finding]) -> str:
    """``crash`` / ``hang`` / ``desync`` / ``incomplete`` / ``healthy`` (step 9)."""
    tiers = {_tier(f) for f in findings if f.kind != "healthy"}
    if any(f.kind == "crashed_rank" for f in findings):
        return "crash"
    if tiers & {0, 1, 3, 4}:
        return "hang"
    if 5 in tiers:
        return "desync"
    if 6 in tiers:
        return "incomplete"
    return "healthy"


# ---------------------------------------------------------------------- steps


def _cycle_finding(ctx: Context, cycle: list[Wait], graph: WaitGraph) -> Finding:
    ranks = sorted({w.waiter for w in cycle})
    hops = []
    frames = {}
    for w in cycle:
        g = ctx.groups[w.group]
        frame = ctx.frame_at(w.waiter, w.group, w.seq) if w.seq is not None else None
        frames[w.waiter] = frame
        what = ctx.op_at(w.waiter, w.group, w.seq) if w.seq is not None else w.op
        hops.append(f"rank {w.waiter} waits for rank {w.target} in {what} of {g.label()} "
                    f"at {frame_text(frame)}")
    behind = sorted(reaching(set(ranks), graph))
    also = f"; {ranks_phrase(behind)} wait behind them" if behind else ""
    first = cycle[0]
    return Finding(
        kind="cross_group_deadlock", group=ctx.groups[first.group], collective_seq_id=first.seq,
        op=(ctx.sig(first.waiter, first.group, first.seq).op
            if first.seq is not None and ctx.sig(first.waiter, first.group, first.seq)
            else first.op),
        culprit_ranks=ranks, waiting_ranks=behind,
        message=(f"{ranks_phrase(ranks).capitalize()} wait for each other across "
                 f"{plural(len({w.group for w in cycle}), 'group')}: " + ", ".join(hops)
                 + f"{also}."),
        blocking=True, details={"frames": frames, "cycle": [(w.waiter, w.target, w.group, w.seq)
                                                            for w in cycle]},
    )


def _behind(ctx: Context, rank: int) -> bool:
    """The rank's history stops before another member's in some group."""
    return any(rank in v.spans and v.spans[rank][1] < v.max_hi for v in ctx.views.values())


def _status(ctx: Context, rank: int, group: str, seq: int) -> int:
    t = ctx.load.dumps[rank].tracks[group]
    return t.status[seq - t.lo]


def _op(ctx: Context, rank: int, group: str | None, seq: int | None) -> str | None:
    if group is None or seq is None:
        return None
    sig = ctx.sig(rank, group, seq)
    return sig.op if sig else None


def _best_view(ctx: Context, rank: int) -> GroupView | None:
    best = None
    for key in sorted(ctx.views):
        view = ctx.views[key]
        if rank not in view.group.ranks or not view.spans:
            continue
        score = (view.max_hi > 0, len(view.group.ranks), view.max_hi)
        if best is None or score > best[0]:
            best = (score, view)
    return best[1] if best else None


def _crash_findings(ctx: Context, graph: WaitGraph) -> list[Finding]:
    unreadable = {u.rank for u in ctx.load.unreadable if u.rank is not None}
    lost = [r for r in ctx.expected if r not in ctx.load.dumps and r not in unreadable]
    buckets: dict[str | None, list[int]] = {}
    for r in lost:
        view = _best_view(ctx, r)
        buckets.setdefault(view.group.key if view else None, []).append(r)
    findings = []
    for key, ranks in sorted(buckets.items(), key=lambda kv: (kv[0] is None, kv[0] or "")):
        who = ranks_phrase(ranks)
        if key is None:
            findings.append(Finding(
                kind="crashed_rank", group=None, collective_seq_id=None, op=None,
                culprit_ranks=ranks, waiting_ranks=[], blocking=True,
                message=(f"{who.capitalize()} left no dump (crashed, or its file was not "
                         "collected); no group in the other dumps shows where it stopped."),
            ))
            continue
        view = ctx.views[key]
        seq = view.max_hi
        front = sorted(r for r, (_, hi) in view.spans.items() if hi == seq)
        sig = ctx.sig(front[0], key, seq) if front else None
        unfinished = [r for r in front if not _status(ctx, r, key, seq) & _DONE]
        state = (("still waits in it" if len(unfinished) == 1 else "still wait in it")
                 if unfinished else
                 "recorded it as finished (gloo also retires a collective that failed because "
                 "a peer died)")
        where = frame_text(ctx.frame_at(front[0], key, seq)) if front else "no stack recorded"
        what = f"{sig.op} #{seq} ({sig.sizes_text()})" if sig else f"#{seq}"
        findings.append(Finding(
            kind="crashed_rank", group=view.group, collective_seq_id=seq,
            op=sig.op if sig else None, culprit_ranks=ranks, waiting_ranks=front, blocking=True,
            message=(f"{who.capitalize()} left no dump (crashed or unreachable, so its own stack "
                     f"is unknown) while {ranks_phrase(front)} reached {what} of "
                     f"{view.group.label()} and {state}, at {where}."),
        ))
    for r, gap in sorted(ctx.stale.items()):
        d = ctx.load.dumps[r]
        activity, frame = ctx.last_activity(r)
        waits = sorted((w for w in graph.edges() if w.target == r),
                       key=lambda w: (w.seq is None, w.seq or 0, w.group, w.waiter))
        reason = f" (reason: {d.dump_reason})" if d.dump_reason else ""
        if waits:
            first = waits[0]
            group, seq = ctx.groups[first.group], first.seq
            waiting = sorted({w.waiter for w in waits})
            what = ctx.op_at(waiting[0], first.group, seq) if seq is not None else first.op
            tail = f"; {ranks_phrase(waiting)} wait for it in {what} of {group.label()}"
        else:
            group = ctx.groups.get(d.last[0]) if d.last else None
            seq = d.last[1] if d.last and d.last[1] >= 0 else None
            waiting, tail = [], ""
        findings.append(Finding(
            kind="crashed_rank", group=group, collective_seq_id=seq,
            op=_op(ctx, waiting[0] if waiting else r, group.key if group else None, seq),
            culprit_ranks=[r], waiting_ranks=waiting, blocking=True,
            message=(f"Rank {r}'s dump was written {ms(gap)} before the others'{reason}: it "
                     f"stopped early, after {activity} at {frame_text(frame)}{tail}."),
            details={"frames": {r: frame}},
        ))
    return findings


def _frontier_findings(ctx: Context, graph: WaitGraph, explained: set[int]) -> list[Finding]:
    findings = []
    for key in sorted(ctx.views):
        view = ctx.views[key]
        f = view.frontier
        if f is None or f.completed_by:
            continue
        culprits = [q for q in f.lack
                    if not graph.stuck(q) and q not in explained and q not in ctx.stale]
        if not culprits:
            continue
        ref = next((r for r in f.have if ctx.sig(r, key, f.seq)), None)
        sig = ctx.sig(ref, key, f.seq) if ref is not None else None
        what = f"{sig.op} #{f.seq} ({sig.sizes_text()})" if sig else f"collective #{f.seq}"
        activity, frame = ctx.last_activity(culprits[0])
        who = ranks_phrase(culprits)
        if f.waiting:
            verb = "waits" if len(f.waiting) == 1 else "wait"
            wait_text = f"which {ranks_phrase(f.waiting)} {verb} in"
        else:
            wait_text = (f"which {ranks_phrase(f.have)} recorded as finished (so {who}'s dump "
                         "may be older than theirs, or the collective failed)")
        owner = f"{ranks_phrase(culprits[:1])}'s" if len(culprits) > 1 else f"{who}'s"
        findings.append(Finding(
            kind="missing_rank", group=view.group, collective_seq_id=f.seq,
            op=sig.op if sig else None, culprit_ranks=culprits, waiting_ranks=list(f.waiting),
            blocking=bool(f.waiting),
            message=(f"{who.capitalize()} never joined {what} of {view.group.label()}, "
                     f"{wait_text}; {owner} last record is {activity} at {frame_text(frame)}."),
            details={"frames": {culprits[0]: frame}},
        ))
    return findings


def _p2p_findings(ctx: Context, graph: WaitGraph, explained: set[int]) -> list[Finding]:
    findings = []
    seen: set[tuple[str, int, int]] = set()
    for issue in ctx.p2p:
        op, r, q = issue.op, issue.rank, issue.peer
        if q is None or (issue.group, r, q) in seen:
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
                culprit_ranks=sorted({r, q}), waiting_ranks=[], blocking=pending,
                message=(f"Rank {r} sends {sig.sizes_text()} to rank {q} in {g.label()} "
                         f"(p2p #{op.p2p_seq}, at {frame_text(frame)}) but rank {q}'s matching "
                         f"recv takes {other.sizes_text()}."),
            ))
            continue
        if op.status & _DONE or q not in ctx.load.dumps or q in explained or graph.stuck(q):
            continue
        seen.add((issue.group, r, q))
        partner = "recv" if op.op == "send" else "send"
        direction = "to" if op.op == "send" else "from"
        activity, q_frame = ctx.last_activity(q)
        findings.append(Finding(
            kind="p2p_unmatched", group=g, collective_seq_id=None, op=op.op,
            culprit_ranks=[q], waiting_ranks=[r], blocking=True,
            message=(f"Rank {r} waits in {op.op} {direction} rank {q} ({sig.sizes_text()}, p2p "
                     f"#{op.p2p_seq} of {g.label()}, at {frame_text(frame)}) but rank {q} never "
                     f"posted the matching {partner}; rank {q}'s last record is {activity} at "
                     f"{frame_text(q_frame)}."),
            details={"frames": {q: q_frame, r: frame}},
        ))
    return findings


def _unreadable_findings(ctx: Context) -> list[Finding]:
    findings = []
    for u in ctx.load.unreadable:
        if u.rank is None or u.rank in ctx.load.dumps or u.rank not in ctx.expected:
            continue
        findings.append(Finding(
            kind="unreadable_dump", group=None, collective_seq_id=None, op=None,
            culprit_ranks=[u.rank], waiting_ranks=[],
            message=(f"Rank {u.rank}'s dump {os.path.basename(u.file)} could not be read "
                     f"({u.error}), so where rank {u.rank} stopped is unknown."),
        ))
    return findings


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
            findings.append(Finding(
                kind="truncated_history", group=g, collective_seq_id=start, op=None,
                culprit_ranks=ranks, waiting_ranks=[],
                message=(f"{ranks_phrase(ranks).capitalize()} kept only their newest {size} "
                         f"records (their ring wrapped), so collectives of {g.label()} before "
                         f"#{start} were compared among the other ranks only and are never "
                         "called missing."),
            ))
        if view.unknown:
            f = view.frontier
            at = f" whether they reached #{f.seq}" if f else " where they are in it"
            findings.append(Finding(
                kind="truncated_history", group=g, collective_seq_id=f.seq if f else None,
                op=None, culprit_ranks=list(view.unknown), waiting_ranks=[],
                message=(f"{ranks_phrase(view.unknown).capitalize()} belong to {g.label()} but "
                         f"their wrapped rings hold no record of it, so{at} cannot be decided."),
                details={"undecided": True},
            ))
    return findings


def _healthy(ctx: Context) -> Finding:
    checked = sum(v.checked for v in ctx.views.values())
    return Finding(
        kind="healthy", group=None, collective_seq_id=None, op=None, culprit_ranks=[],
        waiting_ranks=[],
        message=(f"All {plural(len(ctx.load.dumps), 'rank')} with dumps agree on every recorded "
                 f"collective ({checked} sequence numbers compared across "
                 f"{plural(len(ctx.views), 'group')}) and none is stuck."),
    )


def diagnose(ctx: Context, straggler_ms: float = 50.0) -> list[Finding]:
    """All findings, root cause first (see module doc)."""
    ctx.stale = {r: gap for r, gap in stale_dumps(ctx).items() if _behind(ctx, r)}
    findings = mismatch_findings(ctx)
    graph = build_waits(ctx.views, ctx.p2p, pending_mismatch_ranks(ctx))
    explained: set[int] = set()
    for cycle in find_cycles(graph):
        skip = find_skip(ctx, cycle)
        findings.append(skip_finding(ctx, skip, cycle, graph) if skip
                        else _cycle_finding(ctx, cycle, graph))
        explained.update(w.waiter for w in cycle)
    findings += _crash_findings(ctx, graph)
    findings += _frontier_findings(ctx, graph, explained)
    findings += _p2p_findings(ctx, graph, explained)
    if not any(f.blocking for f in findings):
        findings += stalled_findings(ctx)
    findings += _unreadable_findings(ctx)
    findings += _truncated_findings(ctx)
    findings += straggler_findings(ctx, straggler_ms)
    findings += _nothing_to_read(ctx, findings)
    findings.sort(key=_sort_key)
    if not findings:
        findings.append(_healthy(ctx))
    return findings


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
    if all(d.n_entries == 0 for d in ctx.load.dumps.values()):
        return [Finding(
            kind="truncated_history", group=None, collective_seq_id=None, op=None,
            culprit_ranks=[], waiting_ranks=[],
            message=(f"The {plural(len(ctx.load.dumps), 'dump')} hold no record at all (the "
                     "recorder was off, e.g. TORCH_FR_BUFFER_SIZE=0, or dumped without "
                     "collectives), so nothing can be decided."),
            details={"undecided": True},
        )]
    return []

