"""The Flight Recorder tutorial's on-demand dump, with commscope (any number of ranks).

commscope run --standalone --nproc-per-node 2 examples/tutorial_flight_recorder_on_demand.py
"""

import pickle

import torch
import torch.distributed as dist

import commscope.flight

dist.init_process_group("gloo")
dist.all_reduce(torch.ones(3, 4))

# the tutorial: torch._C._distributed_c10d._dump_nccl_trace(includeCollectives=True,
#                                   includeStackTraces=True, onlyActive=False)
t = pickle.loads(
    commscope.flight.dump_trace(
        include_collectives=True, include_stack_traces=True, only_active=False
    )
)
last = t["entries"][-1]["profiling_name"]
print(f"{t['version']} rank {dist.get_rank()}: {list(t['pg_config'])} {t['pg_status']} {last}")
dist.destroy_process_group()
