"""Per-module tracing of collectives: a faster, corrected ``CommDebugMode``.

``from commscope.comm import CommDebugMode`` is a drop-in for
``torch.distributed.tensor.debug.CommDebugMode``; see docs/comm.md for what it adds and
where it deliberately differs. Reports, the JSON dump and the offline viewer work from a
:class:`CommTrace`, which :func:`load_json` also rebuilds from a dump file. :func:`diff`
compares two traces (what a plan change or a model PR added to communication).
"""

from __future__ import annotations

from commscope.comm.compare import diff
from commscope.comm.compare_report import diff_to_json, format_diff
from commscope.comm.compare_types import DiffInputError, DiffRow, TraceDiff
from commscope.comm.compare_viewer import write_diff_viewer
from commscope.comm.counts import CommCounts
from commscope.comm.mode import CommDebugMode
from commscope.comm.report import format_summary, format_table
from commscope.comm.schema import SCHEMA_VERSION, load_json, trace_from_json, trace_to_json
from commscope.comm.trace import CollectiveRecord, CommTrace, ModuleNode, OpEntry
from commscope.comm.viewer import render_viewer, write_viewer

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
