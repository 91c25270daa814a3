"""The columnar C reader: where it answers, it answers what the standard path does.

``commscope.analyze.read._fastread`` declines (returns ``None``) on anything but the common,
well-formed case, and the file is then read the standard way. These tests check, on
every fixture, on generated dumps with a hostile value in any field, and on randomly
damaged bytes, that it never crashes and never gives a different result.

After changing the C file, run these tests against an AddressSanitizer build too::

    gcc -O1 -g -fsanitize=address,undefined -shared -fPIC \
        -I"$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["include"])')" \
        commscope/analyze/read/_fastread.c -o /tmp/_fastread_asan.so
    COMMSCOPE_FASTREAD_SO=/tmp/_fastread_asan.so ASAN_OPTIONS=detect_leaks=0 \
        LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)" \
        .venv/bin/python -m pytest -p no:cacheprovider tests/unit/test_analyze_fastread.py
"""

from __future__ import annotations

import os
import pickle
import random
import shutil
from dataclasses import fields
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from commscope.analyze.model import RankDump
from commscope.analyze.read import load
from commscope.analyze.read.extract import DumpError, extract_dump
from commscope.analyze.read.load import read_dump_file
from commscope.analyze.synth import SyntheticJob, write_dump
from tests.unit.test_analyze_property import ENTRY_FIELDS, TOP_FIELDS, pickle_values

DATA = Path(__file__).resolve().parents[1] / "data"


def _reader():
    """The built reader, or the one ``COMMSCOPE_FASTREAD_SO`` names (a sanitizer build)."""
    path = os.environ.get("COMMSCOPE_FASTREAD_SO")
    if not path:
        return load._fastread
    import importlib.util

    spec = importlib.util.spec_from_file_location("_fastread", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fastread = _reader()
needs_reader = pytest.mark.skipif(fastread is None, reason="the C reader is not built")


@pytest.fixture(autouse=True)
def _use_the_reader_under_test(monkeypatch):
    monkeypatch.setattr(load, "_fastread", fastread)


def _standard(path: str, rank: int | None, end_times: bool = True) -> RankDump | str:
    try:
        return extract_dump(read_dump_file(path), path, rank, end_times=end_times)
    except DumpError as exc:
        return f"error: {exc}"


def _fields(d: RankDump) -> dict:
    return {f.name: getattr(d, f.name) for f in fields(RankDump)}


def _agree(path: str, rank: int | None = None) -> bool:
    """The fast path declines or gives exactly the standard result; True if it answered."""
    fast = load._read_fast(path, rank, True)
    if fast is None:
        return False
    standard = _standard(path, rank)
    assert not isinstance(standard, str), f"fast path read {path}, standard says {standard}"
    assert _fields(fast) == _fields(standard), path
    return True


def test_the_reader_is_built_where_there_is_a_compiler():
    import sysconfig

    headers = os.path.join(sysconfig.get_paths()["include"], "Python.h")
    if not (shutil.which("cc") or shutil.which("gcc")) or not os.path.exists(headers):
        pytest.skip("no C compiler or no Python headers: the standard reader is used")
    assert fastread is not None, (
        "pip install -e . should have built commscope.analyze.read._fastread")


@needs_reader
def test_every_fixture_reads_the_same_and_the_reader_answers_for_real_dumps():
    files = sorted(p for p in DATA.rglob("rank_*") if p.is_file())
    assert len(files) > 80
    answered = [p for p in files if _agree(str(p), int(p.name.rsplit("_", 1)[1]))]
    # the native gloo dumps (C++ pickler) and ours (Python pickler) are the common case
    assert len(answered) >= 0.9 * len(files), [str(p) for p in files if p not in answered]


def _job() -> SyntheticJob:
    job = SyntheticJob(3)
    job.group("1", "pair", [0, 1])
    for _ in range(3):
        job.collective("all_reduce")
        job.collective("all_gather", group="1")
    job.p2p(0, 2)
    job.p2p(2, 1, post="send")
    job.collective("all_reduce", ranks=[0, 1])
    return job


@needs_reader
@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
@pytest.mark.parametrize("n", [1, 2, 999, 1000, 1001, 2001])
def test_protocols_batch_sizes_and_single_records(tmp_path, protocol, n):
    job = SyntheticJob(2)
    for _ in range(n):
        job.collective("all_reduce")
    data = job.dump(0)
    path = tmp_path / "rank_0"
    path.write_bytes(pickle.dumps(data, protocol=protocol))
    assert _agree(str(path))


@needs_reader
def test_failed_flags_peers_and_durations_come_through(tmp_path):
    data = _job().dump(2)
    data["entries"][0]["failed"] = True
    data["entries"][1]["duration_ms"] = 2.5
    data["entries"][1]["time_discovered_completed_ns"] = None
    path = tmp_path / "rank_2"
    write_dump(data, str(path))
    assert _agree(str(path))
    fast = load._read_fast(str(path), None, True)
    assert fast.p2p and fast.p2p[0].peer is not None
    assert fast.ends[1] == data["entries"][1]["time_created_ns"] + 2_500_000


@needs_reader
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from([*sorted(ENTRY_FIELDS), "peer", "failed", "duration_ms", "frames"]),
       where=st.integers(0, 20), value=pickle_values, protocol=st.sampled_from([2, 4]))
