"""From aligned groups to one wait-for graph, and from the graph to findings and a verdict.

Algorithm (:func:`diagnose`):

1. Stale dumps (ours carry ``dump_time_ns``): a rank whose dump is much older than the
   others' and whose history stops before theirs stopped early
   (:func:`commscope.analyze.timing.stale_dumps`).
2. Disagreements inside groups (:func:`commscope.analyze.mismatch.mismatch_findings`):
   op / order / size / dtype / skipped collective.
3. **The wait-for graph** (:mod:`commscope.analyze.waits`) over every rank's unfinished
   work: a collective waits for the members that never reached it or left no dump, a
   send for the peer's matching recv, a recv for the send.
4. **Crashed ranks** (``crashed_rank``): an expected rank without a dump, with a stale
   dump, or whose dump was written because it raised an exception that is not a
   communication error (the text of the exception is quoted), or on a signal no other
   rank got, before any other rank dumped (torchrun's SIGTERM to the survivors of a
   failure is not a cause). Ranks whose collective failed with the dead rank, or who raised a
   communication error, are its *victims*: listed as waiting, never as culprits.
5. **Cycles**: every strongly connected component is a deadlock. A rank that skipped
   a collective and went on (:mod:`commscope.analyze.skips`) is named as
   ``missing_rank``; a cycle only through send/recv is a ``p2p_deadlock``; a cycle
   through a send/recv and collectives is the ``p2p_unmatched`` of the rank that never
   posted the partner op; a cycle through collectives of several groups is a
   ``cross_group_deadlock`` that names the rank(s) whose order differs from the
   majority's (the group most ranks wait in is the order they agree on).
6. **Roots**: ranks others wait for that wait for nobody. At a group's frontier the
   ones that never issued the collective are ``missing_rank``; the peer of an
   unfinished send/recv that never posted its partner is ``p2p_unmatched``. When the
   root's dump carries thread stacks (commscope's do), the finding says where its main
   thread is now; a PyTorch-native dump has none, and the finding says so.
7. Everyone who reaches a culprit in the graph, transitively, waits behind it.
8. ``stalled_collective`` when nothing above explains a stop and everyone is inside the
   same unfinished collective (with evidence of age).
9. **Coverage**: a rank with unfinished work that no blocking finding names (as
   culprit or waiter) gets a ``stalled_collective`` of its own: a dump with unfinished
   work is never called healthy.
10. Remarks: ``unreadable_dump``, ``truncated_history``, ``straggler``; ``healthy`` when
    there is nothing at all.
11. Order: blocking disagreements whose shape is known, crashes, other roots (missing
    ranks, unmatched p2p, blocking mismatches), cycles, stalls, then survived
    disagreements (desync), unreadable dumps, undecidable history, remarks; within a
    tier by sequence number, group and ranks. The verdict is ``crash`` if a rank
    crashed, else ``hang`` if anything blocks, else ``desync``, else ``incomplete``
    when dumps are unreadable or history undecidable, else ``healthy``.
"""

from __future__ import annotations

import os

from commscope.analyze.context import Context
from commscope.analyze.frames import user_frame
from commscope.analyze.match import GroupView, P2PIssue
from commscope.analyze.mismatch import mismatch_findings, pending_mismatch_ranks
from commscope.analyze.model import COMPLETED, FAILED, RETIRED, Finding
from commscope.analyze.skips import find_skip, skip_finding
from commscope.analyze.text import frame_text, ms, place_text, plural, ranks_phrase
from commscope.analyze.timing import stale_dumps, stalled_findings, straggler_findings
from commscope.analyze.waits import Wait, WaitGraph, build_waits, find_cycles, reaching

__all__ = ["diagnose", "verdict", "MISMATCH_KINDS", "KINDS", "is_comm_error"]

_DONE = RETIRED | COMPLETED
MISMATCH_KINDS = ("op_mismatch", "order_mismatch", "size_mismatch", "dtype_mismatch")
KINDS = (
    "missing_rank", "size_mismatch", "dtype_mismatch", "op_mismatch", "order_mismatch",
    "p2p_unmatched", "p2p_deadlock", "crashed_rank", "cross_group_deadlock",
    "truncated_history", "straggler", "stalled_collective", "unreadable_dump", "healthy",
)
_CYCLE_KINDS = ("cross_group_deadlock", "p2p_deadlock")
_COMM_ERROR_TYPES = ("DistBackendError", "DistNetworkError", "DistStoreError",
                     "DistError", "ProcessGroup")
