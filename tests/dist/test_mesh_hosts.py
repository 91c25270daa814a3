"""The mesh on ranks that really run on different hosts: real gloo ranks, each in a UTS
namespace of its own with its own hostname (root only; skipped, saying why, elsewhere).

Placements: two hosts of two ranks, uneven hosts (3 + 1), round-robin (ranks 0 and 2 on
hostA, 1 and 3 on hostB, as some mpirun and Slurm distributions place them). Every rank
must draw the same picture, the topology warning must come once per job (rank 0), and
the hostnames must be gathered once (three store requests per rank).
"""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest
import torch.distributed as dist

from tests.hostname import LO, become, why_no_hostnames

pytestmark = pytest.mark.dist

_HOSTS_PREFIX = "commscope/mesh/hosts/"


@pytest.fixture
def hosts_ranks(ranks):
    """``ranks`` with loopback gloo, skipped where a rank cannot have its own hostname."""
    why = why_no_hostnames()
    if why:
        pytest.skip(why)

    def _run(fn, world_size, *args, **kwargs):
        return ranks(fn, world_size, *args, env=LO, timeout=90, **kwargs)

    return _run


class _CountingStore:
    """The default store, counting the requests that touch the host keys."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.requests: list[str] = []

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.inner, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            keys = args[0] if args else ""
            keys = keys if isinstance(keys, list) else [keys]
            if any(str(k).startswith(_HOSTS_PREFIX) for k in keys):
                self.requests.append(name)
            return method(*args, **kwargs)

        return call


def _capture() -> tuple[list[logging.LogRecord], _CountingStore]:
    """Collect every commscope.mesh log record at WARNING and count host-key requests."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # type: ignore[method-assign]
    logging.getLogger("commscope.mesh").addHandler(handler)
    c10d = dist.distributed_c10d
    counting = _CountingStore(c10d._get_default_store())
    c10d._get_default_store = lambda: counting  # this forked rank only
    return records, counting


def _job(rank: int, world: int, hostnames: list[str], shape: tuple, names: tuple) -> dict:
    from commscope.mesh import init_device_mesh

    become(hostnames[rank])
    records, store = _capture()
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    first_requests = list(store.requests)
    again = init_device_mesh("cpu", shape, mesh_dim_names=names)  # gathered: no new request
    tp = mesh["tp"]
    return {
        "picture": mesh.describe(),
        "again": again.describe(),
        "tp_picture": tp.describe(),
        "flat_hosts": mesh.flatten("dp_tp").hosts.names,
        "hosts": (mesh.hosts.names, mesh.hosts.host_index.tolist(), mesh.hosts.gathered),
        "tp_inside": next(x.intra_host for x in mesh.locality() if x.axis == "tp"),
        "warnings": [r.getMessage() for r in records],
        "first_requests": first_requests,
        "requests": list(store.requests),
    }


def _agree(results: list[dict]) -> dict:
    """Every rank drew the same picture of the same hosts; rank 0's results."""
    first = results[0]
    for key in ("hosts", "tp_inside", "flat_hosts"):
        assert all(r[key] == first[key] for r in results), key
    # the same but for the rank in brackets and the rank's own line
    strip = {re.sub(r"[\[\] ]+", " ", r["picture"].rsplit("\nrank ", 1)[0]).replace(" \n", "\n")
             for r in results}
    assert len(strip) == 1, strip
    return first


def _gathered_once(results: list[dict]) -> None:
    for rank, r in enumerate(results):
        expected = ["set", "multi_get", "set"] if rank == 0 else ["set", "wait", "get"]
        assert r["first_requests"] == expected, (rank, r["first_requests"])
        assert r["requests"] == expected, "a second mesh, a slice or a flatten gathered again"


def test_two_hosts_of_two_ranks(hosts_ranks):
    results = hosts_ranks(_job, 4, ["hostA", "hostA", "hostB", "hostB"], (2, 2), ("dp", "tp"))
    r = _agree(results)
    _gathered_once(results)
    assert r["hosts"] == (("hostA", "hostB"), [0, 0, 1, 1], True)
    assert "4 ranks, 2 hosts of 2 ranks (hostA, hostB)" in r["picture"]
    assert "[0 hostA]" in r["picture"] and "3 hostB" in r["picture"]
    assert "tp  2 ranks per group, 2 groups: inside a host" in r["picture"]
    assert "dp  2 ranks per group, 2 groups: crosses hosts" in r["picture"]
    assert r["tp_inside"] and all(x["warnings"] == [] for x in results)
    assert "rank 0: (dp=0, tp=0), host hostA" in r["picture"]
    assert "2 ranks of 4, 1 host (hostA)" in r["tp_picture"]
    assert "2 ranks of 4, 1 host (hostB)" in results[3]["tp_picture"]


