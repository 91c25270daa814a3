"""A short gloo training loop for the simulated-host straggler tests
(``tests/hosts/test_stragglers.py``).

``STEPS`` steps (default 40): every rank does its ordinary host-side work (2-12 ms,
uniform, the same distribution everywhere), the ranks of ``SLOW_RANKS`` (global ranks,
comma-separated; none by default) sleep another 40-60 ms in their data loader, then
everyone all_reduces. At the end each rank dumps (``flight.dump()``), waits for the
others at a barrier and leaves: the job ends by itself.
"""

import os
import random
import time

import torch
import torch.distributed as dist

import commscope.flight as flight

STEPS = int(os.environ.get("STEPS", "40"))
SLOW_RANKS = {int(r) for r in os.environ.get("SLOW_RANKS", "").split(",") if r.strip()}


def _die_with_parent() -> None:
    """A test job must never outlive its launcher (Linux: PR_SET_PDEATHSIG)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def load_batch(rng: random.Random, step: int) -> torch.Tensor:
    """The data loader: slow on the ranks of ``SLOW_RANKS``."""
    if dist.get_rank() in SLOW_RANKS:
        time.sleep(rng.uniform(0.04, 0.06))
    return torch.ones(256) * step


def _clock_measured(limit_s: float = 20.0) -> None:
    """Wait until this rank has measured its clock's offset to rank 0's (its watchdog
    does it once rank 0 answers, retrying every second), then for every rank: the
    steps are all timed on one clock. A job dumped before that carries no offset, and
    the analyzer names no straggler across hosts in it (tests/unit covers that)."""
    from commscope.flight.api import _state  # the test's peek at its own recorder

    rec = _state.recorder
    deadline = time.monotonic() + limit_s
    while (dist.get_rank() != 0 and rec is not None and rec.clock is None
           and time.monotonic() < deadline):
        time.sleep(0.05)
    dist.barrier()


def main() -> None:
    """Init, wait for the clocks, the steps, dump, leave (see module doc)."""
    _die_with_parent()
    dist.init_process_group("gloo")
    _clock_measured()
    rng = random.Random(dist.get_rank())
    for step in range(STEPS):
        flight.step(step)
        time.sleep(rng.uniform(0.002, 0.012))  # ordinary work, with jitter
        dist.all_reduce(load_batch(rng, step))
    flight.dump()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