_COMM_ERROR_WORDS = (
    "connection closed by peer", "connection reset by peer", "broken pipe", "timed out",
    "timeout", "communicator was aborted", "nccl error", "gloo", "socket", "peer",
)


def is_comm_error(kind: str, message: str) -> bool:
    """An exception a rank gets *because* a peer died or hung (a victim's), as opposed
    to a fault of its own."""
    text = message.lower()
    return any(t in kind for t in _COMM_ERROR_TYPES) or any(w in text for w in _COMM_ERROR_WORDS)


def _tier(f: Finding) -> int:
    if f.blocking and f.kind in (*MISMATCH_KINDS, "missing_rank") and "shape" in f.details:
        return 1
    if f.kind == "crashed_rank":
        return 2
    if f.kind in ("truncated_history", "stalled_collective") and f.details.get("undecided"):
        return 7
    if f.details.get("cycle_root"):
        return 4
    if f.blocking and f.kind in ("missing_rank", "p2p_unmatched", *MISMATCH_KINDS):
        return 3
    if f.kind in _CYCLE_KINDS:
        return 4
    if f.kind == "stalled_collective":
        return 5
    if f.kind in (*MISMATCH_KINDS, "missing_rank", "p2p_unmatched"):
        return 6
    if f.kind == "unreadable_dump":
        return 7
    if f.kind in ("truncated_history", "stalled_collective") and f.details.get("undecided"):
        return 7
    return 8


def _sort_key(f: Finding) -> tuple[object, ...]:
    seq = f.collective_seq_id if f.collective_seq_id is not None else 1 << 62
    return (_tier(f), seq, f.culprit_ranks, f.group.name if f.group else "", f.kind)


def verdict(findings: list[Finding]) -> str:
    """``crash`` / ``hang`` / ``desync`` / ``incomplete`` / ``healthy`` (step 11)."""
    if any(f.kind == "crashed_rank" or f.details.get("killed") for f in findings):
        return "crash"
    if any(f.blocking for f in findings):
        return "hang"
    tiers = {_tier(f) for f in findings if f.kind != "healthy"}
    if tiers & {1, 3, 4, 5}:
        return "hang"
    if 6 in tiers:
        return "desync"
    if 7 in tiers:
        return "incomplete"
    return "healthy"


# ---------------------------------------------------------------------- wording


def _status(ctx: Context, rank: int, group: str, seq: int) -> int:
    t = ctx.load.dumps[rank].tracks[group]
    return t.status[seq - t.lo]


def _op(ctx: Context, rank: int, group: str | None, seq: int | None) -> str | None:
    if group is None or seq is None:
        return None
    sig = ctx.sig(rank, group, seq)
    return sig.op if sig else None


def _busy(ctx: Context, rank: int) -> bool:
    """The rank has unfinished work in its dump."""
    d = ctx.load.dumps.get(rank)
    return bool(d and d.pending)


def _now_text(ctx: Context, rank: int) -> str:
    """Where a rank that others wait for is now, as far as its dump tells."""
    d = ctx.load.dumps.get(rank)
    activity, frame = ctx.last_activity(rank)
    last = f"its last record is {activity} at {frame_text(frame)}"
    if d is None:
        return last
    if ctx.frames.has_threads(rank):
        place = ctx.frames.main_place(rank)
        if not _busy(ctx, rank):
            where = place_text(place) if place else "an unknown place (no Python frame)"
            return f"rank {rank} is alive and in no collective: at {where}; {last}"
        return last
    if d.source == "pytorch":
        return (f"{last} (a PyTorch-native dump carries no thread stacks, so where rank "
                f"{rank} is now is unknown)")
    return last


def _wait_verb(ranks: list[int]) -> str:
    return "waits" if len(ranks) == 1 else "wait"


def _wait_edges_to(graph: WaitGraph, targets: set[int]) -> list[Wait]:
    return sorted((w for w in graph.edges() if w.target in targets),
                  key=lambda w: (w.seq is None, w.seq or 0, w.group, w.waiter))


# ---------------------------------------------------------------------- crashes


