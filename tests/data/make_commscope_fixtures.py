"""Regenerate the fixture folders that need commscope's own dump format.

Usage (from the repository root)::

    .venv/bin/python tests/data/make_commscope_fixtures.py

gloo's native recorder writes no p2p records and no timings, so these failures cannot
come from a native gloo dump. Until they are recorded by ``commscope.flight`` on real
ranks, they are written by the documented generator
:class:`commscope.analyze.synth.SyntheticJob` in the agreed ``commscope.flight/1``
format. Each scenario below is fully described by its function.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from commscope.analyze.synth import SyntheticJob  # noqa: E402

DATA = Path(__file__).resolve().parent
TRAIN = "/home/user/train.py"


def p2p_unmatched(out: Path) -> None:
    """4-stage pipeline: 3 healthy steps of 0->1->2->3 sends and a gradient all_reduce;
    then rank 2 sends its activations to rank 3, which never posts the recv; rank 2
    waits in the send."""
    job = SyntheticJob(4)
    pp = job.group("1", "mesh_pp", [0, 1, 2, 3])
    for _ in range(3):
        for src in range(3):
            job.p2p(src, src + 1, group=pp, sizes=[[8, 16]], where=("forward", TRAIN, 120))
        job.collective("all_reduce", where=("sync_grads", TRAIN, 150))
    job.p2p(0, 1, group=pp, sizes=[[8, 16]], where=("forward", TRAIN, 120))
    job.p2p(1, 2, group=pp, sizes=[[8, 16]], where=("forward", TRAIN, 120))
    job.p2p(2, 3, group=pp, sizes=[[8, 16]], post="send", where=("forward", TRAIN, 120))
    job.write(out)


def straggler(out: Path) -> None:
    """4 ranks, 20 all_reduces that all complete; rank 3 arrives 120 ms after the others
    every time (a slow data loader)."""
    job = SyntheticJob(4, step_ns=200_000_000)
    for i in range(20):
        job.collective("all_reduce", sizes=[[1024]], arrive={3: 120_000_000},
                       where=("train_step", TRAIN, 60 + i % 2))
    job.write(out)


def stale_dump(out: Path) -> None:
    """4 ranks; rank 1 dies after all_reduce #5 (its last dump, from an exception
    handler, is 5 minutes older than the others'); ranks 0, 2, 3 wait in #6."""
    job = SyntheticJob(4)
    for _ in range(5):
        job.collective("all_reduce", where=("train_step", TRAIN, 60))
    job.collective("all_reduce", ranks=[0, 2, 3], where=("train_step", TRAIN, 60))
    late = job.clock + 10 * 60 * 10**9
    job.write(out, dump_times={0: late, 1: late - 5 * 60 * 10**9, 2: late, 3: late})


def stalled_collective(out: Path) -> None:
    """2 ranks both inside all_reduce #3 with the same sizes, dumped on timeout 10
    minutes later: the program agrees, the transport is stuck."""
    job = SyntheticJob(2)
    job.collective("all_reduce", where=("train_step", TRAIN, 60))
    job.collective("broadcast", where=("train_step", TRAIN, 61))
    job.collective("all_reduce", stuck=True, where=("train_step", TRAIN, 60))
    late = job.clock + 10 * 60 * 10**9
    job.write(out, dump_times={0: late, 1: late})


def p2p_size_mismatch(out: Path) -> None:
    """2 ranks: rank 0 sends 8x16 floats, rank 1's matching recv takes 8x32; both wait."""
    job = SyntheticJob(2)
    job.collective("all_reduce", where=("train_step", TRAIN, 60))
    job.p2p(0, 1, sizes=[[8, 16]], recv_sizes=[[8, 32]], where=("exchange", TRAIN, 90))
    job.write(out)


SCENARIOS: dict[str, Callable[[Path], None]] = {
    "p2p_unmatched": p2p_unmatched,
    "straggler": straggler,
    "stale_dump": stale_dump,
    "stalled_collective": stalled_collective,
    "p2p_size_mismatch": p2p_size_mismatch,
}

def main(argv: list[str]) -> int:
    names = argv or list(SCENARIOS)
    for name in names:
        out = DATA / name
        if out.exists():
            shutil.rmtree(out)
        SCENARIOS[name](out)
        print(f"{name}: {sorted(p.name for p in out.iterdir())}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
