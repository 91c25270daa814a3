"""Does the recorder's splice work on the torch that is installed? Say so loudly if not.

The recorder reaches into ``torch.distributed`` internals (:mod:`commscope.flight.splice.install`);
on another torch they can change without notice, and a recorder that silently records
nothing is worse than none. Two checks:

1. **At** :func:`commscope.flight.enable` (:func:`check_torch`), on the code itself:
   ``distributed_c10d._new_process_group_helper`` exists, takes the arguments the
   recorder reads (``group_size``, ``group_rank``, ``global_ranks_in_group``,
   ``backend``, ``store``), and builds its group through the module-level name
   ``ProcessGroup`` (the name the splice answers); ``batch_isend_irecv`` exists; the
   ``ProcessGroup`` methods the recording group overrides exist. Any miss raises
   :class:`RecorderUnsupported`, naming the torch version and what is missing.
2. **When a group is created** (:func:`splice_missed`): torch returned a group that is
   not a recording one although recording was on. The recorder logs an error naming the
   group and torch version; under ``commscope run`` (``COMMSCOPE_FR_STRICT=1``) it raises
   :class:`RecorderUnsupported` instead, so the job stops at ``init_process_group``
   rather than producing empty dumps.
"""

from __future__ import annotations

import inspect
import logging
import os
from typing import Any

from commscope import compat, probe

__all__ = ["RecorderUnsupported", "check_torch", "splice_missed", "require_flight",
           "STRICT_ENV", "REQUIRED"]

logger = logging.getLogger(__name__)

STRICT_ENV = "COMMSCOPE_FR_STRICT"
REQUIRED = ("group_size", "group_rank", "global_ranks_in_group", "backend", "store")
"""Arguments of ``_new_process_group_helper`` the recorder reads."""
_METHODS = ("allreduce", "broadcast", "allgather", "reduce_scatter", "alltoall_base",
            "barrier", "send", "recv")


class RecorderUnsupported(RuntimeError):
    """The flight recorder cannot record on this torch."""


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


def check_torch(c10d: Any = None) -> None:
    """Step 1 of the module doc; raises :class:`RecorderUnsupported` with every miss."""
    if c10d is None:
        import torch.distributed.distributed_c10d as c10d
    missing = []
    helper = getattr(c10d, "_new_process_group_helper", None)
    if helper is None or not inspect.isfunction(helper):
        missing.append("distributed_c10d._new_process_group_helper (where every group is made)")
    else:
        inner = inspect.unwrap(helper)
        try:
            params = set(inspect.signature(inner).parameters)
        except (TypeError, ValueError):
            params = set()
        lacking = [p for p in REQUIRED if p not in params]
        if lacking:
            missing.append(f"_new_process_group_helper's arguments {', '.join(lacking)}")
        if "ProcessGroup" not in getattr(getattr(inner, "__code__", None), "co_names", ()):
            missing.append("_new_process_group_helper no longer builds its group through "
                           "the name ProcessGroup")
    if not callable(getattr(c10d, "batch_isend_irecv", None)):
        missing.append("distributed_c10d.batch_isend_irecv")
    pg = getattr(c10d, "ProcessGroup", None)
    absent = [m for m in _METHODS if pg is None or not hasattr(pg, m)]
    if absent:
        missing.append(f"ProcessGroup methods {', '.join(absent)}")
    if missing:
        raise RecorderUnsupported(
            f"commscope flight cannot record on torch {_torch_version()}: "
            + "; ".join(missing)
            + ". Nothing would be recorded, so recording was not started. The tested "
            "versions are listed in docs/compat.md.")


def splice_missed(group: Any) -> None:
    """Step 2: a group torch made while recording is not a recording group."""
    name = getattr(group, "group_name", "?")
    text = (f"commscope flight: torch {_torch_version()} created process group {name!r} "
            "without the recording class, so its collectives are NOT recorded (the splice "
            "into torch.distributed no longer works on this version)")
    if os.environ.get(STRICT_ENV, "") not in ("", "0"):
        raise RecorderUnsupported(text + f"; {STRICT_ENV}=1 stops here.")
    logger.error("%s.", text)


_proven: list[bool] = []
"""Set once a passing probe has cleared the recorder in this process."""


def require_flight() -> None:
    """Step 3: raise :class:`RecorderUnsupported` unless a throw-away job
    (:mod:`commscope.probe`) saw every call recorded; once per torch install, then cached."""
    if _proven or probe.skipped():
        return
    result = probe.probe()
    if not result.flight_ok:
        raise RecorderUnsupported(
            f"commscope flight cannot record on torch {result.torch_version}: a throw-away "
            f"one-rank job recorded nothing for {'; '.join(result.flight_missing)}. "
            f"Nothing would be recorded, so recording was not started. {probe.TESTED}")
    compat.warn_if_newer(result.torch_version)
    _proven.append(True)
