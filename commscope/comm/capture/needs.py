"""The torch internals CommDebugMode's hooks use, looked up once with a clear error.

CommDebugMode reads a few private ``torch._C`` entry points (the autograd graph task and
node, the dispatch-mode slot). On a torch without one of them, importing
``CommDebugMode`` raises :class:`CommUnsupported` naming the torch version and the
missing name, instead of an ``AttributeError`` deep in an import or, worse, hooks that
quietly count nothing.
"""

from __future__ import annotations

from typing import Any

import torch

from commscope import compat, probe

__all__ = ["CommUnsupported", "torch_internal", "require_comm"]


class CommUnsupported(ImportError):
    """CommDebugMode cannot trace on this torch."""


def torch_internal(path: str) -> Any:
    """``torch_internal("_C._current_graph_task_id")``: the object, or
    :class:`CommUnsupported` naming what this torch lacks."""
    obj: Any = torch
    for part in path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise CommUnsupported(
                f"commscope.comm cannot trace on torch {torch.__version__}: torch.{path} is "
                "missing (CommDebugMode's hooks need it). The tested versions are listed in "
                "docs/compat.md.") from None
    return obj


_proven: list[bool] = []
"""Set once a passing probe has cleared the tracer in this process."""


def require_comm() -> None:
    """Raise :class:`CommUnsupported` unless a throw-away job (:mod:`commscope.probe`) saw
    every collective counted under its module; once per torch install, then cached."""
    if _proven or probe.skipped():
        return
    result = probe.probe()
    if not result.comm_ok:
        raise CommUnsupported(
            f"commscope.comm cannot trace on torch {result.torch_version}: a throw-away "
            f"one-rank job's CommDebugMode missed {'; '.join(result.comm_missing)}. "
            f"{probe.TESTED}")
    compat.warn_if_newer(result.torch_version)
    _proven.append(True)
