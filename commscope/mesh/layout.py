"""The arithmetic of an n-dimensional named mesh of ranks: no processes, no torch.

A mesh is one row-major grid of ranks (the *root*): for shape ``(2, 4)`` the ranks are
``[[0, 1, 2, 3], [4, 5, 6, 7]]``, so the last axis holds consecutive ranks. Every view of
it is a :class:`MeshLayout` whose axes are tuples of root axes:

* the root itself has one root axis per axis: ``((0,), (1,))``;
* a slice keeps some axes in their order: ``mesh["dp", "tp"]`` of ``(dp, pp, tp)`` is
  ``((0,), (2,))``;
* a flattened axis joins the root axes of several axes: ``flatten("dp_tp")`` of that
  slice is ``((0, 2),)``.

A *group* along an axis is the set of ranks that agree with a rank on every root axis
outside that axis, listed row-major over the axis's root axes. That one rule gives the
groups of plain axes, slices and flattened axes alike, and lists them in the order
PyTorch's ``init_device_mesh`` does, so the rank lists are identical.

Answering "what are rank r's groups" costs the size of those groups; planning a mesh of
a million ranks takes microseconds. :meth:`MeshLayout.all_groups` (every group of an
axis at once) uses numpy and costs O(world size).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import pairwise

import numpy as np

from commscope.mesh.errors import MeshError, MeshIndexError, MeshKeyError, MeshRuntimeError

__all__ = ["MeshLayout", "MeshError", "format_ranks", "format_shape"]


def format_shape(shape: Sequence[int], names: Sequence[str]) -> str:
    """``dp(2) * tp(4)``: how error messages show a shape."""
    return " * ".join(f"{n}({s})" for n, s in zip(names, shape))


def format_ranks(ranks: Sequence[int], limit: int = 8) -> str:
    """A short form of a rank list: ``[0..7]``, ``[5, 13, ..., 8189] (1024 ranks, step 8)``."""
    ranks = list(ranks)
    n = len(ranks)
    if n <= 2:
        return str(ranks)
    step = ranks[1] - ranks[0]
    arithmetic = all(b - a == step for a, b in pairwise(ranks))
    if arithmetic and step == 1 and n > 3:
        return f"[{ranks[0]}..{ranks[-1]}]"
    if n <= limit:
        return str(ranks)
    head = ", ".join(map(str, ranks[:3]))
    detail = f"{n} ranks, step {step}" if arithmetic else f"{n} ranks"
    return f"[{head}, ..., {ranks[-1]}] ({detail})"


def _row_major_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    return tuple(strides)


def _runs(root_axes: Sequence[int]) -> list[tuple[int, ...]]:
    """Split an axis's root axes into runs of neighbours (``(0, 1, 3)`` → ``(0, 1), (3,)``):
    neighbouring root axes are one block of consecutive strides."""
    runs: list[list[int]] = []
    for a in root_axes:
        if runs and runs[-1][-1] + 1 == a:
            runs[-1].append(a)
        else:
            runs.append([a])
    return [tuple(r) for r in runs]


def _suffix_products(sizes: Sequence[int]) -> set[int]:
    """Where an axis's index space is cut by ``sizes`` (major first), from its minor end."""
    out, acc = {1}, 1
    for s in reversed(sizes):
        acc *= s
        out.add(acc)
    return out


def _suffix_starts(sizes: Sequence[int]) -> list[int]:
    """For each of ``sizes`` (major first), the product of the sizes after it."""
    starts, acc = [], 1
    for s in reversed(sizes):
        starts.append(acc)
        acc *= s
    return starts[::-1]


def _unique_name(name: str, taken: set[str]) -> str:
    candidate, n = name, 1
    while candidate in taken:
        n += 1
        candidate = f"{name}#{n}"
    taken.add(candidate)
    return candidate


