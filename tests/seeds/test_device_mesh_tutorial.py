"""The DeviceMesh tutorial (seeds/004) runs against commscope: 2-D set-up and HSDP.

The example scripts in examples/ are what the README shows; here they run on 8 real
gloo ranks (forked; the same scripts also run under torchrun).
"""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

from tests.needs import torch_has

pytestmark = pytest.mark.dist

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _run_script(rank, world, name):
    import torch.distributed as dist

    g = runpy.run_path(str(EXAMPLES / name), run_name="__main__")
    if name == "tutorial_device_mesh_2d.py":
        mesh = g["device_mesh"]
        return {
            "shard": dist.get_process_group_ranks(g["current_shard_group"]),
            "replicate": dist.get_process_group_ranks(g["current_replicate_group"]),
            "mesh_shard": dist.get_process_group_ranks(mesh.get_group(1)),
            "mesh_replicate": dist.get_process_group_ranks(mesh.get_group(0)),
        }
    import torch

    torch.manual_seed(0)
    initial = [p.detach().clone() for p in g["ToyModel"]().parameters()]
    return {
        "fsdp1_loss": g["loss"].item(),
        "fsdp2_loss": g["loss2"].item(),
        "placements": [str(p.placements) for p in g["model2"].parameters()],
        "full": [p.full_tensor().tolist() for p in g["model2"].parameters()],
        "moved": [
            not torch.equal(p.full_tensor(), q) for p, q in zip(g["model2"].parameters(), initial)
        ],
    }


def test_two_d_setup_gives_the_tutorials_groups(ranks):
    results = ranks(_run_script, 8, "tutorial_device_mesh_2d.py", timeout=90)
    for rank, out in enumerate(results):
        expected_shard = [0, 1, 2, 3] if rank < 4 else [4, 5, 6, 7]
        expected_replicate = [rank % 4, rank % 4 + 4]
        assert out["shard"] == out["mesh_shard"] == expected_shard
        assert out["replicate"] == out["mesh_replicate"] == expected_replicate


@torch_has("fsdp2_on_cpu")
def test_hsdp_example_trains_a_step_with_fsdp1_and_fsdp2(ranks):
    results = ranks(_run_script, 8, "tutorial_hsdp.py", timeout=120)
    for out in results:
        assert all(p == "(Replicate(), Shard(dim=0))" for p in out["placements"])
        assert all(out["moved"])  # the optimizer step changed every parameter
        # every replica holds the same model after the step, and saw the same loss
        assert out["full"] == results[0]["full"]
        assert out["fsdp1_loss"] == pytest.approx(results[0]["fsdp1_loss"])
        assert out["fsdp2_loss"] == pytest.approx(results[0]["fsdp2_loss"])
