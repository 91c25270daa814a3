"""Findings for ranks that disagree about a collective: op, order, size, dtype, skipped.

Algorithm (:func:`mismatch_findings`), per group, over its mismatches in sequence order:

1. Skip a mismatch whose culprits were already reported for this group: once a rank is
   off by one collective, every later one differs too (counted, not repeated).
2. Compare the culprit's match keys from ``seq`` on with the majority's (a reference
   rank among the majority, the lowest), in this order:
   * the first ``k`` (2 to 8) are a permutation of the majority's, not equal, and the
     rest of what both recorded is equal: ``order_mismatch`` (later mismatches inside
     that window are part of it);
   * both recorded as many collectives and the rest lines up unshifted (``c[s+k] ==
     m[s+k]`` for ``k >= 1``): one call differs, go to step 3 (with the same op every
     step a shift fits too, but a skipped or extra call leaves one side a record short
     or over);
   * the same op with other arguments (a dtype, a shape) and the rest lines up
     unshifted: one call differs, go to step 3, whatever the counts (a job dumped while
     it runs is caught a step apart, and in a loop of alike calls a shift fits too);
   * the culprit's collectives equal the majority's shifted by one (``c[s+k] ==
     m[s+k+1]``): the culprit **skipped** collective ``seq`` (``missing_rank``);
   * shifted the other way: it issued an **extra** collective (``op_mismatch``);
3. otherwise by what differs between the culprit's and the majority's signature: the
   op (``op_mismatch``), the shapes (``size_mismatch``), the dtypes
   (``dtype_mismatch``), the root of a rooted op (``root_mismatch``), else the reduce
   op (``reduce_op_mismatch``). (all_to_all split sizes are checked pair by pair in
   :mod:`~commscope.analyze.diagnose.splits`: ``split_mismatch``.)
4. A mismatch with an unfinished record is *blocking* (the job stopped there); a
   finished one is a bug the job survived (desync: e.g. float32 against int32 of the
   same byte size completes on gloo with garbage).
5. A tie (no majority: a group of two) whose two sides issued #s at two different lines
   of code is put to the ranks outside the group: in the one group of theirs with the
   same description (the other tp group of a mesh), those that issued the first
   side's line as #s and the second side's as #s+1 say the second side skipped the
   first's call (``missing_rank``), and the other way round; the side more of them
   name is the culprit.
6. A tie that evidence could not break names every side as a culprit and says so.

:func:`print_findings` adds what the records alone cannot show: groups whose members'
running fingerprints part (:mod:`commscope.analyze.align.prints`) where no record-based
disagreement of that group was found (a progress record keeps a few records; a dump's
ring may have dropped the collective). Exact splits are told by what differs, as above
(``dtype_mismatch`` ...); a split older than the kept folds is a
``fingerprint_mismatch`` ("at or before #k"). A side that merely skipped a collective
is left to the waits.
"""

from __future__ import annotations

from dataclasses import replace

from commscope.analyze.align.match import GroupView, Mismatch
from commscope.analyze.align.prints import PrintSplit, compare_prints
from commscope.analyze.diagnose.context import Context
from commscope.analyze.diagnose.skips import MAX_WITNESSES
from commscope.analyze.model import Finding, PrintWhat, Sig, Track
from commscope.analyze.text import frame_text, ranks_phrase

__all__ = ["mismatch_findings", "pending_mismatch_ranks", "print_findings", "MISMATCH_KINDS"]

MISMATCH_KINDS = ("op_mismatch", "order_mismatch", "size_mismatch", "dtype_mismatch",
                  "root_mismatch", "reduce_op_mismatch", "split_mismatch",
                  "fingerprint_mismatch")
"""The kinds of a disagreement about one call (a skipped one is a ``missing_rank``)."""

_WINDOW = 8
_VAGUE_DESCS = ("", "undefined")


def pending_mismatch_ranks(ctx: Context) -> set[int]:
    """Ranks inside an unfinished collective that their group disagrees about."""
    out: set[int] = set()
    for view in ctx.views.values():
        for m in view.mismatches:
            if m.pending:
                out.update(r for rs in m.by_key.values() for r in rs)
    return out


