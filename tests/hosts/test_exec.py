"""A job launched srun-style with ``commscope exec``: 2 simulated hosts x 2 ranks, gloo.

No torchrun: each host starts its two ranks as ``slurmstepd`` would, with Slurm's
variables only (``tests/hosts/srun.py``). Rank 3 (on hostB) stalls in its data loader at
step 3; the recorder's 2 s timeout makes every rank on both hosts dump. One job serves
every assertion: the dumps and their places, the merged analysis, and ``commscope
watch`` typed on hostB.
"""

from __future__ import annotations

import json
import pickle
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from commscope.cli import main
from commscope.exitcodes import for_verdict
from tests.hosts.cluster import Cluster
from tests.hosts.job import TRACES, MultiHostJob
from tests.hosts.srun import start_srun_job

pytestmark = [pytest.mark.dist, pytest.mark.slow, pytest.mark.timeout(150)]

CULPRIT = 3


@dataclass
class Hung:
    """The hung job (still running), its cluster, the dumps copied out, and hostB's
    ``commscope watch --once --json``."""

    cluster: Cluster
    job: MultiHostJob
    merged: Path
    watch: dict
    seconds: float


@pytest.fixture(scope="module")
def hung(tmp_path_factory):
    root = tmp_path_factory.mktemp("exec")
    start = time.monotonic()
    with Cluster(2, root / "hosts") as cluster:
        job = start_srun_job(cluster, "hosts_job.py", ntasks_per_node=2, timeout_s=100,
                             env={"COMMSCOPE_FR_TIMEOUT_S": "2", "STALL_RANK": str(CULPRIT),
                                  "STALL_STEP": "3"})
        try:
            job.wait_for(lambda: all(len(job.dumps(h)) == 2 for h in cluster), 80,
                         "2 dumps on each host")
            merged = job.collect(root / "merged", merged=True)
            proc = cluster["hostB"].run(
                [sys.executable, "-m", "commscope", "watch", "--once", "--json"], timeout=60,
                env={"PYTHONPATH": str(Path(__file__).resolve().parents[2])})
            assert proc.returncode == 0, (proc.stderr, job.story())
            watch = json.loads(proc.stdout)
            yield Hung(cluster, job, merged, watch, time.monotonic() - start)
        finally:
            job.stop()


def _dump(path: Path) -> dict:
    with open(path, "rb") as f:
        return pickle.load(f)


def test_every_rank_dumps_on_its_own_host_with_its_slurm_place(hung):
    for node, host in enumerate(hung.cluster):
        mine = [node * 2, node * 2 + 1]
        assert hung.job.dumps(host) == [f"rank_{r}" for r in mine]
        for local, rank in enumerate(mine):
            dump = _dump(hung.merged / f"rank_{rank}")
            assert dump["world_size"] == 4 and dump["hostname"] == host.name
            place = dump["commscope_place"]
            assert (place["launcher"], place["host"], place["node_rank"],
                    place["local_rank"]) == ("slurm", host.name, node, local), place
            assert place["dump_dir"] == TRACES
    # the job's host table reached every rank (gathered through the store rank 0 serves)
    table = _dump(hung.merged / "rank_2").get("commscope_hosts")
    assert table and "hostA" in json.dumps(table) and "hostB" in json.dumps(table), table


def test_rank_0_printed_the_banner_once_and_every_host_has_its_watch_file(hung):
    log = hung.job.log("hostA") + hung.job.log("hostB")
    assert log.count("commscope: recording every collective of 4 ranks") == 1, log
    infos = [json.loads(h.read_text(f"{TRACES}/watch.json")) for h in hung.cluster]
    assert [i["host"] for i in infos] == ["hostA", "hostB"]
    assert [i["rank"] for i in infos] == [0, 2]  # each host's first local rank
    assert infos[0]["token"] == infos[1]["token"]  # one token, agreed through the store
    assert all(i["store"].endswith(hung.job.endpoint.split(":")[1]) for i in infos), infos


def test_the_merged_analysis_names_the_rank_on_the_other_host(hung, capsys):
    assert main(["analyze", str(hung.merged), "--json"]) == for_verdict("hang")
    result = json.loads(capsys.readouterr().out)
    assert result["verdict"] == "hang"
    assert result["ranks"]["loaded"] == [0, 1, 2, 3]
    root = result["findings"][0]
    assert (root["kind"], root["culprit_ranks"]) == ("missing_rank", [CULPRIT]), root
    assert "load_batch" in root["message"]


def test_watch_typed_on_hostb_sees_every_rank_of_both_hosts(hung):
    watch = hung.watch
    assert watch["world_size"] == 4 and watch["missing"] == [], watch
    assert [row["rank"] for row in watch["ranks"]] == [0, 1, 2, 3]
    print(f"srun-style job: {hung.seconds:.1f} s from the cluster's start to watch's answer")
