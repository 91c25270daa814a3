"""Our group rank lists are exactly PyTorch's, under the fake backend, for many shapes."""

from __future__ import annotations

import pytest
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh as torch_init_device_mesh

from commscope import compat
from commscope.mesh import init_device_mesh
from commscope.mesh.layout import MeshLayout
from tests.needs import needs_torch, torch_has

CASES = [
    ((8,), ("w",), [0, 5]),
    ((2, 4), ("dp", "tp"), [0, 5, 7]),
    ((4, 2), ("dp", "tp"), [3, 6]),
    ((2, 2, 2), ("dp", "pp", "tp"), [0, 3, 6]),
    ((1, 8), ("pp", "tp"), [2]),
    ((2, 1, 4), ("dp", "cp", "tp"), [1, 6]),
    ((3, 1, 2, 2), ("pp", "dp", "cp", "tp"), [0, 7, 11]),
    ((4, 4, 4), ("dp", "cp", "tp"), [0, 21, 63]),
    ((8, 1), ("dp", "tp"), [5]),
]


def _ranks(pg) -> list[int]:
    return dist.get_process_group_ranks(pg)


@pytest.mark.parametrize(("shape", "names", "ranks"), CASES)
def test_groups_slices_and_flatten_match_torch(fake_pg, shape, names, ranks):
    world = 1
    for s in shape:
        world *= s
    lay = MeshLayout.create(shape, names)
    for rank in ranks:
        with fake_pg(rank, world):
            tm = torch_init_device_mesh("cpu", shape, mesh_dim_names=names)
            ours = init_device_mesh("cpu", shape, mesh_dim_names=names)
            for name in names:
                expected = _ranks(tm.get_group(name))
                assert lay.group(rank, name) == expected, (shape, rank, name)
                assert _ranks(ours.get_group(name)) == expected
                assert ours.get_local_rank(name) == tm.get_local_rank(name)
                desc = tm.get_group(name).group_desc
                if len(expected) == world and not compat.has(
                        "mesh_world_axis_reuses_default_group"):
                    # torch before 2.10 makes a group of its own for such an axis of an
                    # n-D mesh; ours reuses the default group, as torch does later
                    desc = "default_pg"
                assert ours.get_group(name).group_desc == desc
            assert ours.get_coordinate() == tm.get_coordinate()
            assert ours.mesh.tolist() == tm.mesh.tolist()
            if len(names) >= 2:
                pick = (names[0], names[-1])
                osub = ours[pick]
                oflat = osub.flatten("joined")
                assert ours["joined"] is oflat
                flat_ranks = lay.slice(pick).flatten("joined").group(rank, 0)
                assert _ranks(oflat.get_group()) == flat_ranks
                if not compat.has("mesh_slices_any_axes"):
                    # torch before 2.10 cannot give these groups: check ours alone
                    for n in pick:
                        assert _ranks(osub.get_group(n)) == lay.group(rank, n)
                    continue
                tsub = tm[pick]
                assert osub.mesh.tolist() == tsub.mesh.tolist()
                for n in pick:
                    assert _ranks(osub.get_group(n)) == _ranks(tsub.get_group(n))
                tflat = tsub._flatten("joined")
                assert _ranks(oflat.get_group()) == _ranks(tflat.get_group())
                assert oflat.mesh.tolist() == tflat.mesh.tolist()


def test_group_creation_all_path_matches_torch(fake_pg):
    with fake_pg(5, 16):
        tm = torch_init_device_mesh("cpu", (2, 2, 4), mesh_dim_names=("a", "b", "c"))
        ours = init_device_mesh(
            "cpu", (2, 2, 4), mesh_dim_names=("a", "b", "c"), group_creation="all"
        )
        for n in ("a", "b", "c"):
            assert _ranks(ours.get_group(n)) == _ranks(tm.get_group(n))


def test_a_rank_of_16384_creates_only_its_groups(fake_pg):
    created = []
    original = dist.new_group

    def counting(*args, **kwargs):
        created.append(kwargs.get("use_local_synchronization"))
        return original(*args, **kwargs)

    with fake_pg(12345, 16384):
        dist.new_group = counting
        try:
            mesh = init_device_mesh("cpu", (2, 1024, 8), mesh_dim_names=("dp", "fsdp", "tp"))
        finally:
            dist.new_group = original
        assert created == [True, True, True]
        assert _ranks(mesh.get_group("tp")) == list(range(12344, 12352))
        assert _ranks(mesh.get_group("dp")) == [12345 - 8192, 12345]