def _crash_reasons(ctx: Context, graph: WaitGraph) -> dict[int, str]:
    """Step 4: rank → why it counts as crashed (text for the finding)."""
    out: dict[int, str] = {}
    unreadable = {u.rank for u in ctx.load.unreadable if u.rank is not None}
    for r in ctx.expected:
        if r not in ctx.load.dumps and r not in unreadable:
            out[r] = "nodump"
    for r in ctx.stale:
        out[r] = "stale"
    waited_for = {w.target for w in graph.edges()}
    signal_dumps = [r for r, d in ctx.load.dumps.items()
                    if (d.dump_reason or "").startswith("signal")]
    for r, d in ctx.load.dumps.items():
        if r in out:
            continue
        reason = d.dump_reason or ""
        exc = ctx.frames.exception(r)
        if exc is not None and not is_comm_error(exc[0], exc[1]):
            out[r] = "exception"
        elif reason == "exception":
            if exc is not None and not is_comm_error(exc[0], exc[1]):
                out[r] = "exception"
            elif exc is None and not d.pending and r in waited_for:
                out[r] = "exception"  # an older dump without the exception itself
        elif (reason.startswith("signal") and len(signal_dumps) == 1 and not d.pending
              and _first_to_dump(ctx, r)):
            out[r] = "signal"
    if any(why != "signal" for why in out.values()):
        # torchrun stops every rank once one fails: a signal is then not a cause.
        out = {r: why for r, why in out.items() if why != "signal"}
    return out


def _first_to_dump(ctx: Context, rank: int) -> bool:
    """``rank`` dumped before every other rank: the signal that made it dump came first
    (torchrun's SIGTERM to the survivors comes after another rank's timeout or crash)."""
    mine = ctx.load.dumps[rank].dump_time_ns
    others = [d.dump_time_ns for r, d in ctx.load.dumps.items() if r != rank]
    return mine is not None and all(t is not None and mine < t for t in others)


def _victims(ctx: Context, crashed: set[int]) -> list[int]:
    """Ranks whose work failed (a dead peer) or who raised a communication error."""
    out = []
    for r, d in ctx.load.dumps.items():
        if r in crashed:
            continue
        failed = any(t.status[i] & FAILED for t in d.tracks.values()
                     for i in range(max(0, len(t) - 4), len(t)))
        failed = failed or any(op.status & FAILED for op in d.p2p[-4:])
        exc = ctx.frames.exception(r) if d.dump_reason == "exception" else None
        if failed or (exc is not None and is_comm_error(exc[0], exc[1])):
            out.append(r)
    return sorted(out)


def _best_view(ctx: Context, rank: int) -> GroupView | None:
    best = None
    for key in sorted(ctx.views):
        view = ctx.views[key]
        if rank not in view.group.ranks or view.max_hi <= 0:
            continue
        score = (view.max_hi > 0, len(view.group.ranks), view.max_hi)
        if best is None or score > best[0]:
            best = (score, view)
    return best[1] if best else None


def _victim_text(victims: list[int], dead: list[int]) -> str:
    if not victims:
        return ""
    verb = "was" if len(victims) == 1 else "were"
    return (f" {ranks_phrase(victims).capitalize()} {verb} its victims (their work failed "
            f"when {ranks_phrase(dead)} went away, or they raised a communication error).")


