"""Everything one analysis knows, with lookups the diagnosis steps share."""

from __future__ import annotations

from dataclasses import dataclass, field

from commscope.analyze.align.arrivals import Arrivals
from commscope.analyze.align.match import GroupView, P2PIssue
from commscope.analyze.align.progress import RankProgress
from commscope.analyze.model import GAP, Group, HostMap, LoadResult, Sig
from commscope.analyze.read.frame_source import FrameSource
from commscope.analyze.read.places import Frame
from commscope.analyze.text import frame_text

__all__ = ["Context"]


@dataclass
class Context:
    """The loaded dumps, groups, alignments and p2p pairing of one analysis."""

    load: LoadResult
    groups: dict[str, Group]
    views: dict[str, GroupView]
    p2p: list[P2PIssue]
    expected: list[int]
    frames: FrameSource
    stale: dict[int, int] = field(default_factory=dict)
    """Rank → how many ns its dump is older than the others' median (crashed early)."""
    hosts: HostMap = field(default_factory=lambda: HostMap({}))
    """Where every rank ran, from the dumps' places and host tables."""
    arrivals: dict[str, Arrivals] | None = None
    """Group key → its arrival figures (:mod:`commscope.analyze.align.arrivals`), when
    worked out once for the whole analysis."""
    away: dict[str, list[int]] = field(default_factory=dict)
    """Host → its ranks whose dumps are on that host, not here (never crashed for it)."""
    progress: dict[int, RankProgress] = field(default_factory=dict)
    """Rank → how far it issued and finished, and its unfinished work in order
    (:mod:`commscope.analyze.align.progress`)."""

    @property
    def device(self) -> bool:
        """The job's dumps are of a device backend (NCCL and the like): calls returned at
        once, unfinished records are device queues (:mod:`.queues`), not waits."""
        kinds = [d.kind for d in self.load.dumps.values() if d.kind is not None]
        return bool(kinds) and sum(k.device for k in kinds) * 2 > len(kinds)

    def sig(self, rank: int, group: str, seq: int) -> Sig | None:
        """The signature of ``rank``'s collective ``seq`` in ``group``."""
        d = self.load.dumps.get(rank)
        t = d.tracks.get(group) if d else None
        if t is None or not t.lo <= seq <= t.hi:
            return None
        sid = t.sig[seq - t.lo]
        return None if sid == GAP else self.load.sigs.sigs[sid]

    def index(self, rank: int, group: str, seq: int) -> int | None:
        """Position in ``rank``'s file of its record of ``seq`` in ``group``."""
        d = self.load.dumps.get(rank)
        t = d.tracks.get(group) if d else None
        if t is None or not t.lo <= seq <= t.hi:
            return None
        i = t.index[seq - t.lo]
        return None if i < 0 else i

    def frame_at(self, rank: int, group: str, seq: int) -> Frame | None:
        """User frame of ``rank``'s record of ``seq`` in ``group``."""
        return self.frames.frame(rank, self.index(rank, group, seq))

    def op_at(self, rank: int, group: str, seq: int) -> str:
        """``all_reduce #4`` (or ``#4`` when unknown)."""
        sig = self.sig(rank, group, seq)
        return f"{sig.op} #{seq}" if sig else f"#{seq}"

    def last_activity(self, rank: int) -> tuple[str, Frame | None]:
        """``broadcast #3 of group 0`` and its frame: the rank's newest record."""
        d = self.load.dumps.get(rank)
        if d is None or d.last is None:
            return "nothing (its dump holds no record)", None
        group, seq, index = d.last
        frame = self.frames.frame(rank, index)
        if seq < 0:
            op = next((o for o in d.p2p if o.index == index), None)
            if op is None:
                what = "a send/recv"
            else:
                side = "to" if op.op == "send" else "from"
                what = f"{op.op} {side} rank {op.peer}" if op.peer is not None else op.op
            return f"{what} in {self.group_ref(group)}", frame
        return f"{self.op_at(rank, group, seq)} of {self.group_ref(group)}", frame

    def last_text(self, rank: int) -> str:
        """``all_reduce #3 of group 0 at train.py:42 in step``: the rank's newest record
        and where it was issued (``(no stack recorded)`` when its dump has no stacks,
        ``nothing (its dump holds no record)`` when it has no record)."""
        activity, frame = self.last_activity(rank)
        if frame is not None:
            return f"{activity} at {frame_text(frame)}"
        d = self.load.dumps.get(rank)
        return activity if d is None or d.last is None else f"{activity} (no stack recorded)"

    def group_ref(self, group: str) -> str:
        """``group 0`` or ``group mesh_dp (d876ba23)`` (see :meth:`Group.ref`)."""
        g = self.groups.get(group)
        return g.ref() if g is not None else f"group {group}"

    def on_hosts(self, ranks: list[int]) -> str:
        """`` (hostB, pid 4242)`` for one rank, `` (on hostA, hostB)`` for several, when the
        job spans more than one host; ``""`` on one host or when the dumps do not say."""
        if len(self.hosts.hosts()) < 2:
            return ""
        if len(ranks) == 1:
            label = self.hosts.label(ranks[0])
            return f" ({label})" if label else ""
        names = list(dict.fromkeys(h for h in (self.hosts.host(r) for r in ranks) if h))
        if not names:
            return ""
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more hosts"
                                         if len(names) > 4 else "")
        return f" (on {shown})"

    def where(self, rank: int, group: str, seq: int) -> str:
        """``make.py:12 in step`` for a record, or a note that no stack was recorded."""
        return frame_text(self.frame_at(rank, group, seq))
