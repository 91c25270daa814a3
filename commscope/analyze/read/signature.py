"""What a collective call *is*, and which parts of it must agree across ranks.

A record's signature is its ``profiling_name``, sizes and dtypes, and, where the record
has them (ours), the ``root`` and the ``reduce_op``. It is keyed by the ``marshal`` bytes
(version 2: no back-references, so equal values give equal bytes) of
``(name, input_sizes, output_sizes, input_dtypes, output_dtypes)``, where ``name`` is
the profiling name tagged with root and reduce op (:func:`tag_name`; the C reader tags
it the same way); each distinct key is decoded and validated once (:func:`decode_sig`),
however many records share it.

The **match key** (:func:`match_key`) is the part every rank of a group must agree on:

* op (canonical name from :mod:`commscope.collectives`; the backend prefix is dropped),
* all shapes and dtypes for all_reduce, broadcast, reduce, all_gather, reduce_scatter,
  barrier, and the root and reduce op where recorded,
* gather: inputs only (only the root has outputs); scatter: outputs only,
* all_to_all: dtypes only (uneven splits are legal, PyTorch #194559),
* send/recv: never compared here (p2p is matched pair by pair).
"""

from __future__ import annotations

import marshal
from typing import Any

from commscope import collectives as C
from commscope.analyze.model import Sig

__all__ = [
    "COALESCED_TAG",
    "sig_key",
    "tag_name",
    "TAG",
    "decode_sig",
    "coalesced_key",
    "match_key",
    "op_of",
]

COALESCED_TAG = "\x00commscope-coalesced"
TAG = "\x1f"
"""Separates a profiling name from the root and reduce op in a signature key's name."""
_MAX_ROOT = 2**31
_MAX_DIMS = 64
_MAX_TENSORS = 4096


def sig_key(name: Any, ins: Any, outs: Any, idt: Any, odt: Any) -> bytes:
    """The interning key of one record's signature."""
    return marshal.dumps((name, ins, outs, idt, odt), 2)


def tag_name(name: Any, root: Any, reduce_op: Any) -> Any:
    """``name`` as a signature key holds it: ``name<TAG>root<TAG>op`` when the record has
    a usable root (an int in [0, 2**31)) or reduce op (text of 1-32 characters); an
    unusable or absent part is empty, and with neither, ``name`` itself."""
    if type(root) is not int or not 0 <= root < _MAX_ROOT:
        root = None
    if type(reduce_op) is not str or not 1 <= len(reduce_op) <= 32:
        reduce_op = None
    if root is None and reduce_op is None:
        return name
    return f"{name}{TAG}{'' if root is None else root}{TAG}{reduce_op or ''}"


def coalesced_key(member_keys: tuple[bytes, ...]) -> bytes:
    """Key of several records that share one sequence number (a coalesced group)."""
    return marshal.dumps((COALESCED_TAG, member_keys), 2)


def op_of(profiling_name: str) -> str:
    """Canonical op of a profiling name, else its raw op word (``coalesced``)."""
    parsed = C.parse_profiling_name(profiling_name)
    return parsed.collective or parsed.op or profiling_name


def _shapes(value: Any, field: str) -> tuple[tuple[tuple[int, ...], ...] | None, str | None]:
    if not isinstance(value, (list, tuple)):
        return None, f"{field} is {type(value).__name__} {_short(value)}, expected a list of shapes"
    if len(value) > _MAX_TENSORS:
        return None, f"{field} lists {len(value)} tensors, more than {_MAX_TENSORS}"
    out = []
    for shape in value:
        if not isinstance(shape, (list, tuple)) or len(shape) > _MAX_DIMS:
            return None, f"{field} holds {_short(shape)}, expected a shape like [4, 8]"
        dims = []
        for d in shape:
            if type(d) is not int or d < 0:
                return None, f"{field} holds dimension {_short(d)}, expected an int >= 0"
            dims.append(d)
        out.append(tuple(dims))
    return tuple(out), None


def _dtypes(value: Any, field: str) -> tuple[tuple[str, ...] | None, str | None]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(x, str) for x in value):
        return None, f"{field} is {_short(value)}, expected a list of dtype names"
    return tuple(C.normalize_dtype_name(x) for x in value), None


def _short(value: Any, limit: int = 40) -> str:
    try:
        text = repr(value)
    except Exception:  # pragma: no cover - repr of plain data does not fail
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def decode_sig(key: bytes) -> Sig:
    """Decode and validate one signature key; a bad field becomes ``Sig.problem``."""
    name, ins, outs, idt, odt = marshal.loads(key)
    problems: list[str] = []
    root: int | None = None
    reduce_op: str | None = None
    if isinstance(name, str) and TAG in name:
        name, _, rest = name.partition(TAG)
        root_text, _, op_text = rest.partition(TAG)
        root = int(root_text) if root_text.isdigit() else None
        reduce_op = op_text or None
    if not isinstance(name, str):
        problems.append(f"profiling_name is {_short(name)}, expected text like 'nccl:all_reduce'")
        name = "unknown"
    in_sizes, p1 = _shapes(ins, "input_sizes")
    out_sizes, p2 = _shapes(outs, "output_sizes")
    in_dtypes, p3 = _dtypes(idt, "input_dtypes")
    out_dtypes, p4 = _dtypes(odt, "output_dtypes")
    problems += [p for p in (p1, p2, p3, p4) if p]
    if in_sizes is None or out_sizes is None or in_dtypes is None or out_dtypes is None:
        in_sizes = out_sizes = None
        in_dtypes = out_dtypes = None
    return Sig(
        profiling_name=name,
        op=op_of(name),
        input_sizes=in_sizes,
        output_sizes=out_sizes,
        input_dtypes=in_dtypes,
        output_dtypes=out_dtypes,
        problem="; ".join(problems) or None,
        root=root,
        reduce_op=reduce_op,
    )


def match_key(sig: Sig, member_match_keys: tuple[Any, ...] = ()) -> tuple[Any, ...]:
    """The hashable part of ``sig`` that every rank of the group must agree on."""
    if sig.members:
        return ("coalesced", member_match_keys)
    op = sig.op
    if sig.input_sizes is None:
        return (op, "?")
    if op == C.GATHER:
        return (op, sig.input_sizes, sig.input_dtypes, sig.root)
    if op == C.SCATTER:
        return (op, sig.output_sizes, sig.output_dtypes, sig.root)
    if op == C.ALL_TO_ALL:
        return (op, sig.input_dtypes, sig.output_dtypes)
    if sig.root is None and sig.reduce_op is None:
        return (op, sig.input_sizes, sig.output_sizes, sig.input_dtypes, sig.output_dtypes)
    return (op, sig.input_sizes, sig.output_sizes, sig.input_dtypes, sig.output_dtypes,
            sig.root, sig.reduce_op)