def _crash_findings(ctx: Context, graph: WaitGraph, reasons: dict[int, str]) -> list[Finding]:
    victims_all = _victims(ctx, set(reasons))
    findings = []
    nodump = sorted(r for r, why in reasons.items() if why == "nodump")
    buckets: dict[str | None, list[int]] = {}
    for r in nodump:
        view = _best_view(ctx, r)
        buckets.setdefault(view.group.key if view else None, []).append(r)
    for key, ranks in sorted(buckets.items(), key=lambda kv: (kv[0] is None, kv[0] or "")):
        who = ranks_phrase(ranks)
        waiting = sorted(reaching(set(ranks), graph))
        victims = [v for v in victims_all if v in waiting or not waiting]
        if key is None:
            findings.append(Finding(
                kind="crashed_rank", group=None, collective_seq_id=None, op=None,
                culprit_ranks=ranks, waiting_ranks=waiting, blocking=True,
                message=(f"{who.capitalize()} left no dump (crashed, or its file was not "
                         "collected); no group in the other dumps shows where it stopped."
                         + _fatal_text(ctx, ranks) + _victim_text(victims, ranks)),
            ))
            continue
        view = ctx.views[key]
        seq = view.max_hi
        front = sorted(r for r, (_, hi) in view.spans.items() if hi == seq)
        died = _fatal_text(ctx, ranks)
        sig = ctx.sig(front[0], key, seq) if front else None
        unfinished = [r for r in front if not _status(ctx, r, key, seq) & _DONE]
        state = (("still waits in it" if len(unfinished) == 1 else "still wait in it")
                 if unfinished else "recorded it as finished")
        where = frame_text(ctx.frame_at(front[0], key, seq)) if front else "no stack recorded"
        what = f"{sig.op} #{seq} ({sig.sizes_text()})" if sig else f"#{seq}"
        findings.append(Finding(
            kind="crashed_rank", group=view.group, collective_seq_id=seq,
            op=sig.op if sig else None, culprit_ranks=ranks,
            waiting_ranks=sorted(set(waiting) | set(front)), blocking=True,
            message=(f"{who.capitalize()} left no dump (crashed or unreachable, so its own stack "
                     f"is unknown) while {ranks_phrase(front)} reached {what} of "
                     f"{view.group.label()} and {state}, at {where}.{died}"
                     + _victim_text(victims, ranks)),
        ))
    for r in sorted(x for x, why in reasons.items() if why != "nodump"):
        d = ctx.load.dumps[r]
        activity, frame = ctx.last_activity(r)
        waits = _wait_edges_to(graph, {r})
        waiting = sorted(reaching({r}, graph))
        if waits:
            first = waits[0]
            group, seq = ctx.groups[first.group], first.seq
            direct = sorted({w.waiter for w in waits})
            what = ctx.op_at(direct[0], first.group, seq) if seq is not None else first.op
            tail = (f" {ranks_phrase(direct).capitalize()} "
                    f"{'waits' if len(direct) == 1 else 'wait'} for it in {what} of "
                    f"{group.label()}")
            behind = [x for x in waiting if x not in direct]
            tail += f", and {ranks_phrase(behind)} behind them." if behind else "."
        else:
            group = ctx.groups.get(d.last[0]) if d.last else None
            seq = d.last[1] if d.last and d.last[1] >= 0 else None
            tail = ""
        victims = [v for v in victims_all if v in waiting]
        why = reasons[r]
        if why == "stale":
            gap = ctx.stale[r]
            reason = f" (reason: {d.dump_reason})" if d.dump_reason else ""
            head = (f"Rank {r}'s dump was written {ms(gap)} before the others'{reason}: it "
                    f"stopped early, after {activity} at {frame_text(frame)}.")
        elif why == "exception":
            exc = ctx.frames.exception(r)
            if exc is not None:
                kind, text, place = exc
                at = f" at {place_text(place)}" if place else ""
                head = (f"Rank {r} crashed: it raised {kind}: {text}{at}, after {activity} "
                        f"at {frame_text(frame)}.")
            else:
                head = (f"Rank {r} crashed: it dumped on an uncaught exception (its dump "
                        f"does not say which), after {activity} at {frame_text(frame)}.")
        else:
            head = (f"Rank {r} was stopped by a signal ({d.dump_reason}) that no other rank "
                    f"got, after {activity} at {frame_text(frame)}.")
        findings.append(Finding(
            kind="crashed_rank", group=group, collective_seq_id=seq,
            op=_op(ctx, waits[0].waiter if waits else r, group.key if group else None, seq),
            culprit_ranks=[r], waiting_ranks=waiting, blocking=True,
            message=head + tail + _victim_text(victims, [r]),
            details={"frames": {r: frame}},
        ))
    return findings


def _fatal_frame(ctx: Context, rank: int) -> tuple[str, str, int] | None:
    log = ctx.load.fatal.get(rank)
    if log is None or not log.frames:
        return None
    return user_frame([{"name": n, "filename": f, "line": ln} for n, f, ln in log.frames])


def _fatal_text(ctx: Context, ranks: list[int]) -> str:
    """`` Rank 0 died in C (Fatal Python error: Aborted) at train.py:12 in step.``"""
    parts = []
    for r in ranks:
        log = ctx.load.fatal.get(r)
        if log is not None:
            parts.append(f" Rank {r} died in native code ({log.error}) at "
                         f"{frame_text(_fatal_frame(ctx, r))}, as its fatal log "
                         f"{os.path.basename(log.path)} says.")
    return "".join(parts)


