"""Read every rank's flight-recorder dump and say, in plain words, why the job is stuck.

>>> from commscope.analyze import analyze, format_report   # doctest: +SKIP
>>> result = analyze("./commscope_traces")                  # doctest: +SKIP
>>> result.verdict, result.findings[0].message              # doctest: +SKIP

Reads PyTorch's native dumps (pickle, schema 2.x) and commscope's (pickle or JSON,
optionally gzip) with a loader that refuses to run code from a file; lines up every
group's collectives across ranks by sequence number; reports findings root cause
first; writes JSON, a Perfetto timeline and an offline HTML report. Imports no torch.

Steps, each a module of plain functions over plain data: :mod:`~.load` (files),
:mod:`~.extract` and :mod:`~.records` (one dump → columns), :mod:`~.match` (membership,
alignment, p2p pairing), :mod:`~.mismatch`, :mod:`~.waits`, :mod:`~.timing`,
:mod:`~.crashes`, :mod:`~.cycles` and :mod:`~.diagnose` (findings, verdict),
:mod:`~.report`, :mod:`~.entries` and :mod:`~.export` (outputs),
:mod:`~.synth` (synthetic dumps for tests and benchmarks).
"""

from __future__ import annotations

from commscope.analyze.analysis import FORMAT, Analysis, analyze, analyze_loaded
from commscope.analyze.diagnose import KINDS
from commscope.analyze.entries import format_entries
from commscope.analyze.export import (
    html_report,
    perfetto_trace,
    write_html,
    write_json,
    write_perfetto,
)
from commscope.analyze.load import SafeUnpickler, load_dumps, read_dump_file
from commscope.analyze.model import Finding, Group, LoadResult, RankDump, Unreadable
from commscope.analyze.report import format_report

__all__ = [
    "FORMAT",
    "KINDS",
    "Analysis",
    "Finding",
    "Group",
    "LoadResult",
    "RankDump",
    "Unreadable",
    "SafeUnpickler",
    "analyze",
    "analyze_loaded",
    "load_dumps",
    "read_dump_file",
    "format_report",
    "format_entries",
    "write_json",
    "perfetto_trace",
    "write_perfetto",
    "html_report",
    "write_html",
]
