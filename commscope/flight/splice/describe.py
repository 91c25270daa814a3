"""What each process-group method was asked to do: its tensors and its p2p peer.

One function per argument layout of the ``ProcessGroup`` methods (pybind overloads
included). ``describe(args, kwargs) -> (inputs, outputs, peer)``:

* ``inputs``/``outputs`` hold tensors, or lists of tensors that PyTorch's recorder shows
  as one flattened buffer (``all_gather``'s output list becomes ``[[n, *shape]]``);
* ``peer`` is the group rank of a p2p op's other side, ``None`` for a collective.

Only shapes and dtypes are read from the tensors, by the recorder, right away.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "any_source",
    "arg",
    "as_list",
    "gather_like",
    "inplace",
    "nothing",
    "out_in",
    "p2p",
    "scatter_like",
]


def arg(args: tuple[Any, ...], kwargs: dict[str, Any], i: int, *names: str) -> Any:
    """Positional argument ``i``, else the first of ``names`` found in ``kwargs``."""
    if len(args) > i:
        return args[i]
    for name in names:
        if name in kwargs:
            return kwargs[name]
    return None


def as_list(x: Any) -> list[Any]:
    """A tensor or a sequence of tensors as a list (``None`` → ``[]``)."""
    if x is None:
        return []
    return list(x) if isinstance(x, (list, tuple)) else [x]


def inplace(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any, None]:
    """``(tensors, ...)`` or ``(tensor, ...)``: the same tensors in and out."""
    if args and type(args[0]) is list:  # the common case: (tensors, opts)
        return args[0], args[0], None
    tensors = as_list(arg(args, kwargs, 0, "tensors", "tensor"))
    return tensors, tensors, None


def gather_like(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any, None]:
    """Allgather / gather / allgather_coalesced: ``(outputs, inputs, ...)``."""
    # allgather / gather / allgather_coalesced: (outputs, inputs, ...), where outputs is
    # a list of lists (one per input) or a list of tensors for a single input tensor.
    out = arg(args, kwargs, 0, "output_tensors", "output_lists")
    inp = arg(args, kwargs, 1, "input_tensors", "input_tensor", "input_list")
    if isinstance(inp, (list, tuple)):
        return list(inp), as_list(out), None
    return as_list(inp), [as_list(out)], None


def scatter_like(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any, None]:
    """Scatter / reduce_scatter: ``(outputs, inputs, ...)``."""
    # scatter / reduce_scatter: (outputs, inputs, ...), inputs a list of lists (one per
    # output) or a list of tensors for a single output tensor.
    out = arg(args, kwargs, 0, "output_tensors", "output_tensor", "output")
    inp = arg(args, kwargs, 1, "input_tensors", "input")
    if isinstance(out, (list, tuple)):
        return as_list(inp), list(out), None
    return [as_list(inp)], as_list(out), None


def out_in(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any, None]:
    """``(output(s), input(s), ...)`` with single tensors or lists of tensors."""
    # (output, input, ...) with single tensors or lists of tensors.
    out = arg(args, kwargs, 0, "output", "outputs", "outputTensor", "output_tensors")
    inp = arg(args, kwargs, 1, "input", "inputs", "inputTensor", "input_tensors")
    return as_list(inp), as_list(out), None


def nothing(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any, None]:
    """Ops without tensors (barrier)."""
    return [], [], None


def p2p(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any, int]:
    """``send``/``recv``: ``(tensors, peer, tag)``."""
    tensors = as_list(arg(args, kwargs, 0, "tensors"))
    peer = arg(args, kwargs, 1, "dstRank", "srcRank")
    return tensors, tensors, int(peer)


def any_source(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any, int]:
    """``recv_anysource``: ``(tensors, tag)``; the peer is unknown (-1)."""
    tensors = as_list(arg(args, kwargs, 0, "arg0", "tensors"))
    return tensors, tensors, -1
