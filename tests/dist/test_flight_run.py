"""Dumps triggered by the outside world: `commscope run` and a crash, signals, exceptions."""

from __future__ import annotations

import os
import pickle
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.dist

REPO = Path(__file__).resolve().parents[2]


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)})
    env.update(extra)
    return env


def _load(path: Path) -> dict:
    with open(path, "rb") as fh:
        return pickle.load(fh)


CRASH = """
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(4)
for _ in range(3):
    dist.all_reduce(t)
if rank == 1:
    os._exit(3)  # dies without a word
# The survivors wait for each other in a recv that never comes (stuck in C++).
dist.recv(t, src=2 if rank == 0 else 0)
"""


def test_crash_under_commscope_run_leaves_survivors_sigterm_dumps(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(CRASH)
    prefix = tmp_path / "traces" / "rank_"
    cmd = [
        sys.executable,
        "-m",
        "commscope",
        "run",
        "--nproc-per-node",
        "3",
        "--standalone",
        "--monitor-interval",
        "0.2",
        str(script),
    ]
    proc = subprocess.run(
        cmd,
        cwd=tmp_path,
        env=_env(TORCH_FR_DUMP_TEMP_FILE=str(prefix)),
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert proc.returncode != 0
    # one line of our own per job, from rank 0: recording is on, where the dumps go
    assert proc.stderr.count("commscope: recording every collective of 3 ranks") == 1, (
        proc.stderr[-3000:])
    assert f"dumps to {prefix}<rank>" in proc.stderr
    assert f"commscope watch --file {prefix.parent / 'watch.json'}" in proc.stderr
    # torchrun's summary names the first failure it saw: rank 1's exit 3, or a survivor
    # whose recv broke when torchrun stopped the other survivor first
    assert "exitcode" in proc.stderr, proc.stderr[-3000:]
    names = sorted(p.name for p in prefix.parent.iterdir()
                   if p.name[0] != "." and p.name not in ("watch.json", "commscope_later"))
    assert names == ["rank_0", "rank_2"], names  # rank 1 died before it could dump
    # the job's log says where this host's dumps went (`commscope run`'s reporter: from
    # the ranks' notes in the store, or from this disk once the store went with the job)
    host = socket.gethostname()
    ours = [line for line in proc.stderr.splitlines() if line.startswith(f"commscope: {host}: ")]
    assert any(f"ranks 0, 2 dumped to {host}:{prefix.parent}/" in line for line in ours), ours
    assert any(line.startswith(f"commscope: {host}: rank 1 ") and "no dump" in line
               for line in ours), ours
    for rank in (0, 2):
        dump = _load(prefix.parent / f"rank_{rank}")
        # the first dump of the incident: torchrun's SIGTERM, the other survivor's
        # request (it got its SIGTERM first), or its own error when its recv broke; a
        # later one goes to commscope_later/
        reason = dump["dump_reason"]
        assert reason in ("signal SIGTERM", "collective error", f"request from rank "
                          f"{2 - rank}"), reason
        assert dump["rank"] == rank and dump["world_size"] == 3
        ops = [(e["profiling_name"], e["state"]) for e in dump["entries"]]
        peer = 2 if rank == 0 else 0
        assert ops == [("gloo:all_reduce", "completed")] * 3 + [
            (f"gloo:recv {rank}<-{peer}", "started")
        ]
        assert dump["entries"][-1]["peer"] == peer


SIGNALS = """
import os, sys, signal, time, torch, torch.distributed as dist
import commscope.flight as flight
out = sys.argv[1]
if len(sys.argv) > 2:
    def mine(signum, frame):
        open(os.path.join(out, "own_handler_ran"), "w").close()
        sys.exit(0)
    signal.signal(signal.SIGTERM, mine)
flight.enable(dump_prefix=os.path.join(out, "rank_"))
dist.init_process_group("gloo", store=dist.FileStore(os.path.join(out, "store"), 1),
                        rank=0, world_size=1)
dist.all_reduce(torch.ones(2))
open(os.path.join(out, "ready"), "w").close()
while True:
    time.sleep(0.05)
"""


def _start(tmp_path: Path, *extra: str) -> subprocess.Popen:
    script = tmp_path / "job.py"
    script.write_text(SIGNALS)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path), *extra],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while not (tmp_path / "ready").exists():
        assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return proc


