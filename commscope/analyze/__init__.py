"""Read every rank's flight-recorder dump and say, in plain words, why the job is stuck.

>>> from commscope.analyze import analyze, format_report   # doctest: +SKIP
>>> result = analyze("./commscope_traces")                  # doctest: +SKIP
>>> result.verdict, result.findings[0].message              # doctest: +SKIP

Reads PyTorch's native dumps (pickle, schema 2.x) and commscope's (pickle or JSON,
optionally gzip) with a loader that refuses to run code from a file; lines up every
group's collectives across ranks by sequence number; reports findings root cause
first; writes JSON, a Perfetto timeline and an offline HTML report. Imports no torch.

A pipeline of four stages, one sub-package each, every stage importing only the stages
before it and the data model (:mod:`~.model`, :mod:`~.text`) at the bottom:

1. :mod:`~.read`: files to compact per-rank data (safe loading, extraction);
2. :mod:`~.align`: group membership, each group's records side by side, p2p pairs;
3. :mod:`~.diagnose`: the wait-for graph, findings root cause first, the verdict;
4. :mod:`~.present`: the text report, ``--entries``, JSON, Perfetto and HTML.

:mod:`~.analysis` runs stages 1-3 (:func:`analyze`); :mod:`~.command` is ``commscope
analyze``; :mod:`~.synth` writes synthetic dumps for tests and benchmarks.
"""

from __future__ import annotations

from commscope.analyze.analysis import FORMAT, Analysis, analyze, analyze_loaded
from commscope.analyze.diagnose.findings import KINDS
from commscope.analyze.model import Finding, Group, LoadResult, RankDump, Unreadable
from commscope.analyze.present.entries import format_entries
from commscope.analyze.present.export import (
    html_report,
    perfetto_trace,
    write_html,
    write_json,
    write_perfetto,
)
from commscope.analyze.present.report import format_report
from commscope.analyze.read.load import SafeUnpickler, load_dumps, read_dump_file

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
