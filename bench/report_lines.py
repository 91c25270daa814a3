"""How long the text report is, and where its answer is, beside fr_trace's, at 16 to 4 096 ranks.

For each job: run ``commscope analyze DIR`` and PyTorch's ``fr_trace DIR`` (each in its
own process, on the same uncompressed files) and count

* ours: the report's lines, and the line on which the root cause first appears (the
  first line naming a culprit rank of the first blocking finding, or the verdict line
  when nothing blocks);
* fr_trace: the lines it prints (stdout and stderr together, as a terminal shows them).

Jobs:

* 16 and 64 ranks: every scenario of the NCCL corpus (``tests/data/nccl_scenarios``:
  real multi-process jobs on the NCCL-semantics bed, Megatron-shaped groups), each in
  its full and its active-only form;
* 512 and 4 096 ranks: synthesized NCCL dumps (no bed runs that many processes here) of
  a Megatron-shaped job, tensor x pipeline x data parallel groups (tp 8, pp 4, dp the
  rest), a few steps of tp all_reduces, dp reduce_scatters and pipeline sends, then one
  fault: ``thread`` (a rank never issues its next tp all_reduce: a skipped call or hung
  Python) or ``device`` (a rank's device stops: its tp all_reduce finished on its peers,
  never on it, and nothing after it finishes anywhere its group reaches).

  .venv/bin/python bench/report_lines.py                 # everything (a few minutes)
  .venv/bin/python bench/report_lines.py --sizes 16,64   # the corpus only
  .venv/bin/python bench/report_lines.py --torch-max 512 # fr_trace up to 512 ranks

Prints one row per job and a summary per size (median and largest line counts).
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from commscope.analyze import analyze  # noqa: E402
from commscope.analyze.synth import megatron_job  # noqa: E402

CORPUS = ROOT / "tests" / "data" / "nccl_scenarios"


def _unpack(src: Path, dst: Path) -> Path:
    """The scenario's files, uncompressed (fr_trace reads plain pickles only)."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.suffix == ".gz":
            (dst / f.stem).write_bytes(gzip.decompress(f.read_bytes()))
        else:
            shutil.copy(f, dst / f.name)
    return dst


def _ours(folder: Path) -> tuple[int, int, str, list[int]]:
    """(lines, line of the root cause, verdict, culprits) of our text report."""
    out = subprocess.run([sys.executable, "-m", "commscope", "analyze", str(folder),
                          "--exit-zero"], capture_output=True, text=True, check=True,
                         cwd=ROOT).stdout
    lines = out.splitlines()
    a = analyze(folder)
    blocking = [f for f in a.findings if f.blocking and f.culprit_ranks]
    culprits = sorted(blocking[0].culprit_ranks) if blocking else []
    at = next((i for i, line in enumerate(lines, 1) if line.startswith("verdict:")), 0)
    if culprits:
        first = culprits[0]
        at = next((i for i, line in enumerate(lines, 1)
                   if f"rank {first}" in line or f"ranks {first}" in line
                   or f", {first}" in line), at)
    return len(lines), at, a.verdict, culprits


def _theirs(folder: Path, timeout: float) -> str:
    """fr_trace's line count (``timeout`` when it ran out of time, ``error`` when it
    failed without output)."""
    try:
        p = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace",
                            str(folder), "--allow-incomplete-ranks"],
                           capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return "timeout"
    text = (p.stdout + p.stderr).strip()
    return str(len(text.splitlines())) if text else "error"


def main() -> None:
    """Run the jobs of ``--sizes`` and print the table (see module doc)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--sizes", default="16,64,512,4096",
                    help="world sizes to measure (default: %(default)s)")
    ap.add_argument("--torch-max", type=int, default=4096,
                    help="largest world fr_trace is run on (default: %(default)s)")
    ap.add_argument("--timeout-s", type=float, default=600.0,
                    help="fr_trace's time limit per job (default: %(default)s)")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        jobs: list[tuple[int, str, Path]] = []
        for d in sorted(CORPUS.iterdir()):
            meta = d / "scenario.json"
            if not meta.exists():
                continue
            world = json.loads(meta.read_text())["world_size"]
            if world not in sizes:
                continue
            for form in ("full", "active"):
                jobs.append((world, f"{d.name}/{form}",
                             _unpack(d / form, Path(tmp) / d.name / form)))
        for world in (w for w in sizes if w >= 512):
            for fault in ("thread", "device"):
                job, _ = megatron_job(world, fault)
                folder = Path(tmp) / f"synth_{world}_{fault}"
                job.write(folder)
                jobs.append((world, f"synthesized {fault} fault", folder))
        print(f"{'ranks':>5}  {'job':36} {'verdict':10} {'ours':>5} {'answer at':>9} "
              f"{'fr_trace':>8}")
        for world, name, folder in jobs:
            lines, at, verdict, culprits = _ours(folder)
            theirs = _theirs(folder, args.timeout_s) if world <= args.torch_max else "-"
            rows.append({"ranks": world, "job": name, "verdict": verdict, "culprits": culprits,
                         "lines": lines, "answer_line": at, "fr_trace_lines": theirs})
            print(f"{world:>5}  {name:36} {verdict:10} {lines:>5} {at:>9} {theirs:>8}",
                  flush=True)
    print("\nper size: ours median / largest lines, answer line largest; fr_trace median")
    for world in sizes:
        mine = [r for r in rows if r["ranks"] == world]
        if not mine:
            continue
        counts = [r["lines"] for r in mine]
        theirs = [int(r["fr_trace_lines"]) for r in mine if r["fr_trace_lines"].isdigit()]
        med = statistics.median(theirs) if theirs else "-"
        print(f"{world:>5}: ours {statistics.median(counts):.0f} / {max(counts)}, answer by "
              f"line {max(r['answer_line'] for r in mine)}; fr_trace {med}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
