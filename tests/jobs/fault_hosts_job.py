"""A gloo training loop for the simulated-host tests in which one rank fails
(``tests/hosts/test_elsewhere.py``).

Every step broadcasts the weights from rank 0 and all_reduces the gradients. At the
first step from ``FAULT_STEP`` (default 4) on where every rank's dumps carry the job's
host table (the recorder gathers it through the store in its first seconds: a dump
without it cannot say where the other ranks ran), rank ``FAULT_RANK`` (default 1)
fails, by ``FAULT``:

- ``raise``: its data loader raises (a bad batch), which ends its process;
- ``abort``: it posts a buffer too small for the weights rank 0 broadcasts, and gloo
  aborts it (SIGABRT, inside the call: its fatal log says where).

The other ranks' next collective then fails ("Connection closed by peer") and they
raise, as a training script does; torchrun stops the job.
"""

import os
import time

import torch
import torch.distributed as dist

import commscope.flight as flight

FAULT = os.environ.get("FAULT", "raise")
FAULT_RANK = int(os.environ.get("FAULT_RANK", "1"))
FAULT_STEP = int(os.environ.get("FAULT_STEP", "4"))
WEIGHTS = 1 << 14


def _die_with_parent() -> None:
    """A test job must never outlive its launcher (Linux: PR_SET_PDEATHSIG)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def _table_known() -> bool:
    """Whether this rank's dumps carry the job's host table by now."""
    from commscope.flight.api import _recorder

    hosts = _recorder().hosts
    return bool(hosts is not None and hosts.done)


def load_batch(step: int, fault: bool) -> torch.Tensor:
    """A data loader that meets a bad batch on the faulty rank."""
    if fault and FAULT == "raise":
        raise ValueError(f"bad batch at step {step}: label 1043 out of range")
    return torch.ones(4) * step


def main() -> None:
    _die_with_parent()
    dist.init_process_group("gloo")
    for step in range(1_000_000):
        flight.step(step)
        known = torch.tensor([float(_table_known())])
        dist.all_reduce(known)  # the same answer on every rank
        fault = (dist.get_rank() == FAULT_RANK and step >= FAULT_STEP
                 and known.item() == dist.get_world_size())
        small = fault and FAULT == "abort"
        dist.broadcast(torch.ones(2 if small else WEIGHTS), 0)  # gloo aborts a small buffer
        dist.all_reduce(load_batch(step, fault))
        time.sleep(0.05)


if __name__ == "__main__":
    main()
