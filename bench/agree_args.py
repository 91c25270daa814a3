"""What recording the arguments that must agree costs (issue 32, item 2).

The recorder keeps, per record, the root of rooted collectives, the reduce op and the
split sizes of ``all_to_all_single`` (:mod:`commscope.flight.record.agree.arguments`). This
measures, side by side in one process on torch's fake backend (no communication, so the
recorder's own cost shows):

1. per collective, for ``all_reduce`` (reduce op), ``broadcast`` (root) and
   ``all_to_all_single`` with 8 splits: no recorder (a job of its own, the reference),
   then in one recording job the argument readers switched off and on block by block
   (paired), medians reported;
2. per record in a dump: the pickled bytes of a ring full of each op, with and without
   the fields.

    python bench/agree_args.py [--iters 2000] [--rounds 40]
"""

from __future__ import annotations

import argparse
import os
import pickle
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.distributed as dist

import commscope.flight as flight
from commscope.flight.record import recorder as recorder_module
from tests.harness import fake_world

WORLD = 8


def _ops() -> dict[str, object]:
    t = torch.ones(16)
    x = torch.ones(WORLD, 4)
    y = torch.empty(WORLD, 4)
    splits = [1] * WORLD
    return {
        "all_reduce": lambda: dist.all_reduce(t),
        "broadcast": lambda: dist.broadcast(t, 3),
        "all_to_all_single": lambda: dist.all_to_all_single(y, x, splits, splits),
    }


def _per_op_us(fn: object, iters: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(iters):
        fn()  # type: ignore[operator]
    return (time.perf_counter_ns() - start) / iters / 1000


def _bytes_per_record(entries: list[dict[str, object]]) -> tuple[int, float]:
    stripped = [{k: v for k, v in e.items() if k not in
                 ("root", "reduce_op", "input_split_sizes", "output_split_sizes")}
                for e in entries]
    a = len(pickle.dumps({"entries": entries}, protocol=4))
    b = len(pickle.dumps({"entries": stripped}, protocol=4))
    return len(entries), (a - b) / max(1, len(entries))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=2000, help="ops per block")
    ap.add_argument("--rounds", type=int, default=40)
    args = ap.parse_args()
    readers = dict(recorder_module._READERS)
    folder = tempfile.mkdtemp()
    print(f"torch {torch.__version__}, fake backend, {WORLD} ranks; blocks of {args.iters} "
          f"ops, {args.rounds} rounds; median us per op")
    results: dict[tuple[str, str], list[float]] = {}
    with fake_world(0, WORLD):  # the reference: no recorder at all
        for _ in range(max(3, args.rounds // 8)):
            for name, fn in _ops().items():
                results.setdefault((name, "none"), []).append(_per_op_us(fn, args.iters))
    flight.enable(dump_prefix=os.path.join(folder, "rank_"), watchdog=False,
                  handle_signals=False, dump_on_exception=False)
    try:
        with fake_world(0, WORLD):
            ops = _ops()
            # one job, the argument readers switched off and on block by block (paired:
            # the cleanest figure on a shared machine)
            for _ in range(args.rounds):
                for mode in ("no_args", "args"):
                    recorder_module._READERS.clear()
                    if mode == "args":
                        recorder_module._READERS.update(readers)
                    for name, fn in ops.items():
                        results.setdefault((name, mode), []).append(
                            _per_op_us(fn, args.iters))
            recorder_module._READERS.update(readers)
            sizes = {}
            for name, fn in ops.items():  # a ring full of each op, with its fields
                for _ in range(2000):
                    fn()  # type: ignore[operator]
                sizes[name] = _bytes_per_record(flight.snapshot()["entries"])
    finally:
        recorder_module._READERS.update(readers)
        flight.disable()
    print(f"{'op':20} {'no recorder':>12} {'recorder':>10} {'+ args':>8} {'args cost':>10}")
    for name in _ops():
        none, plain, full = (statistics.median(results[(name, m)])
                             for m in ("none", "no_args", "args"))
        print(f"{name:20} {none:12.2f} {plain:10.2f} {full:8.2f} {full - plain:+10.2f}")
    for name, (n, extra) in sizes.items():
        print(f"dump of {n} {name} records: {extra:+.1f} bytes per record for the fields")
    return 0


if __name__ == "__main__":
    sys.exit(main())
