"""The DeviceMesh tutorial's 2-D set-up, by hand and with commscope (8 ranks).

torchrun --nproc-per-node 8 examples/tutorial_device_mesh_2d.py
"""

import os

import torch.distributed as dist

# --- the tutorial's hand-made groups (CPU in place of CUDA: 8 ranks, 2 "hosts" of 4) ---
rank = int(os.environ["RANK"])
world_size = int(os.environ["WORLD_SIZE"])
if not dist.is_initialized():
    dist.init_process_group("gloo")
num_node_devices = world_size
shard_rank_lists = (
    list(range(0, num_node_devices // 2)),
    list(range(num_node_devices // 2, num_node_devices)),
)
shard_groups = (dist.new_group(shard_rank_lists[0]), dist.new_group(shard_rank_lists[1]))
current_shard_group = shard_groups[0] if rank in shard_rank_lists[0] else shard_groups[1]
current_replicate_group = None
shard_factor = len(shard_rank_lists[0])
for i in range(num_node_devices // 2):
    replicate_group_ranks = list(range(i, num_node_devices, shard_factor))
    replicate_group = dist.new_group(replicate_group_ranks)
    if rank in replicate_group_ranks:
        current_replicate_group = replicate_group

# --- the same in two lines -------------------------------------------------------------
from commscope.mesh import init_device_mesh

device_mesh = init_device_mesh("cpu", (2, 4))

# Both give the same groups: shard = dim 1, replicate = dim 0.
ranks_of = dist.get_process_group_ranks
assert ranks_of(device_mesh.get_group(1)) == ranks_of(current_shard_group)
assert ranks_of(device_mesh.get_group(0)) == ranks_of(current_replicate_group)
print(
    f"rank {rank}: shard {ranks_of(device_mesh.get_group(1))}, "
    f"replicate {ranks_of(device_mesh.get_group(0))}"
)
