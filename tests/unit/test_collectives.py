"""The collectives vocabulary: every spelling of every layer maps to one canonical name."""

from __future__ import annotations

import pytest
import torch
import torch.distributed._functional_collectives

from commscope import collectives as C

# How each layer spells each collective, written out by hand from torch 2.13.
EXPECTED = {
    "nccl:all_reduce": "all_reduce",
    "gloo:all_reduce": "all_reduce",
    "nccl:allreduce_coalesced": "all_reduce",
    "nccl:_allgather_base": "all_gather",
    "nccl:all_gather": "all_gather",
    "gloo:all_gather": "all_gather",
    "nccl:all_gather_into_tensor_coalesced": "all_gather",
    "nccl:_reduce_scatter_base": "reduce_scatter",
    "nccl:reduce_scatter": "reduce_scatter",
    "nccl:reduce_scatter_tensor_coalesced": "reduce_scatter",
    "nccl:all_to_all": "all_to_all",
    "gloo:all_to_all": "all_to_all",
    "nccl:broadcast": "broadcast",
    "nccl:reduce": "reduce",
    "nccl:gather": "gather",
    "nccl:scatter": "scatter",
    "gloo:barrier": "barrier",
    "nccl:send 0->1": "send",
    "nccl:recv 1<-0": "recv",
    "c10d.allreduce_": "all_reduce",
    "c10d.allreduce_coalesced_": "all_reduce",
    "c10d.allgather_": "all_gather",
    "c10d._allgather_base_": "all_gather",
    "c10d.allgather_coalesced_": "all_gather",
    "c10d.allgather_into_tensor_coalesced_": "all_gather",
    "c10d.reduce_scatter_": "reduce_scatter",
    "c10d._reduce_scatter_base_": "reduce_scatter",
    "c10d.reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "c10d.alltoall_": "all_to_all",
    "c10d.alltoall_base_": "all_to_all",
    "c10d.broadcast_": "broadcast",
    "c10d.gather_": "gather",
    "c10d.scatter_": "scatter",
    "c10d.reduce_": "reduce",
    "c10d.barrier": "barrier",
    "c10d.send": "send",
    "c10d.recv_": "recv",
    "c10d.recv_any_source_": "recv",
    "c10d_functional.all_reduce": "all_reduce",
    "_c10d_functional.all_reduce.default": "all_reduce",
    "_c10d_functional.all_reduce_.default": "all_reduce",
    "_c10d_functional.all_reduce_coalesced": "all_reduce",
    "c10d_functional.all_gather_into_tensor": "all_gather",
    "_c10d_functional.all_gather_into_tensor_out.default": "all_gather",
    "c10d_functional.reduce_scatter_tensor": "reduce_scatter",
    "c10d_functional.reduce_scatter_tensor_coalesced": "reduce_scatter",
    "c10d_functional.all_to_all_single": "all_to_all",
    "_c10d_functional_autograd.all_to_all_single.default": "all_to_all",
    "_c10d_functional_autograd.all_gather_into_tensor": "all_gather",
    "c10d_functional.broadcast": "broadcast",
    "_c10d_functional.broadcast_.default": "broadcast",
    "_c10d_functional.isend.default": "send",
    "_c10d_functional.irecv": "recv",
    "_dtensor.shard_dim_alltoall": "all_to_all",
    "torch.ops.c10d.allreduce_": "all_reduce",
    # eager functions and process-group methods
    "all_reduce": "all_reduce",
    "all_gather_into_tensor": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
    "all_to_all_single": "all_to_all",
    "allreduce": "all_reduce",
    "_allgather_base": "all_gather",
    "_reduce_scatter_base": "reduce_scatter",
    "alltoall_base": "all_to_all",
    "alltoall": "all_to_all",
    "allgather": "all_gather",
    "isend": "send",
    "irecv": "recv",
    "monitored_barrier": "barrier",
    # profiler OpType names
    "ALLREDUCE": "all_reduce",
    "_ALLGATHER_BASE": "all_gather",
    "_REDUCE_SCATTER_BASE": "reduce_scatter",
    "ALLTOALL_BASE": "all_to_all",
    "RECVANYSOURCE": "recv",
}

NOT_COLLECTIVES = [
    "aten.mm.default",
    "_c10d_functional.wait_tensor.default",
    "wait_tensor",
    "nccl:coalesced",
    "c10d.check_for_nan",
    "",
    "   ",
    "gloo:",
    "aten.detach.default",
    "all_reduce_please",
]


