"""A recorded job that ends with ``destroy_process_group`` ends, on every torch.

Before 2.8, torch destroys a process group while holding the GIL, and gloo's destructor
joins its worker threads; a worker still freeing a finished work whose tensor's Python
object died first needs that GIL, so the rank hangs for good. Measured on torch 2.7.1 with
2-rank jobs that issue one ``all_reduce`` of a temporary tensor and destroy the group:
torch alone hung 1 time in 12, with the recorder 7 in 12, with the recorder's wait
before the destroy (``let_workers_finish``) 0 in 12. Here two processes run that job 20
times in a row (without the wait, on 2.7.1, half of the runs of 6 jobs hung: one job in
ten), so the test fails with high odds on a torch that needs the wait and lacks it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from commscope import compat

pytestmark = [pytest.mark.dist, pytest.mark.timeout(180)]

REPO = Path(__file__).resolve().parents[2]
_JOBS = 20

_JOB = textwrap.dedent("""
    import os, sys
    from datetime import timedelta
    import torch
    import torch.distributed as dist
    import commscope.flight as flight

    rank, folder, JOBS = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    flight.enable(dump_prefix=os.path.join(folder, "rank_"), watch_interval_s=0)
    for job in range(JOBS):
        store = dist.FileStore(os.path.join(folder, f"store_{job}"), 2)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=2,
                                timeout=timedelta(seconds=30))
        dist.all_reduce(torch.ones(3, 4))  # a temporary: its Python object dies first
        print("rank", rank, "all_reduce done", flush=True)  # as a training script logs
        dist.destroy_process_group()
        print("ended", job, flush=True)
""")


def test_jobs_ending_in_destroy_process_group_end(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(_JOB)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO),
           "COMMSCOPE_SELFCHECK": "0"}
    procs = [subprocess.Popen([sys.executable, str(script), str(rank), str(tmp_path), str(_JOBS)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=env) for rank in range(2)]
    outputs = []
    try:
        for proc in procs:
            try:
                out, _ = proc.communicate(timeout=90)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
                out += "\n(hung: killed after 90 s)"
            outputs.append(out)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for rank, (proc, out) in enumerate(zip(procs, outputs, strict=True)):
        assert proc.returncode == 0 and out.count("ended") == _JOBS, f"rank {rank}:\n{out[-3000:]}"


def test_the_wait_is_spliced_in_exactly_where_torch_needs_it():
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    from commscope.flight.splice import install

    was = install.installed()
    install.install()
    try:
        patched = dist.destroy_process_group is install._patched_destroy_process_group
        assert patched is not compat.has("pg_destructor_releases_gil")
        assert (c10d.destroy_process_group is dist.destroy_process_group)
        assert dist.destroy_process_group.__name__ == "destroy_process_group"
    finally:
        if not was:
            install.uninstall()
    if not was:
        assert dist.destroy_process_group is not install._patched_destroy_process_group
