"""A 4-rank gloo training loop for the ``commscope watch`` tests and the demo's story.

Every step all_reduces a small tensor and marks the step. When the file named by
``STALL_FILE`` appears, rank 3 stalls in its data loader (``load_batch``) and the others
wait in the next all_reduce; it writes ``<STALL_FILE>.at`` with the time it stalled.
"""

import os
import time

import torch
import torch.distributed as dist

import commscope.flight as flight

STALL_FILE = os.environ.get("STALL_FILE", "")


def load_batch(step: int) -> torch.Tensor:
    if dist.get_rank() == 3 and STALL_FILE and os.path.exists(STALL_FILE):
        # written whole or not at all: the test polls for it and reads it at once
        with open(STALL_FILE + ".at.tmp", "w") as f:
            f.write(str(time.time()))
        os.replace(STALL_FILE + ".at.tmp", STALL_FILE + ".at")
        time.sleep(3600)  # a dead NFS mount
    return torch.ones(4) * step


def _die_with_parent() -> None:
    """A test job must never outlive its launcher (Linux: PR_SET_PDEATHSIG)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def main() -> None:
    _die_with_parent()
    dist.init_process_group("gloo")
    for step in range(1_000_000):
        flight.step(step)
        batch = load_batch(step)
        dist.all_reduce(batch)
        time.sleep(0.05)


if __name__ == "__main__":
    main()
