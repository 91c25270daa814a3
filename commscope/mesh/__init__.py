"""Device meshes: n-dimensional named layouts of ranks over ``torch.distributed`` groups.

* :class:`MeshError` and its kinds (``errors.py``) — every mesh error, also an
  instance of the exception type torch raises for the same mistake.
* :class:`MeshLayout` (``layout.py``) — pure arithmetic: coordinates, groups, slices,
  flattening; plans a million ranks with no processes.
* :func:`init_device_mesh` / :class:`DeviceMesh` (``device_mesh.py``) — the layout plus
  this rank's process groups; a torch ``DeviceMesh`` that FSDP and DTensor accept, and
  a drop-in for torch's own. Its slices and flattened and unflattened views are made in
  ``reshape.py``, its groups in ``groups.py``.
* :func:`plan_mesh` (``plan.py``) — what ``commscope mesh`` prints.
* :class:`HostTable` (``hosts.py``) — which host each rank runs on: the ranks' real
  hostnames for a live mesh (gathered once per job through the store, ``gather.py``),
  arithmetic for planning.
* ``topology.py`` — whether each axis stays inside a host, and the warning when a
  ``tp``/``cp``/``ep`` axis does not.

``init_device_mesh`` and ``DeviceMesh`` import torch; they are loaded on first use so
that planning works without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from commscope.mesh.describe import describe_mesh
from commscope.mesh.errors import MeshError, MeshIndexError, MeshKeyError, MeshRuntimeError
from commscope.mesh.hosts import HostTable
from commscope.mesh.layout import MeshLayout
from commscope.mesh.plan import MeshPlan, format_plan, plan_mesh
from commscope.mesh.topology import AxisLocality, axis_locality

if TYPE_CHECKING:
    from commscope.mesh.agreement import MeshDisagreement
    from commscope.mesh.device_mesh import DeviceMesh, init_device_mesh

__all__ = [
    "AxisLocality",
    "DeviceMesh",
    "HostTable",
    "MeshDisagreement",
    "MeshError",
    "MeshIndexError",
    "MeshKeyError",
    "MeshLayout",
    "MeshPlan",
    "MeshRuntimeError",
    "axis_locality",
    "describe_mesh",
    "format_plan",
    "init_device_mesh",
    "plan_mesh",
]

_LAZY = {
    "DeviceMesh": "commscope.mesh.device_mesh",
    "init_device_mesh": "commscope.mesh.device_mesh",
    "MeshDisagreement": "commscope.mesh.agreement",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'commscope.mesh' has no attribute {name!r}")
