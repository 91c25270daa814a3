"""Loading: formats, file-name layouts, rank from inside the file, and bad files.

Every bad file (empty, truncated, random bytes, foreign, hostile, duplicate) is named
with its reason and the analysis goes on with the rest.
"""

from __future__ import annotations

import gzip
import os
import pickle
import shutil
from pathlib import Path

import pytest

from commscope.analyze import analyze, load_dumps, read_dump_file
from commscope.analyze.read.load import DumpError, discover
from commscope.analyze.synth import SyntheticJob, write_dump

DATA = Path(__file__).resolve().parents[1] / "data"
needs_fork = pytest.mark.skipif(
    "fork" not in __import__("multiprocessing").get_all_start_methods(),
    reason="the fault is planted in the parent and inherited by the forked readers")


def _missing_rank_job(world: int = 4) -> SyntheticJob:
    job = SyntheticJob(world)
    for _ in range(3):
        job.collective("all_reduce")
    job.collective("all_reduce", ranks=[r for r in range(world) if r != 2])
    return job


def _root(result):
    f = result.findings[0]
    return f.kind, f.culprit_ranks, f.collective_seq_id


@pytest.mark.parametrize("fmt,compress", [("pickle", False), ("json", False),
                                          ("pickle", True), ("json", True)])
def test_our_format_pickle_json_gzip(tmp_path, fmt, compress):
    _missing_rank_job().write(tmp_path, fmt=fmt, compress=compress)
    result = analyze(tmp_path)
    assert result.loaded == [0, 1, 2, 3] and result.unreadable == []
    assert _root(result) == ("missing_rank", [2], 4)
    assert {d.source for d in result.load.dumps.values()} == {"commscope"}


def test_native_format_json_dump_of_pytorch(tmp_path):
    # PyTorch's _dump_fr_trace_json: lists for tuples, 0 for missing times, no frames
    job = _missing_rank_job()
    job.ours = False
    for r in range(4):
        d = job.dump(r)
        for e in d["entries"]:
            e.pop("frames")
            e["time_discovered_started_ns"] = e["time_discovered_started_ns"] or 0
            e["time_discovered_completed_ns"] = e["time_discovered_completed_ns"] or 0
        write_dump(d, str(tmp_path / f"rank_{r}"), fmt="json")
    result = analyze(tmp_path)
    assert _root(result) == ("missing_rank", [2], 4)
    assert "no stack recorded" in result.findings[0].message


@pytest.mark.parametrize("layout", ["rank_{}", "nccl_trace_rank_{}", "comm_lib_trace_rank_{}",
                                    "comm_traces/rank_{}", "trace_host{}_{}"])
def test_file_name_layouts(tmp_path, layout):
    job = _missing_rank_job()
    job.ours = False  # native dumps carry no rank: it comes from the name
    for r in range(4):
        name = layout.format(r, r) if layout.count("{}") == 2 else layout.format(r)
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        write_dump(job.dump(r), str(path))
    (tmp_path / "README.txt").write_text("not a dump")
    result = analyze(tmp_path)
    assert result.loaded == [0, 1, 2, 3]
    assert _root(result) == ("missing_rank", [2], 4)


def test_prefix_selects_files(tmp_path):
    job = _missing_rank_job()
    job.ours = False
    for r in range(4):
        write_dump(job.dump(r), str(tmp_path / f"nccl_trace_rank_{r}"))
        write_dump({"version": "2.10", "entries": []}, str(tmp_path / f"other_{r}"))
    result = analyze(tmp_path, prefix="nccl_trace_rank_")
    assert result.loaded == [0, 1, 2, 3] and result.unreadable == []
    assert _root(result) == ("missing_rank", [2], 4)
    files, _ = discover(tmp_path, "nccl_trace_rank_")
    assert [r for _, r in files] == [0, 1, 2, 3]


def test_rank_inside_the_file_wins_over_its_name(tmp_path):
    job = _missing_rank_job()
    for r in range(4):
        write_dump(job.dump(r), str(tmp_path / f"rank_{3 - r}"))  # names scrambled
    result = analyze(tmp_path)
    assert _root(result) == ("missing_rank", [2], 4)


def test_duplicate_rank_is_named_and_one_kept(tmp_path):
    job = _missing_rank_job()
    job.write(tmp_path)
    shutil.copy(tmp_path / "rank_1", tmp_path / "rank_1.copy")
    os.rename(tmp_path / "rank_1.copy", tmp_path / "old_rank_1")
    result = analyze(tmp_path)
    assert result.loaded == [0, 1, 2, 3]
    dup = [u for u in result.unreadable if "duplicate" in u.error]
    assert len(dup) == 1 and "rank 1" in dup[0].error


