"""``split_mismatch``: ranks of an ``all_to_all_single`` disagree about who sends whom what.

The sizes of an all_to_all differ from rank to rank by design (a mixture-of-experts
layer routes a different number of tokens to each expert), so comparing them across
ranks says nothing. What must agree is each *pair*: the rows rank ``i`` sends rank ``j``
(``i``'s ``input_split_sizes[j]``) times ``i``'s elements per row must equal what ``j``
expects from ``i`` (``j``'s ``output_split_sizes[i]`` times ``j``'s elements per row).
A record with no split sizes splits its first dimension evenly.

Algorithm (:func:`split_findings`), per group, over its all_to_alls in sequence order:

1. Every pair whose two ranks both have a record is checked; each disagreeing pair
   counts against both of its ranks (a rank whose own splits disagree with themselves,
   ``i == j``, counts twice). The rank(s) with the most disagreements are named.
2. A tie (one pair alone disagrees: either side may be the wrong one) is broken by a
   member gloo aborted (no dump, its fatal log says so): it received more than it
   posted, so the one rank that sends it more than any other rank does is named.
3. No pair of the ranks with a record disagrees, but members gloo aborted have none (a
   receiver killed over the size it got: its own splits died with it, and the ranks
   that dumped may have stopped in different collectives after it): each aborted
   member's senders are compared instead, and the rank that sends the aborted members
   more than any other rank sends them is named (it disagrees with every other
   sender); with no such one rank, those that send the most are named, as a tie.
4. The first all_to_all found is the finding; later all_to_alls of the group are not
   reported again (they usually differ as a consequence). The ranks gloo aborted
   become its victims (:func:`commscope.analyze.diagnose.crashes.killed_by_mismatch`).
"""

from __future__ import annotations

from math import prod
from typing import Any

from commscope.analyze.diagnose.context import Context
from commscope.analyze.model import COMPLETED, RETIRED, Finding, Group, Sig
from commscope.analyze.read.places import user_frame
from commscope.analyze.text import frame_text, ranks_phrase
from commscope.collectives import ALL_TO_ALL

__all__ = ["split_findings"]

_DONE = RETIRED | COMPLETED


