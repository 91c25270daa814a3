"""First dump -> the whole-job verdict in the job's own log, on simulated hosts (issue 31, 12).

``--hosts`` simulated hosts (default 8; tests/hosts/: each its own hostname, /tmp and PID
namespace, loopback networking) run one gloo job, one ``commscope run`` per host with c10d
rendezvous, **one rank per host**: on a 2-core box, 8 ranks plus 8 torchrun agents, 8
launchers and 8 reporters already fill both cores. The job trains (publishing every 2 s,
the default) until the bench makes the last host's rank stall in its data loader; the
recorder's timeout (``--timeout-s``, 10 s: a shorter one can fire in a slow
``init_process_group`` on two busy cores) then makes every rank dump on its own host's
disk, and ``commscope run``'s reporter on hostA (rank 0's host) prints the whole-job
verdict from every rank's live record. The rank stalls ``--train-s`` (5 s) after every
rank passed step 5, as a hang in a running job comes. (A reporter attaches once its
host's watch file is there; eight of them importing torch at once on two busy cores take
seconds, so an incident in the job's first seconds is reported once they have attached:
bench/RESULTS.md has one such figure.)
Measured per round, on one clock (the hosts share this machine's):

  verdict:   first dump (the earliest ``dump_time_ns`` of the dumps) -> the line
             ``live verdict (every rank's record, all hosts)`` in hostA's log (the log
             polled every 10 ms from outside)
  dumps:     first dump -> last dump
  hosts:     first dump -> every other host's log names where its own rank dumped

and whether the verdict names the stalled rank and ``load_batch``. PyTorch has no
equivalent to compare with: its flight recorder writes one file per rank on each host and
its log says nothing about the other hosts; ``fr_trace`` needs every file copied to one
place first. The goal is the verdict within 10 s of the first dump.

    sudo .venv/bin/python bench/job_log_verdict.py              # 8 hosts, 3 rounds
    sudo .venv/bin/python bench/job_log_verdict.py --hosts 4 --rounds 1

Needs root (Linux namespaces), as the tests of tests/hosts/ do.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.hosts.cluster import Cluster, Host, namespaces_unavailable
from tests.hosts.job import TRACES, MultiHostJob, start_job

VERDICT = "live verdict (every rank's record, all hosts):"


def _dump_times(job: MultiHostJob) -> list[float]:
    """Every dump's own time (seconds), all hosts."""
    times = []
    for host in job.hosts:
        for name in job.dumps(host):
            with open(host.path(f"{TRACES}/{name}"), "rb") as f:
                times.append(pickle.load(f)["dump_time_ns"] / 1e9)
    return times


def _training(host: Host, world: int) -> bool:
    """Whether every rank has marked step 5 (``commscope watch --once --json`` on
    ``host``); the watch file alone appears before ``init_process_group`` returns."""
    proc = host.run([sys.executable, "-m", "commscope", "watch", "--once", "--json"],
                    timeout=60)
    try:
        ranks = json.loads(proc.stdout)["ranks"]
    except (ValueError, KeyError):
        return False
    return len(ranks) == world and all((r.get("step") or 0) >= 5 for r in ranks)


def one_round(cluster: Cluster, timeout_s: float, train_s: float) -> dict[str, object]:
    """One job: start, stall the last host's rank, time the log; returns the figures."""
    hosts = len(cluster)
    culprit = hosts - 1
    for host in cluster:  # the last round's dumps and watch files
        host.run(["rm", "-rf", TRACES, "/tmp/job/stall", "/tmp/job/stall.at"], check=True)
    job = start_job(cluster, "hosts_job.py", nproc=1, timeout_s=240,
                    env={"COMMSCOPE_FR_TIMEOUT_S": str(timeout_s),
                         "STALL_RANK": str(culprit), "STALL_FILE": "stall"})
    try:
        first, last = cluster[0], cluster[hosts - 1]
        job.wait_for(lambda: all(h.exists(f"{TRACES}/watch.json") for h in cluster), 180,
                     "every host's watch file")
        job.wait_for(lambda: _training(first, hosts), 180, "every rank past step 5")
        time.sleep(train_s)  # the job trains (and every reporter attaches)
        last.write_text("/tmp/job/stall", "now")
        seen: dict[str, float] = {}
        others = [h for h in cluster if h is not first]
        deadline = time.monotonic() + 60 + timeout_s
        while time.monotonic() < deadline and len(seen) < hosts:
            now = time.time()
            if first.name not in seen and VERDICT in job.log(first):
                seen[first.name] = now
            for h in others:
                if h.name not in seen and f"dumped to {h.name}:" in job.log(h):
                    seen[h.name] = now
            time.sleep(0.01)
        times = _dump_times(job)
        log = job.log(first)
    finally:
        job.stop()
    line = next((x for x in log.splitlines() if VERDICT in x), "")
    start = min(times) if times else float("nan")
    nan = float("nan")
    return {
        "verdict_s": seen[first.name] - start if first.name in seen else nan,
        "dumps_s": max(times) - start if times else nan,
        "hosts_s": (max(seen[h.name] for h in others) - start
                    if all(h.name in seen for h in others) else nan),
        "dumps": len(times),
        "right": f"rank {culprit}" in line and "load_batch" in line,
        "line": line,
    }


def main() -> int:
    """Run the rounds and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout-s", type=float, default=10.0,
                        help="the recorder's timeout (COMMSCOPE_FR_TIMEOUT_S)")
    parser.add_argument("--train-s", type=float, default=5.0,
                        help="how long the job trains, once every rank is past step 5, "
                        "before the rank stalls")
    args = parser.parse_args()
    why = namespaces_unavailable()
    if why:
        print(f"cannot simulate hosts here: {why}", file=sys.stderr)
        return 2
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(f"{args.hosts} simulated hosts x 1 gloo rank, recorder timeout {args.timeout_s:g} s, "
          f"stall {args.train_s:g} s after every rank's step 5, publishing every 2 s; load "
          f"{os.getloadavg()[0]:.1f}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp, Cluster(args.hosts, Path(tmp)) as cluster:
        for i in range(args.rounds):
            row = one_round(cluster, args.timeout_s, args.train_s)
            rows.append(row)
            print(f"round {i + 1}: first dump -> verdict in hostA's log {row['verdict_s']:.2f} s"
                  f" | first -> last dump {row['dumps_s']:.2f} s | every host's own line "
                  f"{row['hosts_s']:.2f} s | {row['dumps']} dumps | culprit named: "
                  f"{row['right']}", flush=True)
    print(f"verdict line: {rows[-1]['line']}")
    verdicts = [float(r["verdict_s"]) for r in rows]  # type: ignore[arg-type]
    print(f"median first dump -> verdict: {statistics.median(verdicts):.2f} s "
          f"(max {max(verdicts):.2f} s; goal < 10 s); PyTorch: no equivalent")
    return 0 if all(r["right"] for r in rows) and max(verdicts) < 10 else 1


if __name__ == "__main__":
    raise SystemExit(main())