def _keys(track: Track, seq: int, n: int) -> list[int]:
    start = seq - track.lo
    return list(track.mk[start:start + n]) if track.mk is not None else []


def _shape(ctx: Context, view: GroupView, m: Mismatch, culprit: int) -> tuple[str, int]:
    """Step 2: ``skip``, ``extra``, ``order`` (with its window length) or ``plain``."""
    if not m.agreeing:
        return "plain", 1
    key = view.group.key
    ref_t = ctx.load.dumps[m.agreeing[0]].tracks[key]
    cul_t = ctx.load.dumps[culprit].tracks[key]
    c = _keys(cul_t, m.seq, _WINDOW + 1)
    r = _keys(ref_t, m.seq, _WINDOW + 1)
    overlap = min(len(c), len(r))
    for k in range(2, min(overlap, _WINDOW) + 1):
        if sorted(c[:k]) == sorted(r[:k]) and c[:k] != r[:k] and c[k:overlap] == r[k:overlap]:
            return "order", k
    if overlap >= 2 and cul_t.hi == ref_t.hi and c[1:overlap] == r[1:overlap]:
        return "plain", 1  # as many records, the rest unshifted: one call differs
    if overlap >= 2 and c[1:overlap] == r[1:overlap] and _same_op(ctx, key, m.seq, culprit,
                                                                  m.agreeing[0]):
        # the same op with other arguments and the rest unshifted: one call differs (in a
        # loop of alike calls a shift fits too, but the op says it is the same call; the
        # counts cannot tell in a job dumped while it runs, caught mid-step)
        return "plain", 1
    n = min(len(c), len(r) - 1)
    if n >= 1 and c[:n] == r[1:n + 1]:
        return "skip", 1
    n = min(len(c) - 1, len(r))
    if n >= 1 and c[1:n + 1] == r[:n]:
        return "extra", 1
    return "plain", 1


def _same_op(ctx: Context, key: str, seq: int, a: int, b: int) -> bool:
    """Whether ranks ``a`` and ``b`` issued the same op (not coalesced) as ``seq``."""
    x, y = ctx.sig(a, key, seq), ctx.sig(b, key, seq)
    return x is not None and y is not None and not x.members and not y.members \
        and x.op == y.op


def _sig_kind(ctx: Context, a: Sig | None, b: Sig | None) -> str:
    if a is not None and b is not None and a.members and b.members:
        if len(a.members) != len(b.members):
            return "op_mismatch"
        table = ctx.load.sigs.sigs
        for x, y in zip(a.members, b.members):
            kind = _sig_kind(ctx, table[x], table[y])
            if table[x] != table[y]:
                return kind
        return "op_mismatch"
    if a is None or b is None or a.op != b.op or bool(a.members) != bool(b.members):
        return "op_mismatch"
    if a.input_sizes != b.input_sizes or a.output_sizes != b.output_sizes:
        return "size_mismatch"
    if a.input_dtypes != b.input_dtypes or a.output_dtypes != b.output_dtypes:
        return "dtype_mismatch"
    if a.root != b.root:
        return "root_mismatch"
    if a.reduce_op != b.reduce_op:
        return "reduce_op_mismatch"
    return "op_mismatch"


def _sig_text(sig: Sig | None, ctx: Context | None = None, every_arg: bool = False) -> str:
    if sig is None:
        return "an unreadable record"
    if sig.members and ctx is not None:
        parts = "; ".join(_sig_text(ctx.load.sigs.sigs[m], every_arg=every_arg)
                          for m in sig.members[:4])
        more = ", ..." if len(sig.members) > 4 else ""
        return f"{len(sig.members)} coalesced ops [{parts}{more}]"
    return f"{sig.op} ({sig.sizes_text(every_arg)})"


def _line(ctx: Context, rank: int, key: str, seq: int) -> tuple[str, int] | None:
    frame = ctx.frame_at(rank, key, seq)
    return (frame[1], frame[2]) if frame is not None else None


