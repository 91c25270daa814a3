"""commscope.mesh on real gloo ranks: groups, errors, and hand-off to FSDP, DTensor and TP."""

from __future__ import annotations

import socket
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from commscope import compat
from commscope.mesh import DeviceMesh, HostTable, MeshDisagreement, MeshError, init_device_mesh
from tests.needs import torch_has

pytestmark = pytest.mark.dist


def _ranks(pg) -> list[int]:
    return dist.get_process_group_ranks(pg)


def _groups_and_sums(rank, world, shape, names):
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    out = {"coord": mesh.get_coordinate(), "repr": repr(mesh)}
    for name in names:
        pg = mesh.get_group(name)
        t = torch.tensor([float(rank)])
        dist.all_reduce(t, group=pg)
        out[name] = (_ranks(pg), mesh.get_local_rank(name), t.item(), pg.group_desc)
    return out


@pytest.mark.parametrize(
    ("shape", "names"),
    [
        ((2, 2), ("dp", "tp")),
        ((4,), ("dp",)),
        ((1, 4), ("pp", "tp")),
        ((2, 1, 2), ("dp", "cp", "tp")),
    ],
)
def test_groups_on_four_gloo_ranks(ranks, shape, names):
    results = ranks(_groups_and_sums, 4, shape, names, timeout=60)
    from commscope.mesh.layout import MeshLayout

    lay = MeshLayout.create(shape, names)
    for rank, out in enumerate(results):
        # torch's get_coordinate, which ours keeps: a list on older releases, a tuple later
        assert tuple(out["coord"]) == lay.coordinate(rank)
        for i, name in enumerate(names):
            group, local, total, desc = out[name]
            assert group == lay.group(rank, i)
            assert local == lay.coordinate(rank)[i]
            assert total == sum(group)  # the all_reduce really ran over that group
            assert desc == ("default_pg" if len(group) == 4 else f"mesh_{name}")


def _tutorial_2d(rank, world):
    mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("replicate", "shard"))
    t = torch.tensor([float(rank)])
    dist.all_reduce(t, group=mesh.get_group("shard"))
    return (_ranks(mesh.get_group("shard")), _ranks(mesh.get_group("replicate")), t.item())


def test_eight_rank_two_d_setup_of_the_tutorial(ranks):
    results = ranks(_tutorial_2d, 8, timeout=90)
    for rank, (shard, replicate, total) in enumerate(results):
        assert shard == ([0, 1, 2, 3] if rank < 4 else [4, 5, 6, 7])
        assert replicate == [rank % 4, rank % 4 + 4]
        assert total == (6.0 if rank < 4 else 22.0)


def _slice_flatten(rank, world):
    mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("dp", "pp", "tp"))
    sub = mesh["dp", "tp"]
    flat = sub.flatten("dp_tp")
    t = torch.ones(1)
    dist.all_reduce(t, group=flat.get_group())
    again = mesh["dp", "tp"].flatten("dp_tp")
    return {
        "sub": sub.mesh.tolist(),
        "sub_repr": repr(sub),
        "flat": _ranks(flat.get_group()),
        "flat_desc": flat.get_group().group_desc,
        "sum": t.item(),
        "cached": again is flat and mesh["dp_tp"] is flat,
        "root_get_group": _ranks(mesh.get_group("dp_tp")),
        "same_pg": sub.get_group("tp") is mesh.get_group("tp"),
        "to_torch": type(mesh.to_torch()).__name__
        + ":"
        + str(type(mesh.to_torch()) is not DeviceMesh),
    }


def test_slicing_and_flattening_on_gloo(ranks):
    results = ranks(_slice_flatten, 8, timeout=90)
    for rank, out in enumerate(results):
        base = rank & 2  # the pp coordinate picks the sub-mesh
        assert out["sub"] == [[base, base + 1], [base + 4, base + 5]]
        assert out["sub_repr"] == "DeviceMesh(dp=2, tp=2, device='cpu')"
        assert out["flat"] == [base, base + 1, base + 4, base + 5]
        assert out["flat_desc"] == "mesh_dp_tp"
        assert out["sum"] == 4.0
        assert out["cached"] and out["same_pg"]
        assert out["root_get_group"] == out["flat"]
        assert out["to_torch"] == "DeviceMesh:True"


def _wrong_product(rank, world):
    try:
        init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
    except MeshError as exc:
        return str(exc)
    return None


def test_shape_product_error_shows_the_arithmetic(ranks):
    for msg in ranks(_wrong_product, 6, timeout=60):
        assert "dp(2) * tp(4) = 8 != world size 6" in msg


def _disagree(rank, world):
    shape = (4,) if rank == 3 else (2, 2)
    names = ("dp",) if rank == 3 else ("dp", "tp")
    start = time.monotonic()
    try:
        init_device_mesh("cpu", shape, mesh_dim_names=names, timeout=timedelta(seconds=20))
    except MeshDisagreement as exc:
        return str(exc), time.monotonic() - start
    return None, time.monotonic() - start


