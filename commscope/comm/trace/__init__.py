"""What a traced block produced, and its file format: the bottom of ``commscope.comm``.

:mod:`~.model` holds the trace (:class:`~.model.CommTrace`: the module tree, per-phase
counts, one :class:`~.model.CollectiveRecord` per collective); :mod:`~.schema` writes it
as PyTorch's JSON dump with our additions and reads any such dump back. Needs no torch.
"""
