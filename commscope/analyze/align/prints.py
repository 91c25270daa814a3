"""Where the ranks of a group stopped issuing the same collectives, from their fingerprints.

Every recording rank folds each collective it issues on a group into a running
fingerprint (:mod:`commscope.flight.record.agree.fingerprint`) and keeps its newest folds;
dumps and progress records carry them (:mod:`commscope.analyze.read.prints`). Per group
(:func:`compare_prints`):

1. Take, for every member that carries the group's folds, the fingerprint after each
   sequence number it kept (the last fold of a coalesced block), cut to the fewest bits
   any member kept (a progress record keeps 32).
2. At the newest sequence number every member kept, equal fingerprints mean the members
   issued the same collectives up to there: nothing to say. Otherwise the first kept
   sequence number where they differ is where they split; it is *exact* when they still
   agreed one step before (or it is the group's first collective), else the split is
   older than what the folds kept and only "at or before" can be said.
3. The members are partitioned by their fingerprint there; each side comes with what
   its first rank folded at that step (op, shapes, dtypes, root, reduce op).

Pure and cheap: a few comparisons per member when nothing differs (the case of every
healthy refresh of ``commscope watch``).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass

from commscope.analyze.model import Group, LoadResult, PrintWhat

__all__ = ["PrintSplit", "compare_prints"]


@dataclass
class PrintSplit:
    """Members of one group whose fingerprints part at one collective."""

    group: str
    """The group's key."""
    seq: int
    """The first kept sequence number where the fingerprints differ."""
    exact: bool
    """They agreed at the step before (``seq`` is where they split), else it is older."""
    sides: list[tuple[list[int], PrintWhat | None]]
    """Members by fingerprint at ``seq`` (largest side first, then lowest rank), each with
    what its first rank issued there (``None``: not kept)."""
    since: int
    """The oldest sequence number every member kept (where the comparison starts)."""
    tie: bool = False
    """No side is larger, and what each issued there is as frequent in the group's kept
    folds as the others' (nothing tells which side was meant): every side is named."""
    shifted: bool = False
    """A smaller side issued from ``seq`` on what the largest side issued one step later:
    it skipped a collective (the waits will tell), not a different one."""


def _steps(load: LoadResult, rank: int, name: str, mask: int
           ) -> dict[int, tuple[int, PrintWhat | None]]:
    d = load.dumps[rank]
    rows = d.prints[name]
    table = d.print_table
    out: dict[int, tuple[int, PrintWhat | None]] = {}
    for seq, cum, what in zip(rows.seqs, rows.cums, rows.what):
        out[seq] = (cum & mask, table[what] if 0 <= what < len(table) else None)
    return out


def _shifted(steps: dict[int, dict[int, tuple[int, PrintWhat | None]]],
             sides: list[list[int]], split: int) -> bool:
    """Whether a smaller side's folds from ``split`` are the largest side's one later."""
    ref = steps[sides[0][0]]
    for side in sides[1:]:
        mine = steps[side[0]]
        if mine[split][1] == ref[split][1]:
            continue  # the same call there: a difference in what it passed, not a skip
        pairs = [(mine[s][1], ref[s + 1][1]) for s in range(split, split + 8)
                 if s in mine and s + 1 in ref]
        if len(pairs) >= 2 and all(a is not None and a == b for a, b in pairs):
            return True
    return False


def compare_prints(load: LoadResult, groups: dict[str, Group]) -> list[PrintSplit]:
    """Every group whose members' fingerprints differ (see module doc), by group key."""
    found: list[PrintSplit] = []
    for key in sorted(groups):
        g = groups[key]
        members = [r for r in g.ranks
                   if r in load.dumps and g.name in load.dumps[r].prints]
        if len(members) < 2:
            continue
        bits = min(load.dumps[r].print_bits for r in members)
        mask = (1 << bits) - 1
        newest = min(load.dumps[r].prints[g.name].seqs[-1] for r in members)
        firsts = [load.dumps[r].prints[g.name] for r in members]
        at_newest = set()
        for rows in firsts:  # the cheap check first: one fingerprint per member
            i = bisect_right(rows.seqs, newest) - 1  # the last fold of that step
            at_newest.add(rows.cums[i] & mask if i >= 0 and rows.seqs[i] == newest
                          else None)
        if len(at_newest) == 1 and None not in at_newest:
            continue
        steps = {r: _steps(load, r, g.name, mask) for r in members}
        common = sorted(set.intersection(*(set(s) for s in steps.values())))
        if not common:
            continue
        split = next((s for s in common if len({steps[r][s][0] for r in members}) > 1), None)
        if split is None:
            continue
        before = split - 1
        exact = split == 1 or (before in common
                               and len({steps[r][before][0] for r in members}) == 1)
        by_cum: dict[int, list[int]] = {}
        for r in members:
            by_cum.setdefault(steps[r][split][0], []).append(r)
        sides = sorted(by_cum.values(), key=lambda rs: (-len(rs), rs[0]))
        tie = False
        if len(sides) > 1 and len(sides[0]) == len(sides[1]):
            # as the records' check does: the call the group's kept history uses more
            # often is the one meant
            seen = Counter(w for st in steps.values() for _, w in st.values())
            top = [rs for rs in sides if len(rs) == len(sides[0])]
            top.sort(key=lambda rs: (-seen[steps[rs[0]][split][1]], rs[0]))
            counts = [seen[steps[rs[0]][split][1]] for rs in top]
            tie = counts[0] == counts[1] or steps[top[0][0]][split][1] is None
            sides = top + sides[len(top):]
        found.append(PrintSplit(group=key, seq=split, exact=exact, since=common[0],
                                sides=[(rs, steps[rs[0]][split][1]) for rs in sides],
                                tie=tie, shifted=exact and _shifted(steps, sides, split)))
    return found
