"""The CommDebugMode tutorial's calls, with commscope (4 ranks, CPU).

OMP_NUM_THREADS=1 commscope run --standalone --nproc-per-node 4 examples/tutorial_comm_debug_mode.py
commscope view comm_mode_log.json        # then open comm_mode_log.html in a browser
"""

import torch.distributed as dist

from commscope.comm import CommDebugMode  # the tutorial: torch.distributed.tensor.debug
from commscope.comm.examples import mlp_input, tp_mlp, tp_transformer, transformer_input
from commscope.mesh import init_device_mesh

if not dist.is_initialized():
    dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))

# The model used in this example is a MLPModule applying Tensor Parallel
model, inp = tp_mlp(mesh), mlp_input()
comm_mode = CommDebugMode()
with comm_mode:
    output = model(inp)

# print the operation level collective tracing information
print(comm_mode.generate_comm_debug_tracing_table(noise_level=0))

# The same calls on a small tensor-parallel Transformer
model, inp = tp_transformer(mesh), transformer_input()
comm_mode = CommDebugMode()
with comm_mode:
    output = model(inp)

# log the operation level collective tracing information to a file
comm_mode.log_comm_debug_tracing_table_to_file(
    noise_level=1, file_name="transformer_operation_log.txt"
)

# dump the operation level collective tracing information to json file,
# used in the visual browser below
comm_mode.generate_json_dump(noise_level=2)
