"""Which ranks crashed, and which ranks only went down with them.

A rank that dies takes its peers' work with it: their collective fails, they raise a
communication error, or (gloo) they abort inside the very call. Only the first death is
a cause; the others are its *victims*, listed as waiting, never as culprits.

Algorithm (:func:`crash_reasons`, :func:`killed_by_mismatch`, :func:`crash_findings`):

1. A rank counts as crashed (:func:`crash_reasons`) when it is expected but left no
   dump (and no unreadable file stands for it), when its dump is stale
   (``ctx.stale``), when it raised an exception that is not a communication error
   (:func:`is_comm_error`), or dumped on an uncaught exception it does not name while
   it has no unfinished work and others wait for it (an older dump), or when it alone
   dumped on a signal, with no unfinished work, before every other rank dumped (not
   SIGUSR1, which asks for a dump and stops nothing). A signal is never a cause next to
   any other reason: torchrun's SIGTERM to the survivors of a failure comes after it.
2. Ranks without a dump whose fatal log says they aborted, at the very line where a
   survivor issued one of its newest records of a group they belong to (finished or
   not, but no older than one it finished there; a survivor whose record at that line
   is older issued another call there: its first unfinished one of that group), were
   killed by a size mismatch in that call (:func:`killed_by_mismatch`; gloo
   aborts a rank that receives a message of another size than it posted): they no
   longer count as crashed. Who was wrong is weighed: a mismatch the survivors already
   disagree on in that call stands and lists them as victims; survivors (two or more,
   outnumbering the dead) that agree on the call make the dead ranks the culprits; else
   a ``size_mismatch`` names the survivors' own op with the dead as its victims.
3. Victims: ranks whose recent work (the last four records of a group, or of send/recv)
   failed, or who dumped on a communication error.
4. Findings (:func:`crash_findings`): ranks without a dump, one ``crashed_rank`` per
   group they were last seen in (the largest group they belong to that has records:
   who reached its newest collective, and whether they still wait in it), quoting the
   fatal log of a rank that died in native code; when they are every rank of a host
   (a job on several hosts), the host is named once instead of each rank, with when
   its ranks went (the moment their victims' work failed, on rank 0's clock) and where
   its dumps would be if the host is still up: ``hostB: ranks 2-3 gone at 12:03:10, no
   dump``. Every other crashed rank, one each, says why (stale dump, the exception, the
   signal), its last record, and who waits for it (its direct waiters in the wait
   graph, then everyone behind them).

:func:`deaths_here` names the ranks whose own death shows in these dumps (an exception
of their own, a fatal log): they explain failed work, so no other host is taken for
dead (:func:`commscope.analyze.diagnose.hosts.elsewhere_ranks`).
"""

from __future__ import annotations

import os
import time

from commscope.analyze.align.match import GroupView
from commscope.analyze.diagnose.context import Context
from commscope.analyze.diagnose.hosts import hosts_phrase, whole_hosts
from commscope.analyze.diagnose.mismatch import MISMATCH_KINDS
from commscope.analyze.diagnose.timing import reason_class
from commscope.analyze.diagnose.waits import Wait, WaitGraph, reaching
from commscope.analyze.diagnose.wording import record_op, record_status
from commscope.analyze.model import COMPLETED, FAILED, RETIRED, Finding
from commscope.analyze.read.places import user_frame
from commscope.analyze.text import frame_text, ms, place_text, ranks_phrase
from commscope.collectives import ALL_TO_ALL

__all__ = ["crash_reasons", "killed_by_mismatch", "crash_findings", "is_comm_error",
           "deaths_here"]

_DONE = RETIRED | COMPLETED
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


def crash_reasons(ctx: Context, graph: WaitGraph) -> dict[int, str]:
    """Step 1: rank → why it counts as crashed (text for the finding)."""
    out: dict[int, str] = {}
    unreadable = {u.rank for u in ctx.load.unreadable if u.rank is not None}
    for r in ctx.expected:
        if r not in ctx.load.dumps and r not in unreadable:
            out[r] = "nodump"
    for r in ctx.stale:
        out[r] = "stale"
    waited_for = {w.target for w in graph.edges()}
    # a signal that asks for a dump (SIGUSR1) stops nothing: never a cause
    signal_dumps = [r for r, d in ctx.load.dumps.items()
                    if reason_class(d.dump_reason) == "signal"]
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
        elif (r in signal_dumps and len(signal_dumps) == 1 and not d.pending
              and _first_to_dump(ctx, r)):
            out[r] = "signal"
    if any(why != "signal" for why in out.values()):
        # torchrun stops every rank once one fails: a signal is then not a cause.
        out = {r: why for r, why in out.items() if why != "signal"}
    return out


