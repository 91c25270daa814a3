"""The DeviceMesh tutorial's HSDP example, both ways the ecosystem offers (8 ranks).

torchrun --nproc-per-node 8 examples/tutorial_hsdp.py
"""

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import ShardingStrategy, fully_shard

from commscope.mesh import init_device_mesh  # the tutorial: torch.distributed.device_mesh


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


if not dist.is_initialized():
    dist.init_process_group("gloo")
torch.manual_seed(0)  # same initial weights and data on every rank

# HSDP: MeshShape(2, 4)
mesh_2d = init_device_mesh("cpu", (2, 4))

# FSDP1, as in the tutorial (on CPU, FSDP1 needs device_id=torch.device("cpu")).
model = FSDP(
    ToyModel(),
    device_mesh=mesh_2d,
    sharding_strategy=ShardingStrategy.HYBRID_SHARD,
    device_id=torch.device("cpu"),
)
loss = model(torch.randn(4, 10)).sum()
loss.backward()
torch.optim.SGD(model.parameters(), lr=0.01).step()

# FSDP2: fully_shard on a 2-D mesh is HSDP (replicate over dim 0, shard over dim 1). It
# needs the axes named (torch's FSDP2 refuses an unnamed 2-D mesh, whichever mesh it is).
hsdp_mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("replicate", "shard"))
model2 = ToyModel()
fully_shard(model2, mesh=hsdp_mesh)
loss2 = model2(torch.randn(4, 10)).sum()
loss2.backward()
torch.optim.SGD(model2.parameters(), lr=0.01).step()

print(f"rank {dist.get_rank()}: HSDP steps done, loss {loss.item():.4f} / {loss2.item():.4f}")
