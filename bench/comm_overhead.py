"""Overhead of comm tracing: plain vs PyTorch's CommDebugMode vs ours, side by side.

One process, torch's fake process group (4 ranks, this process is rank 0), one OpenMP
thread. Each trial times ``with mode: step`` (enter and exit included, as PyTorch's mode
cannot run two steps in one block); the variants take turns trial by trial, so a noisy
neighbour slows them all alike. Medians are reported, with each variant's ratio to plain
and ours relative to PyTorch.

Each ratio to plain is printed twice: the ratio of the medians, and ``paired``: the
median over rounds of the ratio within a round (see ``_paired_ratio``), which cancels a
drift of the machine's speed between rounds.

Variants: ``plain`` (no mode), ``bare_dispatch`` (a dispatch mode that only forwards
ops: the floor of any dispatch-mode tool), ``pytorch``
(torch.distributed.tensor.debug.CommDebugMode), ``ours`` (commscope.comm.CommDebugMode,
everything captured: ops, modules, collectives with bytes and groups) and
``ours_ops=False`` (collectives and modules only, no dispatch mode: hooks where
collectives enter torch.distributed).

``--floors`` adds two lower bounds of any hook-based capture (see ``_ModuleHooksFloor``
and ``_EntrySwapsFloor``).

Steps: TP MLP forward, TP MLP forward+backward, 2-layer TP Transformer forward+backward,
and a whole training step of it (forward, backward, AdamW step).

    OMP_NUM_THREADS=1 .venv/bin/python bench/comm_overhead.py [--scale 0.2] [--json out.json]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import contextlib
import gc
import json
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

warnings.simplefilter("ignore")


def _variants(floors: bool) -> dict[str, Callable[[], contextlib.AbstractContextManager]]:
    from torch.distributed.tensor.debug import CommDebugMode as TorchCommDebugMode

    from commscope.comm import CommDebugMode

    variants: dict[str, Callable[[], contextlib.AbstractContextManager]] = {
        "plain": contextlib.nullcontext,
        "bare_dispatch": _BareDispatch,
        "pytorch": TorchCommDebugMode,
        "ours": CommDebugMode,
        "ours_ops=False": lambda: CommDebugMode(ops=False),
    }
    if floors:
        variants["floor_mod_hooks"] = _ModuleHooksFloor
        variants["floor_swaps"] = _EntrySwapsFloor
    return variants


class _ModuleHooksFloor:
    """Two global module hooks that only push and pop a list, installed for the block:
    the least that following modules through torch's hooks costs (no names, no records)."""

    def __enter__(self) -> None:
        from torch.nn.modules import module

        stack: list = []

        def push(mod: object, args: object) -> None:
            stack.append(mod)

        def pop(mod: object, args: object, out: object) -> None:
            stack.pop()  # a hook that returns a value replaces the module's output

        self._key = key = object()  # a key no handle id can equal
        module._global_forward_pre_hooks[key] = push
        module._global_forward_hooks[key] = pop
        module._global_forward_hooks_always_called[key] = True

    def __exit__(self, *exc: object) -> None:
        from torch.nn.modules import module

        module._global_forward_pre_hooks.pop(self._key, None)
        module._global_forward_hooks.pop(self._key, None)
        module._global_forward_hooks_always_called.pop(self._key, None)


class _EntrySwapsFloor:
    """commscope's collective entry points swapped in and out around the block, each
    collective passed through to a sink that counts nothing: the least that hooking the
    entry points costs (no tracker, no bookkeeping)."""

    def __enter__(self) -> None:
        from commscope.comm.capture import hooks

        hooks.attach(_SINK)

    def __exit__(self, *exc: object) -> None:
        from commscope.comm.capture import hooks

        hooks.detach(_SINK)


class _Sink:
    """A mode for :class:`_EntrySwapsFloor` that throws every collective away."""

    def _count_hooked(self, *args: object) -> None:
        pass

    def _count_hooked_batch(self, *args: object) -> None:
        pass


_SINK = _Sink()


