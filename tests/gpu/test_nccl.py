"""The NCCL paths, on one GPU: recording, polled completion, timing, the timeout dump,
the mesh on ``"cuda"``, FSDP2 and DDP on CUDA, and PyTorch's own NCCL dumps.

These run only where a CUDA GPU and NCCL are present (skipped elsewhere, CI included;
see DEVELOPERS.md for how they were run on a lent GPU machine). NCCL refuses two ranks
on one GPU ("Duplicate GPU detected"), so every job here is a single rank: what they
check is the NCCL-specific plumbing (device-side completion learnt by polling, NCCL's
own timing, ``device_id`` eager init, communicator splitting), not cross-rank matching,
which the gloo tests cover.

The pytest process itself never touches CUDA: the availability check runs in a child
process and each job is a forked rank, so no CUDA context is ever forked.
"""

from __future__ import annotations

import glob
import os
import pickle
import shutil
import subprocess
import sys
from datetime import timedelta

import pytest

from tests.harness import run_ranks


def _gpu_reason() -> str | None:
    """Why these tests cannot run here (``None`` when they can)."""
    if not (shutil.which("nvidia-smi") or os.path.exists("/dev/nvidiactl")):
        return "no NVIDIA GPU on this machine"
    probe = (
        "import sys, torch, torch.distributed as d;"
        "sys.exit(0 if torch.cuda.is_available() and d.is_nccl_available() else 3)"
    )
    try:
        done = subprocess.run([sys.executable, "-c", probe], timeout=120, capture_output=True)
    except subprocess.TimeoutExpired:
        return "probing CUDA timed out"
    if done.returncode != 0:
        return "torch sees no CUDA device with NCCL"
    return None


_WHY_NOT = _gpu_reason()

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_WHY_NOT is not None, reason=f"needs a CUDA GPU with NCCL: {_WHY_NOT}"),
]


def _start(rank: int, world_size: int, **enable_kwargs) -> None:
    import torch
    import torch.distributed as dist

    import commscope.flight as flight

    flight.enable(**enable_kwargs)
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    store = dist.FileStore(os.environ["COMMSCOPE_TEST_STORE"], world_size)
    dist.init_process_group(
        "nccl", store=store, rank=rank, world_size=world_size,
        timeout=timedelta(seconds=60), device_id=device,
    )


def _settle() -> None:
    """Wait for the device; an on-demand snapshot then polls the works itself."""
    import torch

    torch.cuda.synchronize()


# --------------------------------------------------------------------------- recording


def _every_road(rank, world_size, prefix):
    import weakref

    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    import torch.nn as nn

    import commscope.flight as flight

    _start(rank, world_size, dump_prefix=prefix, timing=True, watchdog=False,
           handle_signals=False, dump_on_exception=False)
    dev = torch.device("cuda", 0)
    t = torch.ones(1024, device=dev)
    probe = weakref.ref(t)
    dist.all_reduce(t)
    dist.broadcast(t, 0)
    out = torch.empty(1024, device=dev)
    dist.all_gather_into_tensor(out, t)
    dist.reduce_scatter_tensor(t, out)
    dist.all_to_all_single(out, t)
    dist.barrier()
    dist.all_reduce(t, async_op=True).wait()
    sub = dist.new_group([0])
    dist.all_reduce(t, group=sub)
    funcol.wait_tensor(funcol.all_reduce(t, "sum", sub))
    a, b = torch.ones(3, device=dev), torch.ones(3, device=dev)
    with dist._coalescing_manager(device=dev, async_ops=True) as cm:
        dist.all_reduce(a)
        dist.all_reduce(b)
    cm.wait()
    model = nn.parallel.DistributedDataParallel(nn.Linear(64, 64).to(dev))
    model(torch.randn(8, 64, device=dev)).sum().backward()
    small = torch.ones(2, device=dev)
    for _ in range(1500):  # synchronous: each tracked by a (reused) device event
        dist.all_reduce(small)
    _settle()
    del t
    snap = flight.snapshot()
    path = flight.dump()
    return {
        "snap": snap,
        "path": path,
        "tensor_freed": probe() is None,
    }


