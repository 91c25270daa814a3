"""The plain data of a comparison of two comm traces (see :mod:`commscope.comm.present.compare`).

:class:`TraceDiff` holds one :class:`DiffRow` per (module, phase, collective, axis), the
:class:`NetChange` per (collective, axis), the :class:`DiffTotals`, and where each side
came from (:class:`TraceSide`). Every number is kept for both sides; the changes are
properties, ``None`` where a side cannot know them (a PyTorch dump has no bytes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "UNKNOWN_AXIS",
    "DEFAULT_BANDWIDTH_GBPS",
    "DiffInputError",
    "TraceSide",
    "Change",
    "DiffRow",
    "NetChange",
    "DiffTotals",
    "Growth",
    "TraceDiff",
]

UNKNOWN_AXIS = "?"
"""The axis of a row when one of the traces cannot tell (a PyTorch dump)."""
DEFAULT_BANDWIDTH_GBPS = 100.0
"""Bus bandwidth (decimal GB/s) for time estimates when none is given."""


class DiffInputError(ValueError):
    """A trace that cannot be compared: missing, not JSON, or not a comm dump."""


@dataclass(frozen=True, slots=True)
class TraceSide:
    """Where one side of a comparison came from."""

    label: str
    """The file name, or ``a`` / ``b`` (or the label given) for in-memory traces."""
    source: str
    """``commscope`` (a record per collective) or ``pytorch`` (counts per module only)."""
    rank: int | None = None
    world_size: int | None = None
    torch_version: str = ""
    modules: tuple[str, ...] = ()
    """Every module FQN of the trace's tree, ``Global`` first, pre-order."""

    @property
    def has_bytes(self) -> bool:
        """True when the trace knows bytes, axes and group sizes (commscope's records)."""
        return self.source == "commscope"

    def describe(self) -> str:
        """``a.json (commscope, rank 0 of 4, torch 2.13.0)``."""
        parts = [self.source if self.has_bytes else "pytorch: counts only, no bytes or axes"]
        if self.rank is not None:
            where = f"rank {self.rank}"
            parts.append(f"{where} of {self.world_size}" if self.world_size else where)
        if self.torch_version:
            parts.append(f"torch {self.torch_version}")
        return f"{self.label} ({', '.join(parts)})"


@dataclass(frozen=True, slots=True)
class Change:
    """Calls, bytes and estimated time before (``a``) and after (``b``)."""

    calls_before: int
    calls_after: int
    bytes_before: int | None
    """``None`` when that trace does not know bytes (a PyTorch dump)."""
    bytes_after: int | None
    est_us_before: float | None
    """Estimated time in microseconds at the diff's bandwidth; ``None`` when unknown."""
    est_us_after: float | None

    @property
    def calls_delta(self) -> int:
        """``calls_after - calls_before``."""
        return self.calls_after - self.calls_before

    @property
    def bytes_delta(self) -> int | None:
        """``bytes_after - bytes_before``; ``None`` when either is unknown."""
        if self.bytes_before is None or self.bytes_after is None:
            return None
        return self.bytes_after - self.bytes_before

    @property
    def est_us_delta(self) -> float | None:
        """``est_us_after - est_us_before``; ``None`` when either is unknown."""
        if self.est_us_before is None or self.est_us_after is None:
            return None
        return self.est_us_after - self.est_us_before

    @property
    def est_changed(self) -> bool:
        """True when both estimates are known and differ by more than rounding noise."""
        x, y = self.est_us_before, self.est_us_after
        return x is not None and y is not None and not math.isclose(
            x, y, rel_tol=1e-9, abs_tol=1e-9
        )

    @property
    def changed(self) -> bool:
        """True when calls, bytes or estimated time differ."""
        return bool(self.calls_delta or self.bytes_delta or self.est_changed)

    @property
    def direction(self) -> int:
        """+1 more, -1 less, 0 the same: the sign of the first known, non-zero change
        among estimated time, bytes and calls."""
        est = self.est_us_delta if self.est_changed else 0
        for delta in (est, self.bytes_delta, self.calls_delta):
            if delta:
                return 1 if delta > 0 else -1
        return 0

    def _numbers(self) -> dict[str, Any]:
        return {
            "calls_before": self.calls_before,
            "calls_after": self.calls_after,
            "calls_delta": self.calls_delta,
            "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after,
            "bytes_delta": self.bytes_delta,
            "est_us_before": self.est_us_before,
            "est_us_after": self.est_us_after,
            "est_us_delta": self.est_us_delta,
            "direction": self.direction,
        }


