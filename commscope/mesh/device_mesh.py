"""``DeviceMesh``: a :class:`~commscope.mesh.layout.MeshLayout` plus this rank's groups.

``init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))`` creates, on each rank,
only the process groups that rank belongs to (one per axis), with
``new_group(ranks, use_local_synchronization=True)`` so that the members of a group
alone take part in creating it. PyTorch's ``init_device_mesh`` makes every rank call
``new_group`` for every group of every axis (10 256 calls per rank for a
``(2, 1024, 8)`` mesh). Before any group exists, the ranks check through the store that
they all asked for the same mesh, so a mismatch is an error instead of a hang.

The mesh *is* a ``torch.distributed.device_mesh.DeviceMesh`` (a subclass, built from
the groups with torch's public ``DeviceMesh.from_group``), so FSDP1, FSDP2 (HSDP),
DTensor and tensor parallelism take it as it is. ``to_torch()`` gives a plain torch
mesh over the same groups for code that insists on the exact class.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Literal

import commscope.needs_torch  # noqa: F401 (first: a clear error where torch is absent)

# isort: split
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh as TorchDeviceMesh

from commscope.mesh.agreement import check_ranks_agree
from commscope.mesh.layout import MeshError, MeshLayout
from commscope.mesh.topology import (
    AxisLocality,
    axis_locality,
    ranks_per_host_from_env,
    warn_fast_axes_crossing_hosts,
)

__all__ = ["DeviceMesh", "init_device_mesh", "GroupCreation"]

logger = logging.getLogger(__name__)

GroupCreation = Literal["auto", "local", "all"]
"""How groups are created: ``local`` (members only), ``all`` (every rank calls
``new_group`` for every group, PyTorch's way) or ``auto`` (local where the backend
allows it)."""

_DEFAULT_CHECK_TIMEOUT = timedelta(minutes=10)


def _check_device_type(device_type: object) -> str:
    if not isinstance(device_type, str) or not device_type.isalpha():
        hint = ""
        if isinstance(device_type, str) and ":" in device_type:
            hint = f"; pass {device_type.split(':')[0]!r} (torch.device({device_type!r}).type)"
        raise MeshError(
            f"device_type must be a device type such as 'cpu' or 'cuda', got {device_type!r}{hint}"
        )
    return device_type


def _backend_name() -> str:
    try:
        return str(dist.get_backend()).lower()
    except Exception:  # a custom backend without a name
        return ""


def _choose_creation(requested: GroupCreation) -> Literal["local", "all"]:
    env = os.environ.get("COMMSCOPE_MESH_GROUPS", "").strip().lower()
    choice = env if env in ("local", "all") else requested
    if choice not in ("auto", "local", "all"):
        raise MeshError(f"group_creation must be 'auto', 'local' or 'all', got {requested!r}")
    if choice != "auto":
        return choice  # type: ignore[return-value]
    if _backend_name() == "mpi":
        return "all"  # MPI cannot create groups with member-only synchronisation
    if getattr(getattr(dist, "config", None), "use_torchcomms", False):
        return "all"  # torchcomms turns new_group into a world-collective split
    return "local"


def _set_cuda_device(device_type: str) -> None:
    if device_type != "cuda" or not torch.cuda.is_available():
        return
    if torch.cuda.is_initialized() and torch.cuda.current_device() != 0:
        return
    local = os.environ.get("LOCAL_RANK")
    index = int(local) if local is not None else dist.get_rank() % torch.cuda.device_count()
    torch.cuda.set_device(index)


def _create_groups(
    layout: MeshLayout,
    rank: int,
    creation: Literal["local", "all"],
    timeout: timedelta | None,
    backend: str | None,
) -> list[Any]:
    """Create (or reuse) this rank's group along every axis of a root layout."""
    groups = []
    for i, name in enumerate(layout.names):
        desc = f"mesh_{name}"
        if layout.covers_world(i) and backend is None:
            groups.append(dist.distributed_c10d._get_default_group())
            continue
        if creation == "local":
            pg = dist.new_group(
                layout.group(rank, i),
                timeout=timeout,
                backend=backend,
                use_local_synchronization=True,
                group_desc=desc,
            )
        else:
            pg = None
            for row in layout.all_groups(i).tolist():
                created = dist.new_group(row, timeout=timeout, backend=backend, group_desc=desc)
                if rank in row:
                    pg = created
        groups.append(pg)
    return groups