def test_any_value_in_any_record_field(field, where, value, protocol):
    data = _job().dump(1)
    entry = data["entries"][where % len(data["entries"])]
    entry[field] = value
    _check_bytes(data, protocol)


@needs_reader
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from([*sorted(TOP_FIELDS), "pg_config", "pg_status"]),
       value=pickle_values)
def test_any_value_in_any_top_level_field(field, value):
    data = _job().dump(1)
    data[field] = value
    _check_bytes(data, 2)


def _check_bytes(data, protocol):
    try:
        raw = pickle.dumps(data, protocol=protocol)
    except (TypeError, ValueError, OverflowError, pickle.PicklingError, RecursionError):
        return
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "rank_1")
        with open(path, "wb") as f:
            f.write(raw)
        _agree(path)


@needs_reader
def test_damaged_bytes_never_crash_or_differ(tmp_path):
    job = _job()
    originals = [pickle.dumps(job.dump(r), protocol=p) for r in range(3) for p in (2, 4)]
    originals.append((DATA / "missing_rank" / "rank_0").read_bytes())  # C++ pickler
    rng = random.Random(20261122)
    path = tmp_path / "rank_0"
    answered = 0
    for _i in range(600):
        raw = bytearray(rng.choice(originals))
        for _ in range(rng.randint(1, 4)):
            if not raw:
                break
            kind = rng.random()
            at = rng.randrange(len(raw))
            if kind < 0.5:
                raw[at] = rng.randrange(256)
            elif kind < 0.7:
                del raw[at:at + rng.randint(1, 8)]
            elif kind < 0.85:
                raw[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
            else:
                del raw[at:]
        fastread.read_columns(bytes(raw))  # must not crash, whatever it says
        path.write_bytes(bytes(raw))
        answered += _agree(str(path), 0)
    assert answered > 15  # some damage leaves a readable dump: those must agree


@needs_reader
@settings(max_examples=200, deadline=None)
@given(raw=st.binary(max_size=300))
def test_random_bytes_are_declined(raw):
    assert fastread.read_columns(b"\x80\x02" + raw) is None


@needs_reader
def test_hostile_pickles_are_declined_and_run_nothing(tmp_path):
    class Boom:
        def __reduce__(self):
            return (os.system, ("touch " + str(tmp_path / "pwned"),))

    data = _job().dump(0)
    data["entries"][3]["frames"] = Boom()
    raw = pickle.dumps(data, protocol=2)
    assert fastread.read_columns(raw) is None
    assert not (tmp_path / "pwned").exists()
    # a record list referenced twice, and a record that is not a dict
    data = _job().dump(0)
    data["pg_status"] = data["entries"]
    assert fastread.read_columns(pickle.dumps(data, protocol=2)) is None
    data = _job().dump(0)
    data["entries"].append(["not", "a", "dict"])
    assert fastread.read_columns(pickle.dumps(data, protocol=2)) is None
    data = _job().dump(0)
    data["entries"].append(data["entries"][0])  # the same record twice
    assert fastread.read_columns(pickle.dumps(data, protocol=2)) is None


@needs_reader
def test_signatures_equal_in_value_but_not_in_type_keep_their_own_keys(tmp_path):
    # the reader reuses a recent record's key when the signature parts are the same
    # values of the same types; 1, True and 1.0 compare equal in Python but are not
    data = _job().dump(0)
    for entry, size in zip(data["entries"], [1, True, 1.0, 1, (1,), [1], 2**40, 1]):
        entry["input_sizes"] = [[size]] if not isinstance(size, (tuple, list)) else [size]
    path = tmp_path / "rank_0"
    write_dump(data, str(path))
    assert _agree(str(path))
    fast = load._read_fast(str(path), None, True)
    assert len(set(fast.sig_keys)) >= 6
