"""A running fingerprint of what a rank issued on each group, to compare across ranks.

Ranks that all-reduce tensors of the same byte count but different dtypes or shapes do
not hang: the job runs on with wrong numbers. To see that while it runs, with no extra
collective (PyTorch's ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` adds one per call), every rank
folds each collective it issues on a group into that group's :class:`Fingerprint`:

``cum = hash((cum, code, sizes, root))``

where ``code`` stands for the op, its dtypes and its reduce op (a CRC-32 of their text,
worked out once per distinct combination, so it is the same number in every process:
Python's own ``hash`` of a string differs from process to process), ``sizes`` are the
shapes every rank must pass alike, and ``root`` the global rank of a rooted op (-1 for
none). ``hash`` of a tuple of ints is the same in every process of one Python version
(no string in it, and no ``None``, whose hash is its address before Python 3.12).
What must agree, per op, as the analyzer's match key has it
(:mod:`commscope.analyze.read.signature`): the inputs' shapes and dtypes; a scatter's
outputs (only the root has inputs); an all_to_all's dtypes only (uneven splits are
legal). Point-to-point ops are not folded (they are matched pair by pair).

Two ranks whose fingerprints agree at the same sequence number issued the same
collectives up to there (up to a hash collision, 2**-64; 2**-32 in a progress record).
The newest :data:`WINDOW` folds are kept, each with its sequence number, fingerprint,
what it folded and when the rank arrived, so a watcher can name the first collective
where ranks differ within that window, and time the arrivals (who comes last). Cost:
well under a microsecond per collective (``bench/fingerprint.py``); no tensor is kept.
"""

from __future__ import annotations

import zlib
from collections import deque
from typing import Any

__all__ = ["WINDOW", "PUBLISHED", "Fingerprint", "fold", "describe", "window_rows", "fields"]

WINDOW = 64
"""Folds kept per group (the newest)."""
PUBLISHED = 16
"""Folds per group a progress record carries (a watcher keeps what it saw before)."""

_SIDE = {"scatter": 1, "all_to_all": 2}
"""Op -> which shapes must agree: 0 the inputs (default), 1 the outputs, 2 none."""

_CODES: dict[tuple[Any, ...], int] = {}
"""``(op, dtypes, reduce_op)`` -> its process-independent code."""


class Fingerprint:
    """The running fingerprint of one group on this rank, and its newest folds."""

    __slots__ = ("cum", "seq", "window")

    def __init__(self) -> None:
        self.cum = 0
        """The fingerprint after the newest fold (0 before any)."""
        self.seq = 0
        """The sequence number of the newest fold (0 before any)."""
        self.window: deque[tuple[int, int, tuple[Any, ...], tuple[Any, ...], Any, int]] = \
            deque(maxlen=WINDOW)
        """``(seq, cum, (op, dtypes, reduce_op), sizes, root, time_created_ns)``, oldest
        first."""


def _code(key: tuple[Any, ...]) -> int:
    code = _CODES[key] = zlib.crc32(repr(key).encode("utf-8", "replace"))
    return code


def fold(fp: Fingerprint, op: str, e: Any, seq: int, now: int) -> None:
    """Fold the collective entry ``e`` (sequence number ``seq``, created at ``now``) into
    ``fp``. The recorder's hot path: a few hundred nanoseconds, no allocation beyond two
    small tuples."""
    side = _SIDE.get(op, 0)
    agree = e.agree
    if side == 0:
        sizes, dtypes = e.input_sizes, e.input_dtypes
    elif side == 1:
        sizes, dtypes = e.output_sizes, e.output_dtypes
    else:
        sizes, dtypes = (), e.input_dtypes
    if type(sizes) is not tuple:
        sizes = tuple(sizes)
    if type(dtypes) is not tuple:
        dtypes = tuple(dtypes)
    if agree is None:
        key = (op, dtypes, None)
        root = None
    else:
        key = (op, dtypes, agree[1])
        root = agree[0]
    code = _CODES.get(key)
    if code is None:
        code = _code(key)
    # never hash None: before Python 3.12 its hash is its address, different per process
    cum = hash((fp.cum, code, sizes, -1 if root is None else root))
    fp.cum = cum
    fp.seq = seq
    fp.window.append((seq, cum, key, sizes, root, now))


def describe(key: tuple[Any, ...], sizes: tuple[Any, ...], root: Any) -> list[Any]:
    """What one fold holds, as plain data: ``[op, sizes, dtypes, root, reduce_op]``."""
    op, dtypes, reduce_op = key
    return [op, [[int(d) for d in s] for s in sizes], list(dtypes), root, reduce_op]


def window_rows(fp: Fingerprint, table: list[list[Any]], index: dict[Any, int], *,
                bits: int = 64, last: int = WINDOW, t0: int = 0) -> list[list[int]]:
    """``fp``'s newest ``last`` folds as ``[seq, cum, what, t_us]`` rows: ``what`` an index
    into ``table`` (the distinct :func:`describe` lists, shared by the groups of one
    record), ``cum`` cut to its low ``bits`` bits (a progress record keeps 32), ``t_us``
    the arrival in microseconds after ``t0`` (ns, this rank's clock)."""
    mask = (1 << bits) - 1
    rows = []
    window = list(fp.window)
    for seq, cum, key, sizes, root, when in window[-last:] if last else ():
        ref = (key, sizes, root)
        at = index.get(ref)
        if at is None:
            at = index[ref] = len(table)
            table.append(describe(key, sizes, root))
        rows.append([seq, cum & mask, at, (when - t0) // 1000])
    return rows


def fields(groups: list[Any], *, bits: int = 64, last: int = WINDOW) -> dict[str, Any] | None:
    """The fingerprints of ``groups`` (``GroupInfo``) as a dump or a progress record
    carries them (``commscope_fingerprints``, docs/formats.md): ``{"bits", "t0",
    "table", "groups": {group name: rows}}`` (see :func:`window_rows`); ``None`` when no
    group keeps one."""
    kept = [(g.name, g.fp) for g in groups if g.fp is not None and g.fp.window]
    if not kept:
        return None
    t0 = min(fp.window[0][5] for _, fp in kept)
    table: list[list[Any]] = []
    index: dict[Any, int] = {}
    return {"bits": bits, "t0": t0, "table": table,
            "groups": {name: window_rows(fp, table, index, bits=bits, last=last, t0=t0)
                       for name, fp in kept}}
