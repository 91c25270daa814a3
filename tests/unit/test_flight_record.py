"""Recording on torch's fake process group: fields, threads, memory, tensor lifetime."""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import pickle
import subprocess
import sys
import threading
import weakref

import pytest
import torch
import torch.distributed as dist

import commscope.flight as flight
from commscope import compat
from commscope.collectives import canonical_name
from commscope.flight.config import resolve_config
from commscope.flight.record.groups import GroupInfo
from commscope.flight.record.recorder import SLOT, Recorder
from commscope.flight.splice.backend import RecordingProcessGroup
from commscope.flight.splice.describe import nothing


@contextlib.contextmanager
def recording(tmp_path, **kwargs):
    kwargs.setdefault("watchdog", False)
    cfg = flight.enable(
        dump_prefix=str(tmp_path / "rank_"),
        handle_signals=False,
        dump_on_exception=False,
        **kwargs,
    )
    try:
        yield cfg
    finally:
        flight.disable()


def entries():
    return flight.snapshot()["entries"]


def test_group_is_a_recording_group_and_entries_follow_the_format(tmp_path, fake_pg):
    with recording(tmp_path, timing=True), fake_pg(3, 8):
        world = dist.group.WORLD
        assert isinstance(world, RecordingProcessGroup)
        x = torch.ones(4, 2, dtype=torch.bfloat16)
        dist.all_reduce(x)
        out = torch.empty(32, 2, dtype=torch.bfloat16)
        dist.all_gather_into_tensor(out, x)
        dist.reduce_scatter_tensor(
            torch.empty(1, 2, dtype=torch.bfloat16), torch.ones(8, 2, dtype=torch.bfloat16)
        )
        dist.send(torch.zeros(3), dst=5)
        dist.barrier()
        got = entries()
        snap = flight.snapshot()
    names = [e["profiling_name"] for e in got]
    assert names == [
        "fake:all_reduce",
        "fake:_all_gather_base",
        "fake:_reduce_scatter_base",
        "fake:send 3->5",
        "fake:barrier",
    ]
    assert [canonical_name(n) for n in names] == [
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "send",
        "barrier",
    ]
    ar, ag, rs, send, _barrier = got
    assert ar["input_sizes"] == ar["output_sizes"] == [[4, 2]]
    assert ar["input_dtypes"] == ["BFloat16"]
    assert (ag["input_sizes"], ag["output_sizes"]) == ([[4, 2]], [[32, 2]])
    assert (rs["input_sizes"], rs["output_sizes"]) == ([[8, 2]], [[1, 2]])
    assert [e["collective_seq_id"] for e in got] == [1, 2, 3, 3, 4]
    assert [e["p2p_seq_id"] for e in got] == [0, 0, 0, 1, 1]
    assert [e["op_id"] for e in got] == [1, 2, 3, 4, 5]
    assert [e["record_id"] for e in got] == [0, 1, 2, 3, 4]
    assert send["is_p2p"] and send["peer"] == 5 and not ar["is_p2p"] and ar["peer"] is None
    for e in got:
        assert e["process_group"] == ("0", "default_pg")
        assert e["state"] == "completed" and e["retired"] is True
        assert e["duration_ms"] >= 0
        assert e["time_discovered_completed_ns"] >= e["time_created_ns"]
        assert e["mesh_axis"] is None
    # Frames: innermost first, starting at torch's API function, ending in this test.
    assert ar["frames"][0]["name"] == "all_reduce"
    assert any(
        f["name"] == "test_group_is_a_recording_group_and_entries_follow_the_format"
        for f in ar["frames"]
    )
    frame = next(f for f in ar["frames"] if f["filename"] == __file__)
    with open(__file__) as fh:
        assert "dist.all_reduce(x)" in fh.readlines()[frame["line"] - 1]
    assert snap["pg_config"] == {
        "0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(8)))}
    }
    assert snap["pg_status"]["0"] == {
        "last_enqueued_collective": 4,
        "last_started_collective": 4,
        "last_completed_collective": 4,
    }
    assert (snap["rank"], snap["world_size"], snap["version"]) == (3, 8, "2.10")
    assert snap["commscope_format"] == "commscope.flight/1"


def test_mesh_groups_carry_their_axis(tmp_path, fake_pg):
    with recording(tmp_path), fake_pg(1, 4):
        tp = dist.new_group([0, 1], use_local_synchronization=True, group_desc="mesh_tp")
        dist.all_reduce(torch.ones(2), group=tp)
        dist.broadcast(torch.ones(2), group_src=1, group=tp)
        got = entries()
        cfg = flight.snapshot()["pg_config"]
    assert [e["mesh_axis"] for e in got] == ["tp", "tp"]
    assert [e["collective_seq_id"] for e in got] == [1, 2]
    assert {c["desc"]: c["ranks"] for c in cfg.values()} == {
        "default_pg": "[0, 1, 2, 3]",
        "mesh_tp": "[0, 1]",
    }


