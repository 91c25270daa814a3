"""The analyzer on PyTorch's own NCCL flight-recorder dumps, written on a real GPU.

The files under ``tests/data/nccl_native/`` come from ``tests/data/make_nccl_fixtures.py``
(PyTorch 2.11 with NCCL 2.28 on one H100; one rank, since NCCL refuses two ranks on one
GPU). Unlike gloo's native dumps they carry NCCL's names (``nccl:_all_gather_base``),
``comm_lib_version``, correct ``pg_config`` memberships and a ``scheduled`` state.
"""

from __future__ import annotations

from pathlib import Path

from commscope.analyze import analyze
from commscope.analyze.present.entries import format_entries

DATA = Path(__file__).resolve().parents[1] / "data" / "nccl_native"


def test_a_healthy_nccl_dump_loads_with_every_record_and_group():
    a = analyze(DATA / "healthy")
    assert not a.unreadable
    assert a.verdict == "healthy"
    dump = a.load.dumps[0]
    assert (dump.source, dump.backend, dump.version) == ("pytorch", "nccl", "2.10")
    assert dump.n_entries == 7
    assert dump.pending == []
    # NCCL's pg_config is trustworthy (gloo's is not): both groups' members are known
    assert dump.config == {"0": (0,), "1": (0,)}
    assert dump.group_desc == {"0": "default_pg", "1": "undefined"}


def test_nccl_op_names_read_as_the_collectives_they_are():
    text = format_entries(analyze(DATA / "healthy"))
    rows = [line.split()[1] for line in text.splitlines() if line.strip().startswith("#")]
    assert rows == ["all_reduce", "broadcast", "all_gather", "reduce_scatter", "all_reduce",
                    "all_reduce", "all_reduce"], text


def test_a_collective_queued_on_the_device_is_pending():
    a = analyze(DATA / "pending")
    dump = a.load.dumps[0]
    assert dump.n_entries == 8
    # the all_reduce behind a long kernel was still "scheduled" when the dump was taken
    assert dump.pending == [("0", 7, 7)]
    text = format_entries(a)
    assert "#7  all_reduce [[1024]] Float      0 pending" in text, text
