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
DTensor and tensor parallelism take it as it is, and torch's own API works on it as on
torch's: the constructor ``DeviceMesh(device_type, mesh_tensor)``, ``backend_override``,
unnamed meshes, meshes smaller than the job, and torch's exception types
(:mod:`commscope.mesh.errors`). ``to_torch()`` gives a plain torch mesh over the same
groups for code that insists on the exact class.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any, Literal

import commscope.needs_torch  # noqa: F401 (first: a clear error where torch is absent)

# isort: split
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh as TorchDeviceMesh

from commscope.mesh import gather
from commscope.mesh.agreement import check_ranks_agree
from commscope.mesh.errors import (
    MeshError,
    MeshIndexError,
    MeshKeyError,
    MeshRuntimeError,
)
from commscope.mesh.groups import (
    DEFAULT_SPEC,
    BackendSpec,
    GroupCreation,
    backend_name,
    choose_creation,
    create_axis_group,
    normalize_backend_override,
    set_cuda_device,
    torch_view,
)
from commscope.mesh.hosts import HostTable
from commscope.mesh.layout import MeshLayout, format_shape
from commscope.mesh.reshape import MeshReshapes
from commscope.mesh.topology import (
    AxisLocality,
    axis_locality,
    ranks_per_host_from_env,
    warn_crossing_hosts,
)

__all__ = ["DeviceMesh", "init_device_mesh", "GroupCreation"]

logger = logging.getLogger(__name__)

_DEFAULT_CHECK_TIMEOUT = timedelta(minutes=10)
_LATER_GATHER_TIMEOUT = timedelta(seconds=60)
_warned_partial: set[tuple[int, int]] = set()
_warned_hosts: set[str] = set()


def _check_device_type(device_type: object) -> str:
    if not isinstance(device_type, str) or not device_type.isalpha():
        hint = ""
        if isinstance(device_type, str) and ":" in device_type:
            hint = f"; pass {device_type.split(':')[0]!r} (torch.device({device_type!r}).type)"
        raise MeshRuntimeError(
            "Device type with index is not supported: device_type must be a device type "
            f"such as 'cpu' or 'cuda', got {device_type!r}{hint}"
        )
    return device_type


def _check_size(layout: MeshLayout, world: int) -> None:
    """A mesh bigger than the job is refused (as torch); a smaller one leaves the other
    ranks out of it (as torch), which is said once per shape."""
    if layout.world_size > world:
        raise MeshRuntimeError(
            f"Mesh should not be bigger than default world size {world}: "
            f"{format_shape(layout.shape, layout.names)} = {layout.world_size} != world size "
            f"{world}: the mesh shape must multiply to the number of ranks; change the shape "
            f"or launch {layout.world_size} ranks"
        )
    if layout.world_size < world and (layout.world_size, world) not in _warned_partial:
        _warned_partial.add((layout.world_size, world))
        logger.warning(
            "init_device_mesh: %s = %d < world size %d: ranks %d..%d are not in this mesh "
            "(as in torch: their get_coordinate() is None and they hold no group of it)",
            format_shape(layout.shape, layout.names), layout.world_size, world,
            layout.world_size, world - 1,
        )


def _override_summary(specs: tuple[BackendSpec, ...]) -> list[str | None] | None:
    """What the ranks must agree on about ``backend_override`` (JSON-able)."""
    if all(s == DEFAULT_SPEC for s in specs):
        return None
    return [None if s == DEFAULT_SPEC else f"{s[0]}+{'options' if s[1] else ''}" for s in specs]


def _hosts_store() -> tuple[Any, Any] | None:
    """(the default group's store, the default group) where hostnames can be gathered:
    ``None`` for torch's fake process group, whose store holds nothing."""
    if backend_name() == "fake":
        return None
    try:
        c10d = dist.distributed_c10d
        return c10d._get_default_store(), c10d._get_default_group()
    except Exception:  # a backend without a store (MPI)
        return None


def _arithmetic_hosts(world: int, why: str | None, any_rank: bool = False) -> HostTable:
    """Hosts by arithmetic (``LOCAL_WORLD_SIZE``) where the real ones are not known;
    ``why``: a failure, said once by rank 0 (by this rank with ``any_rank``: it alone
    asked), or ``None`` (nothing to say: torch's fake group)."""
    per_host = ranks_per_host_from_env(world)
    if why is not None and (any_rank or dist.get_rank() == 0) and why not in _warned_hosts:
        _warned_hosts.add(why)
        logger.warning(
            "commscope mesh: %s; hosts are assumed to hold %d consecutive ranks each "
            "(LOCAL_WORLD_SIZE)", why, per_host,
        )
    return HostTable.consecutive(world, per_host)


