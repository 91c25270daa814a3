"""``commscope diff`` on dumps written by real gloo ranks (the unit tests use the fake group).

Here, not in tests/unit: a rank forked after the test process ran a backward pass cannot
use autograd on torch's CUDA builds ("Autograd and Fork"); tests/matrix.py runs the
forked-rank folder first.
"""

from __future__ import annotations

import pytest

from commscope.comm import diff
from tests.unit.test_comm_diff import AG_BYTES, _ag_us, _key, _step


def _gloo_dumps(rank: int, world: int, out: str) -> list[str]:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from commscope.comm import CommDebugMode

    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    paths = []
    for name in ("A", "B"):
        cm = _step(name, mesh, CommDebugMode)
        path = f"{out}/{name}_rank{rank}.json"
        cm.generate_json_dump(path, noise_level=0)
        paths.append(path)
    dist.barrier()
    return paths


@pytest.mark.dist
def test_gloo_ranks_give_the_same_diff(ranks, tmp_path):
    """The same plans on 2 real gloo ranks: every rank's dumps give the fake group's diff."""
    for a, b in ranks(_gloo_dumps, 2, str(tmp_path)):
        d = diff(a, b)
        assert [(_key(r), r.calls_delta, r.bytes_delta) for r in d.changed] == [
            (("MLPModule.net1", "forward", "all_gather", "tp"), 1, AG_BYTES),
            (("MLPModule.net2", "backward", "all_gather", "tp"), 1, AG_BYTES),
        ]
        assert d.totals.est_us_delta == pytest.approx(2 * _ag_us(2))
        assert d.unchanged_count == 1
