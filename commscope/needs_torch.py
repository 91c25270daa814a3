"""Imported first by every part of commscope that runs on torch; raises if torch is absent.

``import commscope.needs_torch`` raises :class:`~commscope.compat.TorchMissing` (an
``ImportError``) saying what to install and what works without it, instead of a bare
``No module named 'torch'`` from deep inside an import. The flight recorder,
``CommDebugMode`` and the live mesh import it; the analyzer, ``view``, ``diff`` and mesh
planning never do.
"""

from __future__ import annotations

from commscope.compat import need_torch

need_torch("This part of commscope (the flight recorder, CommDebugMode, init_device_mesh)")