def test_ring_keeps_buffer_size_newest(tmp_path, fake_pg):
    with recording(tmp_path, buffer_size=5), fake_pg(0, 2):
        for _ in range(12):
            dist.all_reduce(torch.ones(1))
        got = entries()
    assert [e["collective_seq_id"] for e in got] == list(range(8, 13))
    assert [e["record_id"] for e in got] == list(range(7, 12))


def test_two_threads_record_everything(tmp_path, fake_pg):
    n = 2000
    with recording(tmp_path, buffer_size=10 * n), fake_pg(0, 2):
        group = dist.new_group([0, 1])

        def work(g):
            t = torch.ones(3)
            for _ in range(n):
                dist.all_reduce(t, group=g)

        threads = [threading.Thread(target=work, args=(g,)) for g in (None, group, None)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        got = entries()
    assert len(got) == 3 * n
    assert sorted(e["record_id"] for e in got) == list(range(3 * n))
    by_pg: dict[str, list[int]] = {}
    for e in got:
        by_pg.setdefault(e["process_group"][1], []).append(e["collective_seq_id"])
    assert sorted(by_pg["default_pg"]) == list(range(1, 2 * n + 1))
    assert sorted(by_pg["undefined"]) == list(range(1, n + 1))
    assert {e["thread_name"] for e in got} >= {t.name for t in threads}


def test_no_tensor_is_kept_alive(tmp_path, fake_pg):
    with recording(tmp_path), fake_pg(0, 2):
        x = torch.ones(8)
        out = torch.empty(16)
        refs = [weakref.ref(x), weakref.ref(out)]
        dist.all_reduce(x)
        work = dist.all_gather_into_tensor(out, x, async_op=True)
        work.wait()
        dist.send(x, dst=1)
        del x, out, work
        gc.collect()
        assert [r() for r in refs] == [None, None]
        assert len(entries()) == 3


_MILLION = """
import gc, os, sys, tempfile
sys.path.insert(0, os.getcwd())
import torch
import torch.distributed as dist
import commscope.flight as flight
from commscope.flight.record.recorder import SLOT
from tests.harness import fake_world


def rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


flight.enable(dump_prefix=os.path.join(tempfile.mkdtemp(), "rank_"), handle_signals=False,
              dump_on_exception=False, watchdog=False)
with fake_world(0, 4):
    pg = dist.group.WORLD
    t = [torch.ones(4)]
    for _ in range(100_000):
        pg.allreduce(t).wait()
    gc.collect()
    before = rss()
    for _ in range(900_000):
        pg.allreduce(t).wait()
    gc.collect()
    after = rss()
    rec = SLOT.rec
    last = flight.snapshot()["entries"][-1]["collective_seq_id"]
    print(rec.ring.written, len(rec.ring), len(rec.pending), last, after - before)
flight.disable()
"""


@pytest.mark.slow
def test_a_million_collectives_keep_memory_flat():
    # In an interpreter of its own: the RSS of the test process also moves with whatever
    # earlier tests left behind (their threads, freed arenas), which is not the recorder's.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run([sys.executable, "-c", _MILLION], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    written, kept, pending, last_seq, grown = map(int, done.stdout.split()[-5:])
    assert written == 1_000_000 and kept == 2000
    assert pending == 0
    assert last_seq == 1_000_000
    assert grown < 16 * 2**20, f"RSS grew by {grown / 2**20:.1f} MiB"


def test_an_internal_failure_stops_recording_and_never_raises(tmp_path, fake_pg, caplog):
    with recording(tmp_path), fake_pg(0, 2):
        dist.all_reduce(torch.ones(1))
        rec = SLOT.rec

        class BrokenRing:
            @property
            def lock(self):
                raise RuntimeError("injected failure")

        ring, rec.ring = rec.ring, BrokenRing()
        with caplog.at_level(logging.ERROR, logger="commscope.flight.record.recorder"):
            for _ in range(3):
                t = torch.ones(2)
                dist.all_reduce(t)  # must not raise
                assert t.tolist() == [1.0, 1.0]
        rec.ring = ring
        assert not flight.is_enabled()
        assert len(entries()) == 1
    messages = [r for r in caplog.records if "stopped recording" in r.getMessage()]
    assert len(messages) == 1 and "injected failure" in messages[0].getMessage()


def test_disable_stops_recording_but_keeps_the_group_working(tmp_path, fake_pg):
    with recording(tmp_path), fake_pg(0, 2):
        dist.all_reduce(torch.ones(1))
        flight.disable()
        dist.all_reduce(torch.ones(1))
        assert not flight.is_enabled()
        assert len(entries()) == 1
        new = dist.new_group([0, 1])
        assert not isinstance(new, RecordingProcessGroup)


def test_dump_trace_has_the_tutorials_three_options(tmp_path, fake_pg):
    with recording(tmp_path), fake_pg(0, 2):
        dist.all_reduce(torch.ones(1))
        full = pickle.loads(flight.dump_trace())
        no_stack = pickle.loads(flight.dump_trace(include_stack_traces=False))
        no_coll = pickle.loads(flight.dump_trace(include_collectives=False))
        active = pickle.loads(flight.dump_trace(only_active=True))
        as_json = flight.dump_trace_json()
    assert {"version", "pg_config", "pg_status", "entries"} <= set(full)
    assert len(full["entries"]) == 1 and full["entries"][0]["frames"]
    assert no_stack["entries"][0]["frames"] == []
    assert no_coll["entries"] == [] and no_coll["pg_config"] == full["pg_config"]
    assert active["entries"] == []  # the only entry completed
    assert b'"profiling_name":"fake:all_reduce"' in as_json


class _Group:
    """What ``Recorder.run`` needs of a recording group: its GroupInfo."""

    def __init__(self, backends):
        self._commscope_info = GroupInfo(0, "0", "default_pg", [0, 1], 0, backends, 1000)


def _bare_recorder() -> Recorder:
    return Recorder(resolve_config(buffer_size=16, watchdog=False))


def test_ops_are_recorded_before_a_call_that_can_block_and_after_one_that_enqueues():
    rec = _bare_recorder()
    seen_during_call = []

    def call():
        seen_during_call.append(rec.ring._written)
        return None  # no work: the entry is retired right away

    for backends, blocking in (({"cpu": "gloo"}, False), ({"cuda": "nccl"}, False),
                               ({"cpu": "gloo", "cuda": "nccl"}, False),
                               ({"cpu": "gloo"}, True), ({"cpu": "my_plugin"}, False)):
        rec.run(_Group(backends), "barrier", nothing, call, (), {}, blocking=blocking)
    # gloo only enqueues: recorded after the hand-over. NCCL's hand-over can block
    # (lazy communicator set-up), as can monitored_barrier (blocking) and a backend we
    # do not know: recorded before, so a rank stuck there still shows it.
    assert seen_during_call == [0, 2, 3, 4, 5]
    states = [e.state for e in rec.ring.snapshot()]
    assert states == ["completed"] * 5


def test_a_failed_hand_over_is_recorded_either_way():
    rec = _bare_recorder()
    def call():
        raise RuntimeError("backend refused")

    groups = [_Group({"cpu": "gloo"}), _Group({"cuda": "nccl"})]
    for group in groups:
        with pytest.raises(RuntimeError, match="backend refused"):
            rec.run(group, "barrier", nothing, call, (), {})
    # It never started, whichever side of the hand-over it was recorded on.
    got = [(e.state, e.failed, e.retired) for e in rec.ring.snapshot()]
    assert got == [("scheduled", True, True)] * 2
    assert [g._commscope_info.last_started for g in groups] == [-1, -1]
    assert [g._commscope_info.last_enqueued for g in groups] == [1, 1]


class _Work:
    """A stand-in work: ``wait()`` returns or raises as told."""

    def __init__(self, error: Exception | None = None):
        self.error = error
        self.waited = 0

    def wait(self, timeout=None):
        self.waited += 1
        if self.error is not None:
            raise self.error
        return True

    def is_completed(self):
        return True

    def source_rank(self):
        return 7


class _Opts:
    def __init__(self, async_op: bool):
        self.asyncOp = async_op


def test_eager_sync_calls_get_the_light_wrapper_the_rest_a_real_work():
    from commscope.flight.record.work import TrackedWork, WaitedWork

    rec = _bare_recorder()
    group = _Group({"cpu": "gloo"})
    # torch's eager functions pass opts.asyncOp = False when they wait at once.
    def call(*args, **kwargs):
        return _Work()

    sync = rec.run(group, "barrier", nothing, call, (), {"opts": _Opts(False)})
    assert type(sync) is WaitedWork
    assert sync.source_rank() == 7  # anything else is forwarded
    assert rec.ring.snapshot()[0].state == "started"
    assert sync.wait() is True and sync.wait() is True  # a second wait changes nothing
    # Async calls, and C++ callers (their options say asyncOp = True, or have none),
    # may hand the work on to C++: it must be a real dist.Work.
    for args in ((_Opts(True),), ([],), ()):
        work = rec.run(group, "barrier", nothing, call, args, {})
        if compat.has("py_work_holder"):
            assert type(work) is TrackedWork and isinstance(work, dist.Work)
        else:  # torch 2.6: C++ would drop a Python-made Work; the backend's own goes back
            assert type(work) is _Work
        work.wait()
    rec.poll()  # torch 2.6: a work without a future is polled (the watchdog's job)
    failing = rec.run(group, "barrier", nothing, lambda *a: _Work(RuntimeError("peer gone")),
                      (_Opts(False),), {})
    with pytest.raises(RuntimeError, match="peer gone"):
        failing.wait()
    got = [(e.state, e.retired, e.failed) for e in rec.ring.snapshot()]
    assert got == [("completed", True, False)] * 4 + [("started", True, True)]
    assert not rec.pending


def test_eager_calls_on_the_fake_backend_complete_through_either_wrapper(tmp_path, fake_pg):
    with recording(tmp_path), fake_pg(0, 2):
        t = torch.ones(4)
        dist.all_reduce(t)
        work = dist.all_reduce(t, async_op=True)
        assert isinstance(work, dist.Work)
        work.wait()
        dist.barrier()
        got = entries()
    assert [(e["profiling_name"], e["state"]) for e in got] == [
        ("fake:all_reduce", "completed"), ("fake:all_reduce", "completed"),
        ("fake:barrier", "completed")]


def test_the_c_stack_walk_matches_the_python_one(tmp_path, fake_pg):
    from commscope.flight.record import recorder as rec_mod
    from commscope.flight.record import stack

    def deep(n, fn):
        return fn() if n == 0 else deep(n - 1, fn)

    here = sys._getframe()
    caller = here.f_back  # suspended in this call: its offset stays put
    for limit in (0, 1, 3, 100):
        assert stack.capture_stack_py(caller, limit) == stack.capture_stack(caller, limit)
    assert stack.capture_stack(None, 5) == [] == stack.capture_stack_py(None, 5)
    walked = deep(4, lambda: stack.capture_stack(sys._getframe(), 7))
    assert [c.co_name for c in walked[::2]] == ["<lambda>", *["deep"] * 5, here.f_code.co_name]
    assert all(isinstance(o, int) for o in walked[1::2])
    if not stack.C_STACK:
        pytest.skip("the C stack walk is not built here (no compiler or Python < 3.11)")
    with pytest.raises(TypeError):
        stack.capture_stack("not a frame", 3)
    # The recorder stores the same frames with either walk.
    frames = []
    with recording(tmp_path), fake_pg(0, 2):
        t = torch.ones(2)
        for walk in (stack.capture_stack_py, stack.capture_stack):
            rec_mod.capture_stack = walk
            try:
                dist.all_reduce(t)
            finally:
                rec_mod.capture_stack = stack.capture_stack
            frames.append(flight.snapshot()["entries"][-1]["frames"])
    assert frames[0] == frames[1] and frames[0]


def test_what_must_agree_is_recorded_root_reduce_op_and_splits(tmp_path, fake_pg):
    # issue 32 item 2: the root (as a global rank), the reduce op and all_to_all splits
    with recording(tmp_path), fake_pg(1, 4):
        sub = dist.new_group([1, 3])
        t = torch.ones(4)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        dist.broadcast(t, 2)
        dist.broadcast(t, 3, group=sub)  # group rank 1 of [1, 3]: global rank 3
        dist.reduce(t, 0, op=dist.ReduceOp.MIN)
        dist.all_to_all_single(torch.empty(6), torch.ones(4), [1, 2, 2, 1], [2, 1, 0, 1])
        dist.all_to_all_single(torch.empty(4), torch.ones(4))  # even splits: nothing kept
        dist.barrier()
        got = entries()
    fields = [{k: e[k] for k in ("root", "reduce_op", "input_split_sizes",
                                 "output_split_sizes") if k in e} for e in got]
    assert fields == [
        {"reduce_op": "MAX"}, {"root": 2}, {"root": 3}, {"root": 0, "reduce_op": "MIN"},
        {"input_split_sizes": [2, 1, 0, 1], "output_split_sizes": [1, 2, 2, 1]}, {}, {},
    ]
