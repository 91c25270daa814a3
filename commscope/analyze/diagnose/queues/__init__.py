"""Stage 3 for device backends (NCCL): who waits for whom when calls return at once.

:mod:`.graph` builds the wait-for graph of the ranks' device queues; :mod:`.roots` names
the two kinds of culprit it can show (a rank whose thread stopped issuing, a rank whose
device stopped finishing), the cycles and the ops everyone is inside.
"""
