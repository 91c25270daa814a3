"""How a mesh gets its process groups, and the torch meshes that hold them.

* :func:`normalize_backend_override` reads ``backend_override`` as torch's
  ``init_device_mesh`` and ``_unflatten`` take it (by axis index or name; a backend
  name, its options, or both), with torch's checks and error types.
* :func:`choose_creation` decides how groups are created: by their members only
  (``new_group(ranks, use_local_synchronization=True)``) or, like torch, every rank
  creating every group of an axis (MPI, torchcomms, ``COMMSCOPE_MESH_GROUPS=all``).
* :func:`create_axis_group` creates the calling rank's group along one axis of a
  layout that way; a rank outside a mesh smaller than the job gets ``None``.
* :func:`torch_view` builds the torch ``DeviceMesh`` over a layout's sub-mesh with
  those groups, through torch's public ``DeviceMesh.from_group`` (or, on a rank outside
  the mesh, an empty one, as torch's own is there).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any, Literal

import commscope.needs_torch  # noqa: F401 (first: a clear error where torch is absent)

# isort: split
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh as TorchDeviceMesh

from commscope import compat
from commscope.mesh.errors import MeshError, MeshRuntimeError
from commscope.mesh.layout import MeshLayout

__all__ = [
    "DEFAULT_SPEC",
    "BackendSpec",
    "GroupCreation",
    "backend_name",
    "choose_creation",
    "create_axis_group",
    "normalize_backend_override",
    "set_cuda_device",
    "torch_view",
]

GroupCreation = Literal["auto", "local", "all"]
"""How groups are created: ``local`` (members only), ``all`` (every rank calls
``new_group`` for every group, PyTorch's way) or ``auto`` (local where the backend
allows it)."""

BackendSpec = tuple[str | None, Any]
"""One axis's ``(backend name, backend options)``; ``(None, None)``: the job's default."""

DEFAULT_SPEC: BackendSpec = (None, None)


def normalize_backend_override(
    override: Mapping[int | str, Any] | None,
    ndim: int,
    names: Sequence[str] | None,
) -> tuple[BackendSpec, ...]:
    """One ``(backend, options)`` per axis from torch's ``backend_override`` mapping.

    Keys are axis indices or names (names only where the mesh has them); a value is a
    backend name (``"gloo"``), backend options (``ProcessGroupNCCL.Options()``), or a
    ``(name, options)`` pair. Raises :class:`MeshRuntimeError` (a ``RuntimeError``, as
    torch) for an axis given twice or a key that is not an axis.
    """
    if override is None:
        return (DEFAULT_SPEC,) * ndim
    if not isinstance(override, Mapping):
        raise MeshRuntimeError(
            "backend_override must be a dict from an axis (index or name) to a backend, "
            f"its options, or both, e.g. {{0: 'gloo'}}; got {override!r}"
        )
    left = dict(override)
    named = tuple(names or ())
    specs: list[BackendSpec] = []
    for i in range(ndim):
        name = named[i] if i < len(named) else None
        if name is not None and name in left and i in left:
            raise MeshRuntimeError(
                f"Found redundant dim index {i} and name {name} in backend_override: "
                "give each axis once, by index or by name"
            )
        if name is not None and name in left:
            specs.append(_spec(left.pop(name)))
        elif i in left:
            specs.append(_spec(left.pop(i)))
        else:
            specs.append(DEFAULT_SPEC)
    if left:
        valid = f"integers in range [0, {ndim})" + (f" or one of {named}" if named else "")
        raise MeshRuntimeError(
            f"Found invalid keys in backend_override: got {list(left)}, expected {valid}"
        )
    return tuple(specs)


def _spec(value: Any) -> BackendSpec:
    if value is None or isinstance(value, str):
        return (value, None)
    if isinstance(value, tuple) and len(value) == 2:
        return (value[0], value[1])
    return (None, value)  # backend options alone


def backend_name() -> str:
    """The default group's backend, lower case (``""`` for a custom one without a name)."""
    try:
        return str(dist.get_backend()).lower()
    except Exception:  # a custom backend without a name
        return ""