def init_device_mesh(
    device_type: str,
    mesh_shape: Sequence[int] | int,
    *,
    mesh_dim_names: Sequence[str] | None = None,
    timeout: timedelta | None = None,
    backend: str | None = None,
    group_creation: GroupCreation = "auto",
    ranks_per_host: int | None = None,
) -> DeviceMesh:
    """Lay the job's ranks out on an n-D named mesh and create this rank's groups.

    Args:
        device_type: ``"cpu"``, ``"cuda"``, … (a type, not ``"cuda:0"``).
        mesh_shape: axis sizes; their product must be the world size.
        mesh_dim_names: one unique name per axis (default ``dim_0``, ``dim_1``, …).
        timeout: timeout of the new groups, and of the check that all ranks agree
            (default: the groups get torch's default; the check waits 10 minutes).
        backend: backend of the new groups (default: the default group's).
        group_creation: ``"auto"`` (member-only creation where the backend allows it),
            ``"local"`` or ``"all"`` (PyTorch's way). ``COMMSCOPE_MESH_GROUPS`` overrides.
        ranks_per_host: for the locality check (default ``LOCAL_WORLD_SIZE``).

    Every rank must call it with the same arguments; if they differ, every rank raises
    :class:`~commscope.mesh.agreement.MeshDisagreement` instead of hanging. Initialises
    the default process group from the environment if there is none yet.
    """
    device_type = _check_device_type(device_type)
    shape = (mesh_shape,) if isinstance(mesh_shape, int) else tuple(mesh_shape)
    names = tuple(mesh_dim_names) if mesh_dim_names is not None else None
    if not dist.is_initialized():
        logger.info("init_device_mesh: initialising the default process group from env://")
        dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    if world > 1 and _backend_name() != "fake":
        check_ranks_agree(
            dist.distributed_c10d._get_default_store(),
            rank,
            world,
            {"shape": list(shape), "names": list(names) if names else None, "device": device_type},
            timeout or _DEFAULT_CHECK_TIMEOUT,
        )
    layout = MeshLayout.create(shape, names, world_size=world)
    _set_cuda_device(device_type)
    creation = _choose_creation(group_creation)
    groups = _create_groups(layout, rank, creation, timeout, backend)
    per_host = ranks_per_host or ranks_per_host_from_env(world)
    if per_host < world:
        warn_fast_axes_crossing_hosts(axis_locality(layout, per_host), per_host, world)
    mesh = DeviceMesh._root_from_groups(device_type, layout, groups, per_host)
    mesh._cs_creation = creation
    return mesh


def _group_name(pg: Any) -> str | None:
    return None if pg is None else str(pg.group_name)


def _resolve_group(name: str | None) -> Any:
    """The process group called ``name`` in this process, or ``None``."""
    if name is None:
        return None
    try:
        return dist.distributed_c10d._resolve_process_group(name)
    except Exception:  # unpickled where that group does not exist: the caller says so
        return None