def _witnessed_skip(ctx: Context, view: GroupView, m: Mismatch
                    ) -> tuple[list[int], list[int], list[int]] | None:
    """Step 5: ``(skipped, kept, witnesses)`` when the two sides of a tie issued #s at
    two lines and the ranks outside the group, in the one group of theirs with the same
    description (a sibling: the other tp group of a mesh), issued the first side's line
    as #s and the second's as #s+1 (more of them than the other way round): the second
    side skipped the first's call. ``None`` otherwise."""
    desc = view.group.desc
    if len(m.by_key) != 2 or desc in _VAGUE_DESCS:
        return None
    (_, a), (_, b) = sorted(m.by_key.items())
    key, seq = view.group.key, m.seq
    line_a, line_b = _line(ctx, a[0], key, seq), _line(ctx, b[0], key, seq)
    if line_a is None or line_b is None or line_a == line_b:
        return None
    outside = sorted(r for r in ctx.load.dumps if r not in view.group.ranks)
    a_skipped: list[int] = []
    b_skipped: list[int] = []
    for w in outside[:MAX_WITNESSES]:
        sibs = [k for k in ctx.load.dumps[w].tracks
                if k != key and k in ctx.groups and ctx.groups[k].desc == desc]
        if len(sibs) != 1:
            continue
        there = (_line(ctx, w, sibs[0], seq), _line(ctx, w, sibs[0], seq + 1))
        if there == (line_b, line_a):
            a_skipped.append(w)
        elif there == (line_a, line_b):
            b_skipped.append(w)
    if len(a_skipped) > len(b_skipped):
        return sorted(a), sorted(b), a_skipped
    if len(b_skipped) > len(a_skipped):
        return sorted(b), sorted(a), b_skipped
    return None