def _publish_host() -> None:
    """Step 1 of gathering (:mod:`commscope.mesh.gather`): this rank's hostname into
    the default group's store, once per default group. Never raises."""
    found = _hosts_store()
    if found is None:
        return
    try:
        gather.publish(found[0], found[1], dist.get_rank(), dist.get_world_size())
    except Exception as exc:  # a store that refuses: the mesh falls back when asked
        logger.debug("commscope mesh: could not publish this rank's hostname: %r", exc)


def _job_hosts(timeout: timedelta) -> HostTable:
    """The whole job's host table, gathered with every rank of the job (called by
    ``init_device_mesh`` after its agreement check, on every rank)."""
    world = dist.get_world_size()
    found = _hosts_store()
    if found is None:
        if world == 1:
            return HostTable.from_hostnames([gather.this_host()])
        return _arithmetic_hosts(world, None)
    try:
        return gather.gather_job(found[0], found[1], dist.get_rank(), world, timeout)
    except gather.GatherFailed as exc:
        return _arithmetic_hosts(world, f"the ranks' hostnames could not be gathered ({exc})")


def _mesh_hosts(n: int) -> HostTable:
    """The host table of ranks ``0..n-1``, for a mesh made without ``init_device_mesh``
    (only its own ranks are waited for)."""
    world = dist.get_world_size()
    found = _hosts_store()
    if found is None:
        return _arithmetic_hosts(world, None).first(n)
    try:
        return gather.gather_first(found[0], found[1], n, world, _LATER_GATHER_TIMEOUT)
    except gather.GatherFailed as exc:
        why = f"the hostnames of this mesh's ranks could not be gathered ({exc})"
        return _arithmetic_hosts(world, why, any_rank=True).first(n)


def _create_groups(
    layout: MeshLayout,
    creation: Literal["local", "all"],
    timeout: timedelta | None,
    specs: tuple[BackendSpec, ...],
) -> list[Any]:
    """Create (or reuse) this rank's group along every axis of a root layout."""
    groups = []
    world = dist.get_world_size()
    for i, name in enumerate(layout.names):
        if specs[i] == DEFAULT_SPEC and layout.shape[i] == world:
            groups.append(dist.distributed_c10d._get_default_group())
            continue
        groups.append(create_axis_group(
            layout, i, creation, desc=f"mesh_{name}", spec=specs[i], timeout=timeout
        ))
    return groups