def test_ranks_that_disagree_get_an_error_not_a_hang(ranks):
    for msg, elapsed in ranks(_disagree, 4, timeout=60):
        assert msg is not None
        assert "ranks disagree on the mesh" in msg
        assert "rank 0 and 2 other ranks asked for shape (2, 2) names ('dp', 'tp')" in msg
        assert "ranks [3] asked for shape (4,) names ('dp',)" in msg
        assert elapsed < 10


def _absent(rank, world):
    if rank == 1:
        time.sleep(4)
        return "skipped"
    try:
        init_device_mesh("cpu", (2,), mesh_dim_names=("dp",), timeout=timedelta(seconds=1.5))
    except MeshDisagreement as exc:
        return str(exc)
    return None


def test_a_rank_that_never_comes_is_named(ranks):
    results = ranks(_absent, 2, timeout=60)
    assert results[1] == "skipped"
    assert "only 1 of 2 ranks reached init_device_mesh" in results[0]
    assert "missing ranks: [1]" in results[0]


def _bad_args(rank, world):
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("dp",))
    calls = [  # each error is a MeshError and the type torch raises there
        (RuntimeError, lambda: init_device_mesh("cuda:0", (2,))),
        (RuntimeError, lambda: init_device_mesh("cpu", (2,), mesh_dim_names=("a", "b"))),
        (KeyError, lambda: mesh["tp"]),
        (KeyError, lambda: mesh.get_group("tp")),
        (IndexError, lambda: mesh.size(3)),
    ]
    errors = []
    for kind, call in calls:
        try:
            call()
        except MeshError as exc:
            errors.append((str(exc), isinstance(exc, kind)))
    built = DeviceMesh("cpu", [0, 1], mesh_dim_names=("dp",))  # torch's constructor
    return errors, (built == mesh, built.group_ranks("dp"), repr(built))


def test_errors_say_what_to_do(ranks):
    errors, built = ranks(_bad_args, 2, timeout=60)[0]
    assert "got 'cuda:0'; pass 'cuda'" in errors[0][0]
    assert "1 axes but 2 names" in errors[1][0]
    assert "unknown axis name 'tp'; valid names are ['dp']" in errors[2][0]
    assert "unknown axis name 'tp'; valid names are ['dp']" in errors[3][0]
    assert "axis index 3 is out of range" in errors[4][0]
    assert len(errors) == 5 and all(is_torch_type for _, is_torch_type in errors)
    assert built == (True, [0, 1], "DeviceMesh(dp=2, device='cpu')")


# ----------------------------------------------------------------- hand-off to torch


def _model_and_data():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    gen = [torch.Generator().manual_seed(100 + i) for i in range(3)]
    data = [(torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g)) for g in gen]
    return model, data


def _single_process_losses():
    model, data = _model_and_data()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = []
    for x, y in data:
        loss = sum(((model(a) - b) ** 2).mean() for a, b in zip(x.chunk(4), y.chunk(4))) / 4
        opt.zero_grad()
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out