class DeviceMesh(TorchDeviceMesh):
    """An n-D named mesh of ranks with this rank's process group along each axis.

    A ``torch.distributed.device_mesh.DeviceMesh`` as far as torch is concerned (FSDP,
    DTensor and tensor parallelism accept it), with commscope's additions: any axis may
    be given by name or index; ``flatten(name)`` and ``unflatten(axis, sizes, names)``
    are public and create only this rank's groups, reusing any group the mesh already
    has; ``layout`` holds the pure arithmetic; ``describe()`` draws the grid with hosts;
    ``to_torch()`` gives a plain torch mesh over the same groups.

    Create it with :func:`init_device_mesh` (or :meth:`from_torch`), not directly.
    """

    _cs_layout: MeshLayout
    _cs_root: DeviceMesh | None
    _cs_flat: dict[str, DeviceMesh]
    _cs_groups: list[Any]
    _cs_ranks_per_host: int
    _cs_torch: TorchDeviceMesh | None
    _cs_base: DeviceMesh | None
    _cs_known: dict[tuple[int, ...], Any]
    _cs_unflat: dict[MeshLayout, DeviceMesh]
    _cs_creation: Literal["local", "all"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError(
            "create a commscope DeviceMesh with commscope.mesh.init_device_mesh(...) "
            "or DeviceMesh.from_torch(torch_mesh)"
        )

    # ---------------------------------------------------------------- building

    @classmethod
    def _adopt(
        cls,
        torch_mesh: TorchDeviceMesh,
        layout: MeshLayout,
        root: DeviceMesh | None,
        groups: list[Any],
        ranks_per_host: int,
        base: DeviceMesh | None = None,
    ) -> DeviceMesh:
        """Turn a torch mesh (made by torch's own public API) into ours, in place.

        ``base`` is the mesh a slice was cut from (``None``: this mesh owns its torch
        groups: a root, a flattened axis or an unflattened mesh).
        """
        torch_mesh.__class__ = cls
        mesh: DeviceMesh = torch_mesh  # type: ignore[assignment]
        mesh._cs_layout = layout
        mesh._cs_root = root
        mesh._cs_flat = {}
        mesh._cs_groups = groups
        mesh._cs_ranks_per_host = ranks_per_host
        mesh._cs_torch = None
        mesh._cs_base = base
        mesh._cs_known = {}
        mesh._cs_unflat = {}
        mesh._cs_creation = "local"
        if root is None:
            rank = mesh.get_rank()
            for i, pg in enumerate(groups):
                mesh._cs_known.setdefault(tuple(layout.group(rank, i)), pg)
        return mesh

    @classmethod
    def _root_from_groups(
        cls, device_type: str, layout: MeshLayout, groups: list[Any], ranks_per_host: int
    ) -> DeviceMesh:
        if layout.ndim == 1:
            tm = TorchDeviceMesh.from_group(groups[0], device_type, mesh_dim_names=layout.names)
        else:
            grid = torch.arange(layout.world_size, dtype=torch.int).reshape(layout.shape)
            tm = TorchDeviceMesh.from_group(
                groups, device_type, mesh=grid, mesh_dim_names=layout.names
            )
        return cls._adopt(tm, layout, None, groups, ranks_per_host)

    @classmethod
    def from_torch(cls, mesh: TorchDeviceMesh, ranks_per_host: int | None = None) -> DeviceMesh:
        """Wrap a root mesh made by torch's ``init_device_mesh`` (same groups, no new ones).

        Its ranks must be laid out row-major (as ``init_device_mesh`` does); an explicit
        permuted mesh is refused with a clear error.
        """
        if isinstance(mesh, DeviceMesh):
            return mesh
        shape = tuple(mesh.shape)
        expected = torch.arange(mesh.size(), dtype=torch.int).reshape(shape)
        if mesh.size() != dist.get_world_size() or not torch.equal(
            mesh.mesh.to(torch.int), expected
        ):
            raise MeshError(
                "from_torch needs a root mesh over all ranks in row-major order "
                f"(like init_device_mesh), got {mesh.mesh.tolist()}"
            )
        layout = MeshLayout.create(shape, mesh.mesh_dim_names, world_size=dist.get_world_size())
        groups = mesh.get_all_groups()
        per_host = ranks_per_host or ranks_per_host_from_env(layout.world_size)
        ours = cls._root_from_groups(mesh.device_type, layout, groups, per_host)
        ours._cs_creation = _choose_creation("auto")
        return ours

    # ------------------------------------------------------------------ queries

    @property
    def layout(self) -> MeshLayout:
        """The pure arithmetic of this mesh (or slice, or flattened axis)."""
        return self._cs_layout

    @property
    def axis_names(self) -> tuple[str, ...]:
        """Axis names of this mesh (``mesh_dim_names`` in torch's spelling)."""
        return self._cs_layout.names

    @property
    def root(self) -> DeviceMesh:
        """The full mesh this slice or flattened axis comes from (itself for a root)."""
        return self._cs_root if self._cs_root is not None else self

    def _flat_axis(self, axis: object) -> DeviceMesh | None:
        if isinstance(axis, str) and axis not in self._cs_layout.names:
            return self.root._cs_flat.get(axis)
        return None

    def _valid_names(self) -> list[str]:
        return [*self._cs_layout.names, *(n for n in self.root._cs_flat if self._cs_root is None)]

    def _index(self, axis: int | str | None) -> int:
        if axis is None:
            if self.ndim != 1:
                raise MeshError(
                    f"this mesh has {self.ndim} axes {list(self.axis_names)}: name one, "
                    "e.g. get_group('tp'), or use get_all_groups()"
                )
            return 0
        try:
            return self._cs_layout.axis_index(axis)
        except MeshError:
            if isinstance(axis, str):
                raise MeshError(
                    f"unknown axis name {axis!r}; valid names are {self._valid_names()}"
                ) from None
            raise

    def size(self, mesh_dim: int | str | None = None) -> int:  # type: ignore[override]
        """Ranks in the mesh, or along one axis given by index or name."""
        if mesh_dim is None:
            return self._cs_layout.size
        flat = self._flat_axis(mesh_dim)
        if flat is not None:
            return flat.size()
        return self._cs_layout.shape[self._index(mesh_dim)]

    def get_group(self, mesh_dim: int | str | None = None) -> dist.ProcessGroup:  # type: ignore[override]
        """The process group of this rank along an axis (name or index)."""
        flat = self._flat_axis(mesh_dim)
        if flat is not None:
            return flat.get_group()
        return super().get_group(self._index(mesh_dim))

    def get_local_rank(self, mesh_dim: int | str | None = None) -> int:  # type: ignore[override]
        """The position of this rank in its group along an axis (its coordinate there)."""
        flat = self._flat_axis(mesh_dim)
        if flat is not None:
            return flat.get_local_rank()
        return self._cs_layout.local_rank(self.get_rank(), self._index(mesh_dim))

    def group_ranks(self, axis: int | str | None = None) -> list[int]:
        """Global ranks of this rank's group along an axis (all axes: the sub-mesh)."""
        flat = self._flat_axis(axis)
        if flat is not None:
            return flat.group_ranks()
        if axis is None:
            return self._cs_layout.group(self.get_rank())
        return self._cs_layout.group(self.get_rank(), self._index(axis))

    def locality(self, ranks_per_host: int | None = None) -> list[AxisLocality]:
        """For each axis: do its groups stay inside a host?"""
        return axis_locality(self._cs_layout, ranks_per_host or self._cs_ranks_per_host)

    # ------------------------------------------------------------ slice, flatten

    def __getitem__(self, mesh_dim_names: str | tuple[str, ...]) -> DeviceMesh:  # type: ignore[override]
        """A view of some axes, by name, in the mesh's order; creates no group.

        On a root mesh, flattened axes may be taken too, alone or beside other axes
        (``mesh["dp_cp", "tp"]``), as long as no root axis is taken twice.
        """
        wanted = (mesh_dim_names,) if isinstance(mesh_dim_names, str) else tuple(mesh_dim_names)
        if len(wanted) == 1:
            flat = self._flat_axis(wanted[0]) if self._cs_root is None else None
            if flat is not None:
                return flat
        if self._cs_root is None and any(w in self._cs_flat for w in wanted):
            return self._with_flat_axes(wanted)
        layout = self._cs_layout.slice(wanted)
        if wanted == self._cs_layout.names:
            return self
        sub = TorchDeviceMesh.__getitem__(self, wanted)
        positions = [self._cs_layout.names.index(w) for w in wanted]
        groups = [self._cs_groups[p] for p in positions]
        base = self._cs_base if self._cs_base is not None else self
        return DeviceMesh._adopt(sub, layout, self.root, groups, self._cs_ranks_per_host, base)

    def _with_flat_axes(self, wanted: tuple[str, ...]) -> DeviceMesh:
        """A root's view mixing flattened axes with others: ``mesh["dp_cp", "tp"]``."""
        root_layout = self._cs_layout
        axes, groups = [], []
        for w in wanted:
            flat = self._cs_flat.get(w)
            if flat is not None:
                axes.append(flat._cs_layout.axes[0])
                groups.append(flat._cs_groups[0])
            elif w in root_layout.names:
                i = root_layout.names.index(w)
                axes.append(root_layout.axes[i])
                groups.append(self._cs_groups[i])
            else:
                raise MeshError(f"unknown axis name {w!r}; valid names are {self._valid_names()}")
        repeated = sorted({n for n in wanted if wanted.count(n) > 1})
        if repeated:
            raise MeshError(f"axis {', '.join(map(repr, repeated))} named twice in {wanted}")
        joined = [a for axis in axes for a in axis]
        if len(set(joined)) != len(joined):
            raise MeshError(
                f"{wanted} take a mesh axis twice: a flattened axis cannot be taken beside "
                f"one of the axes it joins ({self._joins_text()})"
            )
        if joined != sorted(joined):
            order = tuple(w for _, w in sorted(zip((a[0] for a in axes), wanted)))
            raise MeshError(f"{wanted} is out of order: axes keep the mesh's order; write {order}")
        layout = MeshLayout(root_layout.root_shape, root_layout.root_names, tuple(axes), wanted)
        cached = self._cs_unflat.get(layout)
        if cached is not None:
            return cached
        grid = torch.as_tensor(layout.submesh(self.get_rank()), dtype=torch.int)
        tm = TorchDeviceMesh.from_group(groups, self.device_type, mesh=grid,
                                        mesh_dim_names=wanted)
        view = DeviceMesh._adopt(tm, layout, self, groups, self._cs_ranks_per_host)
        self._cs_unflat[layout] = view
        return view

    def _joins_text(self) -> str:
        names = self._cs_layout.root_names
        return "; ".join(
            f"{n} joins {', '.join(names[a] for a in f._cs_layout.axes[0])}"
            for n, f in self._cs_flat.items()
        )

    def _existing_flat(self, layout: MeshLayout) -> DeviceMesh | None:
        """The root's flattened axis of ``layout``'s name, if made already (an error if
        that name joins other axes)."""
        name = layout.names[0]
        existing = self._cs_flat.get(name)
        if existing is not None and existing._cs_layout.axes != layout.axes:
            raise MeshError(f"flattened axis {name!r} already joins other axes; pick another name")
        return existing

    def flatten(self, name: str | None = None) -> DeviceMesh:
        """Join all axes of this mesh (or slice) into one axis called ``name``.

        ``mesh["dp_replicate", "dp_shard"].flatten("dp")``: the group along ``dp`` holds
        the ranks of both axes, row-major. Every rank must call it (same order, same
        name); only the members of each group take part in creating it, and a group
        with the same ranks as one this mesh already has (the whole world: the default
        group) is reused. The result is cached on the root by name and can be sliced
        from it afterwards: ``mesh["dp"]``.
        """
        layout = self._cs_layout.flatten(name)
        flat_name = layout.names[0]
        root = self.root
        existing = root._existing_flat(layout)
        if existing is not None:
            return existing
        if flat_name in root._cs_layout.names:
            raise MeshError(
                f"cannot name a flattened axis {flat_name!r}: the mesh already has an axis "
                f"of that name ({list(root.axis_names)})"
            )
        if self.ndim == 1:
            pg = self._cs_groups[0]
        else:
            pg = root._group_for(layout, 0, f"mesh_{flat_name}")
        tm = TorchDeviceMesh.from_group(pg, self.device_type, mesh_dim_names=(flat_name,))
        flat = DeviceMesh._adopt(tm, layout, root, [pg], self._cs_ranks_per_host)
        root._cs_flat[flat_name] = flat
        return flat

    def unflatten(
        self,
        axis: int | str,
        sizes: Sequence[int],
        names: Sequence[str],
        *,
        backend: str | None = None,
    ) -> DeviceMesh:
        """Split one axis into several: ``world.unflatten("world", (2, 4), ("dp", "tp"))``.

        The axis's ranks, in its order, are reshaped to ``sizes`` (one may be ``-1``),
        the other axes are kept, and the result is a new mesh with those axes (which
        can be sliced, flattened and handed to FSDP or DTensor like any other). Every
        rank must call it (same order, same arguments). A new axis whose group has the
        same ranks as a group this job's mesh already has reuses that group, so
        unflattening never duplicates a communicator; other groups are created by
        their members only (``backend``: their backend, and no reuse). Repeating the
        call returns the same mesh. Raises :class:`~commscope.mesh.layout.MeshError`
        for sizes that do not multiply to the axis's size, clashing names, or a split
        that is not a regular sub-grid (see :meth:`MeshLayout.unflatten`).
        """
        flat = self._flat_axis(axis) if self._cs_root is None else None
        if flat is not None:
            return flat.unflatten(0, sizes, names, backend=backend)
        p = self._index(axis)
        layout = self._cs_layout.unflatten(p, sizes, names)
        root = self.root
        cached = root._cs_unflat.get(layout)
        if cached is not None and backend is None:
            return cached
        rank = self.get_rank()
        added = layout.ndim - self.ndim
        groups = []
        for i, name in enumerate(layout.names):
            if i < p:
                groups.append(self._cs_groups[i])
            elif i > p + added:
                groups.append(self._cs_groups[i - added])
            else:
                groups.append(root._group_for(layout, i, f"mesh_{name}", backend))
        if layout.ndim == 1:
            tm = TorchDeviceMesh.from_group(groups[0], self.device_type,
                                            mesh_dim_names=layout.names)
        else:
            grid = torch.as_tensor(layout.submesh(rank), dtype=torch.int)
            tm = TorchDeviceMesh.from_group(groups, self.device_type, mesh=grid,
                                            mesh_dim_names=layout.names)
        mesh = DeviceMesh._adopt(tm, layout, root, groups, self._cs_ranks_per_host)
        if backend is None:
            root._cs_unflat[layout] = mesh
        return mesh

    def _group_for(
        self, layout: MeshLayout, axis: int, desc: str, backend: str | None = None
    ) -> Any:
        """The calling rank's group along ``axis`` of ``layout``: an existing one with
        the same ranks, the default group for the whole world, or a new one. Called on
        the root, which remembers every group its meshes hold and how the job creates
        groups: by their members only, or (``group_creation="all"``: MPI, torchcomms)
        every rank creating every group of the axis, in PyTorch's order.

        Every rank takes the same branch: the groups of one axis are translates of one
        another, so when the calling rank's group is known, every rank's group is.
        """
        rank = self.get_rank()
        key = tuple(layout.group(rank, axis))
        if backend is None:
            known = self._cs_known.get(key)
            if known is not None:
                return known
            if len(key) == self._cs_layout.world_size:
                return dist.distributed_c10d._get_default_group()
        if self._cs_creation == "all":
            pg = None
            for row in layout.all_groups(axis).tolist():
                created = dist.new_group(row, backend=backend, group_desc=desc)
                if rank in row:
                    pg = created
        else:
            pg = dist.new_group(
                list(key), backend=backend, use_local_synchronization=True, group_desc=desc
            )
        if backend is None:
            self._cs_known[key] = pg
        return pg

    def _flatten(
        self, mesh_dim_name: str | None = None, backend_override: Any = None
    ) -> DeviceMesh:
        """PyTorch's private flatten, as torch does it, and known to this mesh too.

        Torch's own ``_flatten`` runs (its group creation, and its registration on the
        root, where DTensor looks for a flattened mesh to redistribute over several
        axes in one collective, as FSDP2's ``dp_mesh_dims`` path expects); the result
        is then one of ours, so ``mesh["name"]`` finds it. An axis already made with
        :meth:`flatten` under that name is returned as it is.
        """
        layout = self._cs_layout.flatten(mesh_dim_name)
        name = layout.names[0]
        root = self.root
        existing = root._existing_flat(layout)
        if existing is not None:
            return existing
        if backend_override is None:  # older torch has no such argument
            tm = TorchDeviceMesh._flatten(self, name)
        else:
            tm = TorchDeviceMesh._flatten(self, name, backend_override)
        pg = tm.get_group()
        flat = DeviceMesh._adopt(tm, layout, root, [pg], self._cs_ranks_per_host)
        root._cs_flat[name] = flat
        root._cs_known.setdefault(tuple(layout.group(self.get_rank(), 0)), pg)
        return flat

    def _unflatten(  # type: ignore[override]
        self,
        dim: int | str,
        mesh_sizes: Sequence[int],
        mesh_dim_names: Sequence[str],
        backend_override: Any = None,
    ) -> DeviceMesh:
        """PyTorch's private spelling of :meth:`unflatten` (same arguments)."""
        if backend_override is not None:
            raise MeshError(
                "commscope's unflatten takes backend='name' for the new groups instead of "
                "backend_override"
            )
        return self.unflatten(dim, mesh_sizes, mesh_dim_names)

    # -------------------------------------------------------------- hand-offs

    def to_torch(self) -> TorchDeviceMesh:
        """A plain ``torch.distributed.device_mesh.DeviceMesh`` over the same groups."""
        if self._cs_torch is None:
            if self._cs_base is not None:  # a slice: cut from its base's torch mesh
                self._cs_torch = self._cs_base.to_torch()[self.axis_names]
            elif self.ndim == 1:
                self._cs_torch = TorchDeviceMesh.from_group(
                    self._cs_groups[0], self.device_type, mesh_dim_names=self.axis_names
                )
            else:
                grid = self._cs_layout.submesh(self.get_rank())
                self._cs_torch = TorchDeviceMesh.from_group(
                    self._cs_groups,
                    self.device_type,
                    mesh=torch.as_tensor(grid, dtype=torch.int),
                    mesh_dim_names=self.axis_names,
                )
        return self._cs_torch

    # ------------------------------------------------------------------ pickling

    def __getstate__(self) -> dict[str, Any]:
        """Pickle without process groups (as torch's mesh does): they are kept by name.

        ``torch.save`` of a DTensor pickles its mesh, and so does ``copy.deepcopy``.
        """
        parent = getattr(super(), "__getstate__", None)  # torch's own drops its groups
        state = dict(parent() if parent is not None else self.__dict__)
        state["_cs_groups"] = [_group_name(pg) for pg in self._cs_groups]
        state["_cs_known"] = {k: _group_name(pg) for k, pg in self._cs_known.items()}
        state["_cs_torch"] = None  # rebuilt on demand
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Restore, finding the groups by name in this process (``None`` if absent)."""
        parent = getattr(super(), "__setstate__", None)
        if parent is not None:
            parent(state)
        else:  # a torch without its own: plain attributes
            self.__dict__.update(state)
        names = list(self._cs_groups)
        self._cs_groups = [_resolve_group(name) for name in names]
        self._cs_known = {k: pg for k, name in self._cs_known.items()
                          if (pg := _resolve_group(name)) is not None}
        missing = [n for n, pg in zip(names, self._cs_groups) if n is not None and pg is None]
        if missing:
            logger.warning(
                "commscope mesh %s unpickled where its process groups do not exist (%d "
                "missing): its tensors' local data is readable, but no collective can run "
                "on it here", self, len(missing),
            )

    # ------------------------------------------------------------------ display

    def __repr__(self) -> str:
        axes = ", ".join(f"{n}={s}" for n, s in zip(self.axis_names, self._cs_layout.shape))
        return f"DeviceMesh({axes}, device={self.device_type!r})"

    __str__ = __repr__

    def describe(self, ranks_per_host: int | None = None) -> str:
        """The mesh drawn as a grid of ranks with their hosts, and each axis's locality.

        See :func:`commscope.mesh.describe.describe_mesh`.
        """
        from commscope.mesh.describe import describe_mesh

        return describe_mesh(
            self._cs_layout,
            rank=self.get_rank(),
            device_type=self.device_type,
            ranks_per_host=ranks_per_host or self._cs_ranks_per_host,
        )
