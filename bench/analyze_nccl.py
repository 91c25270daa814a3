"""commscope analyze vs PyTorch's fr_trace on the NCCL corpus, side by side: time and memory.

Every scenario of ``tests/data/nccl_scenarios`` (real jobs on the NCCL-semantics bed:
15 at 16 ranks, 2 at 64) in its full and its active-only form, uncompressed into a
temporary folder (fr_trace reads plain pickles only), then, each in its own process,
timed by wall clock with the CPU time and the peak RSS of the whole process tree
(:func:`analyze_scale.run_measured`):

  ours:  python -m commscope analyze DIR --json -o OUT --exit-zero
  torch: python -m torch.distributed.flight_recorder.fr_trace DIR --allow-incomplete-ranks

medians of ``--rounds`` interleaved rounds per folder, and whether each named the
scenario's faulty ranks (ours: the ranks its blocking findings blame, against the
scenario's expectation; fr_trace: every faulty rank's number after "Culprit rank" or in
a "missing ranks" line of its output; a healthy job: no such line).

  .venv/bin/python bench/analyze_nccl.py              # every folder, 3 rounds
  .venv/bin/python bench/analyze_nccl.py --rounds 1 --names gpu_error_ep,gil_hold_64
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from analyze_scale import run_measured  # noqa: E402

CORPUS = ROOT / "tests" / "data" / "nccl_scenarios"


def _unpack(src: Path, dst: Path) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        target = dst / (f.stem if f.suffix == ".gz" else f.name)
        target.write_bytes(gzip.decompress(f.read_bytes()) if f.suffix == ".gz"
                           else f.read_bytes())


def _theirs_named(text: str) -> set[int]:
    """The ranks fr_trace's output blames."""
    named = {int(x) for x in re.findall(r"Culprit rank (\d+)", text)}
    for line in re.findall(r"missing ranks?:? *\{?([0-9, ]+)", text):
        named |= {int(x) for x in re.findall(r"\d+", line)}
    return named


def main(argv: list[str] | None = None) -> int:
    """Measure every folder (see module doc) and print one row each, then medians."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default: 3)")
    ap.add_argument("--names", help="comma-separated scenario names (default: all)")
    ap.add_argument("--timeout-s", type=float, default=600.0,
                    help="each tool's time limit per folder (default: %(default)s)")
    args = ap.parse_args(argv)
    wanted = set(args.names.split(",")) if args.names else None
    rows = []
    print(f"{'scenario':28} {'ranks':>5} {'form':6} {'ours s':>7} {'torch s':>8} "
          f"{'ours cpu':>8} {'torch cpu':>9} {'ours MB':>8} {'torch MB':>9}  right (ours/torch)")
    with tempfile.TemporaryDirectory() as tmp:
        for d in sorted(CORPUS.iterdir()):
            meta_path = d / "scenario.json"
            if not meta_path.exists() or (wanted and d.name not in wanted):
                continue
            meta = json.loads(meta_path.read_text())
            expect = meta["expect"]
            faulty = set(expect["blamed"] if expect["blamed"] is not None
                         else expect["culprits"])
            for form in ("full", "active"):
                if form not in meta["forms"]:
                    continue
                folder = Path(tmp) / d.name / form
                _unpack(d / form, folder)
                out = Path(tmp) / "ours.json"
                ours_cmd = [sys.executable, "-m", "commscope", "analyze", str(folder),
                            "--json", "-o", str(out), "--exit-zero"]
                torch_cmd = [sys.executable, "-m",
                             "torch.distributed.flight_recorder.fr_trace", str(folder),
                             "--allow-incomplete-ranks"]
                ours, theirs = [], []
                ours_right = torch_right = False
                for _ in range(args.rounds):
                    wall, cpu, mb, code, text = run_measured(ours_cmd, args.timeout_s)
                    if code != 0:
                        print(text)
                        return 1
                    ours.append((wall, cpu, mb))
                    doc = json.loads(out.read_text())
                    blamed = {r for f in doc["findings"] if f["kind"] not in (
                        "straggler", "truncated_history", "healthy", "stalled_collective")
                        for r in f["culprit_ranks"]}
                    ours_right = doc["verdict"] == expect["verdict"] and (
                        expect["verdict"] == "healthy" or blamed == faulty)
                    wall, cpu, mb, code, text = run_measured(torch_cmd, args.timeout_s)
                    theirs.append((wall, cpu, mb))
                    torch_right = _theirs_named(text) == faulty
                o = [statistics.median(x[i] for x in ours) for i in range(3)]
                t = [statistics.median(x[i] for x in theirs) for i in range(3)]
                rows.append((meta["world_size"], o, t))
                print(f"{d.name:28} {meta['world_size']:>5} {form:6} {o[0]:>7.2f} {t[0]:>8.2f} "
                      f"{o[1]:>8.2f} {t[1]:>9.2f} {o[2]:>8.0f} {t[2]:>9.0f}  "
                      f"{'yes' if ours_right else 'NO'}/{'yes' if torch_right else 'no'}",
                      flush=True)
                shutil.rmtree(folder, ignore_errors=True)
    print("\nmedians per size (ours / fr_trace): wall, CPU, peak RSS")
    for world in sorted({r[0] for r in rows}):
        mine = [r for r in rows if r[0] == world]
        o = [statistics.median(r[1][i] for r in mine) for i in range(3)]
        t = [statistics.median(r[2][i] for r in mine) for i in range(3)]
        print(f"{world:>5} ranks, {len(mine)} folders: wall {o[0]:.2f} / {t[0]:.2f} s "
              f"(ratio {o[0] / t[0]:.2f}), CPU {o[1]:.2f} / {t[1]:.2f} s "
              f"(ratio {o[1] / t[1]:.2f}), RSS {o[2]:.0f} / {t[2]:.0f} MB "
              f"(ratio {o[2] / t[2]:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