@pytest.mark.timeout(240)
def test_every_road_into_an_nccl_group_is_recorded_and_completes(tmp_path):
    [res] = run_ranks(_every_road, 1, tmp_path, str(tmp_path / "fr_"), init=False,
                      timeout=200)
    snap = res["snap"]
    entries = snap["entries"]
    names = [e["profiling_name"] for e in entries]
    # PyTorch's names for these ops, as its own NCCL recorder writes them
    for wanted in ("nccl:all_reduce", "nccl:broadcast", "nccl:_all_gather_base",
                   "nccl:_reduce_scatter_base", "nccl:all_to_all", "nccl:barrier"):
        assert wanted in names, (wanted, names)
    # a coalescing-manager block (it calls _start/_end_coalescing on NCCL): one record
    coalesced = [e for e in entries if e["input_sizes"] == [[3], [3]]]
    assert [e["profiling_name"] for e in coalesced] == ["nccl:allreduce_coalesced"], names
    # device-side completion, learnt by polling the works: every record completed
    assert {e["state"] for e in entries} == {"completed"}, names
    # NCCL's own device timing filled duration_ms
    assert all(isinstance(e.get("duration_ms"), float) for e in entries), entries
    # the subgroup's records are in it, and its members are right (gloo's are not)
    groups = {v["desc"]: v for v in snap["pg_config"].values()}
    assert groups["default_pg"]["ranks"] == "[0]"
    sub_ids = {e["pg_id"] for e in entries if e["process_group"][1] != "default_pg"}
    assert sub_ids, "no record on the new_group"
    # DDP's gradient all_reduce comes from C++ (the reducer, on the autograd engine's
    # device thread, with no Python caller), and is recorded too; recording goes on
    ddp = [e for e in entries if e["input_sizes"] == [[64 * 64 + 64]]]
    # (DDP's construction also broadcasts the parameters: same size)
    assert "nccl:all_reduce" in [e["profiling_name"] for e in ddp], names[:20]
    assert names.count("nccl:all_reduce") >= 1505, len(names)
    assert res["tensor_freed"], "the recorder kept the CUDA tensor alive"
    with open(res["path"], "rb") as f:
        assert pickle.load(f)["entries"][0]["profiling_name"] == names[0]


# --------------------------------------------------------------------------- timeout


def _stuck_on_device(rank, world_size, prefix):
    import time

    import torch
    import torch.distributed as dist

    import commscope.flight as flight
    from commscope.flight.api import _state

    _start(rank, world_size, dump_prefix=prefix, timeout_s=1.0, poll_interval_s=0.1,
           handle_signals=False, dump_on_exception=False)
    t = torch.ones(16, device="cuda")
    dist.all_reduce(t)
    torch.cuda.synchronize()
    # A long kernel ahead of the collective on the device: it stays pending on the GPU
    # while the host goes on, which is what a hung NCCL collective looks like to us.
    torch.cuda._sleep(int(2e10))
    dist.all_reduce(t)
    deadline = time.monotonic() + 20
    path = f"{prefix}{rank}"
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    found = os.path.exists(path)
    rec, dog = _state.recorder, _state.watchdog
    why = {
        "pending": sorted(rec.pending),
        "polled": sorted(rec.polled),
        "overdue": [e.record_id for e in rec.overdue(time.time_ns(), 1.0)],
        "watchdog": dog is not None and dog._thread is not None and dog._thread.is_alive(),
    }
    torch.cuda.synchronize()
    # once the device is past it, the synchronous all_reduce (no work) is completed
    why["after"] = flight.snapshot()["entries"][-1]["state"]
    return found, why


@pytest.mark.timeout(240)
def test_a_collective_pending_on_the_gpu_triggers_the_timeout_dump(tmp_path):
    prefix = str(tmp_path / "fr_")
    [(found, why)] = run_ranks(_stuck_on_device, 1, tmp_path, prefix, init=False, timeout=200)
    assert found, f"no dump within 20 s of a 1 s timeout: {why}"
    with open(prefix + "0", "rb") as f:
        data = pickle.load(f)
    last = data["entries"][-1]
    assert last["profiling_name"] == "nccl:all_reduce"
    assert last["state"] != "completed" and not last["retired"], last
    assert data["entries"][0]["state"] == "completed"
    assert data["dump_reason"] == "timeout"
    assert why["after"] == "completed", why


# --------------------------------------------------------------------------- mesh, FSDP2