def init_device_mesh(
    device_type: str,
    mesh_shape: Sequence[int] | int,
    *,
    mesh_dim_names: Sequence[str] | None = None,
    backend_override: Mapping[int | str, Any] | None = None,
    timeout: timedelta | None = None,
    backend: str | None = None,
    group_creation: GroupCreation = "auto",
    ranks_per_host: int | None = None,
) -> DeviceMesh:
    """Lay the job's ranks out on an n-D named mesh and create this rank's groups.

    Args:
        device_type: ``"cpu"``, ``"cuda"``, … (a type, not ``"cuda:0"``).
        mesh_shape: axis sizes; their product is the world size (a smaller product
            leaves the other ranks out of the mesh, as torch does, and says so).
        mesh_dim_names: one unique name per axis; without names (as in torch) the
            mesh cannot be sliced by name, and its axes show as ``dim_0``, ``dim_1``.
        backend_override: torch's per-axis backend choice, by axis index or name: a
            backend name, its options, or ``(name, options)``; those axes get a group of
            their own even where the default group would do.
        timeout: timeout of the new groups, and of the check that all ranks agree
            (default: the groups get torch's default; the check waits 10 minutes).
        backend: backend of every new group (default: the default group's).
        group_creation: ``"auto"`` (member-only creation where the backend allows it),
            ``"local"`` or ``"all"`` (PyTorch's way). ``COMMSCOPE_MESH_GROUPS`` overrides.
        ranks_per_host: assume this many consecutive ranks per host instead of the
            ranks' real hostnames (default: the hostnames, gathered once per job
            through the default group's store; :mod:`commscope.mesh.gather`).

    Every rank must call it with the same arguments; if they differ, every rank raises
    :class:`~commscope.mesh.agreement.MeshDisagreement` instead of hanging. Initialises
    the default process group from the environment if there is none yet.
    """
    device_type = _check_device_type(device_type)
    shape = (mesh_shape,) if isinstance(mesh_shape, int) else tuple(mesh_shape)
    names = None
    if mesh_dim_names is not None:
        names = mesh_dim_names if isinstance(mesh_dim_names, str) else tuple(mesh_dim_names)
    layout = MeshLayout.create(shape, names)
    specs = normalize_backend_override(
        dict(backend_override) if backend_override is not None else None, layout.ndim, names
    )
    if backend is not None:
        specs = tuple((b or backend, o) for b, o in specs)
    if not dist.is_initialized():
        logger.info("init_device_mesh: initialising the default process group from env://")
        dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    _check_size(layout, world)
    if ranks_per_host is None:
        _publish_host()  # before the agreement check: after it, every name is there
    if world > 1 and backend_name() != "fake":
        request = {"shape": list(shape), "names": list(names) if names else None,
                   "device": device_type}
        if _override_summary(specs) is not None:
            request["backend_override"] = _override_summary(specs)
        check_ranks_agree(
            dist.distributed_c10d._get_default_store(), rank, world, request,
            timeout or _DEFAULT_CHECK_TIMEOUT,
        )
    if ranks_per_host is not None:
        hosts = HostTable.consecutive(world, ranks_per_host)
    else:
        hosts = _job_hosts(timeout or _DEFAULT_CHECK_TIMEOUT)
    warn_crossing_hosts(layout, hosts.first(layout.world_size), rank)
    set_cuda_device(device_type)
    creation = choose_creation(group_creation)
    groups = _create_groups(layout, creation, timeout, specs)
    tm = torch_view(device_type, layout, groups, names)
    mesh = DeviceMesh._adopt(tm, layout, None, groups, hosts, named=names is not None)
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


_PRIVATE_INIT = ("_layout", "_rank_map", "_root_mesh", "_rank")
"""torch's private constructor arguments: a mesh made with them stays torch's alone."""