def _even(rows: int, n: int) -> tuple[int, ...] | None:
    return (rows // n,) * n if n and rows % n == 0 else None


def _pair_plan(sig: Sig, recorded: tuple[tuple[int, ...] | None, tuple[int, ...] | None] | None,
               n: int) -> tuple[tuple[int, ...], tuple[int, ...], int, int] | None:
    """(input splits, output splits, elements per input row, per output row)."""
    if sig.op != ALL_TO_ALL or not sig.input_sizes or not sig.output_sizes:
        return None
    if len(sig.input_sizes) != 1 or len(sig.output_sizes) != 1:
        return None  # the list form: one tensor per peer, sizes say it all
    ins_shape, outs_shape = sig.input_sizes[0], sig.output_sizes[0]
    if not ins_shape or not outs_shape:
        return None
    ins, outs = recorded if recorded is not None else (None, None)
    ins = ins if ins is not None else _even(ins_shape[0], n)
    outs = outs if outs is not None else _even(outs_shape[0], n)
    if ins is None or outs is None or len(ins) != n or len(outs) != n:
        return None
    return ins, outs, prod(ins_shape[1:]), prod(outs_shape[1:])


def _done(ctx: Context, rank: int, key: str, seq: int) -> bool:
    t = ctx.load.dumps[rank].tracks.get(key)
    return t is not None and t.lo <= seq <= t.hi and bool(t.status[seq - t.lo] & _DONE)


def _aborted(ctx: Context, members: list[int], plans: dict[int, Any]) -> list[int]:
    """Members with no record of the call that gloo aborted (no dump; a fatal log that
    says so): receivers killed over a message of another size than they posted."""
    out = []
    for dead in members:
        log = ctx.load.fatal.get(dead)
        if dead in plans or log is None:
            continue
        if "abort" in log.error.lower():
            out.append(dead)
    return out


def _top_senders(members: list[int], plans: dict[int, Any], dead: int
                 ) -> tuple[list[int], int]:
    """The ranks that send ``dead`` the most elements in this call, and how many."""
    j = members.index(dead)
    sends = {r: plans[r][0][j] * plans[r][2] for r in plans if r != dead}
    if not sends:
        return [], 0
    most = max(sends.values())
    return sorted(r for r, v in sends.items() if v == most), most


def _break_tie(ctx: Context, members: list[int], plans: dict[int, Any],
               tied: list[int]) -> tuple[list[int], str]:
    """Step 2: among ``tied`` ranks, the one that sends a member gloo aborted over a size
    mismatch (its fatal log says so) more than any other rank sends it: that member
    received more than it posted, and this is the sender that sent more."""
    for dead in _aborted(ctx, members, plans):
        top, most = _top_senders(members, plans, dead)
        if len(top) == 1 and top[0] in tied:
            return top, (f"; it sends rank {dead}, which gloo aborted, {most} element(s), "
                         "more than any other rank sends it")
    return tied, ""


def _blame_by_aborted(ctx: Context, members: list[int], plans: dict[int, Any]
                      ) -> tuple[list[int], list[tuple[int, int, int, int]]]:
    """Step 3: the rank(s) that send the members gloo aborted more than any other rank
    sends them, and per (sender, aborted member) what it sends against what the others
    send most: ``(src, dead, rows, others' rows)``."""
    score: dict[int, int] = {}
    seen: list[tuple[int, int, int, int]] = []
    for dead in _aborted(ctx, members, plans):
        top, _ = _top_senders(members, plans, dead)
        if not top or len(top) == len(plans):
            continue  # every rank sends it the same: nothing to tell them apart
        j = members.index(dead)
        rest = max(plans[r][0][j] for r in plans if r not in top and r != dead)
        for r in top:
            score[r] = score.get(r, 0) + 1
            seen.append((r, dead, plans[r][0][j], rest))
    if not score:
        return [], []
    best = max(score.values())
    culprits = sorted(r for r, c in score.items() if c == best)
    return culprits, [p for p in seen if p[0] in culprits]


def _check(ctx: Context, g: Group, key: str, seq: int, died_here: bool = False
           ) -> Finding | None:
    """The ``split_mismatch`` of all_to_all ``seq`` of ``g`` (steps 1-3), if any;
    ``died_here``: the ranks gloo aborted died in this very call (step 3 applies)."""
    members = list(g.ranks)
    n = len(members)
    plans = {}
    for r in members:
        sig = ctx.sig(r, key, seq)
        d = ctx.load.dumps.get(r)
        if sig is None or d is None:
            continue
        plan = _pair_plan(sig, d.splits.get((key, seq), d.splits.get((g.name, seq))), n)
        if plan is not None:
            plans[r] = plan
    if not plans:
        return None
    bad: dict[int, int] = {}
    pairs: list[tuple[int, int, int, int]] = []
    for i, src in enumerate(members):
        for j, dst in enumerate(members):
            if src not in plans or dst not in plans:
                continue
            sent = plans[src][0][j] * plans[src][2]
            expected = plans[dst][1][i] * plans[dst][3]
            if sent != expected:
                pairs.append((src, dst, plans[src][0][j], plans[dst][1][i]))
                bad[src] = bad.get(src, 0) + 1
                bad[dst] = bad.get(dst, 0) + 1
    why = ""
    if pairs:
        top = max(bad.values())
        culprits = sorted(r for r, c in bad.items() if c == top)
        if len(culprits) > 1:
            culprits, why = _break_tie(ctx, members, plans, culprits)
        shown = "; ".join(f"rank {s} keeps {a} row(s) for itself but expects {b}" if s == t
                          else f"rank {s} sends rank {t} {a} row(s), rank {t} expects {b}"
                          for s, t, a, b in pairs[:4])
        more = f" (and {len(pairs) - 4} more pairs)" if len(pairs) > 4 else ""
    elif died_here:
        culprits, sent = _blame_by_aborted(ctx, members, plans)
        if not culprits:
            return None
        pairs = list(sent)
        shown = "; ".join(f"rank {s} sends rank {t}, which gloo aborted, {a} row(s) where "
                          f"no other rank sends it more than {b}" for s, t, a, b in sent[:4])
        more = f" (and {len(sent) - 4} more)" if len(sent) > 4 else ""
        why = ("; the ranks that dumped agree pair by pair, and what the aborted ranks "
               "expected died with them: gloo aborts a rank that receives more than it "
               "posted")
    else:
        return None
    others = sorted(r for r in plans if r not in culprits)
    pending = any(not _done(ctx, r, key, seq) for r in plans)
    who = ranks_phrase(culprits)
    where = frame_text(ctx.frame_at(culprits[0], key, seq))
    if len(culprits) == 1:
        lead = (f"{who.capitalize()}'s all_to_all split sizes for all_to_all #{seq} of "
                f"{g.label()} disagree with what its peers expect ({shown}{more}){why}; "
                f"its call is at {where}")
    else:
        lead = (f"{who.capitalize()} disagree about the split sizes of all_to_all #{seq} of "
                f"{g.label()} ({shown}{more}) and the records cannot tell which side is "
                f"wrong; {ranks_phrase(culprits[:1])} called it at {where}")
    tail = "" if pending else "; it completed, so the job went on with wrong data"
    return Finding(
        kind="split_mismatch", group=g, collective_seq_id=seq, op=ALL_TO_ALL,
        culprit_ranks=culprits, waiting_ranks=others if pending else [],
        blocking=pending, message=lead + tail + ".",
        details={"pairs": [list(p) for p in pairs], "tie": len(culprits) > 1,
                 "frames": {culprits[0]: ctx.frame_at(culprits[0], key, seq)}},
    )


def _died_in(ctx: Context, g: Group, key: str, seqs: list[int]) -> int | None:
    """The all_to_all of ``g`` in which members gloo aborted died: the newest of
    ``seqs`` that a rank with a dump recorded at the line their fatal logs name (no
    later call of the group can have finished without them)."""
    lines = set()
    for r in g.ranks:
        log = ctx.load.fatal.get(r)
        if r in ctx.load.dumps or log is None or "abort" not in log.error.lower():
            continue
        frame = user_frame([{"name": n, "filename": f, "line": ln} for n, f, ln in log.frames])
        if frame is not None:
            lines.add((frame[1], frame[2]))
    if not lines:
        return None
    for seq in reversed(seqs):
        for r in g.ranks:
            frame = ctx.frame_at(r, key, seq) if r in ctx.load.dumps else None
            if frame is not None and (frame[1], frame[2]) in lines:
                return seq
    return None


def split_findings(ctx: Context) -> list[Finding]:
    """One ``split_mismatch`` per group, at its first all_to_all whose pairs disagree."""
    findings: list[Finding] = []
    for key in sorted(ctx.views):
        g = ctx.views[key].group
        seqs: set[int] = set()
        for r in g.ranks:
            d = ctx.load.dumps.get(r)
            if d is not None and d.splits:
                seqs.update(s for (name, s) in d.splits if name in (key, g.name))
        died = _died_in(ctx, g, key, sorted(seqs))
        for seq in sorted(seqs):
            found = _check(ctx, g, key, seq, seq == died)
            if found is not None:
                findings.append(found)
                break
    return findings