def choose_creation(requested: GroupCreation) -> Literal["local", "all"]:
    """``local`` or ``all``: ``COMMSCOPE_MESH_GROUPS`` first, then ``requested``, where
    ``auto`` is ``local`` unless the backend cannot create groups with its members only."""
    env = os.environ.get("COMMSCOPE_MESH_GROUPS", "").strip().lower()
    choice = env if env in ("local", "all") else requested
    if choice not in ("auto", "local", "all"):
        raise MeshError(f"group_creation must be 'auto', 'local' or 'all', got {requested!r}")
    if choice != "auto":
        return choice  # type: ignore[return-value]
    if backend_name() == "mpi":
        return "all"  # MPI cannot create groups with member-only synchronisation
    if getattr(getattr(dist, "config", None), "use_torchcomms", False):
        return "all"  # torchcomms turns new_group into a world-collective split
    return "local"


def set_cuda_device(device_type: str) -> None:
    """Pick this rank's GPU as torch's mesh does, unless the user already has."""
    if device_type != "cuda" or not torch.cuda.is_available() or backend_name() == "fake":
        return
    if torch.cuda.is_initialized() and torch.cuda.current_device() != 0:
        return
    local = os.environ.get("LOCAL_RANK")
    index = int(local) if local is not None else dist.get_rank() % torch.cuda.device_count()
    torch.cuda.set_device(index)


def create_axis_group(
    layout: MeshLayout,
    axis: int,
    creation: Literal["local", "all"],
    *,
    desc: str,
    spec: BackendSpec = DEFAULT_SPEC,
    timeout: timedelta | None = None,
) -> Any:
    """Create the calling rank's group along ``axis`` of ``layout`` (``None`` outside).

    ``local``: only the members of each group take part in creating it (a rank outside
    a mesh smaller than the job creates nothing). ``all``: every rank of the job
    creates every group of the axis, in torch's order. ``spec`` gives the backend and
    its options; without a ``timeout``, the options' own timeout is kept, as torch does.
    """
    backend, options = spec
    if timeout is None and options is not None:
        timeout = getattr(options, "_timeout", None)
    extra: dict[str, Any] = {"pg_options": options} if options is not None else {}
    rank = dist.get_rank()
    if creation == "local":
        if rank >= layout.world_size:
            return None
        return dist.new_group(
            layout.group(rank, axis),
            timeout=timeout,
            backend=backend,
            use_local_synchronization=True,
            group_desc=desc,
            **extra,
        )
    mine = None
    for row in layout.all_groups(axis).tolist():
        created = dist.new_group(row, timeout=timeout, backend=backend, group_desc=desc, **extra)
        if rank in row:
            mine = created
    return mine


def torch_view(
    device_type: str,
    layout: MeshLayout,
    groups: Sequence[Any],
    names: tuple[str, ...] | None,
) -> TorchDeviceMesh:
    """A torch ``DeviceMesh`` over the sub-mesh of ``layout`` that holds this rank.

    Made with torch's public ``DeviceMesh.from_group`` from ``groups`` (one per axis).
    On a rank outside the mesh (a mesh smaller than the job), where torch's own mesh
    holds no group either, it is the first sub-mesh with no groups: its coordinate is
    ``None``.
    """
    rank = dist.get_rank()
    if rank < layout.world_size and all(g is not None for g in groups):
        if layout.ndim == 1:
            return TorchDeviceMesh.from_group(groups[0], device_type, mesh_dim_names=names)
        grid = torch.as_tensor(layout.submesh(rank), dtype=torch.int)
        tm = TorchDeviceMesh.from_group(
            list(groups), device_type, mesh=grid, mesh_dim_names=names or layout.names
        )
        if names is None:  # from_group needs names for several groups: torch's has none
            compat.drop_mesh_dim_names(tm)
        return tm
    grid = torch.as_tensor(layout.submesh(0), dtype=torch.int)
    tm = TorchDeviceMesh(device_type, grid, mesh_dim_names=names, _init_backend=False)
    compat.clear_mesh_groups(tm)
    return tm
