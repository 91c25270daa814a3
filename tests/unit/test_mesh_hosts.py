"""Hosts of a mesh without processes: the host table, locality and the warning under any
placement, the store protocol that gathers hostnames (at 4096 ranks, on an in-memory
store), and torch's fake process group (nothing to gather: arithmetic)."""

from __future__ import annotations

import logging
import time
import zlib
from datetime import timedelta
from typing import Any

import pytest
import torch.distributed as dist

from commscope.mesh import HostTable, MeshLayout, describe_mesh, gather
from commscope.mesh.errors import MeshError
from commscope.mesh.topology import axis_locality, crossing_warnings, warn_crossing_hosts

# ------------------------------------------------------------------ the table


def test_hosts_are_numbered_by_their_lowest_rank():
    t = HostTable.from_hostnames(["b", "a", "b", "c"])
    assert t.names == ("b", "a", "c") and t.host_index.tolist() == [0, 1, 0, 2]
    assert t.counts.tolist() == [2, 1, 1] and t.ranks_per_host is None
    assert t.ranks_on(0) == [0, 2] and not t.is_consecutive
    assert t.first(2).names == ("b", "a") and t.first(1).names == ("b",)
    with pytest.raises(MeshError, match=r"ranks 0\.\.4"):
        t.first(5)


def test_arithmetic_table_is_torchruns_placement():
    t = HostTable.consecutive(10, 4)
    assert t.host_index.tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2]
    assert t.names == ("h0", "h1", "h2") and not t.gathered and t.is_consecutive
    with pytest.raises(MeshError, match=">= 1"):
        HostTable.consecutive(4, 0)


@pytest.mark.parametrize(
    ("names", "summary"),
    [
        (["devbox"] * 4, "1 host (devbox)"),
        (["hostA", "hostA", "hostB", "hostB"], "2 hosts of 2 ranks (hostA, hostB)"),
        (["hostA", "hostA", "hostA", "hostB"], "2 hosts (hostA: 3 ranks, hostB: 1)"),
        # the first host alone: one rank, not "1 ranks" (seen on simulated uneven hosts)
        (["hostA", "hostB", "hostB", "hostB"], "2 hosts (hostA: 1 rank, hostB: 3)"),
        ([f"n{i}" for i in (0, 0, 0, 1, 1, 2, 2, 2, 3, 4, 5)],
         "6 hosts of 1 to 3 ranks (n0: 3 ranks, n1: 2, n2: 3, n3: 1, ...)"),
        ([f"node{r // 8}" for r in range(64)], "8 hosts of 8 ranks"),
    ],
)
def test_summary(names, summary):
    assert HostTable.from_hostnames(names).summary() == summary


def test_arithmetic_summary_is_unchanged():
    assert HostTable.consecutive(4, 4).summary() == "1 host of 4 ranks"
    assert HostTable.consecutive(16384, 8).summary() == "2048 hosts of 8 ranks"


def test_labels_short_names_or_a_legend():
    fqdn = HostTable.from_hostnames(["a1.cluster.example.com", "a2.cluster.example.com"])
    assert fqdn.labels == ("a1", "a2") and fqdn.legend() == []
    same_short = HostTable.from_hostnames(["a.x", "a.y"])
    assert same_short.labels == ("a.x", "a.y")
    many = HostTable.from_hostnames([f"gpu-node-{r // 8:05d}.cluster" for r in range(8 * 20)])
    assert many.labels[:2] == ("h0", "h1")
    legend = many.legend()
    assert legend[0] == "h0 = gpu-node-00000.cluster: ranks [0..7]"
    assert legend[-1] == "... and 12 more hosts" and len(legend) == 9


def test_among_names_the_hosts_of_some_ranks():
    t = HostTable.from_hostnames(["a", "b", "c", "a", "b", "c"])
    sub = t.among([5, 2, 4])
    assert sub.names == ("c", "b") and sub.summary() == "2 hosts (c: 2 ranks, b: 1)"


# ------------------------------------------------------------------ locality, any placement