def test_uneven_hosts(hosts_ranks):
    results = hosts_ranks(_job, 4, ["hostA", "hostA", "hostA", "hostB"], (2, 2), ("dp", "tp"))
    r = _agree(results)
    _gathered_once(results)
    assert r["hosts"] == (("hostA", "hostB"), [0, 0, 0, 1], True)
    assert "4 ranks, 2 hosts (hostA: 3 ranks, hostB: 1)" in r["picture"]
    assert "tp  2 ranks per group, 2 groups: crosses hosts (1 of 2 groups spans 2 hosts)" in (
        r["picture"])
    warnings = [w for x in results for w in x["warnings"]]
    assert len(warnings) == 1 and results[0]["warnings"] == warnings
    assert "mesh axis 'tp' (2 ranks) crosses hosts" in warnings[0]
    assert "group [2, 3] joins hostA (rank 2) and hostB (rank 3)" in warnings[0]
    assert "launch the same number of ranks on every host" in warnings[0]


def test_round_robin_placement_warns_once_per_job(hosts_ranks):
    results = hosts_ranks(_job, 4, ["hostA", "hostB", "hostA", "hostB"], (2, 2), ("dp", "tp"))
    r = _agree(results)
    _gathered_once(results)
    assert r["hosts"] == (("hostA", "hostB"), [0, 1, 0, 1], True)
    assert not r["tp_inside"]
    assert "[0 hostA]   1 hostB" in r["picture"]
    assert "tp  2 ranks per group, 2 groups: crosses hosts (every group spans 2 hosts)" in (
        r["picture"])
    assert "dp  2 ranks per group, 2 groups: inside a host" in r["picture"]
    warnings = [w for x in results for w in x["warnings"]]  # the whole job's log
    assert len(warnings) == 1 and results[0]["warnings"] == warnings
    assert warnings[0] == (
        "commscope mesh: mesh axis 'tp' (2 ranks) crosses hosts (every group spans 2 hosts): "
        "group [0, 1] joins hostA (rank 0) and hostB (rank 1), so its collectives go over "
        "the network; to keep 'tp' inside a host, use mesh_shape (2, 2) with "
        "mesh_dim_names ('tp', 'dp')."
    )


def test_round_robin_with_the_fix_is_quiet(hosts_ranks):
    results = hosts_ranks(_job, 4, ["hostA", "hostB", "hostA", "hostB"], (2, 2), ("tp", "dp"))
    r = _agree(results)
    assert r["tp_inside"] and all(x["warnings"] == [] for x in results)
    assert "tp  2 ranks per group, 2 groups: inside a host" in r["picture"]


def _part_of_the_job(rank: int, world: int, hostnames: list[str]) -> dict:
    """Ranks 0 and 1 make a mesh of their own group; ranks 2 and 3 make none."""
    from commscope.mesh import DeviceMesh, init_device_mesh

    become(hostnames[rank])
    out: dict[str, Any] = {}
    if rank < 2:
        group = dist.new_group([0, 1], use_local_synchronization=True)
        mesh = DeviceMesh.from_group(group, "cpu", mesh_dim_names=("tp",))
        out["picture"] = mesh.describe()  # reads ranks 0 and 1 only: never waits for 2, 3
    # a smaller mesh by init_device_mesh (every rank calls it): ranks 2, 3 are outside
    small = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    out["small"] = small.hosts.names if rank < 2 else small.get_coordinate()
    return out


def test_a_mesh_of_some_ranks_reads_only_theirs(hosts_ranks):
    results = hosts_ranks(_part_of_the_job, 4, ["hostA", "hostB", "hostA", "hostB"])
    for rank, host in ((0, "hostA"), (1, "hostB")):
        picture = results[rank]["picture"]
        assert "2 ranks, 2 hosts of 1 rank (hostA, hostB)" in picture
        assert f"[{rank} {host}]" in picture and f"rank {rank}: (tp={rank}), host {host}" in picture
    assert [r["small"] for r in results] == [("hostA", "hostB")] * 2 + [None, None]


def _arithmetic(rank: int, world: int) -> tuple[list[str], str]:
    from commscope.mesh import init_device_mesh

    records, store = _capture()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("tp", "dp"), ranks_per_host=2)
    init_device_mesh("cpu", (2, 2), mesh_dim_names=("tp", "dp"), ranks_per_host=2)
    assert store.requests == []  # told the hosts: nothing gathered
    return [r.getMessage() for r in records], mesh.describe()


def test_ranks_per_host_given_keeps_the_arithmetic(ranks):
    results = ranks(_arithmetic, 4, timeout=60)
    messages, picture = results[0]
    assert all(m == [] for m, _ in results[1:])
    assert len(messages) == 1
    assert "mesh axis 'tp' (2 ranks) crosses hosts" in messages[0]
    assert "group [0, 2] joins h0 (rank 0) and h1 (rank 2)" in messages[0]
    assert "use mesh_shape (2, 2) with mesh_dim_names ('dp', 'tp')" in messages[0]
    assert "4 ranks, 2 hosts of 2 ranks\n" in picture
    assert "[0 h0]" in picture and "2 h1" in picture
    assert "tp  2 ranks per group, 2 groups: crosses hosts" in picture