def _one(ctx: Context, view: GroupView, m: Mismatch) -> tuple[Finding, int]:
    g = view.group
    key = g.key
    witnessed = _witnessed_skip(ctx, view, m) if m.tie else None
    if witnessed is not None:
        m = replace(m, culprits=witnessed[0], agreeing=witnessed[1], majority=None,
                    tie=False)
    culprit = m.culprits[0]
    ref = m.agreeing[0] if m.agreeing else None
    c_sig = ctx.sig(culprit, key, m.seq)
    r_sig = ctx.sig(ref, key, m.seq) if ref is not None else None
    where = frame_text(ctx.frame_at(culprit, key, m.seq))
    who = ranks_phrase(m.culprits)
    others = ranks_phrase(m.agreeing) if m.agreeing else ""
    shape, span = ("skip", 1) if witnessed is not None else _shape(ctx, view, m, culprit)
    tail = "" if m.pending else "; it completed, so the job went on with wrong data"
    frames = {culprit: ctx.frame_at(culprit, key, m.seq)}
    if m.tie:
        kind = _sig_kind(ctx, ctx.sig(m.culprits[0], key, m.seq),
                         ctx.sig(m.culprits[-1], key, m.seq))
        every = kind == "reduce_op_mismatch"  # then SUM is worth saying too
        variants = "; ".join(
            f"{ranks_phrase(rs)}: {_sig_text(ctx.sig(rs[0], key, m.seq), ctx, every)}"
            for _, rs in sorted(m.by_key.items()))
        msg = (f"The ranks of {g.label()} disagree about collective #{m.seq} and no side has "
               f"a majority ({variants}); {ranks_phrase(m.culprits[:1])} called it at {where}"
               f"{tail}.")
        op = c_sig.op if c_sig else None
    elif witnessed is not None:
        kind = "missing_rank"
        op = r_sig.op if r_sig else None
        seen = ranks_phrase(witnessed[2])
        msg = (f"{who.capitalize()} skipped {_sig_text(r_sig, ctx)} #{m.seq} of {g.label()} that "
               f"{others} called, and {'its' if len(m.culprits) == 1 else 'their'} "
               f"#{m.seq} is the next call ({_sig_text(c_sig, ctx)}, at {where}): {seen}, "
               f"in their own {g.desc} group, issued {others}'s call as #{m.seq} and "
               f"{who}'s as #{m.seq + 1}{tail}.")
    elif shape == "skip":
        kind = "missing_rank"
        op = r_sig.op if r_sig else None
        msg = (f"{who.capitalize()} skipped {_sig_text(r_sig, ctx)} #{m.seq} of {g.label()} that "
               f"{others} called: {who}'s collective #{m.seq} is the others' #{m.seq + 1} "
               f"({_sig_text(c_sig, ctx)}, at {where}){tail}.")
    elif shape == "extra":
        kind = "op_mismatch"
        op = c_sig.op if c_sig else None
        msg = (f"{who.capitalize()} issued an extra {_sig_text(c_sig, ctx)} as #{m.seq} of "
               f"{g.label()} at {where}, which {others} never called{tail}.")
    elif shape == "order":
        kind = "order_mismatch"
        op = c_sig.op if c_sig else None
        mine = ", ".join(ctx.op_at(culprit, key, s) for s in range(m.seq, m.seq + span))
        theirs = ", ".join(ctx.op_at(ref, key, s) for s in range(m.seq, m.seq + span)) \
            if ref is not None else "?"
        msg = (f"{who.capitalize()} issued the same collectives of {g.label()} in a different "
               f"order than {others}: {mine} against {theirs}, starting at {where}{tail}.")
    else:
        kind = _sig_kind(ctx, c_sig, r_sig)
        op = c_sig.op if c_sig else None
        every = kind == "reduce_op_mismatch"  # then SUM is worth saying too
        msg = (f"{who.capitalize()} called {_sig_text(c_sig, ctx, every)} as #{m.seq} of "
               f"{g.label()} where {others} called {_sig_text(r_sig, ctx, every)}, at "
               f"{where}{tail}.")
    finding = Finding(
        kind=kind, group=g, collective_seq_id=m.seq, op=op,
        culprit_ranks=list(m.culprits), waiting_ranks=list(m.agreeing) if m.pending else [],
        message=msg, blocking=m.pending,
        details={"frames": frames, "shape": shape, "tie": m.tie},
    )
    return finding, span


def mismatch_findings(ctx: Context) -> list[Finding]:
    """One finding per distinct disagreement (see module doc)."""
    findings: list[Finding] = []
    for key in sorted(ctx.views):
        view = ctx.views[key]
        reported: dict[tuple[int, ...], Finding] = {}
        covered_until = -1
        for m in view.mismatches:
            culprits = tuple(m.culprits)
            if m.seq <= covered_until:
                continue
            if culprits in reported:
                found = reported[culprits]
                found.details["later"] = found.details.get("later", 0) + 1
                continue
            finding, span = _one(ctx, view, m)
            covered_until = m.seq + span - 1
            reported[culprits] = finding
            findings.append(finding)
        if view.more_mismatches and reported:
            first = next(iter(reported.values()))
            first.details["later"] = first.details.get("later", 0) + view.more_mismatches
    for f in findings:
        later = f.details.get("later")
        if later:
            f.message = f.message[:-1] + (f" ({later} later collective(s) of this group also "
                                          "differ as a consequence).")
    return findings


def _what_kind(a: PrintWhat | None, b: PrintWhat | None) -> str:
    if a is None or b is None:
        return "fingerprint_mismatch"
    if a.op != b.op:
        return "op_mismatch"
    if a.sizes != b.sizes:
        return "size_mismatch"
    if a.dtypes != b.dtypes:
        return "dtype_mismatch"
    if a.root != b.root:
        return "root_mismatch"
    if a.reduce_op != b.reduce_op:
        return "reduce_op_mismatch"
    return "fingerprint_mismatch"


