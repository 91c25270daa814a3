"""MeshLayout: pure arithmetic of coordinates, groups, slices and flattening."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commscope.mesh.layout import MeshError, MeshLayout


def test_row_major_last_axis_is_consecutive():
    lay = MeshLayout.create((2, 4), ("dp", "tp"))
    assert lay.world_size == 8
    assert lay.coordinate(5) == (1, 1)
    assert lay.group(5, "tp") == [4, 5, 6, 7]
    assert lay.group(5, "dp") == [1, 5]
    assert lay.submesh(5).tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert lay.all_groups("dp").tolist() == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert lay.all_groups("tp").tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert lay.local_rank(6, "dp") == 1 and lay.local_rank(6, 1) == 2


def test_default_names_and_negative_index():
    lay = MeshLayout.create((2, 3))
    assert lay.names == ("dim_0", "dim_1")
    assert lay.group(4, -1) == [3, 4, 5]


def test_non_contiguous_slice_and_its_flatten():
    # (dp, pp, tp) = (2, 2, 2): PyTorch gives [[0, 1], [4, 5]] for rank 0's ("dp", "tp").
    lay = MeshLayout.create((2, 2, 2), ("dp", "pp", "tp"))
    sub = lay.slice(("dp", "tp"))
    assert sub.shape == (2, 2)
    assert sub.submesh(0).tolist() == [[0, 1], [4, 5]]
    assert sub.submesh(2).tolist() == [[2, 3], [6, 7]]
    assert sub.group(0, "dp") == [0, 4] and sub.group(0, "tp") == [0, 1]
    flat = sub.flatten()
    assert flat.names == ("dp_tp",)
    assert flat.group(0, 0) == [0, 1, 4, 5]
    assert flat.group(7, 0) == [2, 3, 6, 7]
    assert flat.all_groups(0).tolist() == [[0, 1, 4, 5], [2, 3, 6, 7]]
    # slice of slice
    assert sub.slice("tp").group(6, 0) == [6, 7]


def test_group_of_several_axes_is_their_flatten():
    lay = MeshLayout.create((2, 3, 4), ("a", "b", "c"))
    for r in range(lay.world_size):
        assert lay.group(r, ("a", "c")) == lay.slice(("a", "c")).flatten().group(r, 0)
        assert lay.group(r) == list(range(24))


def test_groups_of_and_num_groups():
    lay = MeshLayout.create((2, 1, 4), ("dp", "cp", "tp"))
    assert lay.groups_of(6) == {"dp": [2, 6], "cp": [6], "tp": [4, 5, 6, 7]}
    assert [lay.num_groups(a) for a in lay.names] == [4, 8, 2]
    assert not lay.covers_world("tp")
    assert MeshLayout.create((8,), ("w",)).covers_world(0)


@pytest.mark.parametrize(
    ("shape", "names", "world", "message"),
    [
        ((2, 4), ("dp", "tp"), 6, r"dp\(2\) \* tp\(4\) = 8 != world size 6"),
        ((2, 4), ("dp", "dp"), None, r"unique, 'dp' appears more than once"),
        ((2, 4), ("dp",), None, r"2 axes but 1 names"),
        ((2, 0), ("dp", "tp"), None, r"size >= 1, got tp=0"),
        ((), (), None, r"empty"),
        ((2, "x"), None, None, r"sequence of integers"),
        ((2,), "dp", None, r"tuple of names, got the string 'dp'"),
        ((2,), ("",), None, r"non-empty strings"),
    ],
)
def test_bad_meshes_show_the_arithmetic(shape, names, world, message):
    with pytest.raises(MeshError, match=message):
        MeshLayout.create(shape, names, world_size=world)


def test_bad_slices_list_valid_names():
    lay = MeshLayout.create((2, 2, 2), ("dp", "pp", "tp"))
    with pytest.raises(
        MeshError, match=r"unknown axis name 'ep'; valid names are \['dp', 'pp', 'tp'\]"
    ):
        lay.slice("ep")
    with pytest.raises(MeshError, match=r"out of order.*write \('dp', 'tp'\)"):
        lay.slice(("tp", "dp"))
    with pytest.raises(MeshError, match=r"'dp' named twice"):
        lay.slice(("dp", "dp"))
    with pytest.raises(MeshError, match="no axis names"):
        lay.slice(())


def test_rank_outside_mesh_and_bad_axis():
    lay = MeshLayout.create((2, 2), ("dp", "tp"))
    with pytest.raises(MeshError, match=r"rank 4 is outside the mesh: valid ranks are 0..3"):
        lay.coordinate(4)
    with pytest.raises(MeshError, match="outside the mesh"):
        lay.group(-1, 0)
    with pytest.raises(MeshError, match="axis index 2 is out of range"):
        lay.group(0, 2)


def test_million_ranks_rank_queries_are_cheap():
    lay = MeshLayout.create((2, 62500, 8), ("dp", "fsdp", "tp"))
    r = 777_777
    groups = lay.groups_of(r)
    assert r in groups["dp"] and r in groups["fsdp"] and r in groups["tp"]
    assert len(groups["fsdp"]) == 62500
    assert groups["tp"] == list(range(777_776, 777_784))


shapes = st.lists(st.integers(1, 5), min_size=1, max_size=4).filter(lambda s: math.prod(s) <= 400)


@settings(max_examples=60, deadline=None)
@given(shape=shapes, data=st.data())
def test_groups_partition_the_world_along_every_axis(shape, data):
    names = tuple(f"a{i}" for i in range(len(shape)))
    lay = MeshLayout.create(shape, names)
    rank = data.draw(st.integers(0, lay.world_size - 1))
    coord = lay.coordinate(rank)
    assert lay.group(rank) == list(range(lay.world_size))
    for i in range(lay.ndim):
        groups = lay.all_groups(i)
        # every rank exactly once
        assert sorted(groups.ravel().tolist()) == list(range(lay.world_size))
        mine = lay.group(rank, i)
        assert rank in mine and mine.index(rank) == coord[i]
        assert mine in groups.tolist()
        for other in mine:
            oc = lay.coordinate(other)
            assert all(oc[j] == coord[j] for j in range(lay.ndim) if j != i)
    # slicing any in-order subset agrees with the root's groups
    keep = data.draw(st.lists(st.sampled_from(names), min_size=1, unique=True))
    keep = tuple(n for n in names if n in keep)
    sub = lay.slice(keep)
    for n in keep:
        assert sub.group(rank, n) == lay.group(rank, n)
    assert np.array_equal(np.sort(sub.submesh(rank).ravel()), np.sort(lay.group(rank, keep)))


# ------------------------------------------------------------------------ unflatten


def test_unflatten_a_world_axis_is_init_device_mesh_of_that_shape():
    world = MeshLayout.create((8,), ("world",))
    lay = world.unflatten("world", (2, 2, 2), ("dp", "pp", "tp"))
    root = MeshLayout.create((2, 2, 2), ("dp", "pp", "tp"))
    assert lay.names == ("dp", "pp", "tp") and lay.shape == (2, 2, 2)
    for rank in range(8):
        assert lay.groups_of(rank) == root.groups_of(rank)
        assert lay.coordinate(rank) == root.coordinate(rank)
    assert world.unflatten(0, (4, -1), ("a", "b")).shape == (4, 2)


def test_unflatten_keeps_the_other_axes_and_cuts_a_root_axis():
    lay = MeshLayout.create((2, 8), ("dp", "rest"))
    split = lay.unflatten("rest", (2, 4), ("cp", "tp"))
    assert split.names == ("dp", "cp", "tp") and split.shape == (2, 2, 4)
    assert split.group(13, "dp") == [5, 13]
    assert split.group(13, "cp") == [9, 13]
    assert split.group(13, "tp") == [12, 13, 14, 15]
    # a flattened non-adjacent pair splits at its own boundary
    flat = MeshLayout.create((2, 2, 3), ("a", "b", "c")).slice(("a", "c")).flatten("ac")
    assert flat.unflatten(0, (2, 3), ("x", "y")).group(1, "y") == [0, 1, 2]
    assert flat.unflatten(0, (2, 3), ("x", "y")).group(1, "x") == [1, 7]
    # size-1 axes are fine anywhere
    one = flat.unflatten(0, (1, 6, 1), ("u", "v", "w"))
    assert one.group(7, "v") == [0, 1, 2, 6, 7, 8] and one.group(7, "u") == [7]


def _reshape_oracle(view: MeshLayout, p: int, sizes: tuple[int, ...], rank: int):
    """Groups and coordinate of ``rank`` after reshaping its sub-mesh's axis ``p``."""
    shape = view.shape
    grid = view.submesh(rank).reshape(shape[:p] + sizes + shape[p + 1:])
    pos = tuple(int(i[0]) for i in np.nonzero(grid == rank))
    groups = []
    for j in range(grid.ndim):
        index: list[object] = list(pos)
        index[j] = slice(None)
        groups.append(grid[tuple(index)].tolist())
    return groups, pos


