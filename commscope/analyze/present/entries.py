"""The newest records of each group, side by side across its ranks (``--entries``).

What PyTorch's ``fr_trace -j`` prints as one wide table of every rank's entries, told
compactly enough for thousands of ranks: one line per sequence number of a group, the
ranks that agree folded into one rank list.

Algorithm (:func:`format_entries`), per group that passes the filters:

1. The shown ranks are the group's members that pass ``--ranks``; the shown sequence
   numbers are the newest ``last`` up to the highest any shown rank reached.
2. Each shown rank gets, for each sequence number, a cell: its record's signature and
   state (``done``, ``started``, ``pending``: issued, not seen started), or why it has
   none (``not issued``: the rank never got that far; ``skipped``: no record inside its
   own range; ``not kept``: its ring wrapped past it; ``no dump``).
3. Ranks with the same cell are folded into one rank list. When every rank that has a
   record shows the same signature, it is printed once at the head of the line; when
   they disagree on what must match (op, sizes, dtypes) the line is marked ``!``.

Point-to-point ops follow, per group and shown rank: the newest ``last`` sends and recvs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from commscope.analyze.align.match import GroupView
from commscope.analyze.analysis import Analysis
from commscope.analyze.model import COMPLETED, GAP, RETIRED, STARTED, Group, P2POp, Sig
from commscope.analyze.text import rank_list, ranks_phrase

__all__ = ["format_entries", "parse_rank_spec", "DEFAULT_LAST"]

DEFAULT_LAST = 8
"""Sequence numbers shown per group when ``--entries`` is given without a number."""
_MAX_SPEC_RANKS = 1 << 20
_MAX_P2P_RANKS = 16
_MAX_GROUPS = 16
_DONE = RETIRED | COMPLETED
_DISAGREE = "ranks disagree:"
_PER_RANK = "per rank:"


def parse_rank_spec(spec: str) -> list[int]:
    """``"0-3,7"`` → ``[0, 1, 2, 3, 7]``; raises ``ValueError`` saying what is wrong."""
    out: set[int] = set()
    for part in spec.replace(" ", "").split(","):
        if not part:
            continue
        lo_text, dash, hi_text = part.partition("-")
        if not lo_text.isdigit() or (dash and not hi_text.isdigit()):
            raise ValueError(f"bad rank list {spec!r}: expected ranks like 0-3,7 (at {part!r})")
        lo = int(lo_text)
        hi = int(hi_text) if dash else lo
        if hi < lo:
            raise ValueError(f"bad rank list {spec!r}: range {part!r} runs backwards")
        if hi - lo + len(out) > _MAX_SPEC_RANKS:
            raise ValueError(f"bad rank list {spec!r}: more than {_MAX_SPEC_RANKS} ranks")
        out.update(range(lo, hi + 1))
    if not out:
        raise ValueError(f"bad rank list {spec!r}: no rank in it")
    return sorted(out)


@dataclass(frozen=True, slots=True)
class _Cell:
    """What one rank shows for one sequence number."""

    sig: int
    """Signature id, or ``GAP`` when the rank has no record."""
    state: str


def _state(status: int) -> str:
    if status & _DONE:
        return "done"
    return "started" if status & STARTED else "pending"


def _sig_text(sig: Sig, sigs: list[Sig]) -> str:
    """``all_reduce [[4]] Float``; a coalesced group lists its members (not the closing
    ``coalesced`` marker record NCCL adds)."""
    if sig.members:
        parts = [_sig_text(sigs[m], sigs) for m in sig.members
                 if not (sigs[m].op == "coalesced" and not sigs[m].input_sizes)]
        return f"coalesced({', '.join(parts)})"
    return f"{sig.op} {sig.sizes_text()}"


def _matches(group: Group, wanted: set[str]) -> bool:
    return bool(wanted & {group.key, group.name, group.display, group.desc})


def _cell(a: Analysis, view: GroupView, rank: int, seq: int) -> _Cell:
    dump = a.load.dumps.get(rank)
    if dump is None:
        return _Cell(GAP, "no dump")
    track = dump.tracks.get(view.group.key)
    if track is None or seq > track.hi:
        return _Cell(GAP, "not kept" if track is None and rank in view.unknown else "not issued")
    if seq < track.lo:
        return _Cell(GAP, "not kept" if dump.wrapped else "not issued")
    i = seq - track.lo
    sig = track.sig[i]
    if sig == GAP:
        return _Cell(GAP, "skipped")
    return _Cell(sig, _state(track.status[i]))


def _row(a: Analysis, view: GroupView, ranks: list[int], seq: int) -> tuple[str, str, str]:
    """(mark, head, rank cells) of one sequence number."""
    cells: dict[_Cell, list[int]] = {}
    for r in ranks:
        cells.setdefault(_cell(a, view, r, seq), []).append(r)
    sigs = a.load.sigs
    recorded = {c.sig for c in cells if c.sig != GAP}
    differs = len({sigs.match_keys[s] for s in recorded}) > 1
    order = sorted(cells.items(), key=lambda kv: kv[1][0])
    if not recorded:  # the shown ranks have none: say what the others issued there
        recorded = {c.sig for c in (_cell(a, view, r, seq) for r in view.spans)
                    if c.sig != GAP}
        recorded = {min(recorded)} if recorded else recorded
    if len(recorded) == 1:
        head = _sig_text(sigs.sigs[next(iter(recorded))], sigs.sigs)
        parts = [f"{rank_list(rs, 6)} {c.state}" for c, rs in order]
    else:
        head = "(no record)" if not recorded else (_DISAGREE if differs else _PER_RANK)
        parts = [f"{rank_list(rs, 6)} "
                 + (f"{_sig_text(sigs.sigs[c.sig], sigs.sigs)} {c.state}" if c.sig != GAP
                    else c.state)
                 for c, rs in order]
    return ("!" if differs else " ", head, "; ".join(parts))


def _p2p_text(op: P2POp) -> str:
    peer = "?" if op.peer is None else op.peer
    arrow = f"send → {peer}" if op.op == "send" else f"recv ← {peer}"
    return f"{arrow} #{op.p2p_seq} {_state(op.status)}"


def _group_lines(a: Analysis, view: GroupView, shown: set[int] | None, last: int) -> list[str]:
    g = view.group
    ranks = [r for r in g.ranks if shown is None or r in shown]
    if not ranks:
        return []
    # The range is the whole group's, so a filtered rank that never got as far as the
    # others shows "not issued" there.
    top = view.max_hi
    lines = []
    if top >= 1:
        first = min((lo for lo, hi in view.spans.values() if hi >= 1), default=1)
        start = max(first, top - last + 1, 1)
        span = f"#{start}" if start == top else f"#{start}-#{top}"
        older = f" (recorded from #{first})" if first < start else ""
        which = "" if shown is None else f", {ranks_phrase(ranks)} shown"
        lines.append(f"{g.label()}: {span}{older}{which}")
        rows = [(seq, *_row(a, view, ranks, seq)) for seq in range(start, top + 1)]
        seq_w = max(len(str(seq)) for seq, *_ in rows) + 1
        split = (_DISAGREE, _PER_RANK)
        head_w = max((len(head) for _, _, head, _ in rows if head not in split), default=0)
        lines += [f" {mark}{'#' + str(seq):<{seq_w}}  "
                  + (f"{head} {cells}" if head in split else f"{head:<{head_w}}  {cells}")
                  for seq, mark, head, cells in rows]
    return lines + _p2p_lines(a, g, ranks, last, lines)


def _p2p_lines(a: Analysis, g: Group, ranks: list[int], last: int, before: list[str]
               ) -> list[str]:
    """Each shown rank's newest ``last`` sends and recvs in ``g``; at most
    ``_MAX_P2P_RANKS`` ranks, those with an unfinished op first."""
    newest: dict[int, list[P2POp]] = {}
    for r in ranks:
        dump = a.load.dumps.get(r)
        ops = [op for op in (dump.p2p if dump else ()) if op.group == g.key]
        if ops:
            newest[r] = sorted(ops, key=lambda o: (o.created, o.index))[-last:]
    if not newest:
        return []
    stuck = [r for r, ops in newest.items() if any(not o.status & _DONE for o in ops)]
    chosen = sorted(list(dict.fromkeys([*stuck, *newest]))[:_MAX_P2P_RANKS])
    out = [] if before else [f"{g.label()}:"]
    out.append("  point-to-point, oldest to newest:")
    out += [f"   rank {r}: " + ", ".join(map(_p2p_text, newest[r])) for r in chosen]
    if len(newest) > len(chosen):
        out.append(f"   ... and {len(newest) - len(chosen)} more ranks with sends or recvs "
                   "(choose them with --ranks)")
    return out


def format_entries(a: Analysis, *, last: int = DEFAULT_LAST, ranks: Iterable[int] | None = None,
                   groups: Iterable[str] | None = None) -> str:
    """The newest ``last`` collectives of each group, side by side (see module doc).

    ``ranks`` keeps only those ranks; ``groups`` only the groups named so (by name,
    shown name, or description). Raises ``ValueError`` when a filter matches nothing.
    """
    if last < 1:
        raise ValueError(f"the number of entries to show must be >= 1, got {last}")
    shown = set(ranks) if ranks is not None else None
    wanted = set(groups) if groups is not None else None
    views = [v for _, v in sorted(a.views.items(), key=lambda kv: (len(kv[0]), kv[0]))
             if wanted is None or _matches(v.group, wanted)]
    with_p2p = {op.group for d in a.load.dumps.values() for op in d.p2p}
    views = [v for v in views if v.max_hi >= 1 or v.group.key in with_p2p]  # has records
    more = 0
    if wanted is None and len(views) > _MAX_GROUPS:
        # Many groups (one per TP or PP stage): the ones the findings name come first,
        # then those where the job stops, in the usual order otherwise.
        named = {f.group.key for f in a.findings if f.group is not None}
        ranked = sorted(range(len(views)), key=lambda i: (
            views[i].group.key not in named, views[i].frontier is None, i))
        keep = sorted(ranked[:_MAX_GROUPS])
        more = len(views) - len(keep)
        views = [views[i] for i in keep]
    if wanted is not None and not views:
        known = ", ".join(sorted({v.group.display for v in a.views.values()})) or "none"
        raise ValueError(f"no group named {', '.join(sorted(wanted))} (groups: {known})")
    if shown is not None and not any(r in shown for v in views for r in v.group.ranks):
        raise ValueError(f"none of ranks {rank_list(shown)} is in the groups shown")
    out = [f"entries (newest {last} per group; ! = ranks disagree on op, sizes or dtypes):"]
    for v in views:
        out += _group_lines(a, v, shown, last)
    if more:
        out.append(f"... and {more} more groups (those named by a finding or where the job "
                   "stops come first; choose others with --group)")
    return "\n".join(out) + "\n"