class _BareDispatch(TorchDispatchMode):
    """A dispatch mode that only forwards every op: the floor of any dispatch-mode tool."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _steps(mesh) -> dict[str, tuple[Callable[[], None], int]]:
    from commscope.comm.examples import mlp_input, tp_mlp, tp_transformer, transformer_input

    mlp = tp_mlp(mesh)
    x = mlp_input()
    transformer = tp_transformer(mesh)
    tokens = transformer_input()

    def mlp_forward() -> None:
        mlp(x)

    def mlp_forward_backward() -> None:
        mlp(x).sum().backward()
        mlp.zero_grad(set_to_none=True)

    def transformer_forward_backward() -> None:
        transformer(tokens).sum().backward()
        transformer.zero_grad(set_to_none=True)

    trained = tp_transformer(mesh)
    optimizer = torch.optim.AdamW(trained.parameters(), lr=1e-4, foreach=False)

    def training_step() -> None:
        trained(tokens).sum().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return {
        "TP MLP forward": (mlp_forward, 600),
        "TP MLP forward+backward": (mlp_forward_backward, 300),
        "TP Transformer (2 layers) forward+backward": (transformer_forward_backward, 100),
        "TP Transformer (2 layers) training step (AdamW)": (training_step, 60),
    }


def _measure(
    step: Callable[[], None],
    trials: int,
    variants: dict,
    collect: bool,
    clock: Callable[[], float],
    batch: int = 1,
) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Interleaved trials; returns times per variant and cyclic garbage left per trial.

    With ``batch`` > 1 each variant runs ``batch`` timed trials in a row, after one
    untimed trial, before the next variant's turn: a job runs the same mode every step,
    so its caches are warm with that mode's code, not with PyTorch's that ran just before
    (``batch`` 1: strict alternation, each trial right after another variant's).

    With ``collect``, the garbage collector is off while timing and each round ends with
    ``gc.collect()`` and one untimed plain step, so no variant pays for another's garbage
    (PyTorch's mode leaves reference cycles behind; ours leaves none). The order of the
    variants rotates every round.
    """
    names = list(variants)
    times: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(3):  # warm-up: DTensor's sharding-propagation cache, first hooks
        for make in variants.values():
            with make():
                step()
    garbage: dict[str, float] = {}
    for name in names:
        gc.collect()
        gc.disable()
        for _ in range(10):
            with variants[name]():
                step()
        garbage[name] = gc.collect() / 10
        gc.enable()
    if collect:
        gc.disable()
    try:
        for i in range(0, trials, batch):
            order = names[i % len(names) :] + names[: i % len(names)]
            for name in order:
                for j in range(batch + 1):
                    t0 = clock()
                    with variants[name]():
                        step()
                    if j:  # the first trial after a switch only warms the caches
                        times[name].append(clock() - t0)
            if collect:
                gc.collect()
                step()
    finally:
        gc.enable()
    return times, garbage


def _paired_ratio(times: dict[str, list[float]], name: str, batch: int) -> float:
    """Median over rounds of (this variant's median / plain's median in the same round).

    Each round runs every variant back to back, so a drift of the machine's speed (a
    noisy neighbour, a clock change) slows a round's variants alike and cancels in the
    ratio; the ratio of the overall medians does not cancel it.
    """
    ours, plain = times[name], times["plain"]
    rounds = min(len(ours), len(plain)) // batch
    ratios = [
        statistics.median(ours[r * batch:(r + 1) * batch])
        / statistics.median(plain[r * batch:(r + 1) * batch])
        for r in range(rounds)
    ]
    return statistics.median(ratios) if ratios else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the trial counts")
    parser.add_argument("--json", help="also write the medians to this JSON file")
    parser.add_argument(
        "--gc",
        choices=("between-rounds", "on"),
        default="between-rounds",
        help="garbage collection: off while timing and run between rounds (default), or "
        "left on as usual (then a variant may pay for another's garbage)",
    )
    parser.add_argument(
        "--clock",
        choices=("cpu", "wall"),
        default="cpu",
        help="cpu: this thread's CPU time (default; other processes on a shared box do "
        "not count), wall: elapsed time",
    )
    parser.add_argument(
        "--batch",
        type=int,
        default=1,
        help="timed trials per variant in a row, after one untimed trial (default 1: "
        "strict alternation; a job runs one mode every step, see _measure)",
    )
    parser.add_argument(
        "--floors",
        action="store_true",
        help="also time two floors of a hook-based capture: global module hooks that only "
        "push and pop (floor_mod_hooks), and the collective entry points swapped in and "
        "out with nothing counted (floor_swaps)",
    )
    args = parser.parse_args(argv)

    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    torch.set_num_threads(1)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    mesh = init_device_mesh("cpu", (4,), mesh_dim_names=("tp",))
    variants = _variants(args.floors)
    print(
        f"comm_overhead: torch {torch.__version__}, python {platform.python_version()}, "
        f"{platform.machine()}, fake PG world_size=4, torch threads={torch.get_num_threads()}, "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}, gc={args.gc}, "
        f"clock={args.clock}, batch={args.batch}"
    )
    results = {}
    for title, (step, trials) in _steps(mesh).items():
        n = max(10, int(trials * args.scale))
        clock = time.thread_time if args.clock == "cpu" else time.perf_counter
        times, garbage = _measure(step, n, variants, args.gc == "between-rounds", clock,
                                  max(1, args.batch))
        medians = {name: statistics.median(v) for name, v in times.items()}
        plain = medians["plain"]
        paired = {name: _paired_ratio(times, name, max(1, args.batch)) for name in times}
        print(f"\n[{title}] {n} trials per variant, interleaved")
        for name, value in medians.items():
            p10 = sorted(times[name])[len(times[name]) // 10]
            print(
                f"  {name:15s} median {value * 1e3:8.3f} ms   p10 {p10 * 1e3:8.3f} ms   "
                f"{value / plain:5.2f}x plain (paired {paired[name]:5.3f}x)   "
                f"cyclic garbage/trial {garbage[name]:5.1f}"
            )
        ratio = medians["ours"] / medians["pytorch"]
        light = medians["ours_ops=False"] / medians["pytorch"]
        print(f"  ours / pytorch = {ratio:.2f}x   (ops=False: {light:.2f}x)")
        results[title] = {
            "trials": n,
            "median_ms": {k: v * 1e3 for k, v in medians.items()},
            "x_plain": {k: v / plain for k, v in medians.items()},
            "x_plain_paired": paired,
            "ours_over_pytorch": ratio,
            "ours_ops_false_over_pytorch": light,
            "cyclic_garbage_per_trial": garbage,
        }
    dist.destroy_process_group()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