def test_world_axis_reuses_the_default_group(fake_pg):
    with fake_pg(3, 8):
        mesh = init_device_mesh("cpu", (8,), mesh_dim_names=("dp",))
        assert mesh.get_group("dp") is dist.distributed_c10d._get_default_group()
        mesh2 = init_device_mesh("cpu", (2, 4), mesh_dim_names=("a", "b"))
        assert mesh2.flatten("ab").get_group() is dist.distributed_c10d._get_default_group()


UNFLATTEN_CASES = [
    # (root shape, names, slice to take or None, axis, sizes, new names)
    ((8,), ("world",), None, "world", (2, 2, 2), ("dp", "pp", "tp")),
    ((2, 8), ("dp", "rest"), None, "rest", (2, 4), ("cp", "tp")),
    ((2, 8), ("dp", "rest"), ("rest",), "rest", (4, 2), ("cp", "tp")),
    ((2, 2, 4), ("a", "b", "c"), ("a", "c"), "c", (2, 2), ("c0", "c1")),
    ((4, 4), ("dp", "tp"), None, "dp", (2, 1, 2), ("r", "one", "s")),
]


@torch_has("device_mesh_unflatten")
@pytest.mark.parametrize(("shape", "names", "pick", "axis", "sizes", "new"), UNFLATTEN_CASES)
def test_unflatten_matches_torch(fake_pg, shape, names, pick, axis, sizes, new):
    world = 1
    for s in shape:
        world *= s
    for rank in (0, world // 2 + 1, world - 1):
        with fake_pg(rank, world):
            tm = torch_init_device_mesh("cpu", shape, mesh_dim_names=names)
            ours = init_device_mesh("cpu", shape, mesh_dim_names=names)
            if pick is not None:
                tm, ours = tm[pick], ours[pick]
            # torch 2.10 and 2.11 refuse every axis name (an inverted check): pass the index
            by = axis if compat.has("mesh_unflatten_by_name") else tm.mesh_dim_names.index(axis)
            tu = tm._unflatten(by, sizes, new)
            ou = ours.unflatten(axis, sizes, new)
            assert ou.mesh_dim_names == tu.mesh_dim_names
            assert ou.mesh.tolist() == tu.mesh.tolist()
            assert ou.get_coordinate() == tu.get_coordinate()
            for n in tu.mesh_dim_names:
                assert _ranks(ou.get_group(n)) == _ranks(tu.get_group(n)), (rank, n)
                assert ou.get_local_rank(n) == tu.get_local_rank(n)
            # torch's private spelling gives ours too, and the same mesh again
            assert ours._unflatten(axis, sizes, new) is ou


def test_unflatten_reuses_groups_instead_of_duplicating_them(fake_pg):
    created = []
    original = dist.new_group

    def counting(*args, **kwargs):
        created.append(args[0] if args else kwargs.get("ranks"))
        return original(*args, **kwargs)

    with fake_pg(5, 8):
        mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("dp", "pp", "tp"))
        dist.new_group = counting
        try:
            flat = mesh["dp", "tp"].flatten("dp_tp")
            assert mesh["dp_tp"] is flat and mesh["dp", "tp"]._flatten("dp_tp") is flat
            assert created == [[0, 1, 4, 5]]
            split = flat.unflatten(0, (2, 2), ("dp2", "tp2"))  # same groups as dp and tp
            assert split.get_group("dp2") is mesh.get_group("dp")
            assert split.get_group("tp2") is mesh.get_group("tp")
            again = mesh.unflatten("tp", (2, 1), ("t", "one"))  # t = tp; "one" is new
            assert again.get_group("t") is mesh.get_group("tp")
            assert created == [[0, 1, 4, 5], [5]]
            assert mesh.flatten("all").get_group() is dist.distributed_c10d._get_default_group()
        finally:
            dist.new_group = original
        # torch 2.13 makes a new group for every axis of every unflatten
        needs_torch("device_mesh_unflatten", "mesh_slices_any_axes")
        tm = torch_init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("dp", "pp", "tp"))
        before = len(dist.distributed_c10d._world.pg_map)
        tm["dp", "tp"]._flatten("dp_tp")._unflatten(0, (2, 2), ("dp2", "tp2"))
        assert len(dist.distributed_c10d._world.pg_map) - before == 3


def test_flatten_and_unflatten_follow_the_all_ranks_creation_mode(fake_pg):
    # MPI and torchcomms need every rank to create every group (group_creation="all"):
    # flatten and unflatten must too, or the ranks outside a group would hang.
    calls = []
    original = dist.new_group

    def counting(ranks=None, *args, **kwargs):
        calls.append((list(ranks), bool(kwargs.get("use_local_synchronization"))))
        return original(ranks, *args, **kwargs)

    with fake_pg(5, 8):
        mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("dp", "pp", "tp"),
                                group_creation="all")
        dist.new_group = counting
        try:
            flat = mesh["dp", "tp"].flatten("dp_tp")
            assert calls == [([0, 1, 4, 5], False), ([2, 3, 6, 7], False)]
            assert _ranks(flat.get_group()) == [0, 1, 4, 5]
            calls.clear()
            split = mesh.unflatten("tp", (2, 1), ("t", "one"))
            assert split.get_group("t") is mesh.get_group("tp")  # reused: no call
            assert calls == [([r], False) for r in range(8)]  # every rank, every group
            assert _ranks(split.get_group("one")) == [5]
        finally:
            dist.new_group = original


