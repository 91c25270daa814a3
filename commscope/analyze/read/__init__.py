"""Stage 1 of the analyzer: files to compact per-rank data.

:mod:`~.load` finds and reads every dump safely (pickle without imports, JSON, gzip; the
optional C reader ``_fastread``), :mod:`~.extract` turns one dump into a
:class:`~commscope.analyze.model.RankDump` (columns per group, via :mod:`~.records` and
:mod:`~.signature`), :mod:`~.fatal` reads the last words of a rank that died in C,
:mod:`~.places` finds the user's own frame in a stack, :mod:`~.frame_source` reads a
record's frames back when a finding needs them, :mod:`~.jobs` tells the jobs of one folder
apart, and :mod:`~.inputs` reads several folders and archives as one folder
(:mod:`~.archive` unpacks an archive safely). Imports only the data model below it.
"""
