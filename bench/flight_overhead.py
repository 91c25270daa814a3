"""What recording every collective costs: no recorder, PyTorch's recorder, commscope's.

Three measurements, side by side in one run:

1. a gloo loop of small all_reduces on N local ranks (default 2), in three fresh jobs
   per round: no recorder (``TORCH_FR_BUFFER_SIZE=0``), PyTorch's native recorder
   (``TORCH_FR_BUFFER_SIZE=2000``, the 2.13 default) and commscope's
   (``commscope.flight.enable(buffer_size=2000)``, native off). Each op is timed; a
   job's figure is its median op (robust to bursts of other work on a shared machine);
   rounds interleave the modes and the median over rounds is reported;
   and, in one job, recording switched on and off every 20 ops (paired: the cleanest
   figure on a noisy machine);
2. the same loop on torch's fake backend, which does no communication and so isolates
   the recorder's own cost per collective (separate processes, and paired on/off);
3. the time to produce a dump of a full 2000-entry ring (ours vs PyTorch's
   ``_dump_fr_trace()``, whose first call also initialises its symbolizer).

The loop runs ``--depth`` Python frames deep so stack capture costs what it costs in a
training step.

    python bench/flight_overhead.py [--ranks 2] [--iters 2000] [--rounds 5] [--paired-jobs 12]
    python bench/flight_overhead.py --paired-only [--paired-jobs 30]  # the on/off figure alone
    python bench/flight_overhead.py --in-place   # where the recorder's time goes, per step
    python bench/flight_overhead.py --watch-pairs 10   # commscope watch's publishing, on/off
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch
import torch.distributed as dist

import commscope.flight as flight

MODES = ("none", "native", "ours")


def _nested(depth: int, fn):
    if depth <= 0:
        return fn()
    return _nested(depth - 1, fn)


def _paired(iters: int, block: int, depth: int, op, busy_us: float = 0.0) -> tuple[float, float]:
    """Median op time with recording on and off, alternating blocks of ``block`` ops.

    Recording is switched by the recorder's own slot (the group stays the same object),
    so both halves see the same machine noise; every rank follows the same schedule.
    With ``busy_us`` (the control) there is no recorder: the "on" half spins that many
    microseconds of plain Python before each op instead.
    """
    from commscope.flight.record.recorder import SLOT

    rec = SLOT.rec
    clock = time.perf_counter_ns
    on: list[int] = []
    off: list[int] = []
    spin_ns = int(busy_us * 1000)

    def loop():
        for i in range(iters // block):
            active = i % 2 == 0
            SLOT.rec = rec if active else None
            keep = on.append if active else off.append
            for _ in range(block):
                s = clock()
                if active and spin_ns:
                    while clock() - s < spin_ns:
                        pass
                op()
                keep(clock() - s)

    _nested(depth, loop)
    SLOT.rec = rec
    return statistics.median(on) / 1e3, statistics.median(off) / 1e3


def _gloo_child(rank, world, mode, store_path, iters, depth, numel, conn, busy_us=0.0):
    os.environ["TORCH_FR_BUFFER_SIZE"] = "2000" if mode == "native" else "0"
    torch.set_num_threads(1)
    if mode in ("ours", "paired"):
        flight.enable(buffer_size=2000, watchdog=False, handle_signals=False)
    elif mode in ("watch", "watchoff"):
        # both with the watchdog thread; only "watch" publishes (default interval)
        flight.enable(buffer_size=2000, handle_signals=False,
                      watch_interval_s=WATCH_INTERVAL_S if mode == "watch" else 0)
    dist.init_process_group(
        "gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world
    )
    t = torch.ones(numel)

    clock = time.perf_counter_ns
    samples: list[int] = []
    keep = samples.append

    def loop(n):
        for _ in range(n):
            s = clock()
            dist.all_reduce(t)
            keep(clock() - s)

    _nested(depth, lambda: loop(200))  # warm-up
    samples.clear()
    dist.barrier()
    if mode in ("paired", "control"):
        result = _paired(iters, 20, depth, lambda: dist.all_reduce(t), busy_us)
        dist.barrier()
        conn.send((result, []))
        conn.close()
        dist.destroy_process_group()
        os._exit(0)
    _nested(depth, lambda: loop(iters))
    # The median op: bursts of other work on a shared machine hit single ops, not all.
    per_op_us = statistics.median(samples) / 1e3
    if mode in ("watch", "watchoff"):
        # publishing is a burst every interval: the mean op counts it, the median may not
        published = _published()
        dist.barrier()
        conn.send(((per_op_us, statistics.fmean(samples) / 1e3, published), []))
        conn.close()
        dist.destroy_process_group()
        os._exit(0)
    dump_ms = []
    if mode == "ours":
        for _ in range(2):
            s = time.perf_counter()
            flight.dump_trace()
            dump_ms.append((time.perf_counter() - s) * 1e3)
    elif mode == "native":
        for _ in range(2):
            s = time.perf_counter()
            torch._C._distributed_c10d._dump_fr_trace()
            dump_ms.append((time.perf_counter() - s) * 1e3)
    dist.barrier()
    conn.send((per_op_us, dump_ms))
    conn.close()
    dist.destroy_process_group()
    os._exit(0)


WATCH_INTERVAL_S = 2.0
"""commscope watch's default publishing interval (COMMSCOPE_WATCH_INTERVAL_S)."""


