"""Per-module tracing of collectives: a faster, corrected ``CommDebugMode``.

``from commscope.comm import CommDebugMode`` is a drop-in for
``torch.distributed.tensor.debug.CommDebugMode``; see docs/comm.md for what it adds and
where it deliberately differs. Reports, the JSON dump and the offline viewer work from a
:class:`CommTrace`, which :func:`load_json` also rebuilds from a dump file.
"""

from __future__ import annotations

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
    "ModuleNode",
    "OpEntry",
    "SCHEMA_VERSION",
    "format_summary",
    "format_table",
    "load_json",
    "render_viewer",
    "trace_from_json",
    "trace_to_json",
    "write_viewer",
]