def test_round_robin_placement():
    t = HostTable.from_hostnames(["hostA", "hostB"] * 2)
    dp, tp = axis_locality(MeshLayout.create((2, 2), ("dp", "tp")), t)
    assert dp.intra_host and not tp.intra_host and tp.crossing_groups == 2


def test_uneven_hosts():
    t = HostTable.from_hostnames(["hostA"] * 3 + ["hostB"])
    _, tp = axis_locality(MeshLayout.create((2, 2), ("dp", "tp")), t)
    assert tp.crossing_groups == 1
    assert tp.describe() == "crosses hosts (1 of 2 groups spans 2 hosts)"


@pytest.mark.parametrize("shape", [(2, 4, 8), (4, 16), (64,), (8, 2, 2, 2)])
@pytest.mark.parametrize("per_host", [1, 4, 8, 16])
def test_a_consecutive_table_agrees_with_the_arithmetic(shape, per_host):
    names = tuple(f"a{i}" for i in range(len(shape)))
    layout = MeshLayout.create(shape, names)
    hostnames = [f"node{r // per_host}" for r in range(layout.world_size)]
    scrambled = HostTable.from_hostnames(hostnames[::-1])  # same hosts, other numbering
    by_table = axis_locality(layout, HostTable.from_hostnames(hostnames))
    assert by_table == axis_locality(layout, per_host)
    assert [x.intra_host for x in axis_locality(layout, scrambled)] == [
        x.intra_host for x in by_table
    ]


# ------------------------------------------------------------------ the warning


def _warn(names: list[str], shape: tuple, axes: tuple) -> list[str]:
    return crossing_warnings(MeshLayout.create(shape, axes), HostTable.from_hostnames(names))


def test_warning_names_axis_hosts_and_an_order_that_fits():
    (w,) = _warn(["hostA", "hostB"] * 2, (2, 2), ("dp", "tp"))
    assert w == (
        "mesh axis 'tp' (2 ranks) crosses hosts (every group spans 2 hosts): group [0, 1] "
        "joins hostA (rank 0) and hostB (rank 1), so its collectives go over the network; "
        "to keep 'tp' inside a host, use mesh_shape (2, 2) with mesh_dim_names ('tp', 'dp')."
    )
    assert _warn(["hostA", "hostB"] * 2, (2, 2), ("tp", "dp")) == []


def test_warning_says_why_no_order_fits():
    (uneven,) = _warn(["hostA"] * 3 + ["hostB"], (2, 2), ("dp", "tp"))
    assert "hosts hold different numbers of ranks (hostA: 3, hostB: 1)" in uneven
    (big,) = _warn([f"n{r // 6}" for r in range(12)], (1, 12), ("dp", "tp"))
    assert "no host holds 12 ranks (the largest holds 6): make 'tp' at most 6 ranks" in big
    (odd,) = _warn([f"n{r // 6}" for r in range(12)], (3, 4), ("dp", "tp"))
    assert "group [4..7] joins n0 (ranks 4, 5) and n1 (ranks 6, 7)" in odd
    assert "make the size of 'tp' divide the 6 ranks of each host" in odd


def test_warning_says_what_the_fix_costs_another_fast_axis():
    (w,) = _warn([f"n{r % 4}" for r in range(16)], (2, 2, 4), ("dp", "cp", "tp"))
    assert "mesh_dim_names ('tp', 'dp', 'cp') (then 'cp' crosses hosts)" in w


def test_warned_once_by_rank_0_only(caplog, monkeypatch):
    from commscope.mesh import topology

    monkeypatch.setattr(topology, "_warned", set())
    layout = MeshLayout.create((2, 2), ("dp", "tp"))
    table = HostTable.from_hostnames(["hostA", "hostB"] * 2)
    with caplog.at_level(logging.WARNING, logger="commscope.mesh"):
        assert warn_crossing_hosts(layout, table, rank=1) == []
        for _ in range(3):
            assert len(warn_crossing_hosts(layout, table, rank=0)) == 1
    assert len(caplog.records) == 1
    assert caplog.records[0].getMessage().startswith("commscope mesh: mesh axis 'tp'")


