"""Stragglers across hosts (issue 33 item 2): a short job on 2 simulated hosts of 2 gloo
ranks each (``tests/jobs/straggler_job.py``), hostB's clock 0.3 s or 10 s behind
(libfaketime, as in ``test_clocks.py``), the dumps of both hosts merged and analyzed.

* both ranks of hostB slow: one finding names hostB (ranks 2, 3) as a whole, and the
  slowest section's host row is marked;
* rank 3 slow (on the second host): that rank, not its host;
* nobody slow: no straggler at all, though hostB's times are 0.3 s or 10 s off (a
  clock left uncorrected would make hostA's ranks arrive last by that much).
"""

from __future__ import annotations

import json
import re
import shutil

import pytest

from commscope.cli import main
from commscope.exitcodes import for_verdict
from tests.hosts.cluster import Cluster
from tests.hosts.job import TRACES, start_job
from tests.hosts.test_clocks import LIBFAKETIME

pytestmark = [pytest.mark.dist, pytest.mark.slow, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if LIBFAKETIME is None:
        pytest.skip("libfaketime is not installed (apt-get install faketime; make test does)")
    with Cluster(2, tmp_path_factory.mktemp("stragglers") / "hosts") as c:
        yield c


def _run(cluster: Cluster, tmp_path, capsys, slow: list[int], behind_s: float,
         text: bool = False) -> dict:
    """Run the job with ``slow`` ranks and hostB ``behind_s`` seconds behind; return
    ``commscope analyze --json`` of every host's dumps, merged (with ``text``, the text
    report too, under ``"text"``)."""
    for host in cluster:
        shutil.rmtree(host.path(TRACES), ignore_errors=True)  # the previous case's
    skew = {"hostB": {"LD_PRELOAD": str(LIBFAKETIME), "FAKETIME": f"-{behind_s}s"}}
    job = start_job(cluster, "straggler_job.py", nproc=2, static=True, timeout_s=90,
                    env={"SLOW_RANKS": ",".join(map(str, slow)), "STEPS": "40",
                         "COMMSCOPE_FR_TIMEOUT_S": "30"},
                    host_env=skew)
    try:
        job.wait_for(lambda: [len(job.dumps(h)) for h in job.hosts] == [2, 2], 75,
                     "every rank's dump")
    finally:
        job.stop()
    folder = job.collect(tmp_path / "dumps", merged=True)
    code = main(["analyze", str(folder), "--json"])
    result = json.loads(capsys.readouterr().out)
    assert code == for_verdict(result["verdict"])  # the exit status says the verdict
    if text:
        assert main(["analyze", str(folder)]) == code
        result["text"] = " ".join(capsys.readouterr().out.split())
    return result


def _stragglers(result: dict) -> list[list[int]]:
    return [f["culprit_ranks"] for f in result["findings"] if f["kind"] == "straggler"]


@pytest.mark.parametrize("slow, behind_s, named, host", [
    ([2, 3], 10, [[2, 3]], "hostB"),  # a slow host, its clock 10 s behind
    ([3], 0.3, [[3]], None),  # a slow rank on the second host, its clock 0.3 s behind
    ([], 0.3, [], None),  # nobody slow: an offset makes up no straggler
    ([], 10, [], None),
], ids=["slow-host-10s", "slow-rank3-0.3s", "none-0.3s", "none-10s"])
def test_stragglers_across_hosts_on_one_clock(cluster, tmp_path, capsys, slow, behind_s,
                                              named, host):
    result = _run(cluster, tmp_path, capsys, slow, behind_s, text=True)
    story = json.dumps({"findings": [f["message"] for f in result["findings"]],
                        "slowest": result["slowest"]}, indent=1)
    assert result["verdict"] == "healthy", story
    assert [h["host"] for h in result["hosts"]] == ["hostA", "hostB"], story
    assert _stragglers(result) == named, story
    world = next(row for row in result["slowest"] if row["group"] == "default_pg")
    slow_hosts = [h["host"] for h in world["hosts"] if h["straggler"]]
    assert slow_hosts == ([host] if host else []), story
    if host is not None:  # the ranks of a slow host are not named one by one
        assert not any(x["straggler"] for x in world["ranks"]), story
        finding = next(f for f in result["findings"] if f["kind"] == "straggler")
        assert finding["message"].startswith("Host hostB (ranks 2, 3)"), story
        assert "on rank 0's clock" in finding["message"], story
        assert re.search(r"hostB \(ranks 2, 3\) arrives last in (9\d|100) % of the 41 timed "
                         r"collectives \(all_reduce, barrier\) of default_pg, median lag \d+ ms",
                         result["text"]), result["text"]
        assert "(slow host)" in result["text"], result["text"]
    elif named:
        assert [x["rank"] for x in world["ranks"] if x["straggler"]] == named[0], story
    else:  # the lags stay those of ordinary jitter, far below the offset
        assert all(x["lag_median_ms"] < 100 for x in world["ranks"]), story
        assert "slowest ranks" not in result["text"], result["text"]