def _killed_by_mismatch(ctx: Context, graph: WaitGraph, reasons: dict[int, str],
                        findings: list[Finding]) -> list[Finding]:
    """Step 4b: ranks that aborted inside the very call a surviving rank still waits in.

    gloo aborts a rank that receives a message of another size than it posted, so
    those ranks are the victims of a size mismatch in that call, not its cause: the
    survivors' own op is named (or the mismatch the survivors already disagree on)."""
    dead_at: dict[tuple[str, int], list[int]] = {}
    for r, why in reasons.items():
        log = ctx.load.fatal.get(r)
        frame = _fatal_frame(ctx, r)
        if why == "nodump" and log is not None and "abort" in log.error.lower() and frame:
            dead_at.setdefault((frame[1], frame[2]), []).append(r)
    if not dead_at:
        return findings
    out = list(findings)
    for r, d in sorted(ctx.load.dumps.items()):
        # the survivor's newest record of each group (a root's broadcast may have
        # finished sending before its receivers aborted)
        lasts = [(group, t.hi, t.index[len(t) - 1]) for group, t in sorted(d.tracks.items())
                 if len(t)]
        for group, seq, index in lasts:
            frame = ctx.frames.frame(r, index)
            dead = dead_at.get((frame[1], frame[2])) if frame else None
            g = ctx.groups.get(group)
            if not dead or g is None or not set(dead) <= set(g.ranks):
                continue
            survivors = sorted(q for q in g.ranks if q in ctx.load.dumps
                               and ctx.sig(q, group, seq) is not None)
            for q in dead:
                reasons.pop(q, None)
            what = ctx.op_at(r, group, seq)
            sig = ctx.sig(r, group, seq)
            sizes = sig.sizes_text() if sig else "its sizes"
            died = (f"{ranks_phrase(dead)} aborted (gloo aborts a rank that receives a "
                    "message of another size than it posted), so "
                    f"{'it is a victim' if len(dead) == 1 else 'they are victims'} of a size "
                    "mismatch in that call, not its cause; their own sizes died with them "
                    f"({', '.join(os.path.basename(ctx.load.fatal[q].path) for q in dead)}).")
            victims = died[0].upper() + died[1:]
            known = next((f for f in out if f.blocking and f.group is not None
                          and f.group.key == group and f.collective_seq_id == seq
                          and f.kind in MISMATCH_KINDS), None)
            if known is not None:
                known.waiting_ranks = sorted(set(known.waiting_ranks) | set(dead))
                known.message += " " + victims
                known.details["killed"] = True
                return out
            waiting = sorted((reaching(set(survivors), graph) | set(dead)) - set(survivors))
            out.append(Finding(
                kind="size_mismatch", group=g, collective_seq_id=seq,
                op=sig.op if sig else None, culprit_ranks=survivors, waiting_ranks=waiting,
                blocking=True, details={"shape": "killed", "killed": True},
                message=(f"{ranks_phrase(survivors).capitalize()} issued {what} "
                         f"({sizes}) of {g.label()} at {frame_text(frame)}, the call in which "
                         f"{died}"),
            ))
            return out
    return out


# ---------------------------------------------------------------------- cycles


def _cycle_hops(ctx: Context, cycle: list[Wait]) -> tuple[list[str], dict[int, object]]:
    hops, frames = [], {}
    for w in cycle:
        if w.seq is not None:
            frame = ctx.frame_at(w.waiter, w.group, w.seq)
            what = f"{ctx.op_at(w.waiter, w.group, w.seq)} of {ctx.groups[w.group].label()}"
        else:
            frame = _p2p_frame(ctx, w)
            direction = "to" if w.op == "send" else "from"
            what = f"{w.op} {direction} rank {w.target} in {ctx.group_ref(w.group)}"
        frames[w.waiter] = frame
        hops.append(f"rank {w.waiter} waits for rank {w.target} in {what} at {frame_text(frame)}")
    return hops, frames


def _p2p_frame(ctx: Context, w: Wait) -> object:
    d = ctx.load.dumps.get(w.waiter)
    if d is None:
        return None
    for op in d.p2p:
        if op.group == w.group and op.peer == w.target and op.op == w.op \
                and not op.status & _DONE:
            return ctx.frames.frame(w.waiter, op.index)
    return None


def _component(cycle: list[Wait], graph: WaitGraph) -> set[int]:
    """Every rank of the strongly connected component through ``cycle``."""
    ring = {w.waiter for w in cycle}
    upstream = reaching(ring, graph) | ring
    down: set[int] = set()
    todo = list(ring)
    while todo:
        v = todo.pop()
        for w in graph.out.get(v, []):
            if w.target not in down:
                down.add(w.target)
                todo.append(w.target)
    return (upstream & (down | ring))


