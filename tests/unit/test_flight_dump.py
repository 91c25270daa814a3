"""Dump files: names, formats, plain types only, atomic under kill -9."""

from __future__ import annotations

import gzip
import io
import json
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import commscope.flight as flight
from commscope.flight.out.dump import dump_path, write_atomic

REPO = Path(__file__).resolve().parents[2]
PLAIN = (dict, list, tuple, str, int, float, bool, type(None))


class _PlainOnly(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"dump references {module}.{name}")


def _plain_load(data: bytes):
    return _PlainOnly(io.BytesIO(data)).load()


def _all_plain(obj) -> bool:
    if isinstance(obj, dict):
        return all(isinstance(k, str) and _all_plain(v) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return all(_all_plain(v) for v in obj)
    return isinstance(obj, PLAIN)


def test_dump_path_names():
    assert dump_path("/d/rank_", 3) == "/d/rank_3"
    assert dump_path("/d/rank_", 3, "json") == "/d/rank_3.json"
    assert dump_path("/d/rank_", 3, "json", compress=True) == "/d/rank_3.json.gz"


def test_pickle_json_and_gzip_dumps_hold_plain_data(tmp_path, fake_pg):
    flight.enable(
        dump_prefix=str(tmp_path / "r_"),
        watchdog=False,
        handle_signals=False,
        dump_on_exception=False,
    )
    try:
        with fake_pg(2, 4):
            dist.all_reduce(torch.ones(2, dtype=torch.float16))
            dist.send(torch.ones(1), dst=0)
            pkl = flight.dump()
            js = flight.dump(str(tmp_path / "x" / "named.json"))
            flight.enable(
                dump_prefix=str(tmp_path / "z_"),
                compress=True,
                watchdog=False,
                handle_signals=False,
                dump_on_exception=False,
            )
            dist.all_reduce(torch.ones(2))
            gz = flight.dump()
    finally:
        flight.disable()
    assert pkl == str(tmp_path / "r_2") and gz == str(tmp_path / "z_2.gz")
    with open(pkl, "rb") as fh:
        data = _plain_load(fh.read())  # no class of any module is needed
    assert _all_plain(data)
    assert data["dump_reason"] == "api" and data["rank"] == 2
    assert [e["profiling_name"] for e in data["entries"]] == ["fake:all_reduce", "fake:send 2->0"]
    assert data["entries"][0]["input_dtypes"] == ["Half"]
    with open(js) as fh:
        as_json = json.load(fh)
    assert as_json["entries"][1]["peer"] == 0
    assert as_json["entries"][0]["process_group"] == ["0", "default_pg"]
    with gzip.open(gz, "rb") as fh:
        zipped = _plain_load(fh.read())
    # The second enable() kept the live group and its counters.
    assert [e["collective_seq_id"] for e in zipped["entries"]] == [2]
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_write_atomic_replaces_whole_files(tmp_path):
    target = tmp_path / "a" / "rank_0"
    write_atomic(str(target), b"first")
    write_atomic(str(target), b"second, longer")
    assert target.read_bytes() == b"second, longer"
    assert os.listdir(target.parent) == ["rank_0"]


def test_two_threads_writing_one_file_at_once_both_succeed(tmp_path):
    # A rank's watchdog and a signal handler may dump at the same moment.
    target = tmp_path / "rank_0"
    payloads = [bytes([i]) * 200_000 for i in range(8)]
    errors: list[BaseException] = []

    def write(data: bytes) -> None:
        try:
            for _ in range(20):
                write_atomic(str(target), data)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(p,)) for p in payloads]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert target.read_bytes() in payloads
    assert os.listdir(tmp_path) == ["rank_0"]


DUMP_LOOP = """
import os, sys, torch, torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
import commscope.flight as flight
out, n = sys.argv[1], int(sys.argv[2])
flight.enable(dump_prefix=os.path.join(out, "rank_"), buffer_size=n, watchdog=False)
dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
pg = dist.group.WORLD
t = [torch.ones(2)]
for _ in range(n):
    pg.allreduce(t)
open(os.path.join(out, "ready"), "w").close()
while True:
    flight.dump()
"""


def _run_and_kill(tmp_path: Path, n: int, after_first_dump: bool, attempt: int) -> tuple:
    out = tmp_path / f"{'late' if after_first_dump else 'early'}{attempt}"
    out.mkdir()
    script = tmp_path / "loop.py"
    script.write_text(DUMP_LOOP)
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        [sys.executable, str(script), str(out), str(n)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    final = out / "rank_0"
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None and time.monotonic() < deadline
            # Kill while a dump is being written: a temporary file exists.
            temps = list(out.glob(f".commscope-{proc.pid}-*.tmp"))
            if not after_first_dump and final.exists():
                break  # the first dump was over before we saw it (a loaded box): missed
            if temps and (final.exists() or not after_first_dump):
                break
            time.sleep(0.001)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    temps = list(out.glob(f".commscope-{proc.pid}-*.tmp"))
    if not after_first_dump and final.exists():
        return out, final, None  # not killed inside the first dump: another attempt
    return out, final, temps[0] if temps else None


@pytest.mark.slow
@pytest.mark.parametrize("after_first_dump", [False, True])
def test_kill_9_during_a_dump_never_leaves_a_partial_file(tmp_path, after_first_dump):
    n = 20_000
    for attempt in range(10):  # a loaded box can miss the window: try again
        out, final, tmp = _run_and_kill(tmp_path, n, after_first_dump, attempt)
        if tmp is not None:  # the kill landed while a dump was being written
            break
    else:
        pytest.fail("never managed to kill the process in the middle of a dump")
    if after_first_dump:
        data = pickle.loads(final.read_bytes())  # the previous dump, whole
        assert len(data["entries"]) == n
    else:
        assert not final.exists()  # killed during the first dump: no file at all
    assert sorted(p for p in os.listdir(out) if p != "ready") == sorted(
        [tmp.name] + ([final.name] if after_first_dump else [])
    )