@dataclass(frozen=True, slots=True)
class DiffRow(Change):
    """One (module, phase, collective, axis): its own calls, bytes and time on each side."""

    module: str = ""
    """FQN of the module the collectives are charged to (``Global``: outside every module)."""
    phase: str = ""
    """``forward``, ``backward`` or ``after_backward``."""
    collective: str = ""
    """Canonical name (``all_gather``), or the op key when commscope does not know it."""
    axis: str | None = None
    """Mesh axis; ``None`` for a group that is no mesh axis; :data:`UNKNOWN_AXIS` when
    a trace cannot tell."""

    def to_json(self) -> dict[str, Any]:
        """A JSON object: the key fields, then the numbers and their changes."""
        key = {"module": self.module, "phase": self.phase, "collective": self.collective,
               "axis": self.axis}
        return {**key, **self._numbers()}


@dataclass(frozen=True, slots=True)
class NetChange(Change):
    """One collective on one axis, summed over every module and phase."""

    collective: str = ""
    axis: str | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON object: collective, axis, then the numbers and their changes."""
        return {"collective": self.collective, "axis": self.axis, **self._numbers()}


@dataclass(frozen=True, slots=True)
class DiffTotals(Change):
    """Every collective of each trace, summed."""

    def to_json(self) -> dict[str, Any]:
        """A JSON object of the numbers and their changes."""
        return self._numbers()


@dataclass(frozen=True, slots=True)
class Growth:
    """How much the trace grew on one measure: what ``--fail-on-increase`` checks.

    The measure is the total estimated time, which is the link traffic (bytes times the
    nccl-tests bus-bandwidth factor) over a bandwidth, so its percentage does not depend
    on the bandwidth. Not bytes: an all_reduce moves twice the bus traffic of the
    reduce_scatter + all_gather pair that replaces it under sequence parallelism, yet
    counts half their bytes. PyTorch's dumps know no bytes: then total calls.
    """

    measure: str
    """``est_us`` (microseconds) when both traces know bytes, else ``calls``."""
    before: float
    after: float

    @property
    def percent(self) -> float:
        """``(after - before) / before`` in percent; ``inf`` from nothing to something."""
        if self.before == 0:
            return 0.0 if self.after == 0 else math.inf
        return (self.after - self.before) / self.before * 100.0


@dataclass(slots=True)
class TraceDiff:
    """The comparison of trace ``a`` (before) with trace ``b`` (after)."""

    a: TraceSide
    b: TraceSide
    bandwidth_gbps: float
    """Bus bandwidth of the time estimates, decimal GB/s."""
    rows: list[DiffRow] = field(default_factory=list)
    """Every key of either trace, unchanged ones included, biggest change first."""
    net: list[NetChange] = field(default_factory=list)
    """Per (collective, axis), biggest change first."""
    totals: DiffTotals = field(default_factory=lambda: DiffTotals(0, 0, 0, 0, 0.0, 0.0))
    only_in_a: list[str] = field(default_factory=list)
    """Modules of ``a``'s tree that ``b`` lacks, pre-order."""
    only_in_b: list[str] = field(default_factory=list)
    """Modules of ``b``'s tree that ``a`` lacks, pre-order."""
    module_order: list[tuple[str, int]] = field(default_factory=list)
    """Every module of both trees as ``(fqn, depth)``, in one merged pre-order."""

    @property
    def axes_known(self) -> bool:
        """True when both traces know the mesh axis of each collective."""
        return self.a.has_bytes and self.b.has_bytes

    @property
    def changed(self) -> list[DiffRow]:
        """The rows whose calls, bytes or time differ."""
        return [r for r in self.rows if r.changed]

    @property
    def unchanged_count(self) -> int:
        """How many rows are the same in both traces."""
        return len(self.rows) - len(self.changed)

    def shown(self, unchanged: bool = False) -> list[DiffRow]:
        """The rows to show: the changed ones, or all with ``unchanged=True``."""
        return list(self.rows) if unchanged else self.changed

    def growth(self) -> Growth:
        """Total estimated time before and after (total calls when a trace has no bytes)."""
        t = self.totals
        if t.est_us_before is not None and t.est_us_after is not None:
            return Growth("est_us", t.est_us_before, t.est_us_after)
        return Growth("calls", t.calls_before, t.calls_after)
