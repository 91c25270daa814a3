"""The arguments of a collective that every rank must pass alike, read for its record.

Shapes and dtypes are not enough to tell that the ranks of a group asked for the same
thing: a rank that broadcasts from another root, reduces with another op, or sends an
``all_to_all_single`` peer a different number of rows than that peer expects, records
the same sizes as the others. :data:`READERS` maps an op name (as the recording process
group passes it to the recorder) to a function ``read(args, kwargs, info)`` that returns
what must agree as one tuple ``(root, reduce_op, input_splits, output_splits)``:

* ``root``: the *global* rank of a rooted op's source or destination (``broadcast``,
  ``reduce``, ``gather``, ``scatter`` and so the object variants built on them);
* ``reduce_op``: the reduction's name (``SUM``, ``MAX``, ``AVG``, ``PREMUL_SUM`` ...);
* ``input_splits``/``output_splits``: the rows ``all_to_all_single`` sends to and expects
  from each rank of the group, when the caller gave them (none given: equal splits).

Any part that does not apply, or cannot be read, is ``None``. The readers run on the
recording hot path: they read option attributes only (about 0.2-0.5 us), never a tensor.
Split lists longer than :data:`MAX_SPLITS` are not kept (the record stays small).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.distributed as dist

__all__ = ["MAX_SPLITS", "READERS", "Agree", "reduce_op_name"]

Agree = tuple[int | None, str | None, tuple[int, ...] | None, tuple[int, ...] | None]
"""``(root, reduce_op, input_splits, output_splits)`` of one record."""

MAX_SPLITS = 256
"""The longest split list kept (an expert-parallel group of up to 256 ranks)."""


def _op_codes() -> dict[int, str]:
    """``hash(ReduceOp)`` -> name; pybind's ReduceOp hashes to its enum value."""
    codes: dict[int, str] = {}
    red = getattr(dist.ReduceOp, "RedOpType", None)
    members = getattr(red, "__members__", {}) if red is not None else {}
    for name, value in members.items():
        try:
            codes[int(value)] = name
        except (TypeError, ValueError):
            continue
    try:  # the fast path holds only if hashing gives the enum value
        if codes and hash(dist.ReduceOp(dist.ReduceOp.MAX)) != int(dist.ReduceOp.MAX):
            return {}
    except Exception:
        return {}
    return codes


_CODES = _op_codes()
_BY_CODE: dict[int, Agree] = {code: (None, name, None, None) for code, name in _CODES.items()}
"""``hash(ReduceOp)`` -> the shared record value of a reduction with that op."""


def reduce_op_name(op: Any) -> str | None:
    """The name of a ``ReduceOp`` (or of its enum value), ``None`` if unreadable."""
    if op is None:
        return None
    try:
        if _CODES:
            name = _CODES.get(hash(op))
            if name is not None:
                return name
        inner = getattr(op, "op", op)
        name = getattr(inner, "name", None)
        return name if isinstance(name, str) else None
    except Exception:
        return None


def _opts(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The options object of a call (its last argument), else ``None``."""
    if args:
        return args[-1]
    return kwargs.get("opts")


def _global(info: Any, root: Any) -> int | None:
    if type(root) is not int or root < 0:
        return None
    return info.global_rank(root)


def _as_agree(name: str | None) -> Agree | None:
    return None if name is None else (None, name, None, None)


def _reduction(args: tuple[Any, ...], kwargs: dict[str, Any], info: Any) -> Agree | None:
    """``all_reduce``/``reduce_scatter`` and their variants: the reduce op."""
    # The hot path of every all_reduce: one attribute read (pybind copies the ReduceOp,
    # about 0.2-0.5 us), one hash, one dict lookup, and a shared tuple (no allocation).
    opts = args[-1] if args else kwargs.get("opts")
    try:
        op = opts.reduceOp
    except AttributeError:  # the (tensors, op) overloads
        return _as_agree(reduce_op_name(opts if len(args) > 1 else kwargs.get("op")))
    try:
        return _BY_CODE[hash(op)]
    except (KeyError, TypeError):
        return _as_agree(reduce_op_name(op))


def _rooted(args: tuple[Any, ...], kwargs: dict[str, Any], info: Any) -> Agree | None:
    """``broadcast``/``gather``/``scatter``: the root."""
    opts = _opts(args, kwargs)
    root = getattr(opts, "rootRank", None)
    if root is None:  # the (tensor, root) overload
        root = args[1] if len(args) > 1 else kwargs.get("root")
    g = _global(info, root)
    return None if g is None else (g, None, None, None)


def _rooted_reduction(args: tuple[Any, ...], kwargs: dict[str, Any], info: Any) -> Agree | None:
    """``reduce``: the root and the reduce op."""
    opts = _opts(args, kwargs)
    root = getattr(opts, "rootRank", None)
    if root is not None:
        op = getattr(opts, "reduceOp", None)
    else:  # the (tensor, root[, op]) overload
        root = args[1] if len(args) > 1 else kwargs.get("root")
        op = args[2] if len(args) > 2 else kwargs.get("op")
    g = _global(info, root)
    name = reduce_op_name(op)
    return None if g is None and name is None else (g, name, None, None)


_INT = {int}


def _splits(value: Any) -> tuple[int, ...] | None:
    if type(value) is not list and type(value) is not tuple:
        return None
    if not value or len(value) > MAX_SPLITS:
        return None
    if set(map(type, value)) == _INT:  # the usual case: plain ints, no conversion
        return tuple(value)
    try:  # ints of other types (numpy, 0-d tensors): converted, never kept
        return tuple(map(int, value))
    except (TypeError, ValueError, RuntimeError):
        return None


def _all_to_all(args: tuple[Any, ...], kwargs: dict[str, Any], info: Any) -> Agree | None:
    """``all_to_all_single``: ``(output, input, output_splits, input_splits, opts)``;
    the list form carries its splits in its tensors' sizes (nothing to read)."""
    if len(args) >= 4:
        out_splits, in_splits = args[2], args[3]
    else:
        out_splits = kwargs.get("outputSplitSizes", kwargs.get("output_split_sizes"))
        in_splits = kwargs.get("inputSplitSizes", kwargs.get("input_split_sizes"))
    ins, outs = _splits(in_splits), _splits(out_splits)
    return None if ins is None and outs is None else (None, None, ins, outs)


READERS: dict[str, Callable[[tuple[Any, ...], dict[str, Any], Any], Agree | None]] = {
    "all_reduce": _reduction,
    "allreduce_coalesced": _reduction,
    "reduce_scatter": _reduction,
    "_reduce_scatter_base": _reduction,
    "reduce_scatter_tensor_coalesced": _reduction,
    "broadcast": _rooted,
    "gather": _rooted,
    "scatter": _rooted,
    "reduce": _rooted_reduction,
    "all_to_all": _all_to_all,
}
"""Op name (as passed to :meth:`Recorder.run`) -> its reader."""