def _p2p_tokens(ctx: Context, rank: int) -> tuple[list[tuple[str, str, int | None]], int]:
    """The rank's send/recv ops in record order as (group, op, peer), and the position of
    its first unfinished one (``-1`` if none)."""
    d = ctx.load.dumps.get(rank)
    if d is None:
        return [], -1
    ops = sorted(d.p2p, key=lambda o: o.index)
    tokens = [(o.group, o.op, o.peer) for o in ops]
    first = next((i for i, o in enumerate(ops) if not o.status & _DONE), -1)
    return tokens, first


def _breaks_period(tokens: list[tuple[str, str, int | None]], at: int) -> bool:
    """Whether ``tokens[at]`` breaks the shortest period the ops before it repeat.

    A pipeline stage's send/recv schedule repeats every step; a stage that drops or
    skips one op shows it as the first op that does not fit its own earlier steps."""
    history = tokens[:at]
    for period in range(1, min(len(history), 16) + 1):
        if len(history) < period + 1:
            break
        if all(history[i] == history[i - period] for i in range(period, len(history))):
            return tokens[at] != history[at - period]
    return False


def _pattern_breakers(ctx: Context, comp: set[int]) -> list[int]:
    out = []
    for r in sorted(comp):
        tokens, first = _p2p_tokens(ctx, r)
        if first > 0 and _breaks_period(tokens, first):
            out.append(r)
    return out


def _broken_pattern_finding(ctx: Context, broke: list[int], cycle: list[Wait], comp: set[int],
                            graph: WaitGraph, details: dict[str, object]) -> Finding:
    culprit = broke[0]
    link = next((w for w in cycle if w.target == culprit), cycle[0])
    partner = "recv" if link.op == "send" else "send"
    direction = "to" if link.op == "send" else "from"
    waiting = sorted((comp | reaching(comp, graph)) - set(broke))
    others = [w for w in waiting if w != link.waiter]
    hops, _ = _cycle_hops(ctx, cycle)
    return Finding(
        kind="p2p_unmatched", group=ctx.groups[link.group], collective_seq_id=None,
        op=link.op, culprit_ranks=broke, waiting_ranks=waiting, blocking=True,
        message=(f"Rank {link.waiter} waits in {link.op} {direction} rank {culprit} "
                 f"({ctx.group_ref(link.group)}) but rank {culprit} never posted the "
                 f"matching {partner}: its own send/recv schedule repeats every step until "
                 f"there, then it skipped that op and went on, so the two now wait for each "
                 f"other: " + ", ".join(hops) + "."
                 + (f" {ranks_phrase(others).capitalize()} {_wait_verb(others)} behind them."
                    if others else "")),
        details={**details, "cycle_root": True},
    )


def _deviants(ctx: Context, comp: set[int], graph: WaitGraph) -> tuple[list[int], str | None]:
    """Step 5: the ranks of a cross-group cycle whose order differs from the majority's.

    Every member of the component (and everyone waiting on it) waits in one group of the
    cycle; the group most of them wait in is the order they agree on."""
    involved = comp | reaching(comp, graph)
    groups = {w.group for r in comp for w in graph.out.get(r, []) if w.target in comp}
    choice: dict[int, str] = {}
    for r in sorted(involved):
        if sum(r in ctx.groups[g].ranks for g in groups) < 2:
            continue  # only a member of two of the groups chooses an order between them
        d = ctx.load.dumps.get(r)
        if d is None:
            continue
        for g, seq, _ in d.pending:
            if g in groups and seq >= 0:
                choice[r] = g
                break
    counts: dict[str, int] = {}
    for g in choice.values():
        counts[g] = counts.get(g, 0) + 1
    if len(counts) < 2:
        return sorted(comp), None
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    if ranked[0][1] == ranked[1][1]:
        return sorted(comp), None
    major = ranked[0][0]
    odd = sorted(r for r, g in choice.items() if g != major)
    return odd, major