def deaths_here(ctx: Context) -> list[int]:
    """Ranks whose own death shows in these dumps: one that raised an exception that is
    not a communication error, one that died in native code (its fatal log is here, as
    when gloo aborts a rank). The failures of the others' work (a peer closed the
    connection) are explained by them."""
    out = {r for r in ctx.load.fatal if r not in ctx.load.dumps}
    for r in ctx.load.dumps:
        exc = ctx.frames.exception(r)
        if exc is not None and not is_comm_error(exc[0], exc[1]):
            out.add(r)
    return sorted(out)


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
    one = len(victims) == 1
    were = "was its victim" if one else "were its victims"
    return (f" {ranks_phrase(victims).capitalize()} {were} "
            f"({'its' if one else 'their'} work failed when {ranks_phrase(dead)} went away, or "
            f"{'it' if one else 'they'} raised a communication error).")


def crash_findings(ctx: Context, graph: WaitGraph, reasons: dict[int, str]) -> list[Finding]:
    """Step 4: the ``crashed_rank`` findings of the ranks in ``reasons``."""
    victims_all = _victims(ctx, set(reasons))
    findings = []
    nodump = sorted(r for r, why in reasons.items() if why == "nodump")
    buckets: dict[str | None, list[int]] = {}
    for r in nodump:
        view = _best_view(ctx, r)
        buckets.setdefault(view.group.key if view else None, []).append(r)
    for key, ranks in sorted(buckets.items(), key=lambda kv: (kv[0] is None, kv[0] or "")):
        who = ranks_phrase(ranks).capitalize() + ctx.on_hosts(ranks)  # hosts keep case
        waiting = sorted(reaching(set(ranks), graph))
        victims = [v for v in victims_all if v in waiting or not waiting]
        hosts = whole_hosts(ctx.hosts, ranks)
        if key is None:
            subject = (_host_subject(ctx, hosts, victims) if hosts else
                       f"{who} left no dump (crashed, or its file was not "
                       "collected)")
            rest = ("; no group in the other dumps shows where it stopped."
                    + _fatal_text(ctx, ranks) + _victim_text(victims, ranks))
            findings.append(Finding(
                kind="crashed_rank", group=None, collective_seq_id=None, op=None,
                culprit_ranks=ranks, waiting_ranks=waiting, blocking=True,
                message=subject + rest, details={"rest": rest, "hosts": hosts, "victims": victims},
            ))
            continue
        view = ctx.views[key]
        seq = view.max_hi
        front = sorted(r for r, (_, hi) in view.spans.items() if hi == seq)
        died = _fatal_text(ctx, ranks)
        sig = ctx.sig(front[0], key, seq) if front else None
        unfinished = [r for r in front if not record_status(ctx, r, key, seq) & _DONE]
        failed = [r for r in unfinished if record_status(ctx, r, key, seq) & FAILED]
        if unfinished and len(failed) == len(unfinished):
            state = "failed in it"  # a peer closed the connection: it died, or its host
        elif unfinished:
            state = "still waits in it" if len(unfinished) == 1 else "still wait in it"
        else:
            state = "recorded it as finished"
        where = frame_text(ctx.frame_at(front[0], key, seq)) if front else "no stack recorded"
        what = f"{sig.op} #{seq} ({sig.sizes_text()})" if sig else f"#{seq}"
        subject = (_host_subject(ctx, hosts, victims) if hosts else
                   f"{who} left no dump (crashed or unreachable, so its own stack "
                   "is unknown)")
        rest = (f" while {ranks_phrase(front)} reached {what} of {view.group.label()} and "
                f"{state}, at {where}.{died}" + _victim_text(victims, ranks))
        findings.append(Finding(
            kind="crashed_rank", group=view.group, collective_seq_id=seq,
            op=sig.op if sig else None, culprit_ranks=ranks,
            waiting_ranks=sorted(set(waiting) | set(front)), blocking=True,
            message=subject + rest, details={"rest": rest, "hosts": hosts, "victims": victims},
        ))
    for r in sorted(x for x, why in reasons.items() if why != "nodump"):
        d = ctx.load.dumps[r]
        last, frame = ctx.last_text(r), ctx.last_activity(r)[1]
        waits = _wait_edges_to(graph, {r})
        waiting = sorted(reaching({r}, graph))
        if waits:
            first = waits[0]
            group, seq = ctx.groups[first.group], first.seq
            direct = sorted({w.waiter for w in waits})
            if seq is not None:
                what = f"{ctx.op_at(direct[0], first.group, seq)} of {group.label()}"
            else:  # send/recv: each waiter's own op (one may send, another receive)
                ops = {w.op for w in waits if w.group == first.group}
                what = (f"{first.op if len(ops) == 1 else 'send/recv'} of {group.label()}")
            tail = (f" {ranks_phrase(direct).capitalize()} "
                    f"{'waits' if len(direct) == 1 else 'wait'} for it in {what}")
            behind = [x for x in waiting if x not in direct]
            tail += f", and {ranks_phrase(behind)} behind them." if behind else "."
        else:
            group = ctx.groups.get(d.last[0]) if d.last else None
            seq = d.last[1] if d.last and d.last[1] >= 0 else None
            tail = ""
        victims = [v for v in victims_all if v in waiting]
        why = reasons[r]
        at_host = ctx.on_hosts([r])
        if why == "stale":
            gap = ctx.stale[r]
            reason = f" (reason: {d.dump_reason})" if d.dump_reason else ""
            head = (f"Rank {r}{at_host}'s dump was written {ms(gap)} before the others'"
                    f"{reason}: it stopped early, after {last}.")
        elif why == "exception":
            exc = ctx.frames.exception(r)
            if exc is not None:
                kind, text, place = exc
                at = f" at {place_text(place)}" if place else ""
                head = (f"Rank {r}{at_host} crashed: it raised {kind}: {text}{at}, after "
                        f"{last}.")
            else:
                head = (f"Rank {r}{at_host} crashed: it dumped on an uncaught exception (its dump "
                        f"does not say which), after {last}.")
        else:
            head = (f"Rank {r}{at_host} was stopped by a signal ({d.dump_reason}) that no "
                    f"other rank got, after {last}.")
        findings.append(Finding(
            kind="crashed_rank", group=group, collective_seq_id=seq,
            op=record_op(ctx, waits[0].waiter if waits else r, group.key if group else None, seq),
            culprit_ranks=[r], waiting_ranks=waiting, blocking=True,
            message=head + tail + _victim_text(victims, [r]),
            details={"frames": {r: frame}},
        ))
    return findings


