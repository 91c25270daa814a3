"""torch's own DeviceMesh API on commscope's mesh: constructor, unnamed meshes, meshes
smaller than the job, ``backend_override``, and torch's exception types with our messages.

PyTorch's own ``test_device_mesh.py`` checks the same against ours (``tests/peer``);
these run on every torch release of the matrix, under the fake backend.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh as TorchDeviceMesh
from torch.distributed.device_mesh import init_device_mesh as torch_init_device_mesh

from commscope.mesh import DeviceMesh, MeshError, init_device_mesh


def _ranks(pg) -> list[int]:
    return dist.get_process_group_ranks(pg)


def test_unnamed_mesh_is_torchs_unnamed_mesh(fake_pg):
    with fake_pg(5, 8):
        theirs = torch_init_device_mesh("cpu", (2, 4))
        ours = init_device_mesh("cpu", (2, 4))
        assert ours.mesh_dim_names is None
        assert ours == theirs and theirs == ours and hash(ours) == hash(theirs)
        assert repr(ours) == "DeviceMesh((2, 4), device='cpu')"
        assert _ranks(ours.get_group(1)) == _ranks(theirs.get_group(1)) == [4, 5, 6, 7]
        assert ours.get_group(1).group_desc == theirs.get_group(1).group_desc
        with pytest.raises(RuntimeError, match="Cannot slice a DeviceMesh without mesh_dim_names!"):
            ours["dim_0"]
        with pytest.raises(KeyError, match="No `mesh_dim_names` found"):
            ours.get_group("dim_0")
        with pytest.raises(RuntimeError, match="Cannot flatten a DeviceMesh without"):
            ours._flatten()
        world = ours.flatten("world")  # ours: an unnamed mesh flattens under a given name
        assert world.mesh_dim_names == ("world",) and ours["world"] is world
        assert "dim_0" in ours.describe()


CASES = [
    # (what, call, torch's type, torch's words, our words)
    ("device with index", lambda m: init_device_mesh("cpu:0", (8,)), RuntimeError,
     "Device type with index is not supported", "pass 'cpu'"),
    ("names repeated", lambda m: init_device_mesh("cpu", (2, 4), mesh_dim_names=("a", "a")),
     RuntimeError, "Each mesh_dim_name must be unique", "'a' appears more than once"),
    ("names and shape", lambda m: init_device_mesh("cpu", (8,), mesh_dim_names=("a", "b")),
     RuntimeError, "mesh_shape and mesh_dim_names should have same length!", "1 axes but 2"),
    ("bigger than the job", lambda m: init_device_mesh("cpu", (4, 4)), RuntimeError,
     "Mesh should not be bigger than default world size", "launch 16 ranks"),
    ("unknown slice", lambda m: m["ep"], KeyError, "Invalid mesh_dim_names",
     "valid names are ['dp', 'cp', 'tp']"),
    ("slice out of order", lambda m: m["tp", "dp"], KeyError,
     "Mesh dim indices should be in ascending order", "write ('dp', 'tp')"),
    ("slice repeated", lambda m: m["dp", "dp"], RuntimeError, "Slicing overlapping dim_names",
     "named twice"),
    ("unknown group", lambda m: m.get_group("ep"), KeyError,
     "Mesh dimension 'ep' does not exist", "valid names are"),
    ("group out of range", lambda m: m.get_group(5), IndexError, None, "axis index 5"),
    ("local rank of n-D", lambda m: m.get_local_rank(), RuntimeError,
     "Optional kwarg `mesh_dim` needs to be specified", "get_local_rank('tp')"),
    ("group of n-D", lambda m: m.get_group(), RuntimeError,
     "Optional kwarg `mesh_dim` needs to be specified", "get_all_groups()"),
    ("flatten into an axis", lambda m: m._flatten("dp"), ValueError,
     "dp already exists for submesh of the DeviceMesh", "pick another name"),
    ("unflatten sizes and names", lambda m: m._unflatten("dp", (2, 1), ("a",)), RuntimeError,
     None, "one name per size"),
    ("override twice", lambda m: init_device_mesh(
        "cpu", (2, 4), mesh_dim_names=("dp", "tp"), backend_override={"dp": "a", 0: "b"}),
     RuntimeError, "Found redundant dim index 0 and name dp in backend_override", "once"),
    ("override unknown", lambda m: init_device_mesh(
        "cpu", (2, 4), mesh_dim_names=("dp", "tp"), backend_override={"cp": "a"}),
     RuntimeError, r"Found invalid keys in backend_override: got \['cp'\]", "or one of"),
]


@pytest.mark.parametrize(("call", "kind", "theirs", "ours"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_errors_are_torchs_types_with_our_messages(fake_pg, call, kind, theirs, ours):
    with fake_pg(3, 8):
        mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("dp", "cp", "tp"))
        with pytest.raises(MeshError, match=theirs) as caught:
            call(mesh)
        assert isinstance(caught.value, kind)
        assert ours in str(caught.value)


def test_flattened_axes_out_of_order_say_what_works(fake_pg):
    with fake_pg(0, 8):
        mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("dp", "cp", "tp"))
        mesh["dp", "tp"].flatten("dp_tp")
        with pytest.raises(KeyError, match="Mesh dim indices should be in ascending order") as e:
            mesh["dp_tp", "cp"]
        assert "cannot be taken together in any order: 'dp_tp' joins dp and tp" in str(e.value)
        assert "write" not in str(e.value)
        mesh["cp", "tp"].flatten("cp_tp")
        with pytest.raises(KeyError, match=r"write \('dp', 'cp_tp'\)"):
            mesh["cp_tp", "dp"]


def test_constructor_is_torchs_and_adds_ours(fake_pg):
    grid = torch.arange(8).reshape(2, 4)
    with fake_pg(5, 8):
        built = DeviceMesh("cpu", grid, mesh_dim_names=("dp", "tp"))
        theirs = TorchDeviceMesh("cpu", grid, mesh_dim_names=("dp", "tp"))
        assert type(built) is DeviceMesh
        assert built == theirs == init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
        assert _ranks(built.get_group("tp")) == _ranks(theirs.get_group("tp")) == [4, 5, 6, 7]
        assert built.layout.shape == (2, 4) and built.group_ranks("dp") == [1, 5]
        assert built["tp"].get_local_rank() == 1
        assert "DeviceMesh(dp=2, tp=4" in built.describe()


def test_constructor_of_any_mesh_is_torchs_alone(fake_pg):
    permuted = torch.tensor([[0, 2], [1, 3], [4, 6], [5, 7]])
    with fake_pg(6, 8):
        built = DeviceMesh("cpu", permuted, mesh_dim_names=("a", "b"))
        theirs = TorchDeviceMesh("cpu", permuted, mesh_dim_names=("a", "b"))
        assert built == theirs and repr(built) == repr(theirs)
        for axis in ("a", "b", 0, 1):
            assert _ranks(built.get_group(axis)) == _ranks(theirs.get_group(axis))
            assert built.get_local_rank(axis) == theirs.get_local_rank(axis)
        assert built["b"].mesh.tolist() == theirs["b"].mesh.tolist() == [4, 6]
        plain = built.to_torch()
        assert type(plain) is TorchDeviceMesh and plain == theirs
        with pytest.raises(MeshError, match=r"explicit mesh \[\[0, 2\]"):
            built.describe()
        late = DeviceMesh("cpu", torch.arange(10), _init_backend=False)
        with pytest.raises(RuntimeError, match="process groups not initialized"):
            late.get_group()


def test_mesh_smaller_than_the_job_leaves_the_others_out(fake_pg, caplog, monkeypatch):
    from commscope.mesh import device_mesh

    monkeypatch.setattr(device_mesh, "_warned_partial", set())  # said once per shape
    for rank, member in ((2, True), (6, False)):
        with fake_pg(rank, 8):
            theirs = torch_init_device_mesh("cpu", (2, 2), mesh_dim_names=("x", "y"))
            ours = init_device_mesh("cpu", (2, 2), mesh_dim_names=("x", "y"))
            assert ours == theirs
            assert ours.get_coordinate() == theirs.get_coordinate()
            assert (ours.get_coordinate() is not None) is member
            if member:
                assert _ranks(ours.get_group("y")) == [2, 3] and ours.get_local_rank("x") == 1
                assert ours["y"].get_coordinate() == theirs["y"].get_coordinate()
            else:
                with pytest.raises(IndexError, match="rank 6 is not in this mesh"):
                    ours.get_group("y")
            flat = ours.flatten("xy")
            assert (flat.get_coordinate() is not None) is member
            assert "ranks 4..7 are not in this mesh" in caplog.text


def test_backend_override_gives_those_axes_groups_of_their_own(fake_pg):
    with fake_pg(3, 8):
        world = init_device_mesh("cpu", (8,), mesh_dim_names=("w",), backend_override={0: "fake"})
        assert world.get_group() is not dist.distributed_c10d._get_default_group()
        split = world._unflatten(0, (2, 4), ("pp", "spmd"), backend_override={"pp": "fake"})
        assert _ranks(split.get_group("pp")) == [3, 7]
        assert _ranks(split.get_group("spmd")) == [0, 1, 2, 3]


def test_backend_override_passes_the_backends_options(fake_pg):
    from torch.testing._internal.distributed.fake_pg import FakeProcessGroup

    try:
        opts = FakeProcessGroup.Options()
        opts.fake_option = 42
    except (TypeError, AttributeError):
        pytest.skip("this torch's fake backend options hold no value to check them by")

    def options(mesh, axis):
        return mesh.get_group(axis)._get_backend(torch.device("cpu")).options

    with fake_pg(3, 8):
        mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("dp", "tp", "cp"),
                                backend_override={"cp": ("fake", opts), 0: "fake"})
        assert options(mesh, "cp").fake_option == 42
        assert options(mesh, "tp") is None and options(mesh, "dp") is None
        world = init_device_mesh("cpu", (8,), mesh_dim_names=("w",))
        split = world._unflatten(0, (2, 4), ("pp", "spmd"), backend_override={"pp": opts})
        assert options(split, "pp").fake_option == 42


def test_flattening_a_1d_mesh_into_its_own_name_is_itself(fake_pg):
    with fake_pg(1, 4):
        mesh = init_device_mesh("cpu", (4,), mesh_dim_names=("default",))
        assert mesh._flatten() is mesh and mesh.flatten("default") is mesh


def test_from_group_is_torchs_and_gives_ours(fake_pg):
    with fake_pg(6, 8):
        world = DeviceMesh.from_group(dist.group.WORLD, "cpu", mesh_dim_names=("w",))
        assert type(world) is DeviceMesh and world.layout.shape == (8,)
        assert world == TorchDeviceMesh.from_group(dist.group.WORLD, "cpu", mesh_dim_names=("w",))
        assert world.get_group() is dist.group.WORLD and world.get_local_rank() == 6
        tp = dist.new_group([4, 5, 6, 7])
        part = DeviceMesh.from_group(tp, "cpu", mesh_dim_names=("tp",))
        assert type(part) is DeviceMesh and part.mesh.tolist() == [4, 5, 6, 7]
        assert part.get_group() is tp and part.get_local_rank() == 2  # torch's own answers
        with pytest.raises(ValueError, match="Invalid mesh"):
            DeviceMesh.from_group(tp, "cpu", mesh=[0, 1, 2, 3])
