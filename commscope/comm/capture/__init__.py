"""Capturing a block's collectives: ``CommDebugMode`` and what it hooks into torch.

:mod:`~.mode` is the context manager (a dispatch mode, or with ``ops=False`` only
:mod:`~.hooks` at the entry points); :mod:`~.modules` tracks module names and phases;
:mod:`~.pipeline` charges a pipeline stage's send/recv to its phase; :mod:`~.registry`
knows every collective op; :mod:`~.counts` counts; :mod:`~.snapshot` turns the capture
into a :class:`~commscope.comm.trace.model.CommTrace`; :mod:`~.needs` looks up the torch
internals once. Needs torch; builds on :mod:`commscope.comm.trace` and
:mod:`commscope.comm.present`.
"""
