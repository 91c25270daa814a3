"""Write PyTorch's own NCCL flight-recorder dumps for the analyzer's tests (needs a GPU).

Usage (from the repository root, on a machine with one CUDA GPU)::

    python tests/data/make_nccl_fixtures.py

NCCL refuses two ranks on one GPU, so each job is one rank (``WORLD_SIZE=1``) with the
native recorder on (``TORCH_FR_BUFFER_SIZE=2000``, timing on). The dump is the bytes of
``torch._C._distributed_c10d._dump_nccl_trace()``, exactly what PyTorch's watchdog
writes to ``TORCH_FR_DUMP_TEMP_FILE<rank>``:

* ``nccl_native/healthy/rank_0``: all_reduce, broadcast, all_gather_into_tensor,
  reduce_scatter_tensor, an all_reduce on a ``new_group``, barrier, an async
  all_reduce; every record completed;
* ``nccl_native/pending/rank_0``: the same, then a long kernel on the stream and one
  more all_reduce queued behind it, dumped while it is still ``scheduled``.

Each job runs in its own process (a fresh CUDA context and NCCL communicator).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

JOB = r"""
import os, sys, torch, torch.distributed as dist
out, pending = sys.argv[1], sys.argv[2] == "1"
dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
sub = dist.new_group([0])
t = torch.ones(1024, device="cuda")
dist.all_reduce(t)
dist.broadcast(t, 0)
gathered = torch.empty(1024, device="cuda")
dist.all_gather_into_tensor(gathered, t)
dist.reduce_scatter_tensor(t, gathered)
dist.all_reduce(t, group=sub)
dist.barrier()
dist.all_reduce(t, async_op=True).wait()
torch.cuda.synchronize()
if pending:
    torch.cuda._sleep(int(3e9))
    dist.all_reduce(t)
data = torch._C._distributed_c10d._dump_nccl_trace()
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "rank_0"), "wb") as f:
    f.write(data)
torch.cuda.synchronize()
dist.destroy_process_group()
"""


def main() -> None:
    """Run both jobs and write their dumps under ``tests/data/nccl_native/``."""
    env = dict(
        os.environ,
        TORCH_FR_BUFFER_SIZE="2000",
        TORCH_NCCL_ENABLE_TIMING="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=os.environ.get("MASTER_PORT", "29531"),
        RANK="0",
        WORLD_SIZE="1",
        LOCAL_RANK="0",
    )
    for name, pending in (("healthy", "0"), ("pending", "1")):
        out = HERE / "nccl_native" / name
        subprocess.run([sys.executable, "-c", JOB, str(out), pending], env=env, check=True,
                       timeout=300)
        print(f"wrote {out / 'rank_0'}")


if __name__ == "__main__":
    main()
