"""The straggler thresholds, measured: real gloo jobs with a slow rank and without one.

Runs the scenarios of ``tests/data/make_scenarios.py`` that the straggler defaults are
chosen on, each with several seeds (``STRAGGLER_SEED``: every rank's jitter and sleeps):

* ``straggler_data_loader``: rank 2's data loader sleeps 30-80 ms before each all_reduce;
* ``straggler_compute_heavy``: rank 1 runs 20 matmuls a step where the others run 2;
* ``healthy_jitter``: the same jitter and work on every rank (2-12 ms, one step in 20 a
  30-60 ms hiccup), an all_reduce of everyone and one in a pair each step: no straggler;
* ``healthy_uneven_work``: the same, but only ranks 0 and 1 have a pair (a little more
  work each step): between them they come last at the world's all_reduce, each about
  half the time. No straggler either.

For every group of every run it prints the rank that came last most often, how often
(its share of the timed collectives), its median and p90 lag behind the first arrival,
and the share of the members' wall time lost waiting; then whether the defaults of
:mod:`commscope.analyze.align.arrivals` call it a straggler. ``--json`` writes the rows.

    python bench/straggler_thresholds.py [--seeds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("OMP_NUM_THREADS", "1")

JOBS = ("straggler_data_loader", "straggler_compute_heavy", "healthy_jitter",
        "healthy_uneven_work")


def measure(name: str, seed: int, scratch: Path) -> list[dict[str, Any]]:
    """Run scenario ``name`` with ``seed`` and return one row per group."""
    from commscope.analyze import analyze
    from commscope.analyze.align.arrivals import DEFAULT_THRESHOLDS, group_arrivals
    from tests.data import make_scenarios as ms

    os.environ["STRAGGLER_SEED"] = str(seed)
    out = scratch / f"{name}-{seed}"
    ms.launch(ms.SCENARIOS[name], out, scratch / "store", live=False)
    result = analyze(out / "ours")
    rows = []
    for key, got in sorted(group_arrivals(result.load, result.views).items()):
        top = got.slowest(1)[0] if got.last else None
        group = result.groups.get(key)
        rows.append({
            "job": name, "seed": seed,
            "group": group.desc if group is not None and group.desc else key,
            "size": len(got.ranks), "samples": got.samples, "rank": top,
            "share": got.last.get(top, 0) / got.samples if got.samples else 0.0,
            "lag_median_ms": got.lag_ms(top) if top is not None else 0.0,
            "lag_p90_ms": got.lag_ms(top, 0.9) if top is not None else 0.0,
            "lost_share": got.lost_share(),
            "straggler": got.stragglers(result.hosts.host, DEFAULT_THRESHOLDS)[1],
        })
    shutil.rmtree(out, ignore_errors=True)
    return rows


def _table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'job':24} {'seed':>4} {'group':10} {'n':>2} {'timed':>5} {'last':>4} "
            f"{'share':>6} {'lag med':>8} {'lag p90':>8} {'lost':>6}  straggler")
    lines = [head]
    for r in rows:
        lines.append(
            f"{r['job']:24} {r['seed']:>4} {r['group']:10} {r['size']:>2} {r['samples']:>5} "
            f"{r['rank']!s:>4} {r['share']:>6.2f} {r['lag_median_ms']:>8.1f} "
            f"{r['lag_p90_ms']:>8.1f} {r['lost_share'] * 100:>5.1f}%  "
            f"{r['straggler'] or '-'}")
    return "\n".join(lines)


def _summary(rows: list[dict[str, Any]]) -> str:
    lines = ["", "per job and group, over seeds: min-max"]
    keys = sorted({(r["job"], r["group"]) for r in rows})
    for job, group in keys:
        mine = [r for r in rows if (r["job"], r["group"]) == (job, group)]

        def span(field: str, scale: float = 1.0, mine: list = mine) -> str:
            values = [r[field] * scale for r in mine]
            return f"{min(values):.2f}-{max(values):.2f} (median {statistics.median(values):.2f})"

        lines.append(f"{job} / {group}: share {span('share')}, lag median "
                     f"{span('lag_median_ms')} ms, p90 {span('lag_p90_ms')} ms, lost "
                     f"{span('lost_share', 100)} %, named in "
                     f"{sum(bool(r['straggler']) for r in mine)}/{len(mine)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run every job ``--seeds`` times and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--jobs", nargs="*", default=list(JOBS))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="commscope-straggler-"))
    rows: list[dict[str, Any]] = []
    try:
        for seed in range(1, args.seeds + 1):
            for name in args.jobs:
                rows += measure(name, seed, scratch)
                print(_table(rows[-1:]).splitlines()[-1], flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print()
    print(_table(sorted(rows, key=lambda r: (r["job"], r["group"], r["seed"]))))
    print(_summary(rows))
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
