"""Hosts whose clocks are off (0.3 s, 10 s, 60 s behind) make up no silent, crashed,
stuck or straggling rank: one job on 4 simulated hosts of one gloo rank each, hostB's
clock 0.3 s behind, hostC's 10 s, hostD's 60 s (their processes run under libfaketime;
hostA's clock is the machine's).

While the job runs, ``commscope watch --once`` typed on hostA and on hostD sees every rank
moving, and the dumps it is asked for are healthy with no straggler; then rank 3 (on
hostD, a minute behind) stalls, every rank dumps on the recorder's timeout, and the merged
folder is a hang of rank 3, not a crash of the host whose dumps look a minute old.
"""

from __future__ import annotations

import json
import sys

import pytest

from commscope.cli import main
from commscope.exitcodes import for_verdict
from tests.hosts.cluster import Cluster, Host
from tests.hosts.job import TRACES, start_job

pytestmark = [pytest.mark.dist, pytest.mark.slow, pytest.mark.timeout(240)]

def _libfaketime() -> str | None:
    """Debian's libfaketime (package faketime), preloaded directly: the ``faketime``
    wrapper's named semaphore is keyed by pid, and pids repeat across the simulated
    hosts' pid namespaces."""
    import glob

    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    return found[0] if found else None


LIBFAKETIME = _libfaketime()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if LIBFAKETIME is None:
        pytest.skip("libfaketime is not installed (apt-get install faketime; make test does)")
    with Cluster(4, tmp_path_factory.mktemp("clocks") / "hosts") as c:
        yield c


def _watch(host: Host) -> dict | None:
    """``commscope watch --once --json`` typed on ``host`` (None until it answers)."""
    proc = host.run([sys.executable, "-m", "commscope", "watch", "--once", "--json"],
                    timeout=60)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def _stepping(snap: dict | None) -> dict | None:
    """The snapshot once every rank is past its start (init can stall a second or two
    on two busy cores, which the live view rightly calls stuck)."""
    if snap is None or len(snap["ranks"]) != 4:  # one rank a host
        return None
    return snap if all((row["step"] or 0) >= 2 for row in snap["ranks"]) else None


def _analyze(folder, capsys) -> dict:
    code = main(["analyze", str(folder), "--json"])
    result = json.loads(capsys.readouterr().out)
    assert code == for_verdict(result["verdict"])  # the exit status says the verdict
    return result


BEHIND_S = {"hostB": 0.3, "hostC": 10, "hostD": 60}


def test_hosts_clocks_off_make_up_no_silent_stuck_crashed_or_straggling_rank(
        cluster, tmp_path, capsys):
    env = {"COMMSCOPE_FR_TIMEOUT_S": "8",  # past a slow start on two busy cores
           "COMMSCOPE_WATCH_INTERVAL_S": "0.5",
           "STALL_RANK": "3", "STALL_FILE": "stall"}
    skewed = {host: {"LD_PRELOAD": str(LIBFAKETIME), "FAKETIME": f"-{s}s"}
              for host, s in BEHIND_S.items()}
    # libfaketime shifts the monotonic clock too (by a constant: harmless); keeping it
    # real (FAKETIME_DONT_FAKE_MONOTONIC) makes its sleep calls fail with EINVAL.
    # torchrun's c10d rendezvous reads its heartbeats on the wall clock and leaves out a
    # host more than ~15 s behind (torch's own limit, not ours): the static one then
    job = start_job(cluster, "hosts_job.py", nproc=1, env=env, timeout_s=150,
                    host_env=skewed, static=True)
    try:
        job.wait_for(lambda: all(h.exists(f"{TRACES}/watch.json") for h in cluster), 60,
                     "every host's watch file")
        # the job runs: seen from the reference host and the farthest one, nobody is
        # silent or stuck
        for host in (cluster["hostA"], cluster["hostD"]):
            snap = job.wait_for(lambda h=host: _stepping(_watch(h)), 60,
                                f"4 ranks stepping, seen from {host}")
            assert snap["state"] in ("healthy", "behind"), (host, snap["headline"])
            assert snap["silent"] == [] and snap["stuck_s"] is None, snap
            assert max(row["age_s"] for row in snap["ranks"]) < 5, snap["ranks"]
        # a dump of the running job: healthy, and nobody arrives last by an offset
        asked = cluster["hostA"].run([sys.executable, "-m", "commscope", "dump",
                                      "--wait-s", "30"], timeout=90)
        assert asked.returncode == 0, asked.stderr
        live = asked.stdout.split("live verdict (every rank's record, all hosts): ", 1)[1]
        assert live.startswith(("HEALTHY", "BEHIND")), asked.stdout  # moving, nobody silent
        running = _analyze(job.collect(tmp_path / "running", merged=True), capsys)
        assert running["verdict"] == "healthy", running["findings"]
        # now rank 3 stalls: every rank dumps on the timeout, each on its own host's clock
        cluster["hostD"].write_text("/tmp/job/stall", "now")
        job.wait_for(lambda: _incident(cluster), 60, "the incident dumps")
        hung = _analyze(job.collect(tmp_path / "hung", merged=True), capsys)
    finally:
        job.stop()
    kinds = [f["kind"] for f in hung["findings"]]
    assert hung["verdict"] == "hang" and "crashed_rank" not in kinds, kinds
    assert (hung["findings"][0]["kind"], hung["findings"][0]["culprit_ranks"]) == (
        "missing_rank", [3]), hung["findings"][0]
    assert "straggler" not in kinds and "before the others" not in json.dumps(hung["findings"])


def _incident(cluster: Cluster) -> bool:
    """Every rank's file is the incident's (a timeout or another rank's request), not
    the earlier dump on request."""
    import pickle

    for host in cluster:
        paths = list(host.path(TRACES).glob("rank_*"))
        if len(paths) != 1:  # one rank a host
            return False
        for path in paths:
            try:
                with open(path, "rb") as f:
                    reason = pickle.load(f)["dump_reason"]  # our own test dump
            except (OSError, EOFError, pickle.UnpicklingError):
                return False
            if reason == "request from commscope dump":
                return False
    return True