def _host_subject(ctx: Context, hosts: dict[str, list[int]], victims: list[int]) -> str:
    """``hostB: ranks 2-3 gone at 12:03:10, no dump here (...)``: every rank of a host
    left no dump. The time is when the first victim's work failed (its dump, written on
    the failure, on rank 0's clock); without victims it is not known."""
    times = [t for v in victims
             if (t := ctx.load.dumps[v].dump_time_ns if v in ctx.load.dumps else None)]
    at = f" at {time.strftime('%H:%M:%S', time.localtime(min(times) / 1e9))}" if times else ""
    names = list(hosts)
    folder = ctx.hosts.dump_dir([r for ranks in hosts.values() for r in ranks])
    which = names[0] if len(names) == 1 else "those hosts"
    where = (f"; if {which} is still up, look for them in "
             f"{names[0] + ':' if len(names) == 1 else ''}{folder}/" if folder else "")
    return (f"{hosts_phrase(hosts)} gone{at}, no dump (every rank of {which}: the processes "
            f"or the host died{where})")


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


_DIED = "their own sizes died with them"


_LOOKBACK = 16
"""How many of a survivor's newest records of a group are searched for the call a dead
rank died in (the survivors may have finished it and gone on before they dumped)."""


def _call_died_in(ctx: Context, dead_at: dict[tuple[str, int], list[int]]
                  ) -> tuple[str, int, int, int, list[int]] | None:
    """``(group, seq, survivor, index, dead ranks)``: the newest record of a surviving
    rank at the very line where ranks died in native code, among each survivor's
    :data:`_LOOKBACK` newest records of each group, and no older than the newest one
    it finished there (the dead joined that one: they died in it or later); ``None``
    when there is none. When a survivor's newest record of a group at that line is
    older than one it finished there, and its oldest unfinished record of the group
    follows that finished one, that record is the call they died in: the survivor
    issued another call there (it skipped the dead's, or called another); it is taken
    when no survivor's line matches."""
    best: tuple[int, tuple[str, int, int, int, list[int]]] | None = None
    other: tuple[int, tuple[str, int, int, int, list[int]]] | None = None
    for r, d in sorted(ctx.load.dumps.items()):
        for group, t in sorted(d.tracks.items()):
            g = ctx.groups.get(group)
            if g is None or not len(t):
                continue
            done = [k for k in range(len(t)) if t.status[k] & _DONE and t.index[k] >= 0]
            floor = done[-1] if done else -1
            found: list[int] | None = None
            for k in range(len(t) - 1, max(-1, len(t) - 1 - _LOOKBACK), -1):
                index = t.index[k]
                if index < 0:
                    continue
                frame = ctx.frames.frame(r, index)
                dead = dead_at.get((frame[1], frame[2])) if frame else None
                if not dead or not set(dead) <= set(g.ranks):
                    continue
                found = dead
                if k < floor:
                    break  # an older call at that line: the dead went past it
                created = t.created[k]
                if best is None or created > best[0]:
                    best = (created, (group, t.lo + k, r, index, dead))
                found = None
                break
            nxt = floor + 1
            if not found or nxt >= len(t) or t.index[nxt] < 0 or t.status[nxt] & _DONE:
                continue
            if other is None or t.created[nxt] > other[0]:
                other = (t.created[nxt], (group, t.lo + nxt, r, t.index[nxt], found))
    chosen = best if best is not None else other
    return chosen[1] if chosen else None


