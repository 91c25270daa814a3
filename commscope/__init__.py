"""commscope: see your distributed PyTorch job.

Four parts, each in its own subpackage:

* :mod:`commscope.mesh` — n-dimensional named device meshes over ``torch.distributed``
  process groups, and offline planning of meshes of any size;
* :mod:`commscope.comm` — ``CommDebugMode``: per-module tracing of collectives;
* :mod:`commscope.flight` — a flight recorder of every collective, dumped on hang;
* :mod:`commscope.analyze` — reads every rank's dump and says why the job is stuck.

Importing ``commscope`` imports none of them (nor torch): ``commscope.analyze`` must
work where torch is not installed.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
