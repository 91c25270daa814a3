"""Per-module tracing of collectives: a faster, corrected ``CommDebugMode``.

``from commscope.comm import CommDebugMode`` is a drop-in for
``torch.distributed.tensor.debug.CommDebugMode``; see docs/comm.md for what it adds and
where it deliberately differs. Reports, the JSON dump and the offline viewer work from a
:class:`CommTrace`, which :func:`load_json` also rebuilds from a dump file. :func:`diff`
compares two traces (what a plan change or a model PR added to communication).

Traces, reports, the viewer and ``diff`` need no torch (read a colleague's dump on a
laptop); ``CommDebugMode`` and ``CommCounts`` are loaded on first use and need it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from commscope.comm.present.compare import diff
from commscope.comm.present.compare_report import diff_to_json, format_diff
from commscope.comm.present.compare_types import DiffInputError, DiffRow, TraceDiff
from commscope.comm.present.compare_viewer import write_diff_viewer
from commscope.comm.present.report import format_summary, format_table
from commscope.comm.present.viewer import render_viewer, write_viewer
from commscope.comm.trace.model import CollectiveRecord, CommTrace, ModuleNode, OpEntry
from commscope.comm.trace.schema import SCHEMA_VERSION, load_json, trace_from_json, trace_to_json

__all__ = [
    "CommDebugMode",
    "CommCounts",
    "CollectiveRecord",
    "CommTrace",
    "DiffInputError",
    "DiffRow",
    "ModuleNode",
    "OpEntry",
    "SCHEMA_VERSION",
    "TraceDiff",
    "diff",
    "diff_to_json",
    "format_diff",
    "format_summary",
    "format_table",
    "load_json",
    "render_viewer",
    "trace_from_json",
    "trace_to_json",
    "write_diff_viewer",
    "write_viewer",
]

if TYPE_CHECKING:
    from commscope.comm.capture.counts import CommCounts
    from commscope.comm.capture.mode import CommDebugMode

_LAZY = {"CommDebugMode": "commscope.comm.capture.mode",
         "CommCounts": "commscope.comm.capture.counts"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'commscope.comm' has no attribute {name!r}")
