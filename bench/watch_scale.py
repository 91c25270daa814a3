"""One `commscope watch` refresh at scale: simulated ranks' records through a real TCPStore.

For each N in --ranks: start a real TCPStore server on this machine (the kind torchrun
runs), write N progress records as a (pp, dp, tp) = (N/64, 8, 8) job publishes them
(four groups per rank, the newest four records and the unfinished ones, the main
thread's stack; the groups once, the default group without its rank list, as the
publisher writes it), with one rank stalled in its data loader and its dp peers waiting
in an all_reduce. Then time what one refresh of `commscope watch` does, in a separate
client process as the real watcher is:

  fetch:    StoreSource.fetch (every heartbeat in one multi_get; the N records and the
            groups on the first refresh only: a stuck job's records do not change)
  analysis: commscope.watch.live.snapshot (the same analysis as `commscope analyze`)
  render:   the terminal view (rich) to a string

and the client's CPU time per refresh (steadier than wall time on a shared machine; the
store's server runs in the parent) and peak RSS. There is no PyTorch counterpart to
compare with (its debug server shows raw per-rank tables, one HTTP request per rank, and
no verdict); the figure to meet is one refresh under 1 s at 4 096 ranks.

Each size runs twice (``--hosts both``, the default), a fresh store each time:
``no`` without hosts (every record as on one machine, no ``hostname`` nor ``pid``) and
``yes`` with them: 8 ranks a host (4 096 ranks on 512 hosts, ``gpu-node-0001`` ...), each
record carrying its rank's ``hostname`` and ``pid`` as the publisher writes them, and the
job's host table in the store (``commscope/hosts``, as rank 0 gathers it at start). Then
the live analysis places every rank on its host, names the culprit's host, and the
terminal view folds its ranks table by host (``commscope/analyze/present/byhost.py``).

    .venv/bin/python bench/watch_scale.py                  # 1024, 4096, with and without hosts
    .venv/bin/python bench/watch_scale.py --ranks 4096,16384 --rounds 3
    .venv/bin/python bench/watch_scale.py --ranks 4096 --hosts yes
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing as mp
import os
import resource
import statistics
import sys
import time
import zlib
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from commscope.flight.out import progress
from commscope.flight.record.placement import TABLE_KEY
from commscope.hosttable import encode_table

TOKEN = "bench-token"
RANKS_PER_HOST = 8
TRAIN = "/home/user/torchtitan/train.py"


FRAME_TABLE = [
    {"name": "all_reduce", "filename": "/opt/venv/lib/python3.11/site-packages/torch/"
     "distributed/distributed_c10d.py", "line": 3245},
    {"name": "wrapper", "filename": "/opt/venv/lib/python3.11/site-packages/torch/"
     "distributed/c10d_logger.py", "line": 83},
    {"name": "train_step", "filename": TRAIN, "line": 120},
    {"name": "load_batch", "filename": TRAIN, "line": 42},
]


def _entry(rid: int, group: str, desc: str, seq: int, done: bool, created: int) -> list:
    """One published record (progress.ENTRY_FIELDS order), as the publisher writes it."""
    return [rid, 0, group, desc, seq, 0, "nccl:all_reduce", created, [[4096, 1024]],
            ["BFloat16"], None, None, "completed" if done else "started", done, False, None,
            False, [0, 1, 2]]


def host_of(rank: int) -> str:
    """Rank ``rank``'s host with ``hosts``: 8 ranks a host, torchrun's placement."""
    return f"gpu-node-{rank // RANKS_PER_HOST:04d}"


def pid_of(rank: int) -> int:
    return 100_000 + 7919 * rank % 3_000_000


def host_table(n: int) -> bytes:
    """The job's host table as rank 0 writes it into the store (``commscope/hosts``)."""
    places = [{"host": host_of(r), "dump_dir": "/scratch/job42/commscope_traces",
               "node_rank": r // RANKS_PER_HOST, "pid": pid_of(r)} for r in range(n)]
    return json.dumps(encode_table(places), separators=(",", ":")).encode()


def job_records(n: int, stalled: int, now: int,
                hosts: bool = False) -> tuple[dict[int, bytes], dict[int, bytes]]:
    """Encoded records and group configs of an (n/64, 8, 8) mesh job with one stall;
    with ``hosts``, each record names its rank's host and pid (8 ranks a host)."""
    tp_size, dp_size = 8, 8
    records, configs = {}, {}
    step = 100
    for r in range(n):
        tp0 = r - r % tp_size
        dp_base = (r // (tp_size * dp_size)) * tp_size * dp_size + r % tp_size
        pp_stride = tp_size * dp_size
        groups = {
            "0": ("default_pg", None),
            f"tp{tp0}": ("mesh_tp", list(range(tp0, tp0 + tp_size))),
            f"dp{dp_base}": ("mesh_dp", [dp_base + i * tp_size for i in range(dp_size)]),
            f"pp{r % pp_stride}": ("mesh_pp", list(range(r % pp_stride, n, pp_stride))),
        }
        dp_name = f"dp{dp_base}"
        in_stalled_dp = stalled in groups[dp_name][1]
        entries = []
        rid = 4 * step
        for seq in (step - 1, step):
            for name, (desc, _) in groups.items():
                if name.startswith("pp"):
                    continue
                stuck = name == dp_name and seq == step and in_stalled_dp
                if r == stalled and name == dp_name and seq == step:
                    continue  # never issued: in its data loader
                entries.append(_entry(rid, name, desc, seq, not stuck,
                                      now - int(30e9) + seq * 1000))
                rid += 1
        entries = entries[-progress.RECORD_ENTRIES - 2:]
        main = [FRAME_TABLE[3] if r == stalled else FRAME_TABLE[2]]
        seqs = {name: [desc, step, step - (1 if name == dp_name and in_stalled_dp else 0)]
                for name, (desc, _) in groups.items()}
        # the running fingerprints as the publisher writes them: the newest 16 folds of
        # each group that issued collectives (equal on every member, as in a healthy job)
        t0 = now - int(40e9)
        prints = {}
        for name in groups:
            if name.startswith("pp"):
                continue
            top = step - 1 if (r == stalled and name == dp_name) else step
            prints[name] = [[seq, zlib.crc32(f"{name}|{seq}".encode()), 0,
                             int(10e6) + seq * 1000 + (r * 37) % 500]
                            for seq in range(top - 15, top + 1)]
        rec = {"commscope_watch": progress.VERSION, "rank": r, "world_size": n,
               "interval_s": 2.0,
               "commscope_fingerprints": {"bits": 32, "t0": t0, "groups": prints, "table": [
                   ["all_reduce", [[4096, 1024]], ["BFloat16"], None, "SUM"]]},
               "progress": seqs, "entries": entries, "frame_table": FRAME_TABLE,
               "commscope_threads": [{"name": "MainThread", "main": True, "frames": main}],
               "commscope_step": step}
        if hosts:
            rec["pid"] = pid_of(r)
            rec["hostname"] = host_of(r)
        records[r] = progress.encode(rec)
        configs[r] = json.dumps({name: {"name": name, "desc": desc,
                                        "ranks": "[]" if ranks is None else str(ranks)}
                                 for name, (desc, ranks) in groups.items()}).encode()
    return records, configs


def _client(port: int, rounds: int, conn) -> None:
    from rich.console import Console

    from commscope.watch.live import LiveCache, Thresholds, snapshot
    from commscope.watch.source import Address, StoreSource
    from commscope.watch.view import render

    source = StoreSource(Address("127.0.0.1", port, TOKEN), timeout_s=60)
    source.connect()
    times = []
    cpu: list[float] = []  # this client's CPU per refresh (the store's server is elsewhere)
    snap = None
    cache = LiveCache()
    for _ in range(rounds):
        c0 = time.process_time()
        t0 = time.perf_counter()
        fetched = source.fetch()
        t1 = time.perf_counter()
        # the records were written once, before this process started: not silent here
        snap = snapshot(fetched, thresholds=Thresholds(2.0, silent_s=3600), cache=cache)
        t2 = time.perf_counter()
        Console(file=io.StringIO(), width=120).print(render(snap))
        t3 = time.perf_counter()
        times.append((t1 - t0, t2 - t1, t3 - t2))
        cpu.append(time.process_time() - c0)
        if os.environ.get("WATCH_SCALE_VERBOSE"):
            print(f"    refresh: fetch {t1 - t0:.3f} analysis {t2 - t1:.3f} render {t3 - t2:.3f}",
                  file=sys.stderr)
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    first = snap["findings"][0] if snap["findings"] else {}
    conn.send({"times": times, "cpu": cpu, "rss_mb": rss_mb, "state": snap["state"],
               "headline": snap["headline"], "culprits": first.get("culprit_ranks", []),
               "message": first.get("message", ""),
               "hosts_in_rows": len({row.get("host") for row in snap["ranks"]} - {None})})


def run(n: int, rounds: int, hosts: bool = False) -> dict:
    from torch.distributed import TCPStore

    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                      timeout=timedelta(seconds=60))
    now = time.time_ns()
    stalled = n // 3
    records, configs = job_records(n, stalled, now, hosts)
    tid = progress.token_id(TOKEN)
    t0 = time.perf_counter()
    if hosts:
        server.set(TABLE_KEY, host_table(n))
    server.add(progress.JOBS_KEY, 1)
    server.set(progress.meta_key(tid), json.dumps({"world_size": n, "interval_s": 2.0}))
    for r in range(n):
        server.set(progress.rank_key(tid, r), records[r])
        server.set(progress.beat_key(tid, r), progress.encode_beat(50, 7, now))
        server.set(progress.config_key(tid, r), configs[r])
    publish_s = time.perf_counter() - t0
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_client, args=(server.port, rounds, child))
    p.start()
    out = parent.recv()
    p.join(60)
    out["publish_s"] = publish_s
    out["record_bytes"] = statistics.median(len(v) for v in records.values())
    out["stalled"] = stalled
    out["host_named"] = f"Rank {stalled} ({host_of(stalled)}, pid {pid_of(stalled)})" in (
        out["message"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="1024,4096")
    ap.add_argument("--rounds", type=int, default=5, help="refreshes per size (first: cold)")
    ap.add_argument("--hosts", choices=("both", "no", "yes"), default="both",
                    help="records without hosts, with (8 ranks a host), or both in turn")
    args = ap.parse_args()
    print(f"commscope watch refresh, real TCPStore on this machine, {os.cpu_count()} CPUs, "
          f"python {sys.version.split()[0]}, load average {os.getloadavg()[0]:.2f}")
    print("PyTorch: no counterpart (its debug server shows raw per-rank tables, one HTTP "
          "request per rank, no verdict, no hosts)")
    print(f"{'ranks':>6} {'hosts':>6} {'record B':>9} {'fetch s':>8} {'analysis s':>11} "
          f"{'render s':>9} {'refresh s':>10} {'CPU s':>6} {'cold s':>7} {'CPU s':>6} "
          f"{'RSS MB':>7}  verdict")
    variants = {"both": (False, True), "no": (False,), "yes": (True,)}[args.hosts]
    for n in [int(x) for x in args.ranks.split(",")]:
        for hosts in variants:
            out = run(n, args.rounds, hosts)
            warm = out["times"][1:] or out["times"]
            fetch = statistics.median(t[0] for t in warm)
            analysis = statistics.median(t[1] for t in warm)
            render_s = statistics.median(t[2] for t in warm)
            total = statistics.median(sum(t) for t in warm)
            cold = sum(out["times"][0])
            cpu = statistics.median(out["cpu"][1:] or out["cpu"])
            ok = out["culprits"] == [out["stalled"]]
            named = (f", host named {'right' if out['host_named'] else 'WRONG'}, "
                     f"{out['hosts_in_rows']} hosts in the rows") if hosts else ""
            print(f"{n:6d} {n // RANKS_PER_HOST if hosts else '-':>6} "
                  f"{out['record_bytes']:9.0f} {fetch:8.3f} {analysis:11.3f} {render_s:9.3f} "
                  f"{total:10.3f} {cpu:6.3f} {cold:7.3f} {out['cpu'][0]:6.3f} "
                  f"{out['rss_mb']:7.0f}  {out['state']}, culprit "
                  f"{out['culprits']} ({'right' if ok else 'WRONG'}){named}", flush=True)


if __name__ == "__main__":
    main()
