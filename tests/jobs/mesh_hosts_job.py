"""``tests/jobs/hosts_job.py`` with a 2-D mesh first, for uneven simulated hosts.

Every rank makes ``commscope.mesh.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp",
"tp"))`` (the ranks' real hostnames, gathered through the job's store) and writes the
mesh's picture (``describe()``) to ``mesh.<rank>.txt`` in its working folder (its own
host's ``/tmp/job``). Then it trains as ``hosts_job.py`` does (one all_reduce a step on
the default group, one on its tp group), and rank ``STALL_RANK`` stalls in ``load_batch``
once ``STALL_FILE`` exists.
"""

import os
import time

import torch.distributed as dist

import commscope.flight as flight
from commscope.mesh import init_device_mesh
from tests.jobs.hosts_job import _die_with_parent, load_batch


def main() -> None:
    _die_with_parent()
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    rank = dist.get_rank()
    with open(f"mesh.{rank}.txt.tmp", "w") as f:  # whole or not at all: the test polls
        f.write(mesh.describe())
    os.replace(f"mesh.{rank}.txt.tmp", f"mesh.{rank}.txt")
    tp = mesh.get_group("tp")
    for step in range(1_000_000):
        flight.step(step)
        batch = load_batch(step)
        dist.all_reduce(batch)
        dist.all_reduce(batch, group=tp)
        time.sleep(0.05)


if __name__ == "__main__":
    main()