class DeviceMesh(MeshReshapes):
    """An n-D named mesh of ranks with this rank's process group along each axis.

    A ``torch.distributed.device_mesh.DeviceMesh`` as far as torch is concerned (FSDP,
    DTensor and tensor parallelism accept it), with commscope's additions: any axis may
    be given by name or index; ``flatten(name)`` and ``unflatten(axis, sizes, names)``
    are public and create only this rank's groups, reusing any group the mesh already
    has; ``layout`` holds the pure arithmetic; ``describe()`` draws the grid with hosts;
    ``to_torch()`` gives a plain torch mesh over the same groups.

    Make one with :func:`init_device_mesh`, :meth:`from_torch`, or torch's constructor
    ``DeviceMesh(device_type, mesh)``, which runs as torch's does (every rank creates
    every group); a mesh tensor of the ranks ``0..n-1`` in row-major order
    (``torch.arange(8).reshape(2, 4)``) gets commscope's additions too, any other one
    (a permutation, ranks not from 0) is torch's mesh alone.
    """

    _cs_torch: TorchDeviceMesh | None

    def __init__(self, device_type: str, mesh: Any = None, *args: Any, **kwargs: Any) -> None:
        """Torch's constructor, unchanged (``DeviceMesh("cuda", torch.arange(8).view(2, 4),
        mesh_dim_names=("dp", "tp"))``), then commscope's additions where the mesh is the
        ranks ``0..n-1`` in row-major order."""
        self._cs_clear()
        super().__init__(device_type, mesh, *args, **kwargs)
        self._cs_adopt_constructed(kwargs)

    # ---------------------------------------------------------------- building

    def _cs_clear(self) -> None:
        """The state of a mesh that is torch's alone (every override defers to torch)."""
        self._cs_layout = None
        self._cs_named = False
        self._cs_root = None
        self._cs_flat = {}
        self._cs_groups = []
        self._cs_hosts = None
        self._cs_torch = None
        self._cs_base = None
        self._cs_known = {}
        self._cs_unflat = {}
        self._cs_creation = "local"

    def _cs_init(
        self,
        layout: MeshLayout,
        root: DeviceMesh | None,
        groups: list[Any],
        hosts: HostTable | None,
        base: DeviceMesh | None,
        named: bool,
    ) -> None:
        self._cs_clear()
        self._cs_layout = layout
        self._cs_named = named
        self._cs_root = root
        self._cs_groups = groups
        self._cs_hosts = hosts
        self._cs_base = base
        if root is None:
            rank = self.get_rank()
            rep = rank if rank < layout.world_size else 0
            for i, pg in enumerate(groups):
                self._cs_known.setdefault(tuple(layout.group(rep, i)), pg)

    def _cs_adopt_constructed(self, kwargs: dict[str, Any]) -> None:
        """After torch's constructor: commscope's additions when the mesh is ``0..n-1``
        row-major over this job, its groups were created, and its names are valid."""
        if any(kwargs.get(k) is not None for k in _PRIVATE_INIT):
            return
        if kwargs.get("_init_backend", True):
            self._cs_lay_out()

    def _cs_lay_out(self) -> None:
        """Add commscope's part to a torch mesh with its groups whose ranks are
        ``0..n-1`` of this job in row-major order (any other stays torch's alone)."""
        if not dist.is_initialized() or self.device_type == "xla":
            return
        grid = self.mesh
        n, world = grid.numel(), dist.get_world_size()
        if grid.ndim == 0 or n > world:
            return
        if not torch.equal(grid.flatten().to(torch.int64), torch.arange(n)):
            return
        names = self.mesh_dim_names
        try:
            layout = MeshLayout.create(tuple(grid.shape), names)
        except MeshError:
            return
        member = self.get_rank() < n
        groups = list(self.get_all_groups()) if member else [None] * layout.ndim
        _publish_host()  # its hosts are read when first asked (only its ranks' names)
        self._cs_init(layout, None, groups, None, None, names is not None)
        self._cs_creation = choose_creation("auto")

    @classmethod
    def _adopt(
        cls,
        torch_mesh: TorchDeviceMesh,
        layout: MeshLayout,
        root: DeviceMesh | None,
        groups: list[Any],
        hosts: HostTable | None,
        base: DeviceMesh | None = None,
        named: bool = True,
    ) -> DeviceMesh:
        """Turn a torch mesh (made by torch's own public API) into ours, in place.

        ``base`` is the mesh a slice was cut from (``None``: this mesh owns its torch
        groups: a root, a flattened axis or an unflattened mesh). ``hosts``: the job's
        host table, or ``None`` to gather it when first asked.
        """
        torch_mesh.__class__ = cls
        mesh: DeviceMesh = torch_mesh  # type: ignore[assignment]
        mesh._cs_init(layout, root, groups, hosts, base, named)
        return mesh

    @staticmethod
    def from_group(  # type: ignore[override]
        group: Any,
        device_type: str,
        mesh: Any = None,
        *,
        mesh_dim_names: tuple[str, ...] | None = None,
    ) -> DeviceMesh:
        """Torch's ``DeviceMesh.from_group`` (same arguments, checks and groups); the
        mesh is one of ours, with commscope's additions where its ranks are ``0..n-1``
        in row-major order (the world's group, or groups laid out as
        ``init_device_mesh`` does)."""
        tm = TorchDeviceMesh.from_group(group, device_type, mesh, mesh_dim_names=mesh_dim_names)
        tm.__class__ = DeviceMesh
        ours: DeviceMesh = tm  # type: ignore[assignment]
        ours._cs_clear()
        ours._cs_lay_out()
        return ours

    @classmethod
    def from_torch(cls, mesh: TorchDeviceMesh, ranks_per_host: int | None = None) -> DeviceMesh:
        """Wrap a root mesh made by torch's ``init_device_mesh`` (same groups, no new ones).

        Its ranks must be ``0..n-1`` laid out row-major (as ``init_device_mesh`` does);
        an explicit permuted mesh is refused with a clear error. Hosts are the ranks'
        real ones, read when first asked, unless ``ranks_per_host`` says otherwise.
        """
        if isinstance(mesh, DeviceMesh) and mesh._cs_layout is not None:
            return mesh
        shape = tuple(mesh.shape)
        n, world = mesh.size(), dist.get_world_size()
        expected = torch.arange(n, dtype=torch.int).reshape(shape)
        rank = dist.get_rank()
        if n > world or (rank < n and not torch.equal(mesh.mesh.to(torch.int), expected)):
            raise MeshError(
                "from_torch needs a root mesh over ranks 0..n-1 in row-major order "
                f"(like init_device_mesh), got {mesh.mesh.tolist()}"
            )
        names = mesh.mesh_dim_names
        layout = MeshLayout.create(shape, names)
        groups = list(mesh.get_all_groups()) if rank < n else [None] * layout.ndim
        hosts = None
        if ranks_per_host is not None:
            hosts = HostTable.consecutive(world, ranks_per_host)
        else:
            _publish_host()
        tm = torch_view(mesh.device_type, layout, groups, names)
        ours = cls._adopt(tm, layout, None, groups, hosts, named=names is not None)
        ours._cs_creation = choose_creation("auto")
        return ours

    # ------------------------------------------------------------------ queries

    def _need_layout(self) -> MeshLayout:
        if self._cs_layout is None:
            raise MeshError(
                f"this DeviceMesh holds the explicit mesh {self.mesh.tolist()}, which "
                "commscope does not lay out (its ranks are not 0..n-1 of this job in "
                "row-major order, or it was made without its groups): torch's DeviceMesh "
                "API works on it as on torch's own; layout, describe(), flatten() and "
                "unflatten() need a mesh from init_device_mesh, or "
                "DeviceMesh(device_type, torch.arange(n).reshape(shape))"
            )
        return self._cs_layout

    @property
    def layout(self) -> MeshLayout:
        """The pure arithmetic of this mesh (or slice, or flattened axis)."""
        return self._need_layout()

    @property
    def axis_names(self) -> tuple[str, ...]:
        """Axis names of this mesh (``mesh_dim_names``; ``dim_0``, … where it has none)."""
        if self._cs_layout is None:
            return tuple(self.mesh_dim_names or (f"dim_{i}" for i in range(self.ndim)))
        return self._cs_layout.names

    @property
    def root(self) -> DeviceMesh:
        """The full mesh this slice or flattened axis comes from (itself for a root)."""
        return self._cs_root if self._cs_root is not None else self

    def _member(self) -> bool:
        return self.get_rank() < self._need_layout().world_size

    def _not_member(self) -> MeshIndexError:
        n = self._need_layout().world_size
        return MeshIndexError(
            f"rank {self.get_rank()} is not in this mesh (ranks 0..{n - 1} are): it holds "
            "no group of it, and its get_coordinate() is None"
        )

    def _index(self, axis: int | str | None, what: str = "get_group") -> int:
        layout = self._need_layout()
        if axis is None:
            if self.ndim != 1:
                example = repr(layout.names[-1]) if self._cs_named else str(self.ndim - 1)
                raise MeshRuntimeError(
                    "Optional kwarg `mesh_dim` needs to be specified when device_mesh.ndim "
                    f"> 1. This mesh has {self.ndim} axes {list(layout.names)}: name one, "
                    f"e.g. {what}({example})"
                    + (", or use get_all_groups()" if what == "get_group" else "")
                )
            return 0
        if isinstance(axis, str) and not self._cs_named:
            raise MeshKeyError(
                f"No `mesh_dim_names` found: this mesh's axes have no names, so {axis!r} "
                f"is none of them; pass an index (0..{self.ndim - 1}), or name the axes: "
                "init_device_mesh(..., mesh_dim_names=(...))"
            )
        try:
            return layout.axis_index(axis)
        except MeshKeyError:
            raise MeshKeyError(
                f"Mesh dimension {axis!r} does not exist: unknown axis name {axis!r}; "
                f"valid names are {self._valid_names()}"
            ) from None

    def size(self, mesh_dim: int | str | None = None) -> int:  # type: ignore[override]
        """Ranks in the mesh, or along one axis given by index or name."""
        if self._cs_layout is None:
            return super().size(mesh_dim)  # type: ignore[arg-type]
        if mesh_dim is None:
            return self._cs_layout.size
        flat = self._flat_axis(mesh_dim)
        if flat is not None:
            return flat.size()
        return self._cs_layout.shape[self._index(mesh_dim, "size")]

    def get_group(self, mesh_dim: int | str | None = None) -> dist.ProcessGroup:  # type: ignore[override]
        """The process group of this rank along an axis (name or index)."""
        if self._cs_layout is None:
            return super().get_group(mesh_dim)
        flat = self._flat_axis(mesh_dim)
        if flat is not None:
            return flat.get_group()
        index = self._index(mesh_dim, "get_group")
        if not self._member():
            raise self._not_member()
        return super().get_group(index)

    def get_local_rank(self, mesh_dim: int | str | None = None) -> int:  # type: ignore[override]
        """The position of this rank in its group along an axis (its coordinate there)."""
        if self._cs_layout is None:
            return super().get_local_rank(mesh_dim)
        flat = self._flat_axis(mesh_dim)
        if flat is not None:
            return flat.get_local_rank()
        index = self._index(mesh_dim, "get_local_rank")
        if not self._member():
            raise self._not_member()
        return self._cs_layout.local_rank(self.get_rank(), index)

    def group_ranks(self, axis: int | str | None = None) -> list[int]:
        """Global ranks of this rank's group along an axis (all axes: the sub-mesh)."""
        flat = self._flat_axis(axis)
        if flat is not None:
            return flat.group_ranks()
        layout = self._need_layout()
        index = None if axis is None else self._index(axis, "group_ranks")
        if not self._member():
            raise self._not_member()
        if index is None:
            return layout.group(self.get_rank())
        return layout.group(self.get_rank(), index)

    @property
    def hosts(self) -> HostTable:
        """Where the ranks of this mesh run: the job's host table (real hostnames,
        gathered once per job), for ranks ``0..n-1`` of the mesh."""
        layout = self._need_layout()
        if self._cs_hosts is None:
            self._cs_hosts = _mesh_hosts(layout.world_size)
        return self._cs_hosts.first(layout.world_size)

    def _hosts_or(self, ranks_per_host: int | None) -> HostTable:
        if ranks_per_host is None:
            return self.hosts
        return HostTable.consecutive(self._need_layout().world_size, ranks_per_host)

    def locality(self, ranks_per_host: int | None = None) -> list[AxisLocality]:
        """For each axis: do its groups stay inside a host? (The real hosts, or
        ``ranks_per_host`` consecutive ranks per host.)"""
        return axis_locality(self._need_layout(), self._hosts_or(ranks_per_host))

    # -------------------------------------------------------------- hand-offs

    def to_torch(self) -> TorchDeviceMesh:
        """A plain ``torch.distributed.device_mesh.DeviceMesh`` over the same groups."""
        if self._cs_torch is None:
            if self._cs_layout is None:  # torch's alone: the same mesh in torch's class
                plain = object.__new__(TorchDeviceMesh)
                plain.__dict__.update(
                    {k: v for k, v in self.__dict__.items() if not k.startswith("_cs_")}
                )
                self._cs_torch = plain
            elif self._cs_base is not None:  # a slice: cut from its base's torch mesh
                self._cs_torch = self._cs_base.to_torch()[self.axis_names]
            else:
                names = self.axis_names if self._cs_named else None
                self._cs_torch = torch_view(
                    self.device_type, self._cs_layout, self._cs_groups, names
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
        state["_cs_hosts"] = None  # read again where asked (a table per rank of the job)
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
        self.__dict__.setdefault("_cs_named", True)  # pickled before unnamed meshes existed
        self.__dict__.setdefault("_cs_hosts", None)  # pickled before host tables existed
        self.__dict__.pop("_cs_ranks_per_host", None)
        self._cs_known = {k: pg for k, name in self._cs_known.items()
                          if (pg := _resolve_group(name)) is not None or name is None}
        missing = [n for n, pg in zip(names, self._cs_groups) if n is not None and pg is None]
        if missing:
            logger.warning(
                "commscope mesh %s unpickled where its process groups do not exist (%d "
                "missing): its tensors' local data is readable, but no collective can run "
                "on it here", self, len(missing),
            )

    # ------------------------------------------------------------------ display

    def __repr__(self) -> str:
        layout = self._cs_layout
        if layout is None:
            return super().__repr__()
        if self._cs_named:
            axes = ", ".join(f"{n}={s}" for n, s in zip(layout.names, layout.shape))
        else:
            axes = str(tuple(layout.shape))
        return f"DeviceMesh({axes}, device={self.device_type!r})"

    __str__ = __repr__

    def describe(self, ranks_per_host: int | None = None) -> str:
        """The mesh drawn as a grid of ranks with their hosts, and each axis's locality.

        Hosts are the ranks' real ones (:attr:`hosts`), or ``ranks_per_host``
        consecutive ranks per host. See :func:`commscope.mesh.describe.describe_mesh`.
        """
        from commscope.mesh.describe import describe_mesh

        return describe_mesh(
            self._need_layout(),
            rank=self.get_rank() if self._member() else None,
            device_type=self.device_type,
            hosts=self._hosts_or(ranks_per_host),
        )
