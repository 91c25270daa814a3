"""A job that hangs: rank 1 "forgets" one all_reduce (the Flight Recorder tutorial's case).

Run it with nothing but the tutorial's environment variables and `commscope run`:

    TORCH_NCCL_TRACE_BUFFER_SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=true \
        commscope run --standalone --nproc-per-node 2 examples/tutorial_flight_recorder_hang.py
    commscope analyze -d commscope_traces -o analysis.txt

The job's own timeout (init_process_group's) is what the recorder waits for.
"""

import time
from datetime import timedelta

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=timedelta(seconds=4))
rank = dist.get_rank()
x = torch.ones(1024)
for _step in range(3):
    dist.all_reduce(x)
if rank != 1:  # rank 1 skips the fourth all_reduce
    dist.all_reduce(x)
time.sleep(60)