def test_describe_draws_real_hosts_and_a_legend_at_scale():
    t = HostTable.from_hostnames([f"gpu-node-{r // 8:05d}.cluster" for r in range(8 * 20)])
    text = describe_mesh(MeshLayout.create((20, 8), ("dp", "tp")), rank=9, hosts=t)
    assert "160 ranks, 20 hosts of 8 ranks" in text
    assert "[9 h1]" in text and "hosts: h0 = gpu-node-00000.cluster: ranks [0..7]" in text
    assert "rank 9: (dp=1, tp=1), host h1" in text
    one_d = describe_mesh(MeshLayout.create((2,), ("tp",)), rank=0,
                          hosts=HostTable.from_hostnames(["a", "b"]))
    assert "tp: [0 a]   1 b" in one_d


# ------------------------------------------------------------------ the store protocol


class _Owner:
    """Stands for one rank's default process group (weak-referenceable)."""


class _Counting:
    """A store that counts the requests each simulated rank makes."""

    def __init__(self, inner: Any, multi_get: bool = True) -> None:
        self.inner = inner
        self.requests: list[str] = []
        self.read_bytes = 0
        self.has_multi_get = multi_get

    def set(self, key: str, value: Any) -> None:
        self.requests.append("set")
        self.inner.set(key, value)

    def get(self, key: str) -> bytes:
        self.requests.append("get")
        value = self.inner.get(key)
        self.read_bytes += len(value)
        return value

    def wait(self, keys: list[str], timeout: timedelta) -> None:
        self.requests.append("wait")
        self.inner.wait(keys, timeout)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        self.requests.append("multi_get")
        if not self.has_multi_get:  # a Python store on a torch whose Store lacks a default
            raise RuntimeError("INTERNAL ASSERT FAILED: Not implemented.")
        values = self.inner.multi_get(keys)
        self.read_bytes += sum(len(v) for v in values)
        return values


def _simulate(monkeypatch, hostnames: list[str], sample: list[int], **store_kw: Any):
    """Every rank publishes, rank 0 gathers, then the sampled ranks read the table."""
    world = len(hostnames)
    inner = dist.HashStore()
    stores = {r: _Counting(inner, **store_kw) for r in [0, *sample]}
    owners = {r: _Owner() for r in stores}
    for r in range(world):
        monkeypatch.setattr(gather, "this_host", lambda r=r: hostnames[r])
        gather.publish(stores.get(r) or inner, owners.get(r) or _Owner(), r, world)
    t0 = time.perf_counter()
    tables = {0: gather.gather_job(stores[0], owners[0], 0, world, timedelta(seconds=5))}
    rank0_s = time.perf_counter() - t0
    for r in sample:
        tables[r] = gather.gather_job(stores[r], owners[r], r, world, timedelta(seconds=5))
    return stores, owners, tables, rank0_s


def test_gathering_costs_three_requests_per_rank_at_4096_ranks(monkeypatch):
    world, sample = 4096, [1, 8, 2049, 4095]
    names = [f"gpu-node-{r // 8:04d}.cluster.example.com" for r in range(world)]
    stores, owners, tables, rank0_s = _simulate(monkeypatch, names, sample)
    assert stores[0].requests == ["set", "multi_get", "set"]
    for r in sample:
        assert stores[r].requests == ["set", "wait", "get"], r
        assert stores[r].read_bytes < 4096, "the table a rank reads stays small"
        assert tables[r].names == tables[0].names
        assert tables[r].host_index.tolist() == tables[0].host_index.tolist()
    assert tables[0].num_hosts == 512 and tables[0].ranks_per_host == 8
    assert rank0_s < 2.0
    # a second mesh, a slice or a flatten of any rank asks the store nothing
    again = gather.gather_job(stores[1], owners[1], 1, world, timedelta(seconds=5))
    assert again is tables[1] and stores[1].requests == ["set", "wait", "get"]


def test_round_robin_table_at_4096_ranks(monkeypatch):
    names = [f"gpu-node-{r % 512:04d}" for r in range(4096)]
    stores, _, tables, _ = _simulate(monkeypatch, names, [4095])
    assert tables[4095].host_index.tolist() == [r % 512 for r in range(4096)]
    assert stores[4095].read_bytes < 8192