def _wait_for_reason(path: Path, reason: str, limit: float = 10.0) -> dict:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if path.exists():
            dump = _load(path)
            if dump["dump_reason"] == reason:
                return dump
        time.sleep(0.05)
    raise AssertionError(f"no dump with reason {reason!r} at {path}")


def test_sigusr1_dumps_and_the_job_goes_on_then_sigterm_dumps_and_terminates(tmp_path):
    proc = _start(tmp_path)
    try:
        proc.send_signal(signal.SIGUSR1)
        dump = _wait_for_reason(tmp_path / "rank_0", "signal SIGUSR1")
        assert [e["profiling_name"] for e in dump["entries"]] == ["gloo:all_reduce"]
        time.sleep(0.3)
        assert proc.poll() is None  # SIGUSR1 only dumps
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == -signal.SIGTERM  # default action, as before
        _wait_for_reason(tmp_path / "rank_0", "signal SIGTERM", limit=1)
    finally:
        proc.kill()
        proc.wait()


def test_sigterm_hands_over_to_the_previous_handler(tmp_path):
    proc = _start(tmp_path, "own-handler")
    try:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        assert (tmp_path / "own_handler_ran").exists()
        _wait_for_reason(tmp_path / "rank_0", "signal SIGTERM", limit=1)
    finally:
        proc.kill()
        proc.wait()


def test_uncaught_exception_dumps_before_the_traceback(tmp_path):
    script = tmp_path / "boom.py"
    script.write_text(
        textwrap.dedent(f"""
        import torch, torch.distributed as dist
        import commscope.flight as flight
        flight.enable(dump_prefix={str(tmp_path / "rank_")!r})
        dist.init_process_group("gloo", store=dist.FileStore({str(tmp_path / "store")!r}, 1),
                                rank=0, world_size=1)
        dist.broadcast(torch.ones(3), src=0)
        raise RuntimeError("loss is nan")
    """)
    )
    proc = subprocess.run(
        [sys.executable, str(script)], env=_env(), capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1 and "loss is nan" in proc.stderr
    dump = _load(tmp_path / "rank_0")
    assert dump["dump_reason"] == "exception"
    assert [e["profiling_name"] for e in dump["entries"]] == ["gloo:broadcast"]


FORKED_WORKER = """
import os, signal, sys, time, torch, torch.distributed as dist
import commscope.flight as flight
out = sys.argv[1]
flight.enable(dump_prefix=os.path.join(out, "rank_"))
dist.init_process_group("gloo", store=dist.FileStore(os.path.join(out, "store"), 1),
                        rank=0, world_size=1)
dist.all_reduce(torch.ones(2))
flight.dump(reason="before fork")
pid = os.fork()  # what a DataLoader worker does
if pid == 0:
    assert not flight.is_enabled()
    time.sleep(30)
    os._exit(0)
time.sleep(0.5)
os.kill(pid, signal.SIGTERM)  # e.g. the loader shutting its workers down
_, status = os.waitpid(pid, 0)
time.sleep(3)  # the parent's watchdog must not react to the child's signal
dist.all_reduce(torch.ones(2))
print("child", os.waitstatus_to_exitcode(status), "parent alive", flight.is_enabled())
"""


def test_a_forked_worker_neither_dumps_nor_disturbs_the_parent(tmp_path):
    script = tmp_path / "fork.py"
    script.write_text(FORKED_WORKER)
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "child -15 parent alive True" in proc.stdout
    dump = _load(tmp_path / "rank_0")
    assert dump["dump_reason"] == "before fork"
    assert len(dump["entries"]) == 1