def _published() -> tuple[int, float]:
    from commscope.flight.api import _state

    dog = _state.watchdog
    pub = dog.publisher if dog is not None else None
    return (pub._count, pub.busy_s) if pub is not None else (0, 0.0)


def watch_pairs(args: argparse.Namespace) -> None:
    """Pairs of fresh jobs, recorder on in both, publishing for `commscope watch` at the
    default interval in one and off in the other, alternating which runs first."""
    pairs = args.watch_pairs
    mean_share, median_share, counts, busy = [], [], [], []
    for i in range(pairs):
        order = ("watchoff", "watch") if i % 2 == 0 else ("watch", "watchoff")
        got = {}
        for mode in order:
            results = _gloo_job(_gloo_child, args.ranks, lambda rank, store, child, m=mode: (
                rank, args.ranks, m, store, args.watch_iters, args.depth, args.numel, child))
            got[mode] = [r[0] for r in results]
        on_med = statistics.median(x[0] for x in got["watch"])
        off_med = statistics.median(x[0] for x in got["watchoff"])
        on_mean = statistics.fmean(x[1] for x in got["watch"])
        off_mean = statistics.fmean(x[1] for x in got["watchoff"])
        mean_share.append(on_mean / off_mean - 1)
        median_share.append(on_med / off_med - 1)
        counts.append(min(x[2][0] for x in got["watch"]))
        busy.extend(x[2][1] / max(1, x[2][0]) for x in got["watch"])
        print(f"  pair {i + 1}: mean op {off_mean:.1f} -> {on_mean:.1f} us "
              f"({mean_share[-1]:+.2%}), median op {off_med:.1f} -> {on_med:.1f} us "
              f"({median_share[-1]:+.2%}), {counts[-1]} records published per rank",
              flush=True)
    lo, hi = median_interval(mean_share)
    mlo, mhi = median_interval(median_share)
    print(
        f"commscope watch publishing every {WATCH_INTERVAL_S:g} s vs off, recorder on in both, "
        f"{pairs} pairs of fresh jobs (gloo {args.ranks} ranks, {args.watch_iters} all_reduces "
        f"of {args.numel} floats, torch {torch.__version__}, {os.cpu_count()} CPUs):\n"
        f"  mean op {statistics.median(mean_share):+.2%} (95% interval of the median "
        f"{lo:+.2%} to {hi:+.2%}); median op {statistics.median(median_share):+.2%} "
        f"({mlo:+.2%} to {mhi:+.2%}); records per rank per job: {min(counts)}-{max(counts)}\n"
        f"  one publish (build, encode, store calls, FileStore here) takes "
        f"{statistics.median(busy) * 1e3:.2f} ms of the watchdog thread: "
        f"{statistics.median(busy) / WATCH_INTERVAL_S:.3%} of one core at the default interval"
    )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"mean_share": mean_share, "median_share": median_share,
                       "published": counts, "args": vars(args)}, fh)