def _hsdp_losses(rank, world, which, torch_mesh=False):
    from torch.distributed.device_mesh import init_device_mesh as torch_init_device_mesh

    make_mesh = torch_init_device_mesh if torch_mesh else init_device_mesh
    if which != "fsdp2-cp":
        mesh = make_mesh("cpu", (2, 2), mesh_dim_names=("dp_replicate", "dp_shard"))
    model, data = _model_and_data()
    if which == "fsdp2-cp":
        # torchtitan's HSDP with context parallel: shard over the flattened (dp_shard,
        # cp) axis, replicate over dp_replicate, on a view mixing the two.
        from torch.distributed.fsdp import fully_shard

        mesh = make_mesh("cpu", (2, 2, 1), mesh_dim_names=("dp_replicate", "dp_shard", "cp"))
        if torch_mesh:
            mesh["dp_shard", "cp"]._flatten("dp_shard_cp")
        else:
            mesh["dp_shard", "cp"].flatten("dp_shard_cp")
        hsdp = mesh["dp_replicate", "dp_shard_cp"]
        for layer in model:
            if list(layer.parameters()):
                fully_shard(layer, mesh=hsdp)
        fully_shard(model, mesh=hsdp)
        placements = [str(p.placements) for p in model.parameters()]
    elif which == "fsdp2-spmd":
        # FSDP2 on the full mesh, sharding over both axes: torch flattens them with
        # mesh[...]._flatten(), which is our flatten (one group over all four ranks).
        from torch.distributed.fsdp import DataParallelMeshDims, fully_shard
        from torch.distributed.tensor import distribute_module

        distribute_module(model, mesh)  # parameters replicated on the mesh
        fully_shard(model, mesh=mesh, dp_mesh_dims=DataParallelMeshDims(
            shard=("dp_replicate", "dp_shard")))
        placements = [str(p.placements) for p in model.parameters()]
        if not torch_mesh:
            assert mesh["dp_replicate_dp_shard"].get_group() is dist.group.WORLD
        # DTensor warns when it cannot find the flattened mesh and reduces over the two
        # axes one after the other; with torch's registry kept, it finds it.
        import logging

        sequential: list[str] = []
        handler = logging.Handler()
        handler.emit = lambda record: sequential.append(record.getMessage())  # type: ignore[method-assign]
        logging.getLogger("torch.distributed.tensor._redistribute").addHandler(handler)
    elif which == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            if list(layer.parameters()):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        placements = [str(p.placements) for p in model.parameters()]
    else:
        from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy

        model = FullyShardedDataParallel(
            model,
            device_mesh=mesh,
            sharding_strategy=ShardingStrategy.HYBRID_SHARD,
            device_id=torch.device("cpu"),
        )
        placements = []
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for x, y in data:
        x, y = x.chunk(world)[rank], y.chunk(world)[rank]
        if which == "fsdp2-spmd":  # the whole step in DTensors: the batch split over both axes
            from torch.distributed.tensor import DTensor, Shard

            x, y = (DTensor.from_local(t, mesh, [Shard(0), Shard(0)]) for t in (x, y))
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if which == "fsdp2-spmd":
            losses.append(loss.full_tensor().item())
            continue
        t = loss.detach().clone()
        dist.all_reduce(t)
        losses.append(t.item() / world)
    if which == "fsdp2-spmd":
        assert not [m for m in sequential if "sequential" in m], sequential
    return losses, placements


@torch_has("fsdp_data_parallel_mesh_dims")
def test_fsdp2_on_the_full_spmd_mesh_flattens_through_ours_like_torch(ranks):
    # FSDP2's dp_mesh_dims path calls mesh[...]._flatten(): on our mesh that is our
    # flatten. The losses must be torch's own, bit for bit (torch's SPMD path does not
    # reproduce the single-process losses exactly, on its own mesh either).
    theirs = ranks(_hsdp_losses, 4, "fsdp2-spmd", True, timeout=90)
    ours = ranks(_hsdp_losses, 4, "fsdp2-spmd", False, timeout=90)
    assert ours == theirs  # losses and placements: torch's own, whatever the release
    for losses, placements in ours:
        assert len(losses) == 3 and placements


@pytest.mark.parametrize("which", [
    pytest.param("fsdp2", marks=torch_has("fsdp2_on_cpu")), "fsdp1",
    pytest.param("fsdp2-cp", marks=torch_has("fsdp2_on_cpu"))])
def test_hsdp_trains_like_a_single_process(ranks, which):
    expected = _single_process_losses()
    if which != "fsdp1" and not compat.has("fsdp2_hsdp_trains_exactly"):
        # torch 2.8's FSDP2 HSDP misses one process's losses on its own mesh too
        expected = ranks(_hsdp_losses, 4, which, True, timeout=90)[0][0]
    for losses, placements in ranks(_hsdp_losses, 4, which, timeout=90):
        assert losses == pytest.approx(expected, rel=1e-5)
        if which in ("fsdp2", "fsdp2-cp"):
            assert placements and all(p == "(Replicate(), Shard(dim=0))" for p in placements)


def _tensor_parallel(rank, world):
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(7))
    expected = model(x).detach()
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    out = model(x)
    return torch.allclose(out, expected, atol=1e-6), str(model[0].weight.placements)


def test_tensor_parallel_on_the_tp_axis_matches_one_device(ranks):
    for same, placements in ranks(_tensor_parallel, 4, timeout=90):
        assert same
        assert placements == "(Shard(dim=0),)"


def _to_torch(rank, world):
    from torch.distributed.device_mesh import DeviceMesh as TorchDeviceMesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    tm = mesh.to_torch()
    same_groups = all(tm.get_group(n) is mesh.get_group(n) for n in ("dp", "tp"))
    dt = distribute_tensor(torch.arange(8.0).reshape(4, 2), tm, [Replicate(), Shard(0)])
    return type(tm) is TorchDeviceMesh, same_groups, dt.to_local().tolist(), tm["tp"].mesh.tolist()


def test_to_torch_shares_the_groups(ranks):
    for rank, (is_torch, same, local, tp_mesh) in enumerate(ranks(_to_torch, 4, timeout=60)):
        assert is_torch and same
        assert local == ([[0.0, 1.0], [2.0, 3.0]] if rank % 2 == 0 else [[4.0, 5.0], [6.0, 7.0]])
        assert tp_mesh == ([0, 1] if rank < 2 else [2, 3])


