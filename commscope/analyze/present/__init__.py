"""Stage 4 of the analyzer: what people and programs read.

:mod:`~.report` writes the text report, :mod:`~.entries` the per-record listing
(``--entries``), :mod:`~.export` the JSON, the Perfetto timeline and the offline HTML
report. Reads an :class:`~commscope.analyze.analysis.Analysis`; decides nothing.
"""