def _gloo_job(target, world: int, make_args) -> list[Any]:
    """Fork ``world`` ranks running ``target(*make_args(rank, store_path, conn))`` with
    a FileStore in a temporary folder; return what each rank sent, in rank order."""
    ctx = mp.get_context("fork")
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        pipes, procs = [], []
        for rank in range(world):
            parent, child = ctx.Pipe(duplex=False)
            p = ctx.Process(target=target, args=make_args(rank, store, child))
            p.start()
            child.close()
            pipes.append(parent)
            procs.append(p)
        results = [pipe.recv() for pipe in pipes]
        for p in procs:
            p.join(30)
    return results


def gloo_round(
    mode: str, world: int, iters: int, depth: int, numel: int, busy_us: float = 0.0
) -> tuple:
    results = _gloo_job(_gloo_child, world, lambda rank, store, child: (
        rank, world, mode, store, iters, depth, numel, child, busy_us))
    if mode in ("paired", "control"):
        return results[0][0], []
    per_op = statistics.median(r[0] for r in results)
    return per_op, results[0][1]


def _in_place_child(rank, world, store_path, iters, depth, numel, conn):
    """Time the recorder's own steps inside the gloo loop (after the ring is full).

    Each of ``Recorder.run`` (the whole recorded call, gloo's hand-over included),
    ``begin`` (the record) and ``complete`` is wrapped with a clock: what the steps cost
    where they run, between gloo's threads, rather than in a hot loop.
    """
    from commscope.flight.record import recorder as rec_mod

    os.environ["TORCH_FR_BUFFER_SIZE"] = "0"
    torch.set_num_threads(1)
    flight.enable(buffer_size=2000, watchdog=False, handle_signals=False)
    clock = time.perf_counter_ns
    spent: dict[str, list[int]] = {"run": [], "begin": [], "complete": []}
    for name, samples in spent.items():
        step = getattr(rec_mod.Recorder, name)

        def timed(*a, _step=step, _keep=samples.append, **kw):
            s = clock()
            out = _step(*a, **kw)
            _keep(clock() - s)
            return out

        setattr(rec_mod.Recorder, name, timed)
    dist.init_process_group(
        "gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world
    )
    t = torch.ones(numel)

    def loop():
        for _ in range(iters):
            dist.all_reduce(t)

    _nested(depth, loop)  # fills the ring: from here on every entry evicts one
    for samples in spent.values():
        samples.clear()
    _nested(depth, loop)
    dist.barrier()
    conn.send({k: sorted(v) for k, v in spent.items()})
    conn.close()
    dist.destroy_process_group()
    os._exit(0)


def in_place(world: int, iters: int, depth: int, numel: int) -> None:
    """Print what run/begin/complete cost inside the gloo loop, per rank."""
    results = _gloo_job(_in_place_child, world, lambda rank, store, child: (
        rank, world, store, max(iters, 2000), depth, numel, child))
    print(f"recorder steps timed in place (gloo, {world} ranks, {depth}+ frames deep, "
          f"ring full), us: median / p90 / mean")
    for rank, spent in enumerate(results):
        cells = []
        for name, v in spent.items():
            cells.append(f"{name} {v[len(v) // 2] / 1e3:.1f} / {v[len(v) * 9 // 10] / 1e3:.1f}"
                         f" / {sum(v) / len(v) / 1e3:.1f}")
        print(f"  rank {rank}: " + ", ".join(cells))


def _fake_child(mode, iters, depth, conn):
    os.environ["TORCH_FR_BUFFER_SIZE"] = "0"
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if mode in ("ours", "paired"):
        flight.enable(buffer_size=2000, watchdog=False, handle_signals=False)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    t = torch.ones(16)
    if mode == "paired":
        _paired(2000, 50, depth, lambda: dist.all_reduce(t))  # warm-up
        conn.send(_paired(iters, 50, depth, lambda: dist.all_reduce(t)))
        conn.close()
        os._exit(0)

    def loop(n):
        for _ in range(n):
            dist.all_reduce(t)

    _nested(depth, lambda: loop(2000))
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        _nested(depth, lambda: loop(iters))
        best = min(best, (time.perf_counter() - start) / iters * 1e6)
    conn.send(best)
    conn.close()
    os._exit(0)