def test_meshes_pickle_and_deepcopy_with_their_groups(fake_pg):
    # torch.save of a DTensor pickles its mesh (and deepcopy copies it): groups are kept
    # by name and found again, as torch's own mesh does.
    import copy
    import io
    import pickle

    import torch
    from torch.distributed.tensor import Shard, distribute_tensor

    from commscope.mesh import DeviceMesh

    with fake_pg(1, 4):
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        flat = mesh.flatten("world")
        split = mesh.unflatten("tp", (2, 1), ("t", "one"))
        for original in (mesh, mesh["tp"], flat, split):
            for clone in (pickle.loads(pickle.dumps(original)), copy.deepcopy(original)):
                assert type(clone) is DeviceMesh
                assert clone.mesh.tolist() == original.mesh.tolist()
                for name in original.axis_names:
                    assert clone.get_group(name) is original.get_group(name)
                    assert clone.get_local_rank(name) == original.get_local_rank(name)
        again = pickle.loads(pickle.dumps(mesh))
        assert again["world"].get_group() is flat.get_group()  # flattened axes come along
        dt = distribute_tensor(torch.arange(8.0).reshape(4, 2), mesh, [Shard(0), Shard(1)])
        buf = io.BytesIO()
        torch.save({"w": dt}, buf)
        buf.seek(0)
        loaded = torch.load(buf, weights_only=False)["w"]
        assert loaded.placements == dt.placements
        assert torch.equal(loaded.to_local(), dt.to_local())
        assert loaded.device_mesh.get_group("tp") is mesh.get_group("tp")


@torch_has("mesh_slices_any_axes")
def test_a_flattened_axis_beside_other_axes_slices_like_torch(fake_pg):
    # torchtitan's HSDP + context parallel: mesh["dp_replicate", "dp_shard_cp"].
    import warnings

    from commscope.mesh import MeshError

    names = ("dp_replicate", "dp_shard", "cp", "tp")
    for rank in (0, 6, 13):
        with fake_pg(rank, 16), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch: slicing flattened axes is deprecated
            tm = torch_init_device_mesh("cpu", (2, 2, 2, 2), mesh_dim_names=names)
            ours = init_device_mesh("cpu", (2, 2, 2, 2), mesh_dim_names=names)
            tm["dp_shard", "cp"]._flatten("dp_shard_cp")
            ours["dp_shard", "cp"].flatten("dp_shard_cp")
            for pick in (("dp_replicate", "dp_shard_cp"), ("dp_shard_cp", "tp"),
                         ("dp_replicate", "dp_shard_cp", "tp")):
                t, o = tm[pick], ours[pick]
                assert o.mesh.tolist() == t.mesh.tolist(), (rank, pick)
                for n in pick:
                    assert _ranks(o.get_group(n)) == _ranks(t.get_group(n)), (rank, pick, n)
                assert ours[pick] is o  # cached: no new object, no new group
            with pytest.raises(MeshError, match="cannot be taken beside one of the axes"):
                ours["dp_shard_cp", "cp"]
            with pytest.raises(MeshError, match=r"out of order.*write \('dp_shard_cp', 'tp'\)"):
                ours["tp", "dp_shard_cp"]


@torch_has("mesh_slices_any_axes")
def test_torch_spelling_flatten_is_torchs_own_and_known_to_ours(fake_pg):
    # FSDP2's dp_mesh_dims path calls mesh[...]._flatten(); DTensor then looks for that
    # flattened mesh on the root (torch's registry) to reduce over both axes at once.
    from commscope.mesh import DeviceMesh

    with fake_pg(5, 8):
        tm = torch_init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("dp", "pp", "tp"))
        mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("dp", "pp", "tp"))
        flat = mesh["dp", "tp"]._flatten()
        theirs = tm["dp", "tp"]._flatten()
        assert type(flat) is DeviceMesh and flat.axis_names == ("dp_tp",)
        assert mesh["dp_tp"] is flat and mesh._flatten_mapping["dp_tp"] is flat
        assert _ranks(flat.get_group()) == _ranks(theirs.get_group()) == [0, 1, 4, 5]
        assert flat._layout == theirs._layout  # what DTensor compares
