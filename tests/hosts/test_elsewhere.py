"""One host's folder after a fault (issue 37 item 3e), on simulated hosts with real gloo
jobs (``tests/jobs/fault_hosts_job.py``, 2 hosts x 2 ranks).

Rank 1 (hostA) fails: it raises (a bad batch), or gloo aborts it inside a broadcast (it
posted too small a buffer). The other ranks' next collective fails ("Connection closed
by peer") and they raise; torchrun stops the job, and each rank dumps on its own host's
disk (the aborted rank leaves its fatal log there). ``commscope analyze`` of hostA's
folder alone must tell hostB's ranks as ``dumps_elsewhere`` (their files are on hostB),
never as crashed: the death that explains the failed work is here, and hostB's ranks
went down with the job and dumped there. With both hosts' folders, the root cause is
rank 1's and no rank is elsewhere. (A fault on hostB seen from hostA's folder alone
looks like hostB dying, as ``test_host_failures.py`` has it, unless a dump here was
asked for by a rank of hostB.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from commscope.cli import main
from commscope.exitcodes import for_verdict
from tests.hosts.cluster import Cluster, wait_until
from tests.hosts.job import TRACES, MultiHostJob, start_job

pytestmark = [pytest.mark.dist, pytest.mark.slow, pytest.mark.timeout(240)]

ENV = {"COMMSCOPE_FR_TIMEOUT_S": "8", "COMMSCOPE_WATCH_INTERVAL_S": "0.5"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with Cluster(2, tmp_path_factory.mktemp("elsewhere") / "hosts") as c:
        yield c


def _run(cluster: Cluster, fault: str, rank: int, tmp_path: Path) -> tuple[Path, Path]:
    """Run the job with ``fault`` on ``rank`` until every rank left its dump (an aborted
    rank, its fatal log) on its own host; hostA's and hostB's folders, copied out."""
    for host in cluster:
        host.run(["rm", "-rf", TRACES], check=True)
    job: MultiHostJob = start_job(cluster, "fault_hosts_job.py", nproc=2, timeout_s=150,
                                  env={**ENV, "FAULT": fault, "FAULT_RANK": str(rank)})
    hosts = {0: cluster["hostA"], 1: cluster["hostA"], 2: cluster["hostB"],
             3: cluster["hostB"]}

    def left(r: int) -> bool:
        if fault == "abort" and r == rank:
            return hosts[r].exists(f"{TRACES}/.commscope-fatal-{r}.log")
        return f"rank_{r}" in job.dumps(hosts[r])

    try:
        # the launchers end with the job: wait_until, which does not stop on that
        wait_until(lambda: all(left(r) for r in hosts), 120,
                   f"the dumps after rank {rank}'s {fault}", story=job.story)
    finally:
        job.stop()
    return (cluster["hostA"].copy_out(TRACES, tmp_path / "hostA"),
            cluster["hostB"].copy_out(TRACES, tmp_path / "hostB"))


def _analyze(capsys, *folders: Path) -> dict:
    code = main(["analyze", *map(str, folders), "--json"])
    result = json.loads(capsys.readouterr().out)
    assert code == for_verdict(result["verdict"])
    return result


def _story(result: dict) -> str:
    return "\n".join(f"[{f['kind']}] {f['culprit_ranks']}: {f['message']}"
                     for f in result["findings"])


def _no_crash_on_hostB(result: dict) -> None:
    story = _story(result)
    for f in result["findings"]:
        assert not (f["kind"] == "crashed_rank" and {2, 3} & set(f["culprit_ranks"])), story
    assert "hostB" not in result["exclude_hosts"], (result["exclude_hosts"], story)


@pytest.mark.parametrize("rank", [1])
@pytest.mark.parametrize("fault", ["raise", "abort"])
def test_one_hosts_folder_tells_the_other_hosts_ranks_elsewhere(cluster, tmp_path, capsys,
                                                                 fault, rank):
    folder_a, folder_b = _run(cluster, fault, rank, tmp_path)
    alone = _analyze(capsys, folder_a)
    story = _story(alone)
    _no_crash_on_hostB(alone)
    elsewhere = [f for f in alone["findings"] if f["kind"] == "dumps_elsewhere"]
    assert len(elsewhere) == 1, story
    assert elsewhere[0]["message"].startswith("Ranks 2, 3 ran on hostB, and no dump of hostB "
                                              "is here"), story
    if rank == 1:  # the death here comes first
        root = alone["findings"][0]
        assert 1 in root["culprit_ranks"] + root["victims"], story
        if fault == "raise":
            assert (root["kind"], root["culprit_ranks"]) == ("crashed_rank", [1]), story
            assert "ValueError" in root["message"] and "bad batch" in root["message"], story
    both = _analyze(capsys, folder_a, folder_b)
    story = _story(both)
    assert "dumps_elsewhere" not in [f["kind"] for f in both["findings"]], story
    root = both["findings"][0]
    if fault == "raise":
        assert (root["kind"], root["culprit_ranks"]) == ("crashed_rank", [rank]), story
    else:  # the other three agree on the broadcast: the rank that died disagreed
        assert (root["kind"], root["culprit_ranks"]) == ("size_mismatch", [rank]), story
    assert both["verdict"] == "crash", story