def fake_round(mode: str, iters: int, depth: int) -> Any:
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_fake_child, args=(mode, iters, depth, child))
    p.start()
    child.close()
    value = parent.recv()
    p.join(30)
    return value


def median_interval(values: list[float], level: float = 0.95) -> tuple[float, float]:
    """A bootstrap interval of the median of ``values`` (fixed seed: reruns agree)."""
    rng = random.Random(0)
    boot = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(4000))
    cut = int(len(boot) * (1 - level) / 2)
    return boot[cut], boot[-cut - 1]


def paired_only(args: argparse.Namespace) -> None:
    """Print the same-job on/off cost over many jobs, with an interval of its median."""
    jobs = args.paired_jobs or 30
    adds, shares = [], []
    for _ in range(jobs):
        (on, off), _ = gloo_round("paired", args.ranks, 2 * args.iters, args.depth, args.numel)
        adds.append(on - off)
        shares.append((on - off) / off)
    low, high = median_interval(shares)
    q1, mid, q3 = statistics.quantiles(shares, n=4)
    print(
        f"same job, recording switched on/off every 20 ops, {jobs} jobs "
        f"(gloo {args.ranks} ranks, all_reduce of {args.numel} floats, {args.depth}+ frames "
        f"deep, torch {torch.__version__}, {os.cpu_count()} CPUs):\n"
        f"  added {statistics.median(adds):+.1f} us per collective, {mid:+.2%}"
        f" (95% interval of the median {low:+.2%} to {high:+.2%}); "
        f"jobs' quartiles {q1:+.2%} / {mid:+.2%} / {q3:+.2%}"
    )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"added_us": adds, "share": shares, "args": vars(args)}, fh)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--iters", type=int, default=2000, help="all_reduces per gloo job")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--paired-jobs", type=int, default=None,
                    help="paired on/off jobs (and control jobs); default: --rounds")
    ap.add_argument("--fake-iters", type=int, default=20000)
    ap.add_argument("--depth", type=int, default=20, help="extra Python frames under the loop")
    ap.add_argument("--numel", type=int, default=16, help="floats per all_reduce")
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--paired-only", action="store_true",
                    help="only the same-job on/off figure, over --paired-jobs jobs (default 30)")
    ap.add_argument("--in-place", action="store_true",
                    help="only time the recorder's steps inside the gloo loop, then exit")
    ap.add_argument("--watch-pairs", type=int, default=0,
                    help="only: publishing for `commscope watch` on vs off, in N pairs of jobs")
    ap.add_argument("--watch-iters", type=int, default=12000,
                    help="all_reduces per job of --watch-pairs (several publishing intervals)")
    args = ap.parse_args()
    if args.watch_pairs:
        watch_pairs(args)
        return
    if args.in_place:
        in_place(args.ranks, args.iters, args.depth, args.numel)
        return
    if args.paired_only:
        paired_only(args)
        return

    gloo: dict[str, list[float]] = {m: [] for m in MODES}
    dumps: dict[str, list[float]] = {"ours": [], "native": []}
    for r in range(args.rounds):
        order = MODES if r % 2 == 0 else MODES[::-1]
        for mode in order:
            per_op, dump_ms = gloo_round(mode, args.ranks, args.iters, args.depth, args.numel)
            gloo[mode].append(per_op)
            if dump_ms:
                dumps[mode].append(dump_ms)
    fake: dict[str, list[float]] = {"none": [], "ours": []}
    for r in range(args.rounds):
        for mode in ("none", "ours") if r % 2 == 0 else ("ours", "none"):
            fake[mode].append(fake_round(mode, args.fake_iters, args.depth))
    fake_paired = [fake_round("paired", args.fake_iters, args.depth) for _ in range(args.rounds)]
    f_add = statistics.median(x[0] - x[1] for x in fake_paired)
    paired, control = [], []
    for _ in range(args.paired_jobs or args.rounds):
        paired.append(gloo_round("paired", args.ranks, 2 * args.iters, args.depth, args.numel)[0])
        control.append(
            gloo_round("control", args.ranks, 2 * args.iters, args.depth, args.numel, f_add)[0]
        )

    med = {m: statistics.median(v) for m, v in gloo.items()}
    fmed = {m: statistics.median(v) for m, v in fake.items()}
    ours_dump = statistics.median(d[1] for d in dumps["ours"])
    native_first = statistics.median(d[0] for d in dumps["native"])
    native_later = statistics.median(d[1] for d in dumps["native"])
    print(
        f"flight recorder overhead — torch {torch.__version__}, {os.cpu_count()} CPUs, "
        f"gloo {args.ranks} ranks, all_reduce of {args.numel} floats, "
        f"{args.depth}+ frames deep, median of {args.rounds} rounds"
    )
    print(f"{'gloo loop':28s}{'us/op':>10s}{'vs none':>10s}{'rounds (us/op)':>40s}")
    for mode, label in (
        ("none", "no recorder"),
        ("native", "PyTorch native (2000)"),
        ("ours", "commscope (2000)"),
    ):
        rounds = " ".join(f"{x:.1f}" for x in gloo[mode])
        print(f"  {label:26s}{med[mode]:10.1f}{med[mode] / med['none']:10.3f}  {rounds:>38s}")
    # Each round runs the three modes back to back: the ratio within a round cancels
    # the box's slow drifts, so its median over rounds is the steadier figure.
    per_round = {m: statistics.median(x / n for x, n in zip(gloo[m], gloo["none"]))
                 for m in ("native", "ours")}
    print(
        f"  per-round ratio to none, median: commscope {per_round['ours']:.3f}, "
        f"PyTorch native {per_round['native']:.3f}"
    )
    print(
        f"  ratio commscope / PyTorch native: {med['ours'] / med['native']:.3f}   "
        f"added per collective: commscope {med['ours'] - med['none']:+.1f} us, "
        f"native {med['native'] - med['none']:+.1f} us"
    )
    p_on = statistics.median(x[0] for x in paired)
    p_off = statistics.median(x[1] for x in paired)
    p_adds = [x[0] - x[1] for x in paired]
    p_add = statistics.median(p_adds)
    print(
        f"  same job, recording switched on/off every 20 ops: on {p_on:.1f} us/op, "
        f"off {p_off:.1f} us/op, added {p_add:+.1f} us ({p_add / p_off:+.1%})"
    )
    if len(p_adds) >= 4:
        # How far single jobs spread: on a busy 2-core box it is wider than the goal.
        q1, _, q3 = statistics.quantiles(p_adds, n=4)
        print(
            f"    {len(p_adds)} jobs, quartiles {q1:+.1f} / {p_add:+.1f} / {q3:+.1f} us "
            f"({q1 / p_off:+.1%} / {p_add / p_off:+.1%} / {q3 / p_off:+.1%}), "
            f"range {min(p_adds):+.1f} to {max(p_adds):+.1f} us"
        )
        low, high = median_interval([x[0] / x[1] - 1 for x in paired])
        print(f"    95% interval of the median: {low:+.1%} to {high:+.1%}")
    c_add = statistics.median(x[0] - x[1] for x in control)
    c_off = statistics.median(x[1] for x in control)
    print(
        f"  control, no recorder: spinning {f_add:.1f} us of plain Python before each op "
        f"adds {c_add:+.1f} us ({c_add / c_off:+.1%}) on this machine"
    )
    added = fmed["ours"] - fmed["none"]
    print(
        f"fake backend (no communication): none {fmed['none']:.2f} us/op, "
        f"commscope {fmed['ours']:.2f} us/op, added {added:.2f} us per collective"
    )
    f_off = statistics.median(x[1] for x in fake_paired)
    print(
        f"  same process, recording on/off every 50 ops: added {f_add:.2f} us per "
        f"collective (off {f_off:.2f} us/op)"
    )
    print(
        f"dump of a full 2000-entry ring: commscope {ours_dump:.1f} ms; PyTorch native "
        f"{native_first:.1f} ms first call, {native_later:.1f} ms later "
        f"(ratio later {ours_dump / native_later:.2f})"
    )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                {
                    "gloo": gloo,
                    "paired": paired,
                    "fake": fake,
                    "fake_paired": fake_paired,
                    "control": control,
                    "dumps": dumps,
                    "args": vars(args),
                },
                fh,
            )


if __name__ == "__main__":
    main()
