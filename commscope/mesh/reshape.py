"""Slicing, flattening and unflattening a commscope ``DeviceMesh``; group reuse.

:class:`MeshReshapes` is the part of :class:`~commscope.mesh.device_mesh.DeviceMesh`
that makes new views of a mesh: ``mesh["dp", "tp"]`` (a slice: no new group),
``flatten(name)`` / torch's ``_flatten`` (one axis joining several), ``unflatten`` /
torch's ``_unflatten`` (one axis split into several), and a root's view mixing
flattened axes with others (``mesh["dp_cp", "tp"]``). A new view's group is reused when
the root already holds one with the same ranks, and otherwise created the way the mesh
was (by its members only, or by every rank: :mod:`commscope.mesh.groups`).

Errors are :class:`~commscope.mesh.errors.MeshError` instances of the type torch raises
for the same mistake (a ``KeyError`` for a name the mesh lacks or a slice out of order).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import commscope.needs_torch  # noqa: F401 (first: a clear error where torch is absent)

# isort: split
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh as TorchDeviceMesh

from commscope import compat
from commscope.mesh.errors import MeshError, MeshKeyError, MeshRuntimeError
from commscope.mesh.groups import (
    DEFAULT_SPEC,
    BackendSpec,
    create_axis_group,
    normalize_backend_override,
    torch_view,
)
from commscope.mesh.hosts import HostTable
from commscope.mesh.layout import MeshLayout

__all__ = ["MeshReshapes"]


class MeshReshapes(TorchDeviceMesh):
    """Views of a mesh: slices, flattened and unflattened axes (see the module docstring).

    A base of :class:`~commscope.mesh.device_mesh.DeviceMesh`; not used on its own.
    """

    _cs_layout: MeshLayout | None
    _cs_named: bool
    _cs_root: MeshReshapes | None
    _cs_flat: dict[str, MeshReshapes]
    _cs_groups: list[Any]
    _cs_hosts: HostTable | None
    _cs_base: MeshReshapes | None
    _cs_known: dict[tuple[int, ...], Any]
    _cs_unflat: dict[MeshLayout, MeshReshapes]
    _cs_creation: Literal["local", "all"]

    # provided by DeviceMesh
    root: MeshReshapes
    axis_names: tuple[str, ...]
    _need_layout: Callable[[], MeshLayout]
    _index: Callable[[int | str | None, str], int]
    _adopt: Callable[..., MeshReshapes]

    # ------------------------------------------------------------------ slices

    def _flat_axis(self, axis: object) -> MeshReshapes | None:
        if self._cs_layout is None:
            return None
        if isinstance(axis, str) and axis not in self._cs_layout.names:
            return self.root._cs_flat.get(axis)
        return None

    def __getitem__(self, mesh_dim_names: str | Sequence[str]) -> MeshReshapes:  # type: ignore[override]
        """A view of some axes, by name, in the mesh's order; creates no group.

        On a root mesh, flattened axes may be taken too, alone or beside other axes
        (``mesh["dp_cp", "tp"]``), as long as no root axis is taken twice.
        """
        if self._cs_layout is None:
            return super().__getitem__(mesh_dim_names)  # type: ignore[return-value]
        wanted = (mesh_dim_names,) if isinstance(mesh_dim_names, str) else tuple(mesh_dim_names)
        if self._cs_root is None:
            if len(wanted) == 1:
                flat = self._flat_axis(wanted[0])
                if flat is not None:
                    return flat
            if any(w in self._cs_flat for w in wanted):
                return self._with_flat_axes(wanted)
        if not self._cs_named:
            raise MeshRuntimeError(
                "Cannot slice a DeviceMesh without mesh_dim_names! Its axes have no names; "
                "give them some, e.g. init_device_mesh(..., mesh_dim_names=('dp', 'tp'))"
            )
        layout = self._cs_layout.slice(wanted)
        if wanted == self._cs_layout.names:
            return self  # type: ignore[return-value]
        sub = TorchDeviceMesh.__getitem__(self, wanted)
        positions = [self._cs_layout.names.index(w) for w in wanted]
        groups = [self._cs_groups[p] for p in positions]
        base = self._cs_base if self._cs_base is not None else self
        return self._adopt(sub, layout, self.root, groups, self._cs_hosts, base)

    def _with_flat_axes(self, wanted: tuple[str, ...]) -> MeshReshapes:
        """A root's view mixing flattened axes with others: ``mesh["dp_cp", "tp"]``."""
        root_layout = self._need_layout()
        axes, groups = [], []
        for w in wanted:
            flat = self._cs_flat.get(w)
            if flat is not None:
                axes.append(flat._need_layout().axes[0])
                groups.append(flat._cs_groups[0])
            elif w in root_layout.names and self._cs_named:
                i = root_layout.names.index(w)
                axes.append(root_layout.axes[i])
                groups.append(self._cs_groups[i])
            else:
                raise MeshKeyError(
                    f"Invalid mesh_dim_names {wanted}: unknown axis name {w!r}; valid names "
                    f"are {self._valid_names()}"
                )
        repeated = sorted({n for n in wanted if wanted.count(n) > 1})
        if repeated:
            raise MeshRuntimeError(
                f"Slicing overlapping dim_names: axis {', '.join(map(repr, repeated))} "
                f"named twice in {wanted}"
            )
        joined = [a for axis in axes for a in axis]
        if len(set(joined)) != len(joined):
            # torch's type: KeyError where the axes are also out of order, else RuntimeError
            kind = MeshRuntimeError if joined == sorted(joined) else MeshKeyError
            raise kind(
                f"Invalid mesh_dim_names {wanted}: slicing overlapping dim_names is not "
                "allowed; they take a mesh axis twice: a flattened axis cannot be taken "
                f"beside one of the axes it joins ({self._joins_text()})"
            )
        if joined != sorted(joined):
            raise MeshKeyError(
                f"Invalid mesh_dim_names {wanted}: Mesh dim indices should be in ascending "
                f"order. {self._order_hint(wanted, axes)}"
            )
        layout = MeshLayout(root_layout.root_shape, root_layout.root_names, tuple(axes), wanted)
        cached = self._cs_unflat.get(layout)
        if cached is not None:
            return cached
        tm = torch_view(self.device_type, layout, groups, wanted)
        view = self._adopt(tm, layout, self, groups, self._cs_hosts)
        self._cs_unflat[layout] = view
        return view

    def _order_hint(self, wanted: tuple[str, ...], axes: list[tuple[int, ...]]) -> str:
        """What to write instead of an out-of-order slice, or why no order works."""
        order = tuple(w for _, w in sorted(zip((min(a) for a in axes), wanted)))
        reordered = [a for w in order for a in axes[wanted.index(w)]]
        if reordered == sorted(reordered):
            return f"{wanted} is out of order: axes keep the mesh's order; write {order}"
        names = self._need_layout().root_names
        for w, ax in zip(wanted, axes):
            for v, other in zip(wanted, axes):
                if v != w and any(min(ax) < a < max(ax) for a in other):
                    joins = " and ".join(names[a] for a in ax)
                    return (
                        f"{wanted} cannot be taken together in any order: {w!r} joins "
                        f"{joins}, and {v!r} lies between them in the mesh {names}; take "
                        f"them one at a time (mesh[{w!r}], mesh[{v!r}]) or flatten other axes"
                    )
        return f"{wanted} is not a slice of the mesh {names} in any order"  # pragma: no cover

    def _valid_names(self) -> list[str]:
        layout = self._need_layout()
        own = list(layout.names) if self._cs_named else []
        return [*own, *(n for n in self.root._cs_flat if self._cs_root is None)]

    def _joins_text(self) -> str:
        names = self._need_layout().root_names
        return "; ".join(
            f"{n} joins {', '.join(names[a] for a in f._need_layout().axes[0])}"
            for n, f in self._cs_flat.items()
        )

    # ----------------------------------------------------------------- flatten

    def _existing_flat(self, layout: MeshLayout) -> MeshReshapes | None:
        """The root's flattened axis of ``layout``'s name, if made already (an error if
        that name joins other axes)."""
        name = layout.names[0]
        existing = self._cs_flat.get(name)
        if existing is not None and existing._need_layout().axes != layout.axes:
            raise MeshError(
                f"Flatten mesh with mesh_dim_name {name} has been created before: the "
                f"flattened axis {name!r} already joins other axes ({self._joins_text()}); "
                "pick another name"
            )
        return existing

    def _check_flat_name(self, name: str) -> None:
        root = self.root
        if name in root._need_layout().names:
            raise MeshError(
                f"{name} already exists for submesh of the {root!r}: a flattened axis "
                f"cannot take the name of one of the mesh's axes "
                f"({list(root._need_layout().names)}); pick another name"
            )

    def _flatten_name(self, name: str | None) -> str:
        if name:
            return name
        if not self._cs_named:
            raise MeshRuntimeError(
                "Cannot flatten a DeviceMesh without mesh_dim_names! Its axes have no "
                "names to join; name the flattened axis: flatten('world')"
            )
        return "_".join(self.axis_names)

    def flatten(self, name: str | None = None) -> MeshReshapes:
        """Join all axes of this mesh (or slice) into one axis called ``name``.

        ``mesh["dp_replicate", "dp_shard"].flatten("dp")``: the group along ``dp`` holds
        the ranks of both axes, row-major. Every rank must call it (same order, same
        name); only the members of each group take part in creating it, and a group
        with the same ranks as one this mesh already has (the whole world: the default
        group) is reused. The result is cached on the root by name and can be sliced
        from it afterwards: ``mesh["dp"]``. Flattening a 1-D mesh into its own name
        returns it (as torch's ``_flatten`` does).
        """
        self._need_layout()
        flat_name = self._flatten_name(name)
        if self.ndim == 1 and self._cs_named and flat_name == self.axis_names[0]:
            return self  # type: ignore[return-value]
        layout = self._need_layout().flatten(flat_name)
        root = self.root
        existing = root._existing_flat(layout)
        if existing is not None:
            return existing
        self._check_flat_name(flat_name)
        if self.ndim == 1:
            pg = self._cs_groups[0]
        else:
            pg = root._group_for(layout, 0, f"mesh_{flat_name}")
        tm = torch_view(self.device_type, layout, [pg], (flat_name,))
        flat = self._adopt(tm, layout, root, [pg], self._cs_hosts)
        root._cs_flat[flat_name] = flat
        return flat

    def _flatten(
        self, mesh_dim_name: str | None = None, backend_override: Any = None
    ) -> MeshReshapes:
        """PyTorch's private flatten, as torch does it, and known to this mesh too.

        Torch's own ``_flatten`` runs (its group creation, and its registration on the
        root, where DTensor looks for a flattened mesh to redistribute over several
        axes in one collective, as FSDP2's ``dp_mesh_dims`` path expects); the result
        is then one of ours, so ``mesh["name"]`` finds it. An axis already made with
        :meth:`flatten` under that name is returned as it is.
        """
        if self._cs_layout is None:
            if backend_override is None:  # older torch has no such argument
                return super()._flatten(mesh_dim_name)  # type: ignore[return-value]
            return super()._flatten(mesh_dim_name, backend_override)  # type: ignore[return-value]
        name = self._flatten_name(mesh_dim_name)
        if self.ndim == 1 and name == self.axis_names[0]:
            return self  # type: ignore[return-value]
        layout = self._cs_layout.flatten(name)
        root = self.root
        existing = root._existing_flat(layout)
        if existing is not None:
            return existing
        self._check_flat_name(name)
        if backend_override is None:
            tm = TorchDeviceMesh._flatten(self, name)
        else:
            compat.require("init_device_mesh_backend_override",
                           "DeviceMesh._flatten(..., backend_override=...)")
            tm = TorchDeviceMesh._flatten(self, name, backend_override)  # type: ignore[call-arg]
        member = tm.get_coordinate() is not None
        pg = tm.get_group() if member else None
        flat = self._adopt(tm, layout, root, [pg], self._cs_hosts)
        root._cs_flat[name] = flat
        if member and backend_override is None:
            root._cs_known.setdefault(tuple(layout.group(self.get_rank(), 0)), pg)
        return flat

    # --------------------------------------------------------------- unflatten

    def unflatten(
        self,
        axis: int | str,
        sizes: Sequence[int],
        names: Sequence[str],
        *,
        backend: str | None = None,
        backend_override: Mapping[int | str, Any] | None = None,
    ) -> MeshReshapes:
        """Split one axis into several: ``world.unflatten("world", (2, 4), ("dp", "tp"))``.

        The axis's ranks, in its order, are reshaped to ``sizes`` (one may be ``-1``),
        the other axes are kept, and the result is a new mesh with those axes (which
        can be sliced, flattened and handed to FSDP or DTensor like any other). Every
        rank must call it (same order, same arguments). A new axis whose group has the
        same ranks as a group this job's mesh already has reuses that group, so
        unflattening never duplicates a communicator; other groups are created by
        their members only. ``backend`` (every new axis) or ``backend_override`` (per new
        axis, by name or index, as torch's ``_unflatten`` takes it) choose another
        backend: those groups are always new. Repeating the call returns the same mesh.
        Raises :class:`~commscope.mesh.errors.MeshError` for sizes that do not multiply
        to the axis's size, clashing names, or a split that is not a regular sub-grid
        (see :meth:`MeshLayout.unflatten`).
        """
        flat = self._flat_axis(axis) if self._cs_root is None else None
        if flat is not None:
            return flat.unflatten(0, sizes, names, backend=backend,
                                  backend_override=backend_override)
        if not self._cs_named and self.ndim > 1:
            raise MeshRuntimeError(
                "unflatten needs a mesh whose axes have names (the new mesh names every "
                "axis); give them some in init_device_mesh(..., mesh_dim_names=...)"
            )
        p = self._index(axis, "unflatten")
        layout = self._need_layout().unflatten(p, sizes, names)
        added = layout.ndim - self.ndim
        new_names = layout.names[p:p + added + 1]
        specs = normalize_backend_override(
            dict(backend_override) if backend_override is not None else None,
            len(new_names), new_names,
        )
        if backend is not None:
            specs = tuple((b or backend, o) for b, o in specs)
        custom = any(s != DEFAULT_SPEC for s in specs)
        root = self.root
        cached = root._cs_unflat.get(layout)
        if cached is not None and not custom:
            return cached
        groups = []
        for i, name in enumerate(layout.names):
            if i < p:
                groups.append(self._cs_groups[i])
            elif i > p + added:
                groups.append(self._cs_groups[i - added])
            else:
                groups.append(root._group_for(layout, i, f"mesh_{name}", specs[i - p]))
        tm = torch_view(self.device_type, layout, groups, layout.names)
        mesh = self._adopt(tm, layout, root, groups, self._cs_hosts)
        if not custom:
            root._cs_unflat[layout] = mesh
        return mesh

    def _unflatten(  # type: ignore[override]
        self,
        dim: int | str,
        mesh_sizes: Sequence[int],
        mesh_dim_names: Sequence[str],
        backend_override: Mapping[int | str, Any] | None = None,
    ) -> MeshReshapes:
        """PyTorch's private spelling of :meth:`unflatten` (same arguments as torch's)."""
        if self._cs_layout is None:
            return super()._unflatten(  # type: ignore[misc,return-value]
                dim, mesh_sizes, mesh_dim_names, backend_override
            )
        return self.unflatten(dim, mesh_sizes, mesh_dim_names, backend_override=backend_override)

    # ------------------------------------------------------------ group reuse

    def _group_for(
        self, layout: MeshLayout, axis: int, desc: str, spec: BackendSpec = DEFAULT_SPEC
    ) -> Any:
        """The calling rank's group along ``axis`` of ``layout``: an existing one with
        the same ranks, the default group for the whole world, or a new one (``None`` on
        a rank outside a mesh smaller than the job). Called on the root, which remembers
        every group its meshes hold and how the job creates groups: by their members
        only, or (``group_creation="all"``: MPI, torchcomms) every rank creating every
        group of the axis, in PyTorch's order. A ``spec`` other than the default
        (another backend or options) always gets a new group.

        Every rank takes the same branch: the groups of one axis are translates of one
        another, so when the calling rank's group is known, every rank's group is (a
        rank outside the mesh looks its first group up instead of its own).
        """
        rank = self.get_rank()
        member = rank < layout.world_size
        key = tuple(layout.group(rank if member else 0, axis))
        if spec == DEFAULT_SPEC:
            if key in self._cs_known:
                return self._cs_known[key] if member else None
            if len(key) == dist.get_world_size():
                return dist.distributed_c10d._get_default_group()
        pg = create_axis_group(layout, axis, self._cs_creation, desc=desc, spec=spec)
        if spec == DEFAULT_SPEC:
            self._cs_known[key] = pg
        return pg
