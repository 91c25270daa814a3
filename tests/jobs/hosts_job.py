"""A gloo training loop for the simulated-host tests (``tests/hosts/``).

Every step all_reduces a small tensor and marks the step. Rank ``STALL_RANK`` (default 3)
stalls in its data loader (``load_batch``), and the others then wait in the next
all_reduce, once its step reaches ``STALL_STEP`` or once the file ``STALL_FILE`` (a path
on its own host, relative to the job's folder) exists. When it stalls it writes
``stall.at`` beside it (in the working folder for ``STALL_STEP``) with the time.

With ``SURVIVE=1``, a rank whose all_reduce fails (a peer's process or host died: gloo
reports the closed connection) stays alive and idle instead of raising, as a rank blocked
until its collective's timeout would (NCCL): the job's store and the survivors' records
outlive the dead peers, and torchrun does not stop the job.
"""

import os
import time

import torch
import torch.distributed as dist

import commscope.flight as flight

STALL_RANK = int(os.environ.get("STALL_RANK", "3"))
STALL_STEP = int(os.environ.get("STALL_STEP", "-1"))
STALL_FILE = os.environ.get("STALL_FILE", "")
SURVIVE = os.environ.get("SURVIVE") == "1"


def _stall_now(step: int) -> bool:
    if dist.get_rank() != STALL_RANK:
        return False
    return step == STALL_STEP or bool(STALL_FILE and os.path.exists(STALL_FILE))


def load_batch(step: int) -> torch.Tensor:
    if _stall_now(step):
        at = os.path.join(os.path.dirname(STALL_FILE) or ".", "stall.at")
        with open(at + ".tmp", "w") as f:  # whole or not at all: the test polls for it
            f.write(str(time.time()))
        os.replace(at + ".tmp", at)
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
        try:
            dist.all_reduce(batch)
        except RuntimeError:
            if not SURVIVE:
                raise
            time.sleep(3600)  # a peer died: stay, as a rank blocked until a timeout does
        time.sleep(0.05)


if __name__ == "__main__":
    main()
