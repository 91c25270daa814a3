"""Splicing into torch: how every collective of every group reaches the recorder.

:mod:`~.install` wraps ``distributed_c10d._new_process_group_helper`` so torch builds a
:class:`~.backend.RecordingProcessGroup` (:mod:`~.backend`: each method records through
:mod:`commscope.flight.record`, with :mod:`~.describe` reading its arguments) and hands
it the real backends; :mod:`~.selfcheck` says, loudly, when this torch does not fit.
"""