def _mesh_on_cuda(rank, world_size, prefix):
    import torch
    import torch.nn as nn
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard, distribute_tensor

    import commscope.flight as flight
    from commscope.mesh import init_device_mesh

    flight.enable(dump_prefix=prefix, watchdog=False, handle_signals=False,
                  dump_on_exception=False)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    mesh = init_device_mesh("cuda", (1, 1), mesh_dim_names=("dp", "tp"))
    backend = mesh.get_group("dp")._get_backend(torch.device("cuda")).name()
    dt = distribute_tensor(torch.arange(8.0, device="cuda"), mesh.to_torch()["tp"], [Shard(0)])
    full = dt.full_tensor()
    model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32)).cuda()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh.to_torch()["dp"])
    fully_shard(model, mesh=mesh.to_torch()["dp"])
    loss = model(torch.randn(4, 32, device="cuda")).sum()
    loss.backward()
    _settle()
    snap = flight.snapshot()
    return {
        "loss_finite": bool(torch.isfinite(loss).item()),
        "backend": backend,
        "full": full.cpu().tolist(),
        "device_type": mesh.device_type,
        "coords": mesh.get_coordinate(),
        "names": [e["profiling_name"] for e in snap["entries"]],
        "states": {e["state"] for e in snap["entries"]},
        "descs": sorted(v["desc"] for v in snap["pg_config"].values()),
    }


@pytest.mark.timeout(240)
def test_mesh_on_cuda_feeds_dtensor_and_fsdp2_and_is_recorded(tmp_path):
    env = {"MASTER_PORT": str(29500 + os.getpid() % 1000)}
    [res] = run_ranks(_mesh_on_cuda, 1, tmp_path, str(tmp_path / "fr_"), init=False,
                      env=env, timeout=200)
    assert res["backend"].lower() == "nccl"
    assert res["device_type"] == "cuda"
    assert list(res["coords"]) == [0, 0]
    assert res["full"] == [float(i) for i in range(8)]
    # distribute_tensor scatters; one rank's FSDP2 and full_tensor() need no collective
    assert "nccl:scatter" in res["names"], res["names"]
    assert res["loss_finite"]
    assert res["states"] == {"completed"}
    # a one-rank mesh's axes each span the whole world: they reuse the default group,
    # as torch's init_device_mesh does
    assert res["descs"] == ["default_pg"], res["descs"]


# --------------------------------------------------------------------------- split_group


def _split(rank, world_size, prefix):
    import torch
    import torch.distributed as dist

    import commscope.flight as flight

    _start(rank, world_size, dump_prefix=prefix, watchdog=False, handle_signals=False,
           dump_on_exception=False)
    part = dist.split_group(split_ranks=[[0]], group_desc="split_part")
    t = torch.ones(4, device="cuda")
    dist.all_reduce(t, group=part)
    _settle()
    snap = flight.snapshot()
    return [(e["process_group"][1], e["profiling_name"], e["state"]) for e in snap["entries"]]


@pytest.mark.timeout(240)
def test_split_group_is_recorded(tmp_path):
    [records] = run_ranks(_split, 1, tmp_path, str(tmp_path / "fr_"), init=False, timeout=200)
    assert ("split_part", "nccl:all_reduce", "completed") in records, records


# --------------------------------------------------------------------------- native dumps


def _native_dump(rank, world_size, out_dir):
    import torch
    import torch.distributed as dist

    os.environ["TORCH_FR_BUFFER_SIZE"] = "2000"
    torch.cuda.set_device(0)
    store = dist.FileStore(os.environ["COMMSCOPE_TEST_STORE"], world_size)
    dist.init_process_group("nccl", store=store, rank=rank, world_size=world_size,
                            device_id=torch.device("cuda", 0))
    t = torch.ones(256, device="cuda")
    dist.all_reduce(t)
    dist.broadcast(t, 0)
    torch.cuda.synchronize()
    torch.cuda._sleep(int(2e9))
    dist.all_reduce(t)  # still queued behind the sleep when the dump is taken
    data = torch._C._distributed_c10d._dump_nccl_trace()
    with open(os.path.join(out_dir, f"rank_{rank}"), "wb") as f:
        f.write(data)
    torch.cuda.synchronize()
    return len(data)


@pytest.mark.timeout(240)
def test_analyzer_reads_this_torch_native_nccl_dump(tmp_path):
    from commscope.analyze import analyze

    out = tmp_path / "native"
    out.mkdir()
    run_ranks(_native_dump, 1, tmp_path, str(out), init=False, timeout=200)
    assert glob.glob(str(out / "rank_*"))
    result = analyze(out)
    assert not result.unreadable, result.unreadable
    assert result.loaded == [0]
    dump = result.load.dumps[0]
    assert (dump.source, dump.backend) == ("pytorch", "nccl")
    assert dump.n_entries == 3
    # the last all_reduce was still queued on the device when the dump was taken
    assert [seq for _group, seq, _i in dump.pending] == [3], dump.pending
