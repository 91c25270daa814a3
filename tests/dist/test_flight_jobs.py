"""The flight recorder on real gloo jobs: a healthy step, a hang, an unmatched send, p2p,
mesh groups, polled (NCCL-style) works and groups adopted from C++."""

from __future__ import annotations

import glob
import os
import pickle
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest

from commscope.collectives import canonical_name, numel
from commscope import compat
from tests.harness import run_ranks
from tests.needs import needs_torch, torch_has

pytestmark = pytest.mark.dist


def _init(rank: int, world_size: int, **enable_kwargs) -> None:
    import torch.distributed as dist

    import commscope.flight as flight

    flight.enable(**enable_kwargs)
    store = dist.FileStore(os.environ["COMMSCOPE_TEST_STORE"], world_size)
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=60)
    )


# --------------------------------------------------------------------------- healthy


def _healthy_step(rank, world_size):
    import pickle

    import torch
    import torch.nn as nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    import commscope.flight as flight
    from commscope import compat

    _init(rank, world_size, watchdog=False, handle_signals=False, dump_on_exception=False)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    ddp = nn.parallel.DistributedDataParallel(nn.Linear(8, 8))
    ddp(torch.randn(4, 8)).sum().backward()
    mlp = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
    mlp = parallelize_module(mlp, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    mlp(torch.randn(4, 8)).sum().backward()
    if compat.has("fsdp2_on_cpu"):  # torch 2.7+ (before, FSDP2 cannot train on CPU)
        model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 4))
        fully_shard(model[0], mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
        model(torch.randn(4, 8)).sum().backward()
    ours = flight.snapshot()
    # gloo's own recorder (torch 2.8+, on by default) is the independent witness.
    native = None
    if compat.has("gloo_flight_recorder"):
        native = pickle.loads(torch._C._distributed_c10d._dump_fr_trace())
    return ours, native


def _same_op(ours: dict, native: dict) -> bool:
    a, b = canonical_name(ours["profiling_name"]), canonical_name(native["profiling_name"])
    # gloo implements reduce_scatter_tensor with an all_reduce of the input.
    return a == b or (a == "reduce_scatter" and b == "all_reduce")


def test_healthy_ddp_tp_fsdp2_step_is_recorded_on_every_rank(tmp_path):
    # gloo's own recorder, the witness, is off by default on some releases: on for this job
    results = run_ranks(_healthy_step, 4, tmp_path, timeout=120, init=False,
                        env={"TORCH_FR_BUFFER_SIZE": "2000"})
    by_rank = {}
    for rank, (ours, native) in enumerate(results):
        entries = ours["entries"]
        assert entries
        # Every collective gloo saw, we saw: same group, op, sizes, in the same order.
        assert native is None or len(entries) == len(native["entries"])
        for e, n in zip(entries, native["entries"] if native else []):
            assert e["process_group"] == tuple(n["process_group"]), (e, n)
            assert _same_op(e, n), (e["profiling_name"], n["profiling_name"])
            assert e["input_sizes"] == n["input_sizes"]
            if canonical_name(e["profiling_name"]) == canonical_name(n["profiling_name"]):
                out_numel = [numel(s) for s in e["output_sizes"]]
                assert out_numel == [numel(s) for s in n["output_sizes"]]
        assert all(e["state"] == "completed" and e["retired"] for e in entries)
        assert ours["rank"] == rank and ours["world_size"] == 4
        dp = [rank % 2, rank % 2 + 2]
        tp = [rank // 2 * 2, rank // 2 * 2 + 1]
        assert sorted((c["desc"], c["ranks"]) for c in ours["pg_config"].values()) == [
            ("default_pg", "[0, 1, 2, 3]"),
            ("mesh_dp", str(dp)),
            ("mesh_tp", str(tp)),
        ]
        by_rank[rank] = entries

    # What each part of the step must have issued, on the right group.
    for entries in by_rank.values():
        kinds = {(e["process_group"][1], e["profiling_name"], e["mesh_axis"]) for e in entries}
        assert ("default_pg", "gloo:all_reduce", None) in kinds  # DDP's bucket
        assert ("mesh_tp", "gloo:all_reduce", "tp") in kinds  # RowwiseParallel output
        if compat.has("fsdp2_on_cpu"):
            assert ("mesh_dp", "gloo:_all_gather_base", "dp") in kinds  # FSDP2 unshard
            assert ("mesh_dp", "gloo:_reduce_scatter_base", "dp") in kinds  # FSDP2 grads
        ddp = [
            e
            for e in entries
            if e["profiling_name"] == "gloo:all_reduce" and e["process_group"][1] == "default_pg"
        ]
        assert ddp[-1]["input_sizes"] == [[8 * 8 + 8]] and ddp[-1]["input_dtypes"] == ["Float"]
        for e in entries:
            if e["profiling_name"].endswith("_all_gather_base"):
                assert numel(e["output_sizes"][0]) == 2 * numel(e["input_sizes"][0])

    # Sequence ids: 1..n per group, and identical sequences on every member.
    per_group: dict[str, dict[int, list]] = {}
    for rank, entries in by_rank.items():
        for e in entries:
            key = (e["collective_seq_id"], e["profiling_name"])
            if canonical_name(e["profiling_name"]) not in ("scatter", "gather"):
                # Only the root of a scatter/gather holds the list side.
                key += (e["input_sizes"], e["output_sizes"], e["input_dtypes"])
            per_group.setdefault(e["process_group"][0], {}).setdefault(rank, []).append(key)
    for name, ranks in per_group.items():
        sequences = list(ranks.values())
        assert all(s == sequences[0] for s in sequences), name
        assert [k[0] for k in sequences[0]] == list(range(1, len(sequences[0]) + 1))
    # default, two tp groups, and two dp groups where FSDP2 ran on them
    assert len(per_group) == 1 + 2 + (2 if compat.has("fsdp2_on_cpu") else 0)


# --------------------------------------------------------------------------- hang


def _exit_when_all_dumped(prefix: str, world_size: int, limit_s: float) -> None:
    def watch() -> None:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            if all(os.path.exists(f"{prefix}{r}") for r in range(world_size)):
                time.sleep(0.2)
                break
            time.sleep(0.05)
        os._exit(0)

    threading.Thread(target=watch, daemon=True).start()


def _skip_one_all_reduce(rank, world_size, out_dir, timeout_s):
    import torch
    import torch.distributed as dist

    prefix = os.path.join(out_dir, "rank_")
    _init(rank, world_size, dump_prefix=prefix, timeout_s=timeout_s, poll_interval_s=0.25)
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)
    with open(os.path.join(out_dir, "..", f"start_{rank}"), "w") as fh:
        fh.write(repr(time.time()))
    _exit_when_all_dumped(prefix, world_size, 30)
    if rank == 3:
        # Rank 3 skips the fourth all_reduce: it does something else, then idles.
        solo = dist.new_group([3], use_local_synchronization=True, group_desc="solo")
        dist.all_gather_into_tensor(torch.empty(4), t, group=solo)
        time.sleep(60)
    else:
        dist.all_reduce(t)  # never completes
    time.sleep(60)


def _load(path: str) -> dict:
    with open(path, "rb") as fh:
        return pickle.load(fh)


def test_hang_every_rank_dumps_and_torch_fr_trace_names_the_missing_rank(tmp_path):
    out = tmp_path / "dumps"
    out.mkdir()
    timeout_s = 2.0
    results = run_ranks(
        _skip_one_all_reduce, 4, tmp_path, str(out), timeout_s, timeout=60, check=False, init=False
    )
    assert all(not r.timed_out for r in results), results
    files = sorted(glob.glob(str(out / "rank_*")))
    assert [os.path.basename(f) for f in files] == [f"rank_{r}" for r in range(4)]
    start = min(float((tmp_path / f"start_{r}").read_text()) for r in range(4))
    for f in files:
        assert os.path.getmtime(f) - start <= timeout_s + 5, f
    dumps = {r: _load(str(out / f"rank_{r}")) for r in range(4)}
    for r in range(3):
        last = dumps[r]["entries"][-1]
        assert last["profiling_name"] == "gloo:all_reduce"
        assert last["collective_seq_id"] == 4 and last["state"] == "started"
        assert not last["retired"]
        assert dumps[r]["pg_status"]["0"]["last_enqueued_collective"] == 4
        assert dumps[r]["pg_status"]["0"]["last_completed_collective"] == 3
    # Rank 3 was not stuck in any collective: it dumped because another rank asked.
    assert dumps[3]["dump_reason"].startswith("request from rank ")
    assert int(dumps[3]["dump_reason"].rsplit(" ", 1)[1]) in (0, 1, 2)
    first_timeout = min(d["dump_time_ns"] for d in dumps.values() if d["dump_reason"] == "timeout")
    assert dumps[3]["dump_time_ns"] - first_timeout <= 2e9  # the request reached it in 2 s
    default = [e for e in dumps[3]["entries"] if e["process_group"][1] == "default_pg"]
    assert [e["collective_seq_id"] for e in default] == [1, 2, 3]
    instead = dumps[3]["entries"][-1]
    assert instead["process_group"][1] == "solo"
    assert instead["profiling_name"] == "gloo:_all_gather_base"
    assert instead["state"] == "completed"

    # PyTorch's own analyzer (torch 2.10+ ships it as a module) reads the dumps and
    # blames the same rank.
    needs_torch("torch_fr_trace", "torch_fr_trace_reads_gloo")
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0, report
    assert "Not all ranks joining collective" in report, report
    assert "missing ranks: {3}" in report, report


def _unmatched_send(rank, world_size, out_dir):
    import torch
    import torch.distributed as dist

    prefix = os.path.join(out_dir, "rank_")
    _init(rank, world_size, dump_prefix=prefix, timeout_s=1.5, poll_interval_s=0.25)
    dist.all_reduce(torch.ones(2))
    _exit_when_all_dumped(prefix, world_size, 30)
    if rank == 0:
        dist.send(torch.arange(6.0), dst=1)  # rank 1 never receives
    time.sleep(60)


def test_unmatched_send_shows_pending_p2p_with_peer(tmp_path):
    out = tmp_path / "dumps"
    out.mkdir()
    results = run_ranks(_unmatched_send, 2, tmp_path, str(out), timeout=60, check=False, init=False)
    assert all(not r.timed_out for r in results), results
    sender = _load(str(out / "rank_0"))
    assert sender["dump_reason"] == "timeout"
    send = sender["entries"][-1]
    assert send["profiling_name"] == "gloo:send 0->1"
    assert send["is_p2p"] and send["peer"] == 1
    assert send["state"] == "started" and not send["retired"]
    assert send["input_sizes"] == [[6]] and send["p2p_seq_id"] == 1
    assert send["collective_seq_id"] == 1  # carries the all_reduce count
    receiver = _load(str(out / "rank_1"))
    assert receiver["dump_reason"] == "request from rank 0"
    assert [e["profiling_name"] for e in receiver["entries"]] == ["gloo:all_reduce"]


# --------------------------------------------------------------------------- p2p


def _p2p_everywhere(rank, world_size):
    import torch
    import torch.distributed as dist

    import commscope.flight as flight

    _init(rank, world_size, watchdog=False, handle_signals=False, dump_on_exception=False)
    pair = dist.new_group([1, 2])
    t = torch.full((3,), float(rank))
    if rank == 0:
        dist.send(t, dst=1)
        dist.isend(t, dst=2).wait()
    elif rank in (1, 2):
        dist.recv(t, src=0)
        peer = 3 - rank  # 1 <-> 2, group ranks 0 <-> 1
        ops = [
            dist.P2POp(dist.isend, torch.ones(2), peer, group=pair),
            dist.P2POp(dist.irecv, torch.empty(2), peer, group=pair),
        ]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        dist.all_reduce(t, group=pair)
    return [
        (
            e["process_group"][1],
            e["profiling_name"],
            e["peer"],
            e["collective_seq_id"],
            e["p2p_seq_id"],
            e["op_id"],
            e["state"],
        )
        for e in flight.snapshot()["entries"]
    ]


def test_p2p_ops_carry_group_local_ranks_global_peers_and_shared_batch_seq(tmp_path):
    r0, r1, r2 = run_ranks(_p2p_everywhere, 3, tmp_path, timeout=60, init=False)
    assert r0 == [
        ("default_pg", "gloo:send 0->1", 1, 0, 1, 1, "completed"),
        ("default_pg", "gloo:send 0->2", 2, 0, 2, 2, "completed"),
    ]
    for rank, entries, peer in ((1, r1, 2), (2, r2, 1)):
        me, other = rank - 1, 2 - rank  # group ranks inside `pair`
        assert entries == [
            ("default_pg", f"gloo:recv {rank}<-0", 0, 0, 1, 1, "completed"),
            ("undefined", f"gloo:send {me}->{other}", peer, 0, 1, 1, "completed"),
            ("undefined", f"gloo:recv {me}<-{other}", peer, 0, 1, 2, "completed"),
            ("undefined", "gloo:all_reduce", None, 1, 1, 3, "completed"),
        ]


# --------------------------------------------------------------------------- commscope.mesh


def _commscope_mesh(rank, world_size):
    import torch
    import torch.distributed as dist

    import commscope.flight as flight
    from commscope.mesh import init_device_mesh

    _init(
        rank, world_size, timing=True, watchdog=False, handle_signals=False, dump_on_exception=False
    )
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    dist.all_reduce(torch.ones(5), group=mesh.get_group("tp"))
    dist.all_reduce(torch.ones(6), group=mesh.get_group("dp"))
    snap = flight.snapshot()
    mine = [e for e in snap["entries"] if e["mesh_axis"] is not None]
    return (
        [(e["mesh_axis"], e["input_sizes"], e["collective_seq_id"]) for e in mine],
        {c["desc"]: c["ranks"] for c in snap["pg_config"].values()},
        all(e["duration_ms"] >= 0 for e in snap["entries"]),
    )


def test_commscope_mesh_groups_are_recorded_with_their_axis(tmp_path):
    results = run_ranks(_commscope_mesh, 4, tmp_path, timeout=60, init=False)
    for rank, (entries, config, timed) in enumerate(results):
        assert entries == [("tp", [[5]], 1), ("dp", [[6]], 1)]
        assert config["mesh_tp"] == str([rank // 2 * 2, rank // 2 * 2 + 1])
        assert config["mesh_dp"] == str([rank % 2, rank % 2 + 2])
        assert timed  # timing=True: every completed gloo op has duration_ms


# ------------------------------------------------------------------ polled works (NCCL)


def _polled_works(rank, world_size, out_dir):
    import gc
    import weakref

    import torch
    import torch.distributed as dist

    import commscope.flight as flight
    from commscope.flight.record import groups as groups_mod
    from commscope.flight.record import recorder as rec_mod
    from commscope.flight.api import _state

    # NCCL's and XCCL's futures complete at enqueue, so their works are polled by the
    # watchdog instead of wrapped. Drive that path on gloo: same recorder, real works.
    groups_mod.POLLED_BACKENDS = rec_mod.POLLED_BACKENDS = frozenset({"gloo"})
    # The recorder's own timeout far off: the first dump of the incident (which keeps
    # the file) is the one the failed work causes, not a race with a timeout dump.
    _init(rank, world_size, handle_signals=False, dump_on_exception=False,
          poll_interval_s=0.05, timing=True, dump_prefix=os.path.join(out_dir, "rank_"),
          timeout_s=120)
    rec = _state.recorder
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)
    held = torch.ones(1000)
    alive = weakref.ref(held)
    work = dist.all_reduce(held, async_op=True)
    unwrapped = type(work).__name__ != "TrackedWork"
    work.wait()
    del work, held
    gc.collect()
    kept_until_polled = alive() is not None or not rec.polled  # the watchdog may be quick
    deadline = time.monotonic() + 10
    while rec.polled and time.monotonic() < deadline:
        time.sleep(0.02)
    gc.collect()
    released = alive() is None and not rec.polled
    # A collective that fails (rank 1 never joins; the group times out after 1 s) is
    # seen failed through the polled work, without anyone calling wait().
    solo = dist.new_group([0, 1], timeout=timedelta(seconds=1))
    if rank == 0:
        failing = dist.all_reduce(torch.ones(2), group=solo, async_op=True)
        deadline = time.monotonic() + 15
        while rec.failed_collectives == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        del failing
        # ... and the watchdog dumps because of it
        dump = os.path.join(out_dir, "rank_0")
        while not os.path.exists(dump) and time.monotonic() < deadline:
            time.sleep(0.05)
    entries = flight.snapshot()["entries"]
    return unwrapped, kept_until_polled, released, rec.failed_collectives, [
        (e["profiling_name"], e["collective_seq_id"], e["state"], e["retired"], e["failed"],
         e.get("duration_ms") is not None)
        for e in entries
    ]


def test_polled_works_complete_release_their_tensors_and_report_failures(tmp_path):
    results = run_ranks(_polled_works, 2, tmp_path, str(tmp_path), timeout=60, init=False,
                        check=False)
    assert all(not r.timed_out for r in results), results
    r0 = results[0].value
    assert r0 is not None, results[0]
    unwrapped, kept_until_polled, released, failed_count, entries = r0
    assert unwrapped and kept_until_polled and released
    healthy = entries[:4]
    assert [e[:5] for e in healthy] == [
        ("gloo:all_reduce", seq, "completed", True, False) for seq in (1, 2, 3, 4)
    ]
    assert all(e[5] for e in healthy)  # timing on: a duration for every completed op
    assert failed_count == 1
    failed = entries[-1]
    assert failed[:5] == ("gloo:all_reduce", 1, "started", True, True)
    assert not failed[5]  # a failed collective gets no duration
    dump = _load(str(tmp_path / "rank_0"))
    assert dump["dump_reason"] == "collective error"
    assert dump["entries"][-1]["failed"] is True


# ------------------------------------------------------------- adopted (split) groups


def _adopted_group(rank, world_size):
    import torch
    import torch.distributed as dist

    import commscope.flight as flight
    from commscope.flight.api import _state
    from commscope.flight.splice.backend import adopt

    # split_group needs an accelerator-bound default group, so build the plain group
    # that it would return by hand (recording off), then adopt it as the split hook does.
    store = dist.FileStore(os.environ["COMMSCOPE_TEST_STORE"], world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    plain = dist.new_group([0, 1], group_desc="made_by_split")
    flight.enable(watchdog=False, handle_signals=False, dump_on_exception=False)
    adopted = adopt(plain, _state.recorder, [0, 1], timedelta(seconds=30))
    t = torch.full((3,), float(rank + 1))
    work = adopted.allreduce([t])
    work.wait()
    entries = flight.snapshot()["entries"]
    groups = flight.snapshot()["pg_config"]
    return (type(adopted).__name__, type(work).__name__, t.tolist(),
            [(e["profiling_name"], e["process_group"], e["collective_seq_id"], e["state"])
             for e in entries],
            groups.get(plain.group_name))


def test_a_group_built_in_cpp_is_adopted_and_recorded(tmp_path):
    for rank, (kind, work, values, entries, config) in enumerate(
            run_ranks(_adopted_group, 2, tmp_path, timeout=60, init=False)):
        # torch 2.6 cannot keep a Python-made Work alive for C++: the backend's own there
        wrapped = "TrackedWork" if compat.has("py_work_holder") else "Work"
        assert kind == "RecordingProcessGroup" and work == wrapped
        assert values == [3.0, 3.0, 3.0]  # forwarded to the real gloo backend
        assert len(entries) == 1
        name, (group, desc), seq, state = entries[0]
        assert (name, desc, seq, state) == ("gloo:all_reduce", "made_by_split", 1, "completed")
        assert config is not None and config["desc"] == "made_by_split"
        assert config["ranks"] == "[0, 1]", config
        assert group  # the plain group's own name


def _split_on_gloo(rank, world_size):
    import torch
    import torch.distributed as dist

    import commscope.flight as flight

    _init(rank, world_size, watchdog=False, handle_signals=False, dump_on_exception=False)
    part = dist.group.WORLD.split_group([0], group_desc="split_part")
    t = torch.ones(2)
    dist.all_reduce(t, group=part)
    errors = []
    for call in (part._start_coalescing, part._end_coalescing):
        try:
            call(torch.device("cpu"))
        except RuntimeError as exc:  # gloo has no coalescing; the call reached it
            errors.append(str(exc))
    snap = flight.snapshot()
    return (type(part).__name__, errors,
            [(e["profiling_name"], e["process_group"][1], e["state"]) for e in snap["entries"]])


@torch_has("pg_split_group")
def test_split_group_and_coalescing_calls_reach_the_backend(tmp_path):
    # one rank: gloo splits only a group of one without an accelerator-bound default group
    [(kind, errors, entries)] = run_ranks(_split_on_gloo, 1, tmp_path, timeout=60, init=False)
    assert kind == "RecordingProcessGroup"
    assert entries == [("gloo:all_reduce", "split_part", "completed")]
    assert [("startCoalescing" in errors[0]), ("endCoalescing" in errors[1])] == [True, True]


def _called_from_cpp_thread(rank, world_size):
    import _thread
    import time

    import torch
    import torch.distributed as dist

    import commscope.flight as flight
    from commscope.flight.api import _state

    _init(rank, world_size, watchdog=False, handle_signals=False, dump_on_exception=False)
    rec = _state.recorder
    t = torch.ones(3)
    # A thread whose first Python frame is the group's method itself, as when DDP's
    # reducer calls it from the autograd engine's device thread: no caller frame.
    _thread.start_new_thread(dist.group.WORLD.allreduce, ([t],))
    deadline = time.monotonic() + 20
    while rec.ring._written < 1 and rec.active and time.monotonic() < deadline:
        time.sleep(0.01)
    dist.all_reduce(t)
    entries = flight.snapshot()["entries"]
    return rec.active, [(e["profiling_name"], len(e["frames"])) for e in entries]


def test_a_call_with_no_python_caller_is_recorded_and_recording_goes_on(tmp_path):
    [(active, entries)] = run_ranks(_called_from_cpp_thread, 1, tmp_path, timeout=60, init=False)
    assert active, "the recorder stopped"
    assert entries[0] == ("gloo:all_reduce", 0)
    assert entries[1][0] == "gloo:all_reduce" and entries[1][1] > 0


# --------------------------------------------------------------------------- where ranks are


def _stalled_loader(rank: int, world_size: int, out_dir: str) -> dict:
    import torch
    import torch.distributed as dist

    import commscope.flight as flight

    _init(rank, world_size, dump_prefix=os.path.join(out_dir, "rank_"), timeout_s=0.5,
          poll_interval_s=0.1)
    dist.all_reduce(torch.ones(2))
    _exit_when_all_dumped(os.path.join(out_dir, "rank_"), world_size, 30)
    if rank == 1:
        _slow_loader()  # rank 0 waits in the all_reduce below; rank 1 is in no collective
    try:
        raise KeyError("batch 7")
    except KeyError as exc:
        if rank == 0:
            path = flight.dump(os.path.join(out_dir, "exc_0"), reason="exception",
                               exception=exc)
            assert os.path.exists(path)
    dist.all_reduce(torch.ones(2))
    time.sleep(30)
    return {}


def _slow_loader() -> None:
    time.sleep(30)  # the stalled data loader


def test_dumps_say_where_every_thread_is_and_which_exception_triggered_them(tmp_path):
    out = tmp_path / "dumps"
    out.mkdir()
    run_ranks(_stalled_loader, 2, tmp_path, str(out), init=False, check=False, timeout=40)
    stalled = _load(str(out / "rank_1"))
    threads = stalled["commscope_threads"]
    main = next(t for t in threads if t["main"])
    assert threads[0] is main and main["name"] == "MainThread"
    top = main["frames"][0]
    assert (top["name"], top["code"]) == ("_slow_loader",
                                          "time.sleep(30)  # the stalled data loader")
    assert all("commscope-" not in t["name"] for t in threads)
    assert len(main["frames"]) <= 16  # bounded by max_frames
    assert "commscope_exception" not in stalled
    exc = _load(str(out / "exc_0"))["commscope_exception"]
    assert exc["type"] == "KeyError" and exc["message"] == "'batch 7'"
    assert exc["frames"][0]["name"] == "_stalled_loader"

    from commscope.analyze import analyze

    result = analyze(str(out), prefix="rank_")
    root = result.findings[0]
    assert (root.kind, root.culprit_ranks, root.waiting_ranks) == ("missing_rank", [1], [0])
    assert "rank 1 is alive and in no collective: at test_flight_jobs.py" in root.message
    assert "in _slow_loader (time.sleep(30)" in root.message


def test_a_signal_during_an_exception_dump_waits_for_that_dump(tmp_path):
    import signal

    from commscope.flight.out.watchdog import Watchdog

    class _Dumper:
        owner = None
        calls: list = []

        def dump(self, reason, exception=None, fatal=False):
            self.owner = threading.get_ident()
            os.kill(os.getpid(), signal.SIGUSR1)  # arrives while this thread is dumping
            time.sleep(0.05)  # the Python handler runs here, inside the dump
            self.calls.append(reason)
            self.owner = None
            return "path"

    from types import SimpleNamespace

    dog = Watchdog(SimpleNamespace(config=None), _Dumper())  # type: ignore[arg-type]
    dog._prev_handlers[signal.SIGUSR1] = signal.SIG_IGN
    previous = signal.signal(signal.SIGUSR1, dog._on_signal)
    try:
        dog._safe_dump("exception", ValueError("x"))
    finally:
        signal.signal(signal.SIGUSR1, previous)
    # the exception dump finished first, then the signal was acted on (its own dump)
    assert dog.dumper.calls == ["exception", "signal SIGUSR1"]
    assert dog._deferred_signals == []


# --------------------------------------------------------------------------- threads


def _loader_thread_dies(rank, world_size, out_dir):
    import queue

    import torch
    import torch.distributed as dist

    prefix = os.path.join(out_dir, "rank_")
    _init(rank, world_size, dump_prefix=prefix, timeout_s=1.5, poll_interval_s=0.25)
    batches: queue.Queue = queue.Queue()

    def load() -> None:
        for step in range(1_000):
            if rank == 1 and step == 3:
                raise ValueError("bad batch 3")  # the loader dies; the process goes on
            batches.put(torch.ones(4) * step)

    threading.Thread(target=load, name="loader", daemon=True).start()

    def leave_when_the_incident_is_dumped() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                reasons = [_load(f"{prefix}{r}")["dump_reason"] for r in range(world_size)]
            except (OSError, EOFError, pickle.UnpicklingError):
                reasons = []
            if reasons and not any(x.startswith("exception in thread") for x in reasons):
                time.sleep(0.2)
                break
            time.sleep(0.05)
        os._exit(0)

    threading.Thread(target=leave_when_the_incident_is_dumped, daemon=True).start()
    for _ in range(10):
        dist.all_reduce(batches.get())  # rank 1 waits here forever after step 3
    time.sleep(60)


def test_a_thread_that_dies_is_not_a_dead_rank(tmp_path):
    # issue 32 item 4: rank 1's loader thread raises; its main thread then waits on the
    # loader's queue while the others wait in the next all_reduce. The thread's death
    # dump does not start an incident: the rank's file is its hang dump, which names the
    # dead thread; the analysis blames rank 1 as alive, never as crashed
    out = tmp_path / "dumps"
    out.mkdir()
    results = run_ranks(_loader_thread_dies, 3, tmp_path, str(out), timeout=60, check=False,
                        init=False)
    assert all(not r.timed_out for r in results), results
    dumps = {r: _load(str(out / f"rank_{r}")) for r in range(3)}
    assert dumps[1]["dump_reason"].startswith("request from rank"), dumps[1]["dump_reason"]
    (death,) = dumps[1]["commscope_thread_deaths"]
    assert (death["thread"], death["type"], death["message"]) == (
        "loader", "ValueError", "bad batch 3")
    assert "commscope_exception" not in dumps[1]
    later = sorted(p.name for p in (out / "commscope_later").glob("*")) if (
        out / "commscope_later").exists() else []
    assert later == [], later  # the thread's dump was not kept as an incident

    from commscope.analyze import analyze

    result = analyze(str(out))
    kinds = [f.kind for f in result.findings]
    assert result.verdict == "hang" and "crashed_rank" not in kinds, kinds
    root = result.findings[0]
    assert (root.kind, root.culprit_ranks) == ("missing_rank", [1]), root.message
    assert "its thread loader died earlier of ValueError: bad batch 3" in root.message
    assert "thread_died" in kinds


# ------------------------------------------------------------ async ops never waited on


def _unwaited_async_ops(rank, world_size, out_dir, hang):
    import torch
    import torch.distributed as dist

    import commscope.flight as flight

    prefix = os.path.join(out_dir, "rank_")
    _init(rank, world_size, dump_prefix=prefix, timeout_s=1.5, poll_interval_s=0.2,
          handle_signals=False, dump_on_exception=False)
    kept = []
    for i in range(3):
        if rank == 1:
            time.sleep(0.3)  # rank 0's op is unfinished when it lets go of the work
        if not (hang and rank == 1 and i == 2):  # hang: rank 1 never issues the third
            work = dist.all_reduce(torch.ones(1 << 14), async_op=True)
            if i == 0:
                kept.append(work)  # held, never waited on
            # the others: dropped at once, unwaited (fire and forget)
    time.sleep(3.3)  # two recorder timeouts
    snap = flight.snapshot()
    return ([(e["collective_seq_id"], e["state"]) for e in snap["entries"]],
            sorted(os.path.basename(p) for p in glob.glob(prefix + "*")))


def test_async_ops_nobody_waits_on_are_seen_completing_and_never_dump_a_healthy_job(tmp_path):
    results = run_ranks(_unwaited_async_ops, 2, tmp_path, str(tmp_path), False, timeout=60,
                        init=False)
    for rank, (entries, dumps) in enumerate(results):
        assert entries == [(1, "completed"), (2, "completed"), (3, "completed")], (rank, entries)
        assert dumps == [], (rank, dumps)  # no timeout: nothing was stuck


def test_an_unwaited_async_op_that_never_completes_still_dumps_at_the_timeout(tmp_path):
    results = run_ranks(_unwaited_async_ops, 2, tmp_path, str(tmp_path), True, timeout=60,
                        init=False)
    entries, dumps = results[0]
    assert entries == [(1, "completed"), (2, "completed"), (3, "started")], entries
    assert "rank_0" in dumps, dumps
    dump = _load(str(tmp_path / "rank_0"))
    assert dump["dump_reason"] == "timeout"
    assert [(e["collective_seq_id"], e["state"]) for e in dump["entries"]][-1] == (3, "started")
