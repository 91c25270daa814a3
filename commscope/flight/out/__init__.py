"""Getting the record out: dumps, their triggers, and the live progress records.

:mod:`~.dump` writes a rank's dump atomically (pickle or JSON, PyTorch's format), with
every thread's stack (:mod:`~.threads`); :mod:`~.watchdog` decides when (timeout,
failure, signal, a request from another rank); :mod:`~.fatal` keeps the last words of a
rank that dies in C; :mod:`~.publish` writes the small progress records ``commscope
watch`` reads, in the format and under the keys of :mod:`~.progress`.
"""