@pytest.mark.parametrize(("spelling", "expected"), sorted(EXPECTED.items()))
def test_every_spelling_maps_to_its_canonical_name(spelling, expected):
    assert C.canonical_name(spelling) == expected
    assert C.is_collective(spelling)
    assert C.is_p2p(spelling) == (expected in ("send", "recv"))


@pytest.mark.parametrize("spelling", NOT_COLLECTIVES)
def test_non_collectives_are_not_collectives(spelling):
    assert C.canonical_name(spelling) is None
    assert not C.is_collective(spelling)


def test_the_eleven_canonical_names():
    assert C.CANONICAL_NAMES == (
        "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast",
        "reduce", "gather", "scatter", "barrier", "send", "recv",
    )
    for name in C.CANONICAL_NAMES:
        assert C.canonical_name(name) == name
        assert C.spec(name).name == name


def _registered_ops(namespace: str) -> list[str]:
    prefix = f"{namespace}::"
    return sorted(
        n[len(prefix):] for n in torch._C._dispatch_get_all_op_names() if n.startswith(prefix)
    )


def test_every_registered_c10d_communication_op_is_known():
    # Every op torch registers in c10d is either a collective we name or a known helper.
    helpers = {"check_for_nan"}
    for op in _registered_ops("c10d"):
        if op in helpers:
            continue
        assert C.canonical_name(f"c10d.{op}") is not None, f"c10d.{op} has no canonical name"


def test_every_registered_functional_op_is_known():
    helpers = {"wait_tensor", "batch_p2p_ops", "_wrap_tensor_autograd"}
    for ns in ("_c10d_functional", "c10d_functional", "_c10d_functional_autograd"):
        for op in _registered_ops(ns):
            if op in helpers:
                continue
            assert C.canonical_name(f"{ns}.{op}.default") is not None, f"{ns}.{op}"


def test_every_process_group_method_is_known():
    methods = {m for m in dir(torch.distributed.ProcessGroup) if not m.startswith("__")}
    communication = {
        "allreduce", "allreduce_coalesced", "allgather", "_allgather_base",
        "allgather_coalesced", "allgather_into_tensor_coalesced", "all_gather_single",
        "reduce_scatter", "_reduce_scatter_base", "reduce_scatter_tensor_coalesced",
        "alltoall", "alltoall_base", "all_to_all_single", "broadcast", "reduce", "gather",
        "scatter", "barrier", "monitored_barrier", "send", "recv", "recv_anysource",
    }
    for method in communication & methods:
        assert C.canonical_name(method) is not None, method


def test_torch_op_objects_are_accepted():
    ops = torch.ops
    assert C.canonical_name(ops.c10d_functional.all_reduce) == "all_reduce"
    assert C.canonical_name(ops._c10d_functional.all_reduce.default) == "all_reduce"
    assert C.canonical_name(ops.c10d.allreduce_) == "all_reduce"
    assert C.canonical_name(ops.c10d._allgather_base_.default) == "all_gather"
    assert C.canonical_name(ops.aten.mm.default) is None


def test_spec_unknown_lists_valid_names():
    with pytest.raises(KeyError, match="canonical names are: all_reduce"):
        C.spec("allreduce_everything")


@pytest.mark.parametrize(
    ("dtype", "size"),
    [
        ("Float", 4), ("float32", 4), ("torch.float32", 4), (torch.float32, 4),
        ("BFloat16", 2), ("bfloat16", 2), ("Half", 2), ("Double", 8), ("Long", 8),
        ("Int", 4), ("Char", 1), ("Byte", 1), ("Bool", 1), ("Short", 2),
        ("ComplexFloat", 8), ("Float8_e4m3fn", 1), (torch.float8_e5m2, 1),
    ],
)
def test_dtype_itemsize(dtype, size):
    assert C.dtype_itemsize(dtype) == size


def test_every_torch_dtype_has_a_size_that_matches_torch():
    # Sub-byte integer and raw-bits dtypes carry no collective payload we could size.
    skip = {f"int{i}" for i in range(1, 8)} | {f"uint{i}" for i in range(1, 8)}
    dtypes = {
        name: dt for name in dir(torch)
        if isinstance(dt := getattr(torch, name), torch.dtype)
        and str(dt).removeprefix("torch.") not in skip and not str(dt).startswith("torch.bits")
    }
    assert len(dtypes) > 20
    for name, dt in dtypes.items():
        assert C.dtype_itemsize(dt) == dt.itemsize, name


