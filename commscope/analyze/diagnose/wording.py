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
from commscope.analyze.text import frame_text, place_text, ranks_phrase

__all__ = ["record_status", "record_op", "now_text", "nows_text", "wait_verb"]


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


def _now(ctx: Context, rank: int) -> tuple[str, str]:
    """(what kind of place, its text) of one rank: ranks with equal pairs are told as one."""
    d = ctx.load.dumps.get(rank)
    last = ctx.last_text(rank)
    if d is None:
        return "last", last
    if ctx.frames.has_threads(rank):
        if not _busy(ctx, rank):
            place = ctx.frames.main_place(rank)
            where = place_text(place) if place else "an unknown place (no Python frame)"
            return "idle", f"{where}{_aside(ctx, rank)}|{last}"
        return "last", last
    if d.source == "pytorch":
        return ("native_idle" if not _busy(ctx, rank) else "native"), last
    return "last", last


def _aside(ctx: Context, rank: int) -> str:
    """What else a rank's dump says of where it is: a signal handler that interrupted
    it (and the collectives that handler issued, which are not where it stopped), the
    other threads blocked beside a blocked main thread."""
    d = ctx.load.dumps[rank]
    out = ""
    running = None
    if d.thread_deaths:  # the likely reason it waits outside the collectives
        name, kind, text, place = d.thread_deaths[-1]
        at = f" at {place_text(place)}" if place else ""
        out += f" (its thread {name} died earlier of {kind}: {text[:120]}{at})"
    if d.handler is not None:
        sig, place = d.handler
        running = place_text(place) if place else "an unknown place"
        out += f", interrupted there by {sig}, whose handler now runs at {running}"
    if d.handler_ops:
        sig, group, seq, index = d.handler_ops[-1]
        frame = ctx.frames.frame(rank, index)
        what = f"#{seq} of {ctx.group_ref(group)}" if seq >= 0 else f"an op of {group}"
        same = running is not None and frame is not None and running.startswith(
            frame_text(frame))
        at = "there" if same else f"at {frame_text(frame)}"
        out += (f" (its {sig} handler issued collective {what} {at}: not counted as where "
                "it stopped)")
    if d.main_blocked and d.blocked_threads:
        shown = [f"thread {name} at {place_text(place) if place else 'an unknown place'}"
                 for name, place in d.blocked_threads[:2]]
        more = f" and {len(d.blocked_threads) - 2} more" if len(d.blocked_threads) > 2 else ""
        out += f"; blocked beside it: {'; '.join(shown)}{more}"
    return out


def _render(kind: str, text: str, ranks: list[int], hosts: str = "") -> str:
    one = len(ranks) == 1
    who = ranks_phrase(ranks) + hosts
    their = "its" if one else "their"
    are = "is" if one else "are"
    has = "has" if one else "have"
    if kind == "idle":
        where, last = text.split("|", 1)
        return f"{who} {are} alive and in no collective: at {where}; {their} last record is {last}"
    if kind == "native_idle":
        return (f"{their} last record is {text}; {who} {has} no unfinished record, so "
                f"{'it is' if one else 'they are'} stuck outside the collectives, in "
                f"{'its' if one else 'their'} own code or creating a process group (a "
                "PyTorch-native dump carries no thread stacks and records no group "
                "creation)")
    if kind == "native":
        return (f"{their} last record is {text} (a PyTorch-native dump carries no thread "
                f"stacks, so where {who} {are} now is unknown)")
    return f"{their} last record is {text}"


def now_text(ctx: Context, rank: int) -> str:
    """Where a rank that others wait for is now, as far as its dump tells."""
    return nows_text(ctx, [rank])


def nows_text(ctx: Context, ranks: list[int], limit: int = 4) -> str:
    """:func:`now_text` of several ranks, those in the same place told once
    (``ranks 0-2 are alive and in no collective: at ...``)."""
    groups: dict[tuple[str, str], list[int]] = {}
    for r in ranks:
        groups.setdefault(_now(ctx, r), []).append(r)
    parts = [_render(kind, text, rs, ctx.on_hosts(rs))
             for (kind, text), rs in list(groups.items())[:limit]]
    if len(groups) > limit:
        parts.append(f"and {len(groups) - limit} more")
    return "; ".join(parts)


def wait_verb(ranks: list[int]) -> str:
    """``waits`` after one rank, ``wait`` after several."""
    return "waits" if len(ranks) == 1 else "wait"
