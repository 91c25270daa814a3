"""One job started as Slurm's ``srun`` starts one: ``commscope exec`` per rank, no torchrun.

On every host a shell plays ``slurmstepd``: it starts that host's tasks, each
``python -m commscope exec SCRIPT`` in ``/tmp/job`` with the variables ``srun`` gives a
task (``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NODEID``, ``SLURM_NTASKS``,
``SLURM_STEP_ID``, ``SLURM_TASKS_PER_NODE``, ``SLURM_JOB_NODELIST``, ``SLURM_JOB_ID``) and
none of torch's: ``commscope exec`` derives ``RANK`` ... ``MASTER_PORT`` from them
(``MASTER_ADDR``: the first host of the nodelist, ``hostA``; ``MASTER_PORT``: from the
job id, which is picked so that port is free). The job is a
:class:`tests.hosts.job.MultiHostJob` whose launcher on each host is that shell.
"""

from __future__ import annotations

import random
import shlex
import socket
import subprocess
import sys
from collections.abc import Mapping

from commscope.flight.launcher_env import slurm_port
from tests.hosts.cluster import Cluster
from tests.hosts.job import MultiHostJob
from tests.jobs.launch import REPO

__all__ = ["free_job_id", "start_srun_job"]


def free_job_id() -> str:
    """A Slurm job id whose ``MASTER_PORT`` (``commscope exec``'s rule) is free now."""
    for _ in range(200):
        job_id = str(random.randrange(10**6, 10**7))
        with socket.socket() as s:
            try:
                s.bind(("", slurm_port(job_id)))
            except OSError:
                continue
        return job_id
    raise RuntimeError("no free port in 15000-24999 for a simulated Slurm job")


def start_srun_job(cluster: Cluster, script: str, *, ntasks_per_node: int = 2,
                   env: Mapping[str, str] | None = None, timeout_s: float = 120,
                   ) -> MultiHostJob:
    """Start ``tests/jobs/<script>`` on every host of ``cluster`` as ``srun
    --ntasks-per-node K commscope exec SCRIPT`` would (see module doc)."""
    names = [h.name for h in cluster]
    path = REPO / "tests" / "jobs" / script
    job_id = free_job_id()
    base = {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "COMMSCOPE_NO_RICH": "1",
            "SLURM_JOB_ID": job_id, "SLURM_STEP_ID": "0",
            "SLURM_JOB_NODELIST": ",".join(names),
            "SLURM_NTASKS": str(ntasks_per_node * len(names)),
            "SLURM_TASKS_PER_NODE": f"{ntasks_per_node}(x{len(names)})", **(env or {})}
    launchers: dict[str, subprocess.Popen] = {}
    try:
        for node, host in enumerate(cluster):
            tasks = [
                f"env SLURM_PROCID={node * ntasks_per_node + local} SLURM_LOCALID={local} "
                f"{shlex.quote(sys.executable)} -m commscope exec {shlex.quote(str(path))} &"
                for local in range(ntasks_per_node)]
            with open(cluster.root / f"{host.name}.job.log", "wb") as log:
                launchers[host.name] = host.popen(
                    ["sh", "-c", " ".join([*tasks, "wait"])],
                    env={**base, "SLURM_NODEID": str(node)},
                    stdout=log, stderr=subprocess.STDOUT)
    except BaseException:
        for name, proc in launchers.items():
            cluster[name].end(proc)
        raise
    endpoint = f"{names[0]}:{slurm_port(job_id)}"
    return MultiHostJob(cluster, launchers, endpoint, timeout_s)