def test_normalize_dtype_name_gives_c10_names():
    assert C.normalize_dtype_name(torch.float32) == "Float"
    assert C.normalize_dtype_name("torch.bfloat16") == "BFloat16"
    assert C.normalize_dtype_name("int64") == "Long"
    assert C.normalize_dtype_name("SomethingNew") == "SomethingNew"


def test_unknown_dtype_raises_with_name():
    with pytest.raises(KeyError, match="Float9"):
        C.dtype_itemsize("Float9")


def test_message_bytes_per_op():
    # all_reduce of 1024 floats: 4 KiB either side
    assert C.message_bytes("all_reduce", [[1024]], ["Float"], [[1024]], ["Float"]) == 4096
    # all_gather: the gathered output
    assert C.message_bytes("nccl:_allgather_base", [[256]], ["Float"], [[1024]], ["Float"]) == 4096
    # reduce_scatter: the full input
    assert C.message_bytes("reduce_scatter", [[1024]], ["BFloat16"], [[256]], ["BFloat16"]) == 2048
    # list form, one dtype for all
    assert C.message_bytes("all_gather", [[4]], ["Float"], [[4], [4], [4], [4]], ["Float"]) == 64
    # only input known
    assert C.message_bytes("all_gather", [[8]], ["Long"]) == 64
    assert C.message_bytes("barrier", [], []) == 0
    assert C.message_bytes("send", [[3, 4]], ["Float"]) == 48
    assert C.message_bytes("recv", [], [], [[3, 4]], ["Half"]) == 24


@pytest.mark.parametrize("n", [1, 2, 4, 8, 1024])
def test_bus_bandwidth_factors_follow_nccl_tests(n):
    assert C.bus_bandwidth_factor("all_reduce", n) == pytest.approx(2 * (n - 1) / n)
    for op in ("all_gather", "reduce_scatter", "all_to_all"):
        assert C.bus_bandwidth_factor(op, n) == pytest.approx((n - 1) / n)
    for op in ("broadcast", "reduce", "send", "recv"):
        assert C.bus_bandwidth_factor(op, n) == 1.0
    assert C.bus_bandwidth_factor("barrier", n) == 0.0


def test_bus_bandwidth_factor_rejects_empty_group():
    with pytest.raises(ValueError, match="group_size must be >= 1, got 0"):
        C.bus_bandwidth_factor("all_reduce", 0)


def test_time_and_bandwidth_are_inverse():
    nbytes, n = 256 * 1024 * 1024, 8
    t = C.estimate_time_us("all_reduce", nbytes, n, busbw_gbps=100.0)
    # 256 MiB * 1.75 / 100 GB/s
    assert t == pytest.approx(nbytes * 1.75 / 100e9 * 1e6)
    assert C.bus_bandwidth_gbps("all_reduce", nbytes, n, t) == pytest.approx(100.0)
    assert C.estimate_time_us("all_reduce", nbytes, 1, 100.0) == 0.0
    with pytest.raises(ValueError):
        C.estimate_time_us("all_reduce", nbytes, n, 0)
    assert C.bus_bandwidth_gbps("all_reduce", nbytes, n, 0) == 0.0


def test_parse_profiling_name():
    p = C.parse_profiling_name("nccl:send 0->1")
    assert (p.backend, p.op, p.collective, p.src, p.dst) == ("nccl", "send", "send", 0, 1)
    p = C.parse_profiling_name("nccl:recv 1<-0")
    assert (p.collective, p.src, p.dst) == ("recv", 0, 1)
    p = C.parse_profiling_name("nccl:coalesced")
    assert (p.op, p.collective) == ("coalesced", None)
    p = C.parse_profiling_name("gloo:all_reduce")
    assert (p.backend, p.collective, p.src) == ("gloo", "all_reduce", None)
    p = C.parse_profiling_name("all_gather")
    assert (p.backend, p.collective) == ("", "all_gather")


def test_numel_and_tensor_bytes():
    assert C.numel([]) == 1
    assert C.numel([3, 4]) == 12
    assert C.tensor_bytes([], ["Float"]) == 0
    assert C.tensor_bytes([[2, 2]], []) == 0
    assert C.tensor_bytes([[2], [3]], ["Float", "Double"]) == 8 + 24
    assert C.dtype_itemsize("QUInt4x2") == 1


def test_collectives_module_does_not_import_torch():
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import commscope.collectives as c\n"
        "assert c.canonical_name('nccl:all_reduce') == 'all_reduce'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
