"""What is shown from a trace: tables, the offline viewer and ``commscope diff``.

:mod:`~.report` prints the noise-level tables and the summary; :mod:`~.viewer` writes the
offline HTML viewer; :mod:`~.compare` (with :mod:`~.compare_types`,
:mod:`~.compare_report` and :mod:`~.compare_viewer`) compares two traces. Reads
:mod:`commscope.comm.trace` only; needs no torch.
"""