def test_a_store_without_multi_get_is_read_key_by_key(monkeypatch):
    names = ["hostA", "hostB"] * 4
    stores, _, tables, _ = _simulate(monkeypatch, names, [3], multi_get=False)
    assert stores[0].requests == ["set", "multi_get", *["get"] * 8, "set"]
    assert tables[3].host_index.tolist() == [0, 1] * 4


def test_when_rank_0_fails_the_others_fail_at_once():
    inner = dist.HashStore()

    class Broken(_Counting):
        def multi_get(self, keys: list[str]) -> list[bytes]:  # type: ignore[override]
            raise OSError("store went away")

        def get(self, key: str) -> bytes:
            raise OSError("store went away")

    with pytest.raises(gather.GatherFailed, match="rank 0 could not read"):
        gather.gather_job(Broken(inner), _Owner(), 0, 4, timedelta(seconds=5))
    t0 = time.perf_counter()
    other, owner = _Counting(inner), _Owner()
    with pytest.raises(gather.GatherFailed, match="rank 0 could not read"):
        gather.gather_job(other, owner, 2, 4, timedelta(seconds=30))
    assert time.perf_counter() - t0 < 5
    # the next mesh of the job gets the same answer, without asking the store again
    with pytest.raises(gather.GatherFailed, match="rank 0 could not read"):
        gather.gather_job(other, owner, 2, 4, timedelta(seconds=30))
    assert other.requests == ["wait", "get"]


def test_a_mesh_of_some_ranks_waits_only_for_them(monkeypatch):
    inner = dist.HashStore()
    for r in range(2):  # ranks 2..7 never publish
        monkeypatch.setattr(gather, "this_host", lambda r=r: f"host{r}")
        gather.publish(inner, _Owner(), r, 8)
    table = gather.gather_first(_Counting(inner), _Owner(), 2, 8, timedelta(seconds=5))
    assert table.names == ("host0", "host1")
    with pytest.raises(gather.GatherFailed, match=r"ranks 0\.\.2 did not all publish"):
        gather.gather_first(inner, _Owner(), 3, 8, timedelta(milliseconds=200))


@pytest.mark.parametrize(
    "blob",
    [
        b"",
        b"not zlib",
        zlib.compress(b"[1, 2]"),
        zlib.compress(b'{"version": 1, "hosts": ["a"], "rank_host": [0, 1]}'),
        zlib.compress(b'{"version": 1, "hosts": ["a"], "rank_host": [0, true]}'),
        zlib.compress(b'{"version": 2, "hosts": ["a"], "rank_host": [0, 0]}'),
        "bomb",  # inflates past the limit
    ],
)
def test_a_foreign_table_is_refused(blob):
    if blob == "bomb":
        packer = zlib.compressobj()
        blob = b"".join(packer.compress(b" " * (1 << 20)) for _ in range(100)) + packer.flush()
    with pytest.raises(gather.GatherFailed, match="unreadable"):
        gather.decode_table(blob, 2)


def test_table_round_trip():
    t = HostTable.from_hostnames(["b", "a", "b", "c"])
    back = gather.decode_table(gather.encode_table(t), 4)
    assert back.names == t.names and back.host_index.tolist() == t.host_index.tolist()


# ------------------------------------------------------------------ fake process group


def test_fake_process_group_keeps_the_arithmetic(fake_pg, monkeypatch):
    """torch's fake group has no store to gather through: hosts come from
    LOCAL_WORLD_SIZE, with no store request and no error."""
    from commscope.mesh import init_device_mesh

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    with fake_pg(5, 4096):
        mesh = init_device_mesh("cpu", (512, 8), mesh_dim_names=("dp", "tp"))
        assert not mesh.hosts.gathered
        assert mesh.hosts.summary() == "512 hosts of 8 ranks"
        assert [x.intra_host for x in mesh.locality()] == [False, True]
        assert "4096 ranks, 512 hosts of 8 ranks" in mesh.describe()
