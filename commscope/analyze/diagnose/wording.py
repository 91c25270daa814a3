"""How a finding names a record, a rank's whereabouts and its waiters.

The few phrases that :mod:`~.crashes`, :mod:`~.cycles` and :mod:`~.findings` all put in
their messages. What they decide is only what to say about where a rank is now: a rank
that others wait for and whose dump carries thread stacks is named where its main thread
stands when it has no unfinished work (alive and in no collective); otherwise its last
record is named, and a PyTorch-native dump (no stacks) says that where the rank is now
is unknown.
"""

from __future__ import annotations

from commscope.analyze.diagnose.context import Context
from commscope.analyze.text import frame_text, place_text

__all__ = ["record_status", "record_op", "now_text", "wait_verb"]


def record_status(ctx: Context, rank: int, group: str, seq: int) -> int:
    """The status bits of ``rank``'s record of collective ``seq`` of ``group``."""
    t = ctx.load.dumps[rank].tracks[group]
    return t.status[seq - t.lo]


def record_op(ctx: Context, rank: int, group: str | None, seq: int | None) -> str | None:
    """The op of ``rank``'s record of ``seq`` of ``group`` (``None`` if it has none)."""
    if group is None or seq is None:
        return None
    sig = ctx.sig(rank, group, seq)
    return sig.op if sig else None


def _busy(ctx: Context, rank: int) -> bool:
    """The rank has unfinished work in its dump."""
    d = ctx.load.dumps.get(rank)
    return bool(d and d.pending)


def now_text(ctx: Context, rank: int) -> str:
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


def wait_verb(ranks: list[int]) -> str:
    """``waits`` after one rank, ``wait`` after several."""
    return "waits" if len(ranks) == 1 else "wait"
