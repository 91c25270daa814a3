"""commscope.mesh in a few lines (8 ranks).

commscope run --standalone --nproc-per-node 8 examples/quickstart_mesh.py
"""

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

from commscope.mesh import init_device_mesh

mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
if dist.get_rank() == 0:
    print(mesh)  # DeviceMesh(dp=2, tp=4, device='cpu')
    print(mesh.describe())  # the grid of ranks and hosts, and which axes cross hosts
coordinate = mesh.get_coordinate()  # (1, 1) on rank 5: the last axis holds consecutive ranks
dp_ranks = mesh.group_ranks("dp")  # [1, 5] on rank 5
tp_group = mesh.get_group("tp")  # this rank's torch ProcessGroup, described "mesh_tp"
dp_mesh = mesh["dp"]  # a 1-D view: slicing creates no group
world = mesh.flatten("world")  # a public flatten (over the whole world: the default group)
again = world.unflatten("world", (2, 4), ("dp", "tp"))  # back to 2-D: reuses the dp, tp groups

model = fully_shard(torch.nn.Linear(16, 16), mesh=dp_mesh)  # FSDP2 takes our mesh as it is
