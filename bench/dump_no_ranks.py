"""`commscope dump` typed on a machine with no ranks, to the printed verdict (issue 31, 12).

For each H in ``--hosts`` (default 2 and 4): H + 1 simulated hosts (tests/hosts/: each
its own hostname, /tmp and PID namespace, loopback networking, one clock). The first H
run one gloo job, one ``commscope run`` per host with c10d rendezvous, ``--nproc`` ranks
a host (default 2), publishing every 2 s (the default); the last host runs no rank: a
login node. Once the job runs, its last rank stalls in its data loader (the recorder's
own timeout is set to 10 minutes, so nothing dumps by itself: the user asks). Then
``--rounds`` times, on the login node, as docs/hosts.md says (store and token from a
copy of a watch file)::

    commscope dump --store "$(jq -r .store watch.json)" --token "$(jq -r .token watch.json)"

timed from outside, on one clock, from the command's start to:

  asked:    its first line (``asked the N ranks ...``): Python, torch's store client,
            the connection and the request
  verdict:  the line ``live verdict (every rank's record, all hosts): ...`` (every rank
            has written its dump on its own host and noted where; the live analysis ran)
  exit:     the command's end (every dump listed as ``host:folder``; nothing read from
            other hosts' disks)

and whether the verdict names the stalled rank, its host and ``load_batch``. For scale,
``import torch.distributed`` alone on the same host (each round, just before), the floor
of any command that talks to torch's store. Rounds are 6 s apart: a rank writes at most
one dump on request every 5 s (docs/watch.md).

PyTorch has no counterpart to run side by side: its flight recorder dumps on a timeout or
a signal on each rank's own host; the nearest, its opt-in debug server
(``torch.distributed.debug.start_debug_server`` called in the training script; needs
Jinja2 and aiohttp), shows each rank's raw flight-recorder table in a web page served
from rank 0's host, with no verdict and no dump files.

    sudo .venv/bin/python bench/dump_no_ranks.py                 # 2 and 4 hosts, 3 rounds
    sudo .venv/bin/python bench/dump_no_ranks.py --hosts 2 --rounds 5

Needs root (Linux namespaces), as the tests of tests/hosts/ do.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.hosts.cluster import Cluster, Host, namespaces_unavailable  # noqa: E402
from tests.hosts.job import TRACES, start_job  # noqa: E402

LIVE = "live verdict (every rank's record, all hosts): "


def _field(key: str) -> str:
    if shutil.which("jq"):
        return f'"$(jq -r .{key} watch.json)"'
    code = f'import json; print(json.load(open("watch.json"))["{key}"])'
    return f'"$({sys.executable} -c \'{code}\')"'


def timed_dump(host: Host) -> dict:
    """One ``commscope dump`` on ``host``: the times its lines appeared, its output."""
    cmd = (f"{sys.executable} -u -m commscope dump --wait-s 60 --store {_field('store')} "
           f"--token {_field('token')}")
    start = time.monotonic()
    proc = host.popen(["sh", "-c", cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                      text=True)
    out: dict = {"lines": []}
    assert proc.stdout is not None
    for line in proc.stdout:
        now = time.monotonic() - start
        out["lines"].append(line.rstrip("\n"))
        if "asked" not in out and line.startswith("asked the "):
            out["asked"] = now
        if "verdict" not in out and line.startswith(LIVE):
            out["verdict"] = now
            out["verdict_line"] = line[len(LIVE):].strip()
    proc.wait(90)
    out["exit"] = time.monotonic() - start
    out["rc"] = proc.returncode
    return out


def import_floor(host: Host) -> float:
    start = time.monotonic()
    host.run([sys.executable, "-c", "import torch.distributed"], check=True, timeout=60)
    return time.monotonic() - start


def run_hosts(n_hosts: int, nproc: int, rounds: int, root: Path) -> list[dict]:
    world = n_hosts * nproc
    stalled = world - 1
    with Cluster(n_hosts + 1, root) as cluster:
        login = cluster.hosts[-1]
        job_hosts = [h.name for h in cluster.hosts[:-1]]
        job = start_job(cluster, "hosts_job.py", nproc=nproc, hosts=job_hosts, timeout_s=600,
                        env={"COMMSCOPE_FR_TIMEOUT_S": "600", "STALL_RANK": str(stalled),
                             "STALL_FILE": "stall"})
        try:
            job.wait_for(lambda: all(h.exists(f"{TRACES}/watch.json") for h in job.hosts),
                         120, "every host's watch file")
            time.sleep(3.0)  # a few steps
            last = job.hosts[-1]
            last.write_text("/tmp/job/stall", "now")
            job.wait_for(lambda: last.exists("/tmp/job/stall.at"), 30, "the stall")
            time.sleep(5.0)  # past the live view's stall threshold (two intervals)
            # the user copies a watch file to the login node (scp)
            login.write_text("/tmp/job/watch.json", job.hosts[0].read_text(
                f"{TRACES}/watch.json"))
            results = []
            for i in range(rounds):
                if i:
                    time.sleep(6.0)  # one dump on request per rank every 5 s
                floor = import_floor(login)
                res = timed_dump(login)
                res["floor"] = floor
                line = res.get("verdict_line", "")
                body = "\n".join(res["lines"])
                res["named"] = (line.startswith("STUCK") and f"rank {stalled}" in line
                                and "load_batch" in line
                                and f"Rank {stalled} ({last.name}, pid " in body)
                res["listed"] = all(f"  {h}:{TRACES}/" in body for h in job_hosts)
                results.append(res)
                print(f"  {n_hosts} hosts x {nproc} ranks, round {i + 1}: asked "
                      f"{res.get('asked', float('nan')):.2f} s, verdict "
                      f"{res.get('verdict', float('nan')):.2f} s, exit {res['exit']:.2f} s "
                      f"(import torch.distributed alone {floor:.2f} s); rc {res['rc']}, "
                      f"culprit and host named: {'yes' if res['named'] else 'NO'}, every "
                      f"host's dumps listed: {'yes' if res['listed'] else 'NO'}", flush=True)
                if not (res["named"] and res["listed"]):
                    print("    " + "\n    ".join(res["lines"]))
            return results
        finally:
            job.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", default="2,4", help="hosts running the job (plus a login node)")
    ap.add_argument("--nproc", type=int, default=2, help="ranks a host")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    why = namespaces_unavailable()
    if why:
        sys.exit(f"dump_no_ranks: {why}")
    print(f"commscope dump from a host with no ranks, simulated hosts on "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, python "
          f"{sys.version.split()[0]}, load average {os.getloadavg()[0]:.2f}")
    print("PyTorch: no counterpart (no on-demand dump of a whole job from outside it; its "
          "opt-in debug server shows raw per-rank tables, no verdict)")
    summary = {}
    with tempfile.TemporaryDirectory(prefix="dump_no_ranks.") as tmp:
        for n in [int(x) for x in args.hosts.split(",")]:
            results = run_hosts(n, args.nproc, args.rounds, Path(tmp) / f"h{n}")
            summary[n] = {k: statistics.median(r[k] for r in results if k in r)
                          for k in ("asked", "verdict", "exit", "floor")}
            summary[n]["ok"] = sum(r["named"] and r["listed"] for r in results)
            summary[n]["rounds"] = len(results)
    print(f"\nmedians, s (load average now {os.getloadavg()[0]:.2f}):")
    print(f"{'hosts':>5} {'ranks':>5} {'asked':>6} {'verdict':>8} {'exit':>6} "
          f"{'import torch.distributed':>25} {'right':>6}")
    for n, s in summary.items():
        print(f"{n:5d} {n * args.nproc:5d} {s['asked']:6.2f} {s['verdict']:8.2f} "
              f"{s['exit']:6.2f} {s['floor']:25.2f} {s['ok']:>3}/{s['rounds']}")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
