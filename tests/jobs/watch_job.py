"""A 4-rank gloo training loop for the ``commscope watch`` tests and the demo's story.

Every step all_reduces a small tensor and marks the step. When the file named by
``STALL_FILE`` appears, rank 3 stalls in its data loader (``load_batch``) and the others
wait in the next all_reduce; it writes ``<STALL_FILE>.at`` with the time it stalled.
When the file named by ``DESYNC_FILE`` appears, rank 1 all-reduces its batch once as
int32 where the others pass float32 (the same byte count: nothing hangs, the job runs on
with a wrong sum) and writes ``<DESYNC_FILE>.at``. While the file named by ``SLOW_FILE``
exists, rank 2's data loader takes 80 ms longer each step (a slow disk): every
all_reduce waits for it. ``STEP_S``: the pause after each step (default 0.05 s: about 20
steps a second).
"""

import os
import time

import torch
import torch.distributed as dist

import commscope.flight as flight

STALL_FILE = os.environ.get("STALL_FILE", "")
DESYNC_FILE = os.environ.get("DESYNC_FILE", "")
SLOW_FILE = os.environ.get("SLOW_FILE", "")
STEP_S = float(os.environ.get("STEP_S", "0.05"))
_desynced = []


def _mark(path: str) -> None:
    """Write ``<path>.at`` with the time now, whole or not at all (the test polls it)."""
    with open(path + ".at.tmp", "w") as f:
        f.write(str(time.time()))
    os.replace(path + ".at.tmp", path + ".at")


def load_batch(step: int) -> torch.Tensor:
    if dist.get_rank() == 3 and STALL_FILE and os.path.exists(STALL_FILE):
        _mark(STALL_FILE)
        time.sleep(3600)  # a dead NFS mount
    if dist.get_rank() == 2 and SLOW_FILE and os.path.exists(SLOW_FILE):
        time.sleep(0.08)
    if dist.get_rank() == 1 and DESYNC_FILE and not _desynced and os.path.exists(DESYNC_FILE):
        _desynced.append(step)
        _mark(DESYNC_FILE)
        return torch.ones(4, dtype=torch.int32) * step  # a cast the others do not do
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
        time.sleep(STEP_S)


if __name__ == "__main__":
    main()
