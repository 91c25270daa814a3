"""Stage 3 of the analyzer: the wait-for graph, and from it findings and a verdict.

:mod:`~.context` holds what the stages before produced; :mod:`~.waits` builds the
wait-for graph; :mod:`~.mismatch`, :mod:`~.timing`, :mod:`~.crashes`, :mod:`~.cycles` and
:mod:`~.skips` each find one kind of cause; :mod:`~.findings` puts them together, root
cause first, with the verdict; :mod:`~.wording` holds the phrasing they share. Imports
only the data model and stages 1-2.
"""
