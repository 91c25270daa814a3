"""Recording: what the flight recorder keeps of every call, bounded, without a tensor.

:mod:`~.recorder` turns each call on a recording group into an :class:`~.entry.Entry`
(in a :class:`~.ring.Ring`) and follows it to completion (:mod:`~.work` wrappers,
:mod:`~.marks` for synchronous device calls); :mod:`~.groups` holds each group's
identity and counters; :mod:`~.stack` walks the caller's stack (``_stack.c``, optional).
Knows nothing of how calls reach it or how dumps leave.
"""