def killed_by_mismatch(ctx: Context, graph: WaitGraph, reasons: dict[int, str],
                       findings: list[Finding]) -> list[Finding]:
    """Step 2: ranks that aborted inside a call the surviving ranks issued too.

    gloo aborts a rank that receives a message of another size than it posted. Whether
    that rank was wrong is weighed from every rank's evidence, the same whether or not
    the survivors had finished that call and gone on before they dumped (their newest
    records of the group are searched for it):

    * the survivors disagree about the call (a mismatch finding is already there, also
      one they came through: they wait for the dead now): its culprits stand and the
      dead ranks are its victims;
    * at least two survivors agree on the call and they outnumber the dead: the dead
      rank(s) are the only ones that can have disagreed, so they are the culprits (their
      own sizes died with them);
    * otherwise (one survivor, or as many dead as alive): the survivors' size is the
      finding and the dead ranks its victims, as gloo kills the receivers of a sender
      that sent more than they posted.
    """
    dead_at: dict[tuple[str, int], list[int]] = {}
    for r, why in reasons.items():
        log = ctx.load.fatal.get(r)
        frame = _fatal_frame(ctx, r)
        if why == "nodump" and log is not None and "abort" in log.error.lower() and frame:
            dead_at.setdefault((frame[1], frame[2]), []).append(r)
    if not dead_at:
        return findings
    call = _call_died_in(ctx, dead_at)
    if call is None:
        return findings
    group, seq, r, index, dead = call
    out = list(findings)
    g = ctx.groups[group]
    frame = ctx.frames.frame(r, index)
    survivors = sorted(q for q in g.ranks if q in ctx.load.dumps
                       and ctx.sig(q, group, seq) is not None)
    for q in dead:
        reasons.pop(q, None)
    what = ctx.op_at(r, group, seq)
    sig = ctx.sig(r, group, seq)
    sizes = sig.sizes_text() if sig else "its sizes"
    logs = ", ".join(os.path.basename(ctx.load.fatal[q].path) for q in dead)
    gloo = "gloo aborts a rank that receives a message of another size than it posted"
    # a disagreement about that very call, also one the survivors came through (their
    # records finished it and went on: the dead are why they wait now)
    known = next((f for f in out if f.group is not None
                  and f.group.key == group and f.collective_seq_id == seq
                  and f.kind in MISMATCH_KINDS), None)
    if known is not None:
        died = (f"{ranks_phrase(dead)} aborted ({gloo}), so "
                f"{'it is a victim' if len(dead) == 1 else 'they are victims'} of a size "
                "mismatch in that call, not its cause; "
                f"{'its own sizes died with it' if len(dead) == 1 else _DIED} ({logs}).")
        known.waiting_ranks = sorted(set(known.waiting_ranks) | set(dead)
                                     | (reaching(set(dead), graph) - set(known.culprit_ranks)))
        known.blocking = True
        known.victims = sorted(set(known.victims) | set(dead))
        known.message += " " + died[0].upper() + died[1:]
        known.details["killed"] = True
        return out
    keys = {_match_key(ctx, q, group, seq) for q in survivors}
    # all_to_all sizes differ by design: agreeing survivors say nothing of the dead there
    comparable = sig is not None and sig.op != ALL_TO_ALL
    if comparable and len(survivors) >= 2 and len(keys) == 1 and len(survivors) > len(dead):
        waiting = sorted(reaching(set(dead), graph) - set(dead))
        out.append(Finding(
            kind="size_mismatch", group=g, collective_seq_id=seq,
            op=sig.op if sig else None, culprit_ranks=sorted(dead), waiting_ranks=waiting,
            blocking=True, victims=[],
            details={"shape": "killed", "killed": True, "dead_culprit": True,
                     "frames": {q: _fatal_frame(ctx, q) for q in dead}},
            message=(f"{ranks_phrase(dead).capitalize()} died inside {what} of {g.label()} "
                     f"at {frame_text(_fatal_frame(ctx, dead[0]))} ({gloo}), while "
                     f"{ranks_phrase(survivors)}, who agree on that call ({sizes}, at "
                     f"{frame_text(frame)}), came through it: "
                     f"{'it is the one rank' if len(dead) == 1 else 'they are the ranks'} "
                     "that can have disagreed, so "
                     f"{'it passed' if len(dead) == 1 else 'they passed'} other sizes "
                     f"({'its own sizes died with it' if len(dead) == 1 else _DIED}: "
                     f"{logs})."),
        ))
        return out
    waiting = sorted((reaching(set(survivors), graph) | reaching(set(dead), graph)
                      | set(dead)) - set(survivors))
    theirs = _fatal_frame(ctx, dead[0])
    apart = ""
    if theirs is not None and frame is not None and theirs[1:] != frame[1:]:
        apart = (f" at {frame_text(theirs)}, in a call other than the one "
                 f"{ranks_phrase(survivors)} issued as #{seq}")
    died = (f"{ranks_phrase(dead)} aborted{apart} ({gloo}), so "
            f"{'it is a victim' if len(dead) == 1 else 'they are victims'} of a size "
            "mismatch in that call, not its cause; "
            f"{'its own sizes died with it' if len(dead) == 1 else _DIED} ({logs}).")
    out.append(Finding(
        kind="size_mismatch", group=g, collective_seq_id=seq,
        op=sig.op if sig else None, culprit_ranks=survivors, waiting_ranks=waiting,
        blocking=True, victims=sorted(dead),
        details={"shape": "killed", "killed": True,
                 "frames": {q: ctx.frames.frame(q, ctx.index(q, group, seq)) for q in survivors}},
        message=(f"{ranks_phrase(survivors).capitalize()} issued {what} "
                 f"({sizes}) of {g.label()} at {frame_text(frame)}, the call in which "
                 f"{died}"),
    ))
    return out


def _match_key(ctx: Context, rank: int, group: str, seq: int) -> int | None:
    t = ctx.load.dumps[rank].tracks.get(group)
    if t is None or t.mk is None or not t.lo <= seq <= t.hi:
        return None
    return t.mk[seq - t.lo]


def _wait_edges_to(graph: WaitGraph, targets: set[int]) -> list[Wait]:
    return sorted((w for w in graph.edges() if w.target in targets),
                  key=lambda w: (w.seq is None, w.seq or 0, w.group, w.waiter))