def _print_finding(ctx: Context, split: PrintSplit) -> Finding:
    g = ctx.groups[split.group]
    sides = split.sides
    tie = split.tie
    culprits = sorted(r for rs, _ in (sides if tie else sides[1:]) for r in rs)
    first = sides[1] if not tie else sides[0]
    kind = _what_kind(sides[0][1], sides[1][1]) if split.exact else "fingerprint_mismatch"
    seq = split.seq
    variants = "; ".join(f"{ranks_phrase(rs)}: {w.text() if w else 'not kept'}"
                         for rs, w in sides)
    where = ctx.frame_at(first[0][0], split.group, seq)
    at = f", at {frame_text(where)}" if where is not None else ""
    side = ("no side has a majority" if tie else
            f"{ranks_phrase(culprits)} {'differs' if len(culprits) == 1 else 'differ'} "
            f"from {ranks_phrase(sides[0][0])}")
    if split.exact:
        msg = (f"The ranks of {g.label()} issued different collectives as #{seq} "
               f"({variants}){at}: {side}. It completed, so the job went on with wrong "
               "data; seen in the ranks' running fingerprints.")
    else:
        members = [ctx.load.dumps[r] for rs, _ in sides for r in rs]
        newest = min(d.prints[g.name].seqs[-1] for d in members)
        if any(d.dump_reason == "watch" for d in members):  # progress records
            older = ("What differed is older than the steps a progress record carries; "
                     "`commscope dump` finds it in the ranks' rings")
        else:
            older = ("What differed is older than the records kept (a larger "
                     "TORCH_FR_BUFFER_SIZE keeps more)")
        msg = (f"The ranks of {g.label()} stopped issuing the same collectives at or before "
               f"#{seq}: their running fingerprints differ at every collective all of them "
               f"still keep (#{seq}-#{newest}), {side}. {older}; it completed, so the job "
               "went on with wrong data.")
    return Finding(kind=kind, group=g, collective_seq_id=seq,
                   op=first[1].op if first[1] else None, culprit_ranks=culprits,
                   waiting_ranks=[], message=msg, blocking=False,
                   details={"shape": "plain", "tie": tie, "fingerprint": True,
                            "exact": split.exact, "frames": {}})


def _unfinished(ctx: Context, split: PrintSplit) -> bool:
    """Whether some member's record of the split's collective is unfinished (or issued
    from a signal handler): then the waits tell it, and nobody went on with wrong data."""
    key, seq = split.group, split.seq
    for ranks, _ in split.sides:
        for r in ranks:
            d = ctx.load.dumps.get(r)
            if d is None:
                continue
            if any(g == key and s == seq for g, s, _ in d.pending):
                return True
            if any(g == key and s == seq for _, g, s, _ in d.handler_ops):
                return True
    return False


def print_findings(ctx: Context, findings: list[Finding]) -> list[Finding]:
    """``findings`` (the record-based disagreements) with a finding added per group whose
    fingerprints part where they say nothing of that group (see module doc). Where the
    records are progress records (a few records each, gaps between them), an exact split
    the fingerprints place replaces what the records said of that group at or after it:
    the fingerprints saw every collective, the records only some. So does a tie the
    records could not break where the fingerprints' longer history breaks it."""
    out = list(findings)
    for split in compare_prints(ctx.load, ctx.groups):
        view = ctx.views.get(split.group)
        if split.shifted or split.group not in ctx.groups or _unfinished(ctx, split):
            continue
        told = [f for f in out if f.group is not None and f.group.key == split.group
                and (f.kind in MISMATCH_KINDS or (f.kind == "missing_rank"
                                                  and not f.blocking))]
        sparse = any(ctx.load.dumps[r].dump_reason == "watch"
                     for ranks, _ in split.sides for r in ranks if r in ctx.load.dumps)
        if told and split.exact and not split.tie and (
                (sparse and all(f.collective_seq_id is not None
                                and f.collective_seq_id >= split.seq for f in told))
                or all(f.details.get("tie") and f.collective_seq_id == split.seq
                       for f in told)):
            out = [f for f in out if f not in told]
        elif told or (view is not None and (view.mismatches or view.more_mismatches)
                      and not sparse):
            continue
        out.append(_print_finding(ctx, split))
    return out