def _cycle_finding(ctx: Context, cycle: list[Wait], graph: WaitGraph) -> Finding:
    comp = _component(cycle, graph)
    hops, frames = _cycle_hops(ctx, cycle)
    first = cycle[0]
    p2p_links = [w for w in cycle if w.seq is None]
    details = {"frames": frames, "cycle": [(w.waiter, w.target, w.group, w.seq) for w in cycle]}
    if p2p_links and len(p2p_links) == len(cycle):
        broke = _pattern_breakers(ctx, comp)
        if broke and len(broke) < len(comp):
            return _broken_pattern_finding(ctx, broke, cycle, comp, graph, details)
        ranks = sorted(comp)
        behind = sorted(reaching(comp, graph))
        also = f"; {ranks_phrase(behind)} {_wait_verb(behind)} behind them" if behind else ""
        return Finding(
            kind="p2p_deadlock", group=ctx.groups[first.group], collective_seq_id=None,
            op="send/recv", culprit_ranks=ranks, waiting_ranks=behind, blocking=True,
            message=(f"{ranks_phrase(ranks).capitalize()} deadlock in send/recv: "
                     + ", ".join(hops) + f"{also}. Each posted its op before the one its "
                     "peer waits for (on gloo a send blocks until the matching recv is "
                     "posted): reorder them, or use batch_isend_irecv."),
            details=details,
        )
    if p2p_links:
        link = p2p_links[0]
        culprit = link.target
        partner = "recv" if link.op == "send" else "send"
        direction = "to" if link.op == "send" else "from"
        waiting = sorted((comp | reaching(comp, graph)) - {culprit})
        return Finding(
            kind="p2p_unmatched", group=ctx.groups[link.group], collective_seq_id=None,
            op=link.op, culprit_ranks=[culprit], waiting_ranks=waiting, blocking=True,
            message=(f"Rank {link.waiter} waits in {link.op} {direction} rank {culprit} "
                     f"({ctx.group_ref(link.group)}) but rank {culprit} never posted the "
                     f"matching {partner}: it went on and now waits itself, so the job "
                     f"deadlocks: " + ", ".join(hops) + f". {ranks_phrase(waiting).capitalize()} "
                     f"{_wait_verb(waiting)} behind it."),
            details={**details, "cycle_root": True},
        )
    culprits, major = _deviants(ctx, comp, graph)
    behind = sorted((comp | reaching(comp, graph)) - set(culprits))
    n_groups = len({w.group for w in cycle})
    if major is not None:
        g = ctx.groups[major]
        text = (f"{ranks_phrase(culprits).capitalize()} issued collectives of "
                f"{plural(n_groups, 'group')} out of order: "
                f"{ranks_phrase(behind)} wait in {g.label()} first, "
                f"{ranks_phrase(culprits)} in another group, so they wait for each other: "
                + ", ".join(hops) + ".")
    else:
        also = f"; {ranks_phrase(behind)} {_wait_verb(behind)} behind them" if behind else ""
        text = (f"{ranks_phrase(culprits).capitalize()} wait for each other across "
                f"{plural(n_groups, 'group')}: " + ", ".join(hops) + f"{also}.")
    return Finding(
        kind="cross_group_deadlock", group=ctx.groups[first.group], collective_seq_id=first.seq,
        op=_op(ctx, first.waiter, first.group, first.seq) or first.op,
        culprit_ranks=culprits, waiting_ranks=behind, message=text, blocking=True,
        details=details,
    )


# ---------------------------------------------------------------------- roots


def _frontier_findings(ctx: Context, graph: WaitGraph, explained: set[int]) -> list[Finding]:
    findings = []
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
        what = f"{sig.op} #{f.seq} ({sig.sizes_text()})" if sig else f"collective #{f.seq}"
        who = ranks_phrase(culprits)
        waiting = sorted(reaching(set(culprits), graph) | set(f.waiting))
        behind = [r for r in waiting if r not in f.waiting]
        if f.waiting:
            verb = "waits" if len(f.waiting) == 1 else "wait"
            wait_text = f"which {ranks_phrase(f.waiting)} {verb} in"
            if behind:
                wait_text = (f"which {ranks_phrase(f.waiting)} {verb} in (and "
                             f"{ranks_phrase(behind)} behind them)")
        else:
            wait_text = (f"which {ranks_phrase(f.have)} recorded as finished (so {who}'s dump "
                         "may be older than theirs, or the collective failed)")
        nows = "; ".join(_now_text(ctx, q) for q in culprits[:4])
        if len(culprits) > 4:
            nows += f"; and {len(culprits) - 4} more"
        frame = ctx.last_activity(culprits[0])[1]
        findings.append(Finding(
            kind="missing_rank", group=view.group, collective_seq_id=f.seq,
            op=sig.op if sig else None, culprit_ranks=culprits, waiting_ranks=waiting,
            blocking=bool(f.waiting),
            message=(f"{who.capitalize()} never joined {what} of {view.group.label()}, "
                     f"{wait_text}; {nows}."),
            details={"frames": {culprits[0]: frame}},
        ))
    return findings


