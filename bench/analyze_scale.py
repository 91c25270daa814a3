"""commscope analyze vs PyTorch's fr_trace on the same synthesized dumps, side by side.

For each N in --ranks: write N rank dumps x --entries records in PyTorch's native 2.10
format with a correct pg_config (one default group; all_reduce / all_gather /
reduce_scatter / broadcast in turn; the newest collective never issued by the middle
rank), then run, each in its own process and timed by wall clock with the peak RSS of
the whole process tree sampled every 10 ms:

  ours:  python -m commscope analyze DIR --json -o OUT
  torch: python -m torch.distributed.flight_recorder.fr_trace DIR

and check that both name the missing rank. Wall time, CPU time of the process tree
(workers included) and peak RSS of the tree are printed, medians of --rounds
interleaved rounds; on a shared machine the CPU-time ratio is the steadier one.
fr_trace is skipped above --torch-max ranks (it takes minutes there: 313 s at 2 048
ranks on this kind of box).

  .venv/bin/python bench/analyze_scale.py                       # 64 and 512 ranks
  .venv/bin/python bench/analyze_scale.py --ranks 64,512,4096   # the goals in the issue
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from commscope.analyze.synth import write_scale_dumps  # noqa: E402


def _tree_rss_kb(pid: int) -> int:
    total = 0
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
                        break
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return total


def run_measured(cmd: list[str], timeout: float) -> tuple[float, float, float, int, str]:
    """(wall s, CPU s of the whole process tree, peak tree RSS MB, exit code, output)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COMMSCOPE_NO_RICH": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    peak = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, _tree_rss_kb(proc.pid))
            stop.wait(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    wall = time.perf_counter() - start
    stop.set()
    sampler.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, peak / 1024, proc.returncode, out.decode(errors="replace")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="64,512", help="comma-separated rank counts")
    ap.add_argument("--entries", type=int, default=2000)
    ap.add_argument("--torch-max", type=int, default=512,
                    help="largest N on which fr_trace also runs (0: never)")
    ap.add_argument("--jobs", type=int, help="worker processes for ours (default: auto)")
    ap.add_argument("--dir", help="where to write dumps (default: a temporary folder)")
    ap.add_argument("--keep", action="store_true", help="keep the dumps")
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--rounds", type=int, default=1,
                    help="interleaved rounds per size; medians are printed")
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.ranks.split(",") if x.strip()]
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="analyze_scale_"))
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, "
          f"python {platform.python_version()}")
    from commscope import compat
    from commscope.analyze.read import load

    if args.torch_max and not compat.has("torch_fr_trace"):
        print(f"torch {compat.torch_version()} has no fr_trace module (torch 2.10+ has): "
              "ours only")
        args.torch_max = 0

    # pip byte-compiles an installed package (torch's fr_trace included); an editable
    # install compiles on first import, unless PYTHONDONTWRITEBYTECODE is set (it is on
    # some CI boxes): compile ours once, so both tools start the same way.
    compileall.compile_dir(str(ROOT / "commscope"), quiet=1)

    reader = ("C columnar reader (_fastread)" if load._fastread is not None
              and not os.environ.get("COMMSCOPE_NO_C_READER") else "standard unpickler only")
    print(f"ours reads pickles with: {reader}")
    print(f"{args.entries} records per rank; the middle rank misses the newest collective\n")
    header = (f"{'ranks':>6} {'ours s':>7} {'torch s':>8} {'speedup':>8} {'ours cpu':>8} "
              f"{'torch cpu':>9} {'cpu ratio':>9} {'ours MB':>8} {'torch MB':>9} "
              f"{'mem ratio':>9} {'us/rank/entry':>13}  both found culprit")
    print(header)
    rows = []
    for n in sizes:
        folder = base / f"n{n}"
        if not (folder / f"rank_{n - 1}").exists():
            shutil.rmtree(folder, ignore_errors=True)
            write_scale_dumps(folder, n, args.entries)
        culprit = n // 2
        out_json = base / f"ours_{n}.json"
        # --exit-zero: the status would say the verdict (5, a hang); a failure stays non-zero
        ours_cmd = [sys.executable, "-m", "commscope", "analyze", str(folder), "--json", "-o",
                    str(out_json), "--exit-zero"]
        if args.jobs:
            ours_cmd += ["--jobs", str(args.jobs)]
        torch_cmd = [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace",
                     str(folder)]
        ours, theirs = [], []
        ours_ok = torch_ok = None
        for _ in range(args.rounds):  # interleaved: both sides see the same load
            wall, cpu, mb, code, text = run_measured(ours_cmd, args.timeout)
            if code != 0:
                print(text)
                return 1
            ours.append((wall, cpu, mb))
            root = json.loads(out_json.read_text())["findings"][0]
            ours_ok = root["kind"] == "missing_rank" and root["culprit_ranks"] == [culprit]
            if n <= args.torch_max:
                wall, cpu, mb, code, text = run_measured(torch_cmd, args.timeout)
                theirs.append((wall, cpu, mb))
                torch_ok = code == 0 and "missing ranks" in text and f"{culprit}" in text
        o_wall, o_cpu, o_mb = (statistics.median(x[i] for x in ours) for i in range(3))
        cells = [f"{n:>6}", f"{o_wall:>7.2f}"]
        if theirs:
            t_wall, t_cpu, t_mb = (statistics.median(x[i] for x in theirs) for i in range(3))
            cells += [f"{t_wall:>8.2f}", f"{t_wall / o_wall:>7.1f}x", f"{o_cpu:>8.2f}",
                      f"{t_cpu:>9.2f}", f"{t_cpu / o_cpu:>8.1f}x", f"{o_mb:>8.0f}",
                      f"{t_mb:>9.0f}", f"{o_mb / t_mb:>9.2f}"]
        else:
            cells += [f"{'-':>8}", f"{'-':>8}", f"{o_cpu:>8.2f}", f"{'-':>9}", f"{'-':>9}",
                      f"{o_mb:>8.0f}", f"{'-':>9}", f"{'-':>9}"]
        per = o_wall / (n * args.entries) * 1e6
        found = f"ours {'yes' if ours_ok else 'NO'}" + (
            f", torch {'yes' if torch_ok else 'NO'}" if torch_ok is not None else "")
        print(" ".join(cells) + f" {per:>13.3f}  {found}", flush=True)
        rows.append((n, o_wall, per))
        if not args.keep and not args.dir:
            shutil.rmtree(folder, ignore_errors=True)
    if len(rows) > 1:
        (n0, _, p0), (n1, _, p1) = rows[0], rows[-1]
        print(f"\nours, time per rank x entry: {p0:.3f} us at {n0} ranks, {p1:.3f} us at {n1} "
              f"ranks (ratio {p1 / p0:.2f}; 1.0 = linear)")
    if not args.keep and not args.dir:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