BAD_FILES = {
    "empty": (b"", "empty file"),
    "truncated": (None, "truncated"),
    "random": (bytes(range(7, 200)) * 3, "not a flight-recorder dump"),
    "foreign_pickle": (pickle.dumps([1, 2, 3], protocol=2), "foreign file: a list of int"),
    "foreign_dict": (pickle.dumps({"model": "weights"}, protocol=2), "foreign file"),
    "bad_json": (b"{\"version\": \"2.10\", \"entries\": [", "invalid JSON"),
    "bad_gzip": (b"\x1f\x8b\x08\x00garbage-here", "gzip"),
    "torch_save": (b"PK\x03\x04" + b"\x00" * 40, "not a flight-recorder dump"),
}


@pytest.mark.parametrize("kind", sorted(BAD_FILES))
def test_bad_file_is_named_and_the_rest_analyzed(tmp_path, kind):
    job = _missing_rank_job(5)
    job.collective("barrier", ranks=[0, 1, 3, 4])
    job.write(tmp_path, ranks=[0, 1, 2, 3])
    content, reason = BAD_FILES[kind]
    if content is None:
        content = pickle.dumps(job.dump(4), protocol=2)[:-200]
    (tmp_path / "rank_4").write_bytes(content)
    result = analyze(tmp_path)
    named = {Path(u.file).name: u.error for u in result.unreadable}
    assert "rank_4" in named, named
    assert reason in named["rank_4"], named["rank_4"]
    assert result.findings[0].kind == "missing_rank"
    assert result.findings[0].culprit_ranks == [2]