def _p2p_findings(ctx: Context, graph: WaitGraph, explained: set[int]) -> list[Finding]:
    findings = []
    seen: set[tuple[str, int, int]] = set()
    lonely: dict[int, list[P2PIssue]] = {}
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
    behind_text = f"; {ranks_phrase(behind)} {_wait_verb(behind)} behind them" if behind else ""
    first = issues[0]
    frames[q] = ctx.last_activity(q)[1]
    text = "; ".join(waits)
    return Finding(
        kind="p2p_unmatched", group=ctx.groups[first.group], collective_seq_id=None,
        op=first.op.op, culprit_ranks=[q], waiting_ranks=waiting, blocking=True,
        message=(f"{text[0].upper()}{text[1:]}{behind_text}; {_now_text(ctx, q)}."),
        details={"frames": frames},
    )


# ---------------------------------------------------------------------- coverage


def _uncovered_findings(ctx: Context, findings: list[Finding]) -> list[Finding]:
    """Step 9: unfinished work that no blocking finding names."""
    covered: set[int] = set()
    for f in findings:
        if f.blocking:
            covered.update(f.culprit_ranks)
            covered.update(f.waiting_ranks)
    by_place: dict[tuple[str, int], list[int]] = {}
    for r, d in sorted(ctx.load.dumps.items()):
        if r in covered or not d.pending:
            continue
        group, seq, _ = d.pending[0]
        by_place.setdefault((group, seq), []).append(r)
    out = []
    for (group, seq), ranks in sorted(by_place.items()):
        g = ctx.groups.get(group)
        r0 = ranks[0]
        d = ctx.load.dumps[r0]
        index = d.pending[0][2]
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
        if done_by:
            out.append(Finding(
                kind="stalled_collective", group=g, collective_seq_id=seq if seq >= 0 else None,
                op=_op(ctx, r0, group, seq) if seq >= 0 else None,
                culprit_ranks=[], waiting_ranks=ranks, blocking=False,
                details={"undecided": True},
                message=(f"{ranks_phrase(ranks).capitalize()} had not finished {what} when "
                         f"{'it' if len(ranks) == 1 else 'they'} dumped, though "
                         f"{ranks_phrase(done_by)} finished it: the dump was taken while it "
                         "was finishing (a dump of a running job), not a hang."),
            ))
            continue
        out.append(Finding(
            kind="stalled_collective", group=g, collective_seq_id=seq if seq >= 0 else None,
            op=_op(ctx, r0, group, seq) if seq >= 0 else (what.split()[0]),
            culprit_ranks=[], waiting_ranks=ranks, blocking=True,
            message=(f"{ranks_phrase(ranks).capitalize()} {verb} still inside {what} when "
                     f"{'it' if len(ranks) == 1 else 'they'} dumped (reason: "
                     f"{', '.join(reasons)}), at {frame_text(frame)}, and no other rank's "
                     "records explain the wait: the transport is slow or stuck, or the "
                     "dump was taken while the op was finishing."),
        ))
    return out


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
        if _status(ctx, r, group, seq) & _DONE:
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


def diagnose(ctx: Context, straggler_ms: float = 50.0) -> list[Finding]:
    """All findings, root cause first (see module doc)."""
    ctx.stale = {r: gap for r, gap in stale_dumps(ctx).items() if _behind(ctx, r)}
    findings = mismatch_findings(ctx)
    graph = build_waits(ctx.views, ctx.p2p, pending_mismatch_ranks(ctx), ctx.load)
    reasons = _crash_reasons(ctx, graph)
    findings = _killed_by_mismatch(ctx, graph, reasons, findings)
    findings += _crash_findings(ctx, graph, reasons)
    explained: set[int] = set(reasons)
    for cycle in find_cycles(graph):
        if explained & {w.waiter for w in cycle}:
            continue
        skip = find_skip(ctx, cycle)
        found = skip_finding(ctx, skip, cycle, graph) if skip else _cycle_finding(ctx, cycle, graph)
        if skip:
            found.details["cycle_root"] = True
        findings.append(found)
        explained.update(w.waiter for w in cycle)
    findings += _frontier_findings(ctx, graph, explained)
    findings += _p2p_findings(ctx, graph, explained)
    if not any(f.blocking for f in findings):
        findings += stalled_findings(ctx)
    findings += _uncovered_findings(ctx, findings)
    findings += _unreadable_findings(ctx)
    findings += _truncated_findings(ctx)
    if straggler_ms != float("inf"):
        findings += straggler_findings(ctx, straggler_ms)
    findings += _nothing_to_read(ctx, findings)
    findings.sort(key=_sort_key)
    if not findings:
        findings.append(_healthy(ctx))
    return findings


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
