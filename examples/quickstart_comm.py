"""Which collectives does each module issue? CommDebugMode (4 ranks).

OMP_NUM_THREADS=1 commscope run --standalone --nproc-per-node 4 examples/quickstart_comm.py
commscope view comm_rank0.json --open
"""

import torch.distributed as dist

from commscope.comm import CommDebugMode
from commscope.comm.examples import mlp_input, tp_mlp
from commscope.mesh import init_device_mesh

mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
model = tp_mlp(mesh)  # the tutorial's MLPModule: net1 colwise, net2 rowwise
inp = mlp_input()
with CommDebugMode(bandwidth_gbps=100) as comm_mode:
    output = model(inp)
    output.sum().backward()
if dist.get_rank() == 0:
    print(comm_mode.generate_comm_debug_tracing_table(noise_level=0))
    print(comm_mode.summary())  # by collective and mesh axis: calls, bytes, estimated time
comm_mode.generate_json_dump("comm_rank{rank}.json", noise_level=2)
