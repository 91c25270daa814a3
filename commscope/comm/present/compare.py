"""Compare two comm traces: what did a plan change or a model PR add to communication?

:func:`diff` takes two traces (dump paths, parsed dumps, :class:`CommTrace` or
``CommDebugMode`` objects; commscope's or PyTorch's) and returns a :class:`TraceDiff`:

1. Each trace is reduced to *self* amounts per (module FQN, phase, collective, mesh
   axis): calls, bytes and estimated time. A collective counts once, at the module it
   is charged to; ancestors do not include it. (The module tree's counts include every
   descendant's, so adding them up over modules would count a collective once per
   ancestor.) commscope dumps carry one record per collective with bytes, group size
   and axis, and the amounts come from those. PyTorch's dumps carry only the inclusive
   counts per module: a module's own count is its count minus its children's, and its
   bytes, axis and time are unknown (``None``, axis :data:`UNKNOWN_AXIS`).
2. When one side has no axes, the other side's axes are folded to
   :data:`UNKNOWN_AXIS` too, so that the two sides line up.
3. One :class:`DiffRow` per key present on either side. The estimated time is the
   nccl-tests model of :mod:`commscope.collectives`: ``bytes * busbw factor(n) /
   bandwidth`` summed over the calls, decimal GB/s, no latency.
4. Rows are sorted by the size of their estimated time change, then bytes change, then
   calls change, biggest first, then in module-tree order.
5. Net changes per (collective, axis) (:class:`NetChange`), totals
   (:class:`DiffTotals`) and the modules present in only one trace complete the picture.

Text: :mod:`commscope.comm.present.compare_report`; the HTML page:
:mod:`commscope.comm.present.compare_viewer`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from commscope import collectives
from commscope.comm.present.compare_types import (
    DEFAULT_BANDWIDTH_GBPS,
    UNKNOWN_AXIS,
    Change,
    DiffInputError,
    DiffRow,
    DiffTotals,
    NetChange,
    TraceDiff,
    TraceSide,
)
from commscope.comm.trace.model import PHASES, CommTrace, ModuleNode
from commscope.comm.trace.schema import trace_from_json

__all__ = ["diff", "load_side"]

_Key = tuple[str, str, str, "str | None"]


# ------------------------------------------------------------------ loading


def load_side(source: Any, label: str | None = None) -> tuple[CommTrace, TraceSide]:
    """A trace and its description from a dump path, a parsed dump, a :class:`CommTrace`
    or a ``CommDebugMode`` (anything with a ``trace()`` method).

    Raises :class:`DiffInputError` naming the input when it cannot be read.
    """
    if isinstance(source, (str, os.PathLike)):
        name = label or os.fspath(source)
        try:
            with open(source, encoding="utf-8") as f:
                source = json.load(f)
        except FileNotFoundError:
            raise DiffInputError(f"no such file: {name}") from None
        except IsADirectoryError:
            raise DiffInputError(f"{name} is a folder, not a JSON dump file") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise DiffInputError(f"cannot read {name} as JSON: {exc}") from None
        label = name
    name = label or "trace"
    if isinstance(source, dict):
        try:
            trace = trace_from_json(source)
        except ValueError as exc:
            raise DiffInputError(f"{name} is {_reason(str(exc))}") from None
        except (KeyError, TypeError, AttributeError) as exc:
            raise DiffInputError(
                f"{name} is not a readable CommDebugMode JSON dump ({type(exc).__name__}: "
                f"{exc}); write one with generate_json_dump()"
            ) from None
        detailed = isinstance(source.get("commscope"), dict) or not _has_counts(trace)
    elif isinstance(source, CommTrace):
        trace = source
        detailed = bool(trace.records) or not _has_counts(trace)
    elif callable(getattr(source, "trace", None)):
        trace = source.trace()
        detailed = True
    else:
        raise DiffInputError(
            f"{name}: cannot compare a {type(source).__name__}; give a dump path, a parsed "
            "dump (dict), a CommTrace or a CommDebugMode"
        )
    side = TraceSide(
        label=name,
        source="commscope" if detailed else "pytorch",
        rank=trace.rank,
        world_size=trace.world_size,
        torch_version=trace.torch_version,
        modules=tuple(fqn for fqn, _ in _tree(trace.root)),
    )
    return trace, side


def _reason(text: str) -> str:
    if text.startswith("not a "):
        return text
    return f"not usable: {text}"


def _has_counts(trace: CommTrace) -> bool:
    return any(trace.root.collectives.get(phase) for phase in PHASES)


def _tree(root: ModuleNode) -> list[tuple[str, str | None]]:
    """``(fqn, parent fqn)`` pre-order, each FQN once (PyTorch's dumps may repeat a child)."""
    out: list[tuple[str, str | None]] = []
    seen: set[str] = set()

    def visit(node: ModuleNode, parent: str | None) -> None:
        if node.fqn in seen:
            return
        seen.add(node.fqn)
        out.append((node.fqn, parent))
        for child in node.children:
            visit(child, node.fqn)

    visit(root, None)
    return out


# ------------------------------------------------------------------ amounts per key


@dataclass(slots=True)
class _Amount:
    calls: int = 0
    bytes: int = 0
    est_us: float = 0.0


def _from_records(trace: CommTrace, bw: float, fold_axis: bool) -> dict[_Key, _Amount]:
    out: dict[_Key, _Amount] = {}
    for r in trace.records:
        axis = UNKNOWN_AXIS if fold_axis else r.axis
        amount = out.setdefault((r.module, r.phase, r.collective, axis), _Amount())
        amount.calls += 1
        amount.bytes += int(r.bytes)
        amount.est_us += r.estimated_us(bw)
    return out


def _by_collective(counts: dict[str, int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for key, n in counts.items():
        name = collectives.canonical_name(key) or key
        out[name] = out.get(name, 0) + int(n)
    return out


def _from_counts(trace: CommTrace) -> dict[_Key, _Amount]:
    """Self counts from inclusive per-module counts: a node's minus its children's."""
    nodes: dict[str, ModuleNode] = {}
    for node in trace.root.walk():
        nodes.setdefault(node.fqn, node)
    out: dict[_Key, _Amount] = {}
    for fqn, node in nodes.items():
        children = {child.fqn: child for child in node.children}.values()
        for phase in PHASES:
            own = _by_collective(node.collectives.get(phase, {}))
            for child in children:
                for name, n in _by_collective(child.collectives.get(phase, {})).items():
                    own[name] = own.get(name, 0) - n
            for name, n in own.items():
                if n > 0:
                    out[(fqn, phase, name, UNKNOWN_AXIS)] = _Amount(calls=n)
    return out


# ------------------------------------------------------------------ the comparison


def _merged_order(a: CommTrace, b: CommTrace) -> list[tuple[str, int]]:
    children: dict[str | None, list[str]] = {}
    for fqn, parent in [*_tree(a.root), *_tree(b.root)]:
        siblings = children.setdefault(parent, [])
        if fqn not in siblings:
            siblings.append(fqn)
    out: list[tuple[str, int]] = []
    seen: set[str] = set()

    def visit(fqn: str, depth: int) -> None:
        if fqn in seen:
            return
        seen.add(fqn)
        out.append((fqn, depth))
        for child in children.get(fqn, []):
            visit(child, depth + 1)

    for root in children.get(None, []):
        visit(root, 0)
    return out


def _size(value: float | None) -> float:
    return abs(value) if value is not None else 0.0


def _change_key(change: Change) -> tuple[float, float, int]:
    return (-_size(change.est_us_delta), -_size(change.bytes_delta), -abs(change.calls_delta))


def diff(
    a: Any,
    b: Any,
    *,
    bandwidth_gbps: float = DEFAULT_BANDWIDTH_GBPS,
    labels: tuple[str, str] | None = None,
) -> TraceDiff:
    """Compare trace ``a`` (before) with trace ``b`` (after); see the module docstring.

    ``a`` and ``b`` are dump paths, parsed dumps, :class:`CommTrace` or ``CommDebugMode``
    objects, commscope's or PyTorch's. ``bandwidth_gbps`` is the bus bandwidth of the
    time estimates (decimal GB/s). ``labels`` names the two sides (default: the file
    names, or ``a`` and ``b``). Raises :class:`DiffInputError` for an unreadable input and
    ``ValueError`` for a bandwidth that is not > 0.
    """
    if not (isinstance(bandwidth_gbps, (int, float)) and bandwidth_gbps > 0):
        raise ValueError(f"bandwidth_gbps must be > 0 GB/s, got {bandwidth_gbps!r}")
    bw = float(bandwidth_gbps)
    names = labels or (None, None)
    trace_a, side_a = load_side(a, names[0] or (None if _is_path(a) else "a"))
    trace_b, side_b = load_side(b, names[1] or (None if _is_path(b) else "b"))
    fold = not (side_a.has_bytes and side_b.has_bytes)

    def amounts(trace: CommTrace, side: TraceSide) -> dict[_Key, _Amount]:
        return _from_records(trace, bw, fold) if side.has_bytes else _from_counts(trace)

    before, after = amounts(trace_a, side_a), amounts(trace_b, side_b)
    order = _merged_order(trace_a, trace_b)
    # Records charged outside the tree (a pipeline stage's send/recv) go last, under Global.
    extra = sorted({k[0] for k in (*before, *after)} - {fqn for fqn, _ in order})
    order += [(fqn, 1) for fqn in extra]
    position = {fqn: i for i, (fqn, _) in enumerate(order)}
    keys = sorted(
        {*before, *after}, key=lambda k: (position[k[0]], _phase_rank(k[1]), k[2], k[3] or "")
    )
    rows = [_row(k, before.get(k), after.get(k), side_a, side_b) for k in keys]
    rows.sort(key=_change_key)  # stable: ties stay in module-tree order
    set_a, set_b = set(side_a.modules), set(side_b.modules)
    return TraceDiff(
        a=side_a,
        b=side_b,
        bandwidth_gbps=bw,
        rows=rows,
        net=_net(rows, side_a, side_b),
        totals=_sum(rows, side_a, side_b, DiffTotals),
        only_in_a=[m for m in side_a.modules if m not in set_b],
        only_in_b=[m for m in side_b.modules if m not in set_a],
        module_order=order,
    )


def _is_path(obj: Any) -> bool:
    return isinstance(obj, (str, os.PathLike))


def _phase_rank(phase: str) -> int:
    return PHASES.index(phase) if phase in PHASES else len(PHASES)


def _numbers(
    before: _Amount | None, after: _Amount | None, side_a: TraceSide, side_b: TraceSide
) -> dict[str, Any]:
    x, y = before or _Amount(), after or _Amount()
    return {
        "calls_before": x.calls,
        "calls_after": y.calls,
        "bytes_before": x.bytes if side_a.has_bytes else None,
        "bytes_after": y.bytes if side_b.has_bytes else None,
        "est_us_before": x.est_us if side_a.has_bytes else None,
        "est_us_after": y.est_us if side_b.has_bytes else None,
    }


def _row(
    key: _Key, before: _Amount | None, after: _Amount | None, sa: TraceSide, sb: TraceSide
) -> DiffRow:
    module, phase, collective, axis = key
    return DiffRow(**_numbers(before, after, sa, sb), module=module, phase=phase,
                   collective=collective, axis=axis)


def _add(into: _Amount, change: Change, after: bool) -> None:
    into.calls += change.calls_after if after else change.calls_before
    into.bytes += (change.bytes_after if after else change.bytes_before) or 0
    into.est_us += (change.est_us_after if after else change.est_us_before) or 0.0


def _sum(rows: Iterable[DiffRow], sa: TraceSide, sb: TraceSide, cls: Any, **key: Any) -> Any:
    before, after = _Amount(), _Amount()
    for row in rows:
        _add(before, row, after=False)
        _add(after, row, after=True)
    return cls(**_numbers(before, after, sa, sb), **key)


def _net(rows: list[DiffRow], sa: TraceSide, sb: TraceSide) -> list[NetChange]:
    groups: dict[tuple[str, str | None], list[DiffRow]] = {}
    for row in rows:
        groups.setdefault((row.collective, row.axis), []).append(row)
    out = [
        _sum(members, sa, sb, NetChange, collective=collective, axis=axis)
        for (collective, axis), members in groups.items()
    ]
    out.sort(key=lambda n: (*_change_key(n), n.collective, n.axis or ""))
    return out