def test_hostile_pickle_never_runs_code(tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    job = _missing_rank_job()
    job.write(tmp_path, ranks=[0, 1, 2])
    data = job.dump(3)
    data["entries"][0]["frames"] = Evil()
    (tmp_path / "rank_3").write_bytes(pickle.dumps(data, protocol=2))
    with pytest.raises(DumpError, match="refused to import"):
        read_dump_file(tmp_path / "rank_3")
    result = analyze(tmp_path)
    assert not marker.exists()
    assert any("refused to import" in u.error and u.file.endswith("rank_3")
               for u in result.unreadable)
    # with rank 3 unreadable the analysis still says what it can
    assert result.verdict in ("hang", "incomplete")


def test_hostile_gzip_pickle_never_runs_code(tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    (tmp_path / "rank_0.gz").write_bytes(gzip.compress(pickle.dumps({"x": Evil()}, protocol=2)))
    result = analyze(tmp_path)
    assert not marker.exists()
    assert "refused to import" in result.unreadable[0].error


def test_old_schema_records_are_read(tmp_path):
    # a 2.2-era record: seq_id, sizes, no retired/process_group/dtypes
    for r in range(2):
        entries = [{"pg_id": 0, "seq_id": s, "profiling_name": "nccl:all_reduce",
                    "sizes": [[4]], "state": "completed"} for s in range(1, 4)]
        if r == 0:
            entries.append({"pg_id": 0, "seq_id": 4, "profiling_name": "nccl:all_reduce",
                            "sizes": [[4]], "state": "scheduled"})
        write_dump({"version": "2.2", "entries": entries}, str(tmp_path / f"rank_{r}"))
    result = analyze(tmp_path)
    assert _root(result) == ("missing_rank", [1], 4)


def test_partly_bad_file_is_named_and_used(tmp_path):
    job = _missing_rank_job()
    job.write(tmp_path, ranks=[0, 1, 2])
    data = job.dump(3)
    data["entries"][1]["state"] = 42
    data["entries"][2]["collective_seq_id"] = "three"
    write_dump(data, str(tmp_path / "rank_3"))
    result = analyze(tmp_path)
    assert 3 in result.loaded
    [u] = result.unreadable
    assert u.file.endswith("rank_3") and "partly used" in u.error
    assert "collective_seq_id is 'three'" in u.error and "state is 42" in u.error
    assert _root(result) == ("missing_rank", [2], 4)


def test_empty_folder_gives_no_files_and_bare_lists_work(tmp_path):
    assert load_dumps(tmp_path).dumps == {}
    with pytest.raises(FileNotFoundError):
        load_dumps(tmp_path / "nope")


def test_parallel_loading_gives_the_same_analysis(tmp_path):
    job = _missing_rank_job(8)
    job.write(tmp_path)
    (tmp_path / "rank_9").write_bytes(b"garbage")
    one = analyze(tmp_path, jobs=1).to_json()
    two = analyze(tmp_path, jobs=2).to_json()
    assert one == two
    assert one["unreadable"][0]["file"].endswith("rank_9")


@pytest.mark.parametrize("slow", [False, True])
def test_end_times_kept_while_loading_match_the_records(tmp_path, slow):
    job = _missing_rank_job()
    job.write(tmp_path, ranks=[0, 1, 2])
    data = job.dump(3)
    entries = data["entries"]
    created = entries[0]["time_created_ns"]
    for e in entries:
        e.pop("duration_ms", None)
    entries[0]["time_discovered_completed_ns"] = None  # gloo with timing: duration only
    entries[0]["duration_ms"] = 2.5
    entries[1]["time_discovered_completed_ns"] = None  # a duration that is no number
    entries[1]["duration_ms"] = True
    entries[2]["time_discovered_completed_ns"] = None  # nothing recorded
    entries[2]["duration_ms"] = float("nan")
    if slow:  # a dropped record sends the file through the record-by-record path
        entries.insert(1, {"collective_seq_id": "bad"})
    write_dump(data, str(tmp_path / "rank_3"))
    from commscope.analyze.present.export import _end_ns

    load = load_dumps(tmp_path, end_times=True)
    for dump in load.dumps.values():
        raw = read_dump_file(dump.path)["entries"]
        assert len(dump.ends) == len(raw)
        kept = [i for i, e in enumerate(raw) if type(e.get("collective_seq_id")) is int]
        assert [dump.ends[i] or None for i in kept] == [_end_ns(raw[i]) for i in kept]
    ends = load.dumps[3].ends
    assert ends[0] == created + 2_500_000
    assert list(ends[1:4 if slow else 3]) == [0] * (3 if slow else 2)
    # kept unasked only for commscope's device dumps (when each record finished tells a
    # stopped device from an early dump: analyze/align/progress.py); gloo's: not kept
    assert load_dumps(tmp_path).dumps[3].ends is not None
    gloo = SyntheticJob(2, backend="gloo")
    gloo.collective()
    gloo.write(tmp_path / "gloo")
    assert all(d.ends is None for d in load_dumps(tmp_path / "gloo").dumps.values())


def test_native_gloo_dump_is_plain_data_only():
    # the committed fixtures are the C++ pickler's bytes: no global is ever needed
    for path in sorted((DATA / "missing_rank").iterdir()):
        data = read_dump_file(path)
        assert data["version"] == "2.10" and data["pg_config"] == {
            "": {"name": "", "desc": "", "ranks": "[0, 1, 2]"}}


def test_scratch_and_odd_files_do_not_invent_ranks(tmp_path):
    job = _missing_rank_job()
    job.write(tmp_path)
    (tmp_path / "rank_0.tmp12345").write_bytes(b"half written")
    (tmp_path / "checkpoint_step_10000").write_bytes(b"not a dump at all")
    result = analyze(tmp_path)
    assert result.expected == [0, 1, 2, 3] and result.missing == []
    assert [Path(u.file).name for u in result.unreadable] == ["checkpoint_step_10000"]
    assert _root(result) == ("missing_rank", [2], 4)


def test_prefetch_asks_a_bounded_window_ahead_and_ignores_missing_files(tmp_path, monkeypatch):
    import os

    from commscope.analyze.read import load

    asked = []
    monkeypatch.setattr(os, "posix_fadvise",
                        lambda fd, offset, length, advice: asked.append((offset, length, advice)),
                        raising=False)
    monkeypatch.setattr(os, "POSIX_FADV_WILLNEED", 3, raising=False)
    monkeypatch.setattr(load, "_PREFETCH_BYTES", 5)  # only the head of a big file
    files = []
    for i in range(10):
        path = tmp_path / f"rank_{i}"
        if i != 1:  # rank_1 is missing: skipped, nothing raised
            path.write_bytes(b"x" * (3 if i % 2 else 9))
        files.append((str(path), i))
    prefetch = load._Prefetch(files, window=3)
    prefetch.up_to(0)
    assert prefetch.next == 3 and len(asked) == 2
    prefetch.up_to(5)
    assert prefetch.next == 8 and len(asked) == 7
    prefetch.up_to(100)
    assert prefetch.next == 10 and len(asked) == 9
    assert [length for _, length, _ in asked] == [5, 5, 3, 5, 3, 5, 3, 5, 3]
    assert {(offset, advice) for offset, _, advice in asked} == {(0, 3)}


@pytest.mark.timeout(60)
def test_a_fifo_among_many_dumps_is_named_not_waited_on(tmp_path):
    import os

    from commscope.analyze.read.load import load_dumps
    from commscope.analyze.synth import write_scale_dumps

    write_scale_dumps(tmp_path, 70, 20)  # enough files for worker processes and read-ahead
    os.mkfifo(tmp_path / "rank_70")
    result = load_dumps(tmp_path, jobs=2)
    assert sorted(result.dumps) == list(range(70))
    assert [(os.path.basename(u.file), u.error) for u in result.unreadable] == [
        ("rank_70", "empty file (0 bytes)")]


@pytest.mark.timeout(120)
@needs_fork
def test_a_reader_process_that_dies_is_named_and_the_rest_analyzed(tmp_path, monkeypatch):
    import os
    import signal

    from commscope.analyze.read import load

    job = _missing_rank_job(24)
    job.write(tmp_path)
    real = load.load_file

    def deadly(path, name_rank, end_times=False, columnar=False):
        if path.endswith("rank_5"):  # as the kernel's OOM killer would
            os.kill(os.getpid(), signal.SIGKILL)
        return real(path, name_rank, end_times, columnar)

    monkeypatch.setattr(load, "load_file", deadly)  # forked workers inherit it
    result = analyze(tmp_path, jobs=2)
    assert result.loaded == [r for r in range(24) if r != 5]
    [u] = result.unreadable
    assert u.file.endswith("rank_5") and "process reading this file died" in u.error
    assert _root(result) == ("missing_rank", [2], 4)


@pytest.mark.timeout(120)
@needs_fork
def test_a_result_a_worker_cannot_send_back_is_named(tmp_path, monkeypatch):
    from commscope.analyze.read import load

    job = _missing_rank_job(12)
    job.write(tmp_path)
    real = load.load_file

    def unsendable(path, name_rank, end_times=False, columnar=False):
        dump = real(path, name_rank, end_times, columnar)
        if path.endswith("rank_7"):
            dump.problems = [lambda: None]  # cannot be pickled back to the parent
        return dump

    monkeypatch.setattr(load, "load_file", unsendable)
    result = analyze(tmp_path, jobs=2)
    assert result.loaded == [r for r in range(12) if r != 7]
    [u] = result.unreadable
    assert u.file.endswith("rank_7") and "internal error while reading" in u.error


def test_reader_processes_from_64_files_or_32_mb(tmp_path, monkeypatch):
    from commscope.analyze.read import load

    monkeypatch.setattr(load.os, "sched_getaffinity", lambda _pid: {0, 1}, raising=False)
    small = [(str(tmp_path / f"rank_{i}"), i) for i in range(8)]
    for path, _ in small:
        Path(path).write_bytes(b"x" * 1000)
    assert load._default_jobs(small) == 1
    assert load._default_jobs(small * 8) == 2  # 64 files
    big = tmp_path / "rank_100"
    big.write_bytes(b"\0" * (33 << 20))  # one rank with a big ring beside small ones
    assert load._default_jobs([*small[:2], (str(big), 100)]) == 2
    assert load._default_jobs([(str(big), 100)]) == 1  # one file: nothing to share


@pytest.mark.parametrize("scenario,culprit", [("missing_rank", 2), ("mesh2d_stall_one_rank", None)])
def test_a_dump_whose_every_record_is_invalid_is_unusable_never_a_culprit(
        tmp_path, scenario, culprit):
    # a real job's folder; one bystander's file keeps its shape but none of its records
    # reads: that rank is named unusable, and the verdict of the others stands
    src = Path(__file__).resolve().parents[1] / "data" / "scenarios" / scenario / "ours"
    reference = analyze(src)
    root = reference.findings[0]
    bystander = next(r for r in reference.loaded
                     if r not in root.culprit_ranks and r != (culprit or -1))
    for f in src.iterdir():
        if f.is_file() and not f.name.startswith("."):
            shutil.copy(f, tmp_path / f.name)
    path = tmp_path / f"rank_{bystander}"
    with open(path, "rb") as fh:
        data = pickle.load(fh)  # our own fixture
    data["entries"] = [{"record_id": "x", "collective_seq_id": None} for _ in data["entries"]]
    with open(path, "wb") as fh:
        pickle.dump(data, fh)
    result = analyze(tmp_path)
    assert bystander not in result.loaded
    assert [u.rank for u in result.unreadable] == [bystander]
    assert "unusable: none of its" in result.unreadable[0].error
    first = result.findings[0]
    assert (first.kind, first.culprit_ranks) == (root.kind, root.culprit_ranks)
    assert all(bystander not in f.culprit_ranks for f in result.findings
               if f.kind != "unreadable_dump")
