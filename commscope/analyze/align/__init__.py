"""Stage 2 of the analyzer: who is in which group, and every group's records side by side.

:mod:`~.match` decides the expected ranks and each group's members, lines up each group's
collectives by sequence number across ranks (a :class:`~.match.GroupView` per group) and
pairs send/recv ops. Imports only the data model and stage 1.
"""