@dataclass(frozen=True)
class MeshLayout:
    """One view (root, slice or flattened axis) of a row-major grid of ranks.

    Build a root with :meth:`create`; derive views with :meth:`slice`,
    :meth:`flatten` and :meth:`unflatten`. All methods are pure integer arithmetic.
    """

    root_shape: tuple[int, ...]
    """Sizes of the root grid's axes; their product is the world size."""
    root_names: tuple[str, ...]
    """Names of the root grid's axes."""
    axes: tuple[tuple[int, ...], ...]
    """This view's axes, each the tuple of root axes it spans (major first)."""
    names: tuple[str, ...]
    """This view's axis names, one per axis."""

    # ------------------------------------------------------------------ building

    @classmethod
    def create(
        cls,
        shape: Sequence[int],
        names: Sequence[str] | None = None,
        *,
        world_size: int | None = None,
    ) -> MeshLayout:
        """A root layout of ``shape`` named ``names`` (default ``dim_0``, ``dim_1``, …).

        Raises :class:`MeshError` for a non-positive size, duplicate or empty names,
        a names/shape length mismatch, or (when ``world_size`` is given) a product of
        sizes that is not the world size.
        """
        try:
            shape_t = tuple(int(s) for s in shape)
        except (TypeError, ValueError):
            raise MeshError(f"mesh shape must be a sequence of integers, got {shape!r}") from None
        if any(isinstance(s, bool) for s in shape):
            raise MeshError(f"mesh shape must be integers, got {shape!r}")
        if names is None:
            names_t = tuple(f"dim_{i}" for i in range(len(shape_t)))
        else:
            if isinstance(names, str):
                raise MeshRuntimeError(
                    f"mesh_dim_names must be a tuple of names, got the string {names!r}; "
                    f"write ({names!r},) for one axis"
                )
            names_t = tuple(names)
        if not shape_t:
            raise MeshError("mesh shape is empty: give at least one axis, e.g. (world_size,)")
        if len(names_t) != len(shape_t):
            raise MeshRuntimeError(
                "mesh_shape and mesh_dim_names should have same length! "
                f"The shape {shape_t} has {len(shape_t)} axes but {len(names_t)} names "
                f"{names_t}: give one name per axis"
            )
        for n in names_t:
            if not isinstance(n, str) or not n or n != n.strip():
                raise MeshError(f"axis names must be non-empty strings, got {n!r} in {names_t}")
        dupes = sorted({n for n in names_t if names_t.count(n) > 1})
        if dupes:
            raise MeshRuntimeError(
                f"Each mesh_dim_name must be unique, {', '.join(map(repr, dupes))} appears "
                f"more than once in {names_t}: give every axis a name of its own"
            )
        bad = [(n, s) for n, s in zip(names_t, shape_t) if s < 1]
        if bad:
            shown = ", ".join(f"{n}={s}" for n, s in bad)
            raise MeshError(
                f"every axis needs size >= 1, got {shown} in {format_shape(shape_t, names_t)}"
            )
        layout = cls(
            root_shape=shape_t,
            root_names=names_t,
            axes=tuple((i,) for i in range(len(shape_t))),
            names=names_t,
        )
        if world_size is not None and layout.world_size != world_size:
            kind = MeshRuntimeError if layout.world_size > world_size else MeshError
            raise kind(
                f"{format_shape(shape_t, names_t)} = {layout.world_size} != world size "
                f"{world_size}: the mesh shape must multiply to the number of ranks; "
                f"change the shape or launch {layout.world_size} ranks"
            )
        return layout

    @property
    def is_root(self) -> bool:
        """True for the full grid itself (not a slice or a flattened view)."""
        return self.axes == tuple((i,) for i in range(len(self.root_shape)))

    def root(self) -> MeshLayout:
        """The root layout this view comes from."""
        return MeshLayout(
            self.root_shape,
            self.root_names,
            tuple((i,) for i in range(len(self.root_shape))),
            self.root_names,
        )

    def slice(self, names: str | Sequence[str]) -> MeshLayout:
        """A view keeping the named axes, which must be in this view's order.

        Any in-order subset works, contiguous or not (``("dp", "tp")`` out of
        ``("dp", "pp", "tp")``). Raises :class:`MeshError` for unknown, repeated or
        out-of-order names, listing the valid ones.
        """
        wanted = (names,) if isinstance(names, str) else tuple(names)
        if not wanted:
            raise MeshError(f"slice with no axis names; valid names are {list(self.names)}")
        unknown = [n for n in wanted if n not in self.names]
        if unknown:
            raise MeshKeyError(
                f"Invalid mesh_dim_names {wanted}: unknown axis name"
                f"{'s' if len(unknown) > 1 else ''} "
                f"{', '.join(map(repr, unknown))}; valid names are {list(self.names)}"
            )
        repeated = sorted({n for n in wanted if wanted.count(n) > 1})
        if repeated:
            raise MeshRuntimeError(
                f"Slicing overlapping dim_names: axis {', '.join(map(repr, repeated))} "
                f"named twice in {wanted}: a slice takes each axis at most once"
            )
        positions = [self.names.index(n) for n in wanted]
        if positions != sorted(positions):
            in_order = tuple(n for n in self.names if n in wanted)
            raise MeshKeyError(
                f"Invalid mesh_dim_names {wanted}: Mesh dim indices should be in ascending "
                f"order. Slice {wanted} is out of order: axes must keep the mesh's order "
                f"{self.names}; write {in_order}"
            )
        return MeshLayout(
            self.root_shape,
            self.root_names,
            tuple(self.axes[p] for p in positions),
            wanted,
        )

    def flatten(self, name: str | None = None) -> MeshLayout:
        """A 1-D view joining all of this view's axes into one axis called ``name``.

        The default name joins the axis names with ``_`` (``dp_tp``), like PyTorch.
        """
        flat_name = name if name is not None else "_".join(self.names)
        if not isinstance(flat_name, str) or not flat_name:
            raise MeshError(f"flattened axis name must be a non-empty string, got {flat_name!r}")
        joined = tuple(a for axis in self.axes for a in axis)
        return MeshLayout(self.root_shape, self.root_names, (joined,), (flat_name,))

    def unflatten(
        self, axis: int | str, sizes: Sequence[int], names: Sequence[str]
    ) -> MeshLayout:
        """A view with ``axis`` split into several axes of ``sizes`` named ``names``.

        The axis's ranks, in its row-major order, are reshaped to ``sizes`` (one size may
        be ``-1``: inferred). The result is a view of a *refined* root: a root axis that
        the split cuts in two becomes two root axes, which numbers the ranks exactly as
        before. Raises :class:`MeshError` when the sizes do not multiply to the axis's
        size, the names clash, or the axis joins non-adjacent root axes and a cut falls
        inside one of them at a point that does not divide it (the groups would not be
        a regular sub-grid of the mesh).
        """
        p = self.axis_index(axis)
        sizes_t, names_t = self._check_split(p, sizes, names)
        runs = _runs(self.axes[p])
        run_sizes = [math.prod(self.root_shape[a] for a in run) for run in runs]
        cuts = sorted(_suffix_products(run_sizes) | _suffix_products(sizes_t))
        for lo, hi in pairwise(cuts):
            if hi % lo:
                self._refuse_split(p, sizes_t, names_t, runs)
        # Fine pieces, major first: piece i spans positions [cuts[-i-2], cuts[-i-1]) of
        # the axis's index space (counted from its minor end).
        bounds = list(zip(cuts[-2::-1], cuts[:0:-1]))

        def pieces_in(lo: int, hi: int) -> list[int]:
            return [i for i, (a, b) in enumerate(bounds) if lo <= a and b <= hi]

        run_lo = _suffix_starts(run_sizes)
        new_lo = _suffix_starts(sizes_t)
        owner = {}  # piece -> new axis
        for k, (lo, size) in enumerate(zip(new_lo, sizes_t)):
            for i in pieces_in(lo, lo * size):
                owner[i] = k
        taken = {n for a, n in enumerate(self.root_names) if a not in self.axes[p]}
        root_shape: list[int] = []
        root_names: list[str] = []
        old_to_new: dict[int, int] = {}
        piece_root: dict[int, int] = {}
        first_of_run = {run[0]: j for j, run in enumerate(runs)}
        in_axis = set(self.axes[p])
        for a, (size, name) in enumerate(zip(self.root_shape, self.root_names)):
            if a not in in_axis:
                old_to_new[a] = len(root_shape)
                root_shape.append(size)
                root_names.append(name)
                continue
            j = first_of_run.get(a)
            if j is None:
                continue  # a later root axis of a run: its pieces are already placed
            for i in pieces_in(run_lo[j], run_lo[j] * run_sizes[j]):
                k = owner[i]
                shared = sum(1 for v in owner.values() if v == k) > 1
                label = f"{names_t[k]}.{i}" if shared else names_t[k]
                piece_root[i] = len(root_shape)
                root_shape.append(bounds[i][1] // bounds[i][0])
                root_names.append(_unique_name(label, taken))
        new_axes: list[tuple[int, ...]] = []
        for q, root_axes in enumerate(self.axes):
            if q != p:
                new_axes.append(tuple(old_to_new[a] for a in root_axes))
                continue
            for k in range(len(sizes_t)):
                new_axes.append(tuple(piece_root[i] for i in sorted(owner) if owner[i] == k))
        return MeshLayout(
            tuple(root_shape),
            tuple(root_names),
            tuple(new_axes),
            self.names[:p] + names_t + self.names[p + 1:],
        )

    def _check_split(
        self, p: int, sizes: Sequence[int], names: Sequence[str]
    ) -> tuple[tuple[int, ...], tuple[str, ...]]:
        axis_name, axis_size = self.names[p], self.shape[p]
        if isinstance(names, str):
            raise MeshError(
                f"unflatten names must be a tuple of names, got the string {names!r}"
            )
        try:
            sizes_t = tuple(int(s) for s in sizes)
        except (TypeError, ValueError):
            raise MeshError(f"unflatten sizes must be integers, got {sizes!r}") from None
        names_t = tuple(names)
        if not sizes_t or len(sizes_t) != len(names_t):
            raise MeshRuntimeError(
                f"unflatten needs one name per size, got sizes {sizes_t} and names {names_t}"
            )
        for n in names_t:
            if not isinstance(n, str) or not n or n != n.strip():
                raise MeshError(f"axis names must be non-empty strings, got {n!r} in {names_t}")
        result = self.names[:p] + names_t + self.names[p + 1:]
        dupes = sorted({n for n in result if result.count(n) > 1})
        if dupes:
            raise MeshError(
                f"unflattening {axis_name!r} into {names_t} would give the mesh the axes "
                f"{result}: {', '.join(map(repr, dupes))} appears more than once"
            )
        if sizes_t.count(-1) > 1 or any(s < 1 and s != -1 for s in sizes_t):
            raise MeshError(
                f"unflatten sizes must be >= 1 (one of them may be -1), got {sizes_t}"
            )
        if -1 in sizes_t:
            known = math.prod(s for s in sizes_t if s != -1)
            if axis_size % known:
                raise MeshError(
                    f"cannot infer the -1 in {sizes_t}: axis {axis_name!r} has {axis_size} "
                    f"ranks, which {known} does not divide"
                )
            sizes_t = tuple(axis_size // known if s == -1 else s for s in sizes_t)
        if math.prod(sizes_t) != axis_size:
            raise MeshError(
                f"cannot unflatten axis {axis_name!r} of size {axis_size} into "
                f"{format_shape(sizes_t, names_t)} = {math.prod(sizes_t)}: the sizes must "
                f"multiply to {axis_size}"
            )
        return sizes_t, names_t

    def _refuse_split(
        self,
        p: int,
        sizes: tuple[int, ...],
        names: tuple[str, ...],
        runs: list[tuple[int, ...]],
    ) -> None:
        parts = " and ".join(
            format_shape([math.prod(self.root_shape[a] for a in run)],
                         ["*".join(self.root_names[a] for a in run)])
            for run in runs
        )
        fits = tuple(math.prod(self.root_shape[a] for a in run) for run in runs)
        raise MeshError(
            f"cannot unflatten axis {self.names[p]!r} into {format_shape(sizes, names)}: it "
            f"joins mesh axes that are not next to each other ({parts}), and that split "
            "would cut one of them at a size that does not divide it, so a group would not "
            f"be a regular slice of the mesh; split at their boundaries instead, e.g. {fits}"
        )

    # ------------------------------------------------------------------- queries

    @property
    def world_size(self) -> int:
        """Ranks in the whole grid."""
        return math.prod(self.root_shape)

    @cached_property
    def root_strides(self) -> tuple[int, ...]:
        """Row-major strides of the root grid (the last axis has stride 1)."""
        return _row_major_strides(self.root_shape)

    @property
    def shape(self) -> tuple[int, ...]:
        """Size of each axis of this view."""
        return tuple(math.prod(self.root_shape[a] for a in axis) for axis in self.axes)

    @property
    def ndim(self) -> int:
        """Number of axes of this view."""
        return len(self.axes)

    @property
    def size(self) -> int:
        """Ranks in one sub-mesh of this view (the product of its shape)."""
        return math.prod(self.shape)

    def axis_index(self, axis: int | str) -> int:
        """Position of an axis given by name or index; a clear error otherwise."""
        if isinstance(axis, bool):
            raise MeshError(f"axis must be a name or an index, got {axis!r}")
        if isinstance(axis, int):
            if not -self.ndim <= axis < self.ndim:
                raise MeshIndexError(
                    f"axis index {axis} is out of range for a {self.ndim}-D mesh {list(self.names)}"
                )
            return axis % self.ndim
        if axis not in self.names:
            raise MeshKeyError(
                f"unknown axis name {axis!r}; valid names are {list(self.names)}"
            )
        return self.names.index(axis)

    def check_rank(self, rank: int) -> None:
        """Raise :class:`MeshError` when ``rank`` is not in ``[0, world_size)``."""
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise MeshError(
                f"rank {rank!r} is outside the mesh: valid ranks are 0..{self.world_size - 1}"
            )

    def root_coordinate(self, rank: int) -> tuple[int, ...]:
        """Coordinate of ``rank`` in the root grid."""
        self.check_rank(rank)
        return tuple((rank // s) % n for n, s in zip(self.root_shape, self.root_strides))

    def coordinate(self, rank: int) -> tuple[int, ...]:
        """Coordinate of ``rank`` along this view's axes (mixed radix over each axis)."""
        root = self.root_coordinate(rank)
        out = []
        for axis in self.axes:
            c = 0
            for a in axis:
                c = c * self.root_shape[a] + root[a]
            out.append(c)
        return tuple(out)

    def local_rank(self, rank: int, axis: int | str) -> int:
        """Rank's position inside its group along ``axis`` (its coordinate there)."""
        return self.coordinate(rank)[self.axis_index(axis)]

    def _offsets(self, root_axes: Sequence[int]) -> list[int]:
        """Rank offsets of one group spanning ``root_axes``, row-major."""
        offsets = [0]
        for a in root_axes:
            stride, n = self.root_strides[a], self.root_shape[a]
            offsets = [o + k * stride for o in offsets for k in range(n)]
        return offsets

    def _base(self, rank: int, root_axes: Iterable[int]) -> int:
        base = rank
        for a in root_axes:
            base -= ((rank // self.root_strides[a]) % self.root_shape[a]) * self.root_strides[a]
        return base

    def group(self, rank: int, axes: int | str | Sequence[int | str] | None = None) -> list[int]:
        """The ranks of ``rank``'s group along ``axes`` (one axis, several, or all).

        Several axes give the group of their product, row-major (what flattening them
        would give). With ``axes=None`` it is the whole sub-mesh of this view that
        contains ``rank``, flattened.
        """
        self.check_rank(rank)
        if axes is None:
            picked = list(range(self.ndim))
        elif isinstance(axes, (int, str)):
            picked = [self.axis_index(axes)]
        else:
            picked = [self.axis_index(a) for a in axes]
        root_axes = [a for p in picked for a in self.axes[p]]
        base = self._base(rank, root_axes)
        return [base + o for o in self._offsets(root_axes)]

    def groups_of(self, rank: int) -> dict[str, list[int]]:
        """``{axis name: rank's group}`` for every axis of this view."""
        return {name: self.group(rank, i) for i, name in enumerate(self.names)}

    def submesh(self, rank: int) -> np.ndarray:
        """The ranks of this view's sub-mesh containing ``rank``, shaped like the view."""
        return np.asarray(self.group(rank), dtype=np.int64).reshape(self.shape)

    def all_groups(self, axis: int | str) -> np.ndarray:
        """Every group along ``axis``: an array of shape ``(num_groups, axis size)``.

        Rows come in PyTorch's order: row-major over the root axes outside the axis.
        """
        root_axes = list(self.axes[self.axis_index(axis)])
        others = [a for a in range(len(self.root_shape)) if a not in root_axes]
        grid = np.arange(self.world_size, dtype=np.int64).reshape(self.root_shape)
        size = math.prod(self.root_shape[a] for a in root_axes)
        return grid.transpose(others + root_axes).reshape(-1, size)

    def num_groups(self, axis: int | str) -> int:
        """How many groups the world splits into along ``axis``."""
        return self.world_size // self.shape[self.axis_index(axis)]

    def covers_world(self, axis: int | str) -> bool:
        """True when one group along ``axis`` holds every rank (the world group)."""
        return self.shape[self.axis_index(axis)] == self.world_size

    def __str__(self) -> str:
        inner = ", ".join(f"{n}={s}" for n, s in zip(self.names, self.shape))
        return f"MeshLayout({inner}; world={self.world_size})"