def _warn_tp(rank, world):
    import logging

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("commscope.mesh").addHandler(handler)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("tp", "dp"))
    return [r.getMessage() for r in records], mesh.describe(), mesh.hosts.gathered


def test_real_hostnames_win_over_local_world_size(ranks):
    # torchrun's LOCAL_WORLD_SIZE says 2 ranks per host, but all four ranks run on this
    # machine: the gathered hostnames say one host, and nothing crosses it
    # (tests/dist/test_mesh_hosts.py runs ranks under hostnames of their own)
    results = ranks(_warn_tp, 4, env={"LOCAL_WORLD_SIZE": "2"}, timeout=60)
    _, picture, gathered = results[0]
    assert all(m == [] for m, _, _ in results) and gathered
    label = HostTable.from_hostnames([socket.gethostname()]).labels[0]
    assert f"4 ranks, 1 host ({label})" in picture
    assert "tp  2 ranks per group, 2 groups: inside a host" in picture


def _unflatten(rank, world):
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    world_mesh = init_device_mesh("cpu", (4,), mesh_dim_names=("world",))
    mesh = world_mesh.unflatten("world", (2, 2), ("dp", "tp"))
    sums = {}
    for name in ("dp", "tp"):
        t = torch.tensor([float(rank)])
        dist.all_reduce(t, group=mesh.get_group(name))
        sums[name] = (_ranks(mesh.get_group(name)), t.item())
    # the same groups again, from the flattened pair: nothing new is created
    again = mesh.flatten("dp_tp").unflatten(0, (2, 2), ("r", "s"))
    reused = again.get_group("r") is mesh.get_group("dp") and (
        again.get_group("s") is mesh.get_group("tp"))
    dt = distribute_tensor(torch.arange(8.0).reshape(4, 2), mesh, [Replicate(), Shard(0)])
    return sums, reused, dt.to_local().tolist(), mesh.get_coordinate()


def test_unflatten_on_gloo_runs_collectives_and_dtensor(ranks):
    for rank, (sums, reused, local, coord) in enumerate(ranks(_unflatten, 4, timeout=60)):
        dp, tp = [rank % 2, rank % 2 + 2], [rank - rank % 2, rank - rank % 2 + 1]
        assert sums == {"dp": (dp, float(sum(dp))), "tp": (tp, float(sum(tp)))}
        assert reused
        assert tuple(coord) == (rank // 2, rank % 2)
        assert local == ([[0.0, 1.0], [2.0, 3.0]] if rank % 2 == 0 else [[4.0, 5.0], [6.0, 7.0]])


def _save_and_load(rank, world, folder):
    import os

    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("dp",))
    model, _ = _model_and_data()
    fully_shard(model, mesh=mesh)
    path = os.path.join(folder, f"state_{rank}.pt")
    torch.save(model.state_dict(), path)  # pickles each DTensor's mesh: ours
    fresh, _ = _model_and_data()
    for p in fresh.parameters():
        torch.nn.init.zeros_(p)
    fully_shard(fresh, mesh=mesh)
    fresh.load_state_dict(torch.load(path, weights_only=False))
    return all(torch.equal(a.to_local(), b.to_local())
               for a, b in zip(model.state_dict().values(), fresh.state_dict().values()))


def test_torch_save_of_an_fsdp2_state_dict_on_our_mesh(ranks, tmp_path):
    assert ranks(_save_and_load, 2, str(tmp_path), timeout=60) == [True, True]


def _checkpoint_and_redistribute(rank, world, folder):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    model, _ = _model_and_data()
    fully_shard(model, mesh=mesh["dp"])
    dcp.save(model.state_dict(), checkpoint_id=folder)  # torch.distributed.checkpoint
    fresh, _ = _model_and_data()
    for p in fresh.parameters():
        torch.nn.init.zeros_(p)
    fully_shard(fresh, mesh=mesh["dp"])
    state = fresh.state_dict()
    dcp.load(state, checkpoint_id=folder)
    fresh.load_state_dict(state)
    restored = all(torch.equal(a.full_tensor(), b.full_tensor())
                   for a, b in zip(model.state_dict().values(), fresh.state_dict().values()))
    full = torch.arange(16.0).reshape(4, 4)
    moved = distribute_tensor(full, mesh, [Shard(0), Replicate()]).redistribute(
        mesh, [Replicate(), Shard(1)])
    split = mesh.unflatten("tp", (2, 1), ("a", "b"))
    on_split = distribute_tensor(full, split, [Shard(0), Shard(1), Replicate()])
    return (restored, torch.equal(moved.full_tensor(), full),
            torch.equal(on_split.full_tensor(), full))


def test_distributed_checkpoint_and_redistribution_on_our_mesh(ranks, tmp_path):
    for result in ranks(_checkpoint_and_redistribute, 4, str(tmp_path), timeout=90):
        assert result == (True, True, True)