def _factor(n: int, parts: int, data) -> tuple[int, ...]:
    out = []
    for _ in range(parts - 1):
        d = data.draw(st.sampled_from([d for d in range(1, n + 1) if n % d == 0]))
        out.append(d)
        n //= d
    return (*out, n)


@settings(max_examples=80, deadline=None)
@given(shape=shapes, data=st.data())
def test_unflatten_equals_reshaping_the_axis(shape, data):
    names = tuple(f"r{i}" for i in range(len(shape)))
    lay = MeshLayout.create(shape, names)
    keep = data.draw(st.lists(st.sampled_from(names), min_size=1, unique=True))
    view = lay.slice(tuple(n for n in names if n in keep))
    if view.ndim > 1 and data.draw(st.booleans()):
        view = view.flatten("f")
    p = data.draw(st.integers(0, view.ndim - 1))
    sizes = _factor(view.shape[p], data.draw(st.integers(1, 3)), data)
    new_names = tuple(f"n{i}" for i in range(len(sizes)))
    contiguous = all(b == a + 1 for a, b in zip(view.axes[p], view.axes[p][1:]))
    try:
        split = view.unflatten(p, sizes, new_names)
    except MeshError as exc:
        assert not contiguous, exc  # only a split inside non-adjacent axes is refused
        assert "not next to each other" in str(exc)
        return
    assert split.world_size == lay.world_size
    for rank in range(lay.world_size):
        groups, pos = _reshape_oracle(view, p, sizes, rank)
        assert [split.group(rank, j) for j in range(split.ndim)] == groups
        assert split.coordinate(rank) == pos


@pytest.mark.parametrize(
    ("sizes", "names", "message"),
    [
        ((2, 3), ("a", "b"), r"a\(2\) \* b\(3\) = 6: the sizes must multiply to 8"),
        ((2, 2), ("a",), "one name per size"),
        ((2, 4), ("dp", "x"), "'dp' appears more than once"),
        ((-1, -1), ("a", "b"), "one of them may be -1"),
        ((3, -1), ("a", "b"), "cannot infer the -1"),
        ((0, 8), ("a", "b"), ">= 1"),
        ((2, 4), "ab", "a tuple of names"),
    ],
)
def test_bad_unflatten_says_why(sizes, names, message):
    lay = MeshLayout.create((2, 8), ("dp", "tp"))
    with pytest.raises(MeshError, match=message):
        lay.unflatten("tp", sizes, names)


def test_unflatten_refuses_an_irregular_split_and_suggests_one():
    flat = MeshLayout.create((2, 2, 3), ("a", "b", "c")).slice(("a", "c")).flatten("ac")
    with pytest.raises(MeshError, match=r"not next to each other .*e\.g\. \(2, 3\)"):
        flat.unflatten(0, (3, 2), ("x", "y"))
