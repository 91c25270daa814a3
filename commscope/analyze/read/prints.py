"""Reading the running fingerprints a dump or a progress record carries.

``commscope_fingerprints`` (docs/formats.md; written by
:mod:`commscope.flight.record.agree.fingerprint`) is ``{"bits", "t0", "table", "groups"}``:
per group name, the rank's newest folds as ``[seq, cum, what, t_us]`` rows, ``what``
indexing ``table`` (``[op, sizes, dtypes, root, reduce_op]`` lists) and ``t_us`` the
arrival in microseconds after ``t0`` (ns). Anything malformed is left out with a
problem noted; nothing here raises for a hostile value.
"""

from __future__ import annotations

from typing import Any

from commscope.analyze.model import PrintRows, PrintWhat, RankDump
from commscope.analyze.read.records import short

__all__ = ["read_prints", "MAX_ROWS", "MAX_TABLE"]

MAX_ROWS = 256
"""Folds read per group."""
MAX_TABLE = 4096
"""Distinct fold contents read per dump."""
MAX_GROUPS = 4096
"""Groups read per dump."""

_INT64 = 2**63


def _what(item: Any) -> PrintWhat | None:
    if not isinstance(item, list) or len(item) != 5:
        return None
    op, sizes, dtypes, root, reduce_op = item
    if type(op) is not str or not isinstance(sizes, list) or not isinstance(dtypes, list):
        return None
    shapes = []
    for s in sizes[:64]:
        if not isinstance(s, list) or len(s) > 64 or \
                any(type(d) is not int or not 0 <= d < _INT64 for d in s):
            return None
        shapes.append(tuple(s))
    if any(type(d) is not str for d in dtypes[:64]):
        return None
    if root is not None and (type(root) is not int or not 0 <= root < 2**31):
        root = None
    if reduce_op is not None and (type(reduce_op) is not str or len(reduce_op) > 32):
        reduce_op = None
    return PrintWhat(op[:64], tuple(shapes), tuple(d[:32] for d in dtypes[:64]), root,
                     reduce_op)


def read_prints(data: dict[str, Any], dump: RankDump, problems: list[str]) -> None:
    """Fill ``dump.prints``, ``dump.print_table`` and ``dump.print_bits`` from ``data``."""
    raw = data.get("commscope_fingerprints")
    if raw is None:
        return
    if not isinstance(raw, dict):
        problems.append(f"commscope_fingerprints is {short(raw)}, ignored")
        return
    bits, t0, table, groups = (raw.get(k) for k in ("bits", "t0", "table", "groups"))
    if bits not in (32, 64) or type(t0) is not int or not 0 <= t0 < _INT64 \
            or not isinstance(table, list) or not isinstance(groups, dict):
        problems.append("commscope_fingerprints lacks bits/t0/table/groups, ignored")
        return
    whats = [_what(x) for x in table[:MAX_TABLE]]
    bad = 0
    for name, rows in list(groups.items())[:MAX_GROUPS]:
        if type(name) is not str or not isinstance(rows, list):
            bad += 1
            continue
        got = PrintRows([], [], [], [])
        last = 0
        for row in rows[-MAX_ROWS:]:
            if not (isinstance(row, list) and len(row) == 4
                    and all(type(x) is int for x in row)):
                bad += 1
                continue
            seq, cum, what, t_us = row
            if seq < last or not 0 < seq < _INT64 or not 0 <= cum < (1 << bits) \
                    or not -_INT64 < t_us * 1000 < _INT64:
                bad += 1
                continue
            last = seq
            got.seqs.append(seq)
            got.cums.append(cum)
            got.what.append(what if 0 <= what < len(whats) and whats[what] else -1)
            got.arrived_ns.append(t0 + t_us * 1000)
        if got.seqs:
            dump.prints[name[:200]] = got
    if bad:
        problems.append(f"commscope_fingerprints: {bad} malformed row(s) or group(s) left out")
    dump.print_table = [w if w is not None else PrintWhat("?", (), (), None, None)
                        for w in whats]
    dump.print_bits = bits
