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
_MAX_US = 2**53
"""Arrival offsets (us) beyond this are not a time."""


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
        seqs, cums, refs, times = got.seqs, got.cums, got.what, got.arrived_ns
        last = 0
        top = 1 << bits
        n_whats = len(whats)
        for row in rows[-MAX_ROWS:]:
            try:
                seq, cum, what, t_us = row
            except (TypeError, ValueError):
                bad += 1
                continue
            if not (type(seq) is int and type(cum) is int and type(what) is int
                    and type(t_us) is int and last <= seq < _INT64 and seq > 0
                    and 0 <= cum < top and -_MAX_US < t_us < _MAX_US):
                bad += 1
                continue
            last = seq
            seqs.append(seq)
            cums.append(cum)
            refs.append(what if 0 <= what < n_whats and whats[what] else -1)
            times.append(t0 + t_us * 1000)
        if got.seqs:
            dump.prints[name[:200]] = got
    if bad:
        problems.append(f"commscope_fingerprints: {bad} malformed row(s) or group(s) left out")
    dump.print_table = [w if w is not None else PrintWhat("?", (), (), None, None)
                        for w in whats]
    dump.print_bits = bits
