"""``commscope analyze DIR [DIR ...]``: several folders and archives read as one folder.

The scenario corpus's real gloo jobs are split per host (2-4 parts, some packed as .tar,
.tar.gz/.tgz or .zip, at any depth, several hosts in one archive) and must give the
analysis of the whole folder. Hostile archives (absolute and ``..`` names, links,
devices, bombs, too many members, damage, a non-archive) are built here, in tmp_path:
each is named with its reason and the rest is analyzed.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import tarfile
import tempfile
import zipfile
from pathlib import Path

import pytest

from commscope.analyze import analyze
from commscope.analyze.read import archive
from commscope.cli import main
from commscope.exitcodes import CRASH, HANG, UNREADABLE, USAGE

DATA = Path(__file__).resolve().parents[1] / "data"
SCENARIOS = DATA / "scenarios"


@pytest.fixture(autouse=True)
def _private_tmp(tmp_path, monkeypatch):
    """Unpack under tmp_path, so that a test can see every unpacked file go away."""
    where = tmp_path / "unpacked"
    where.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(where))
    yield
    assert list(where.iterdir()) == [], "the unpacked files were not removed"


def _rank_of(path: Path) -> int:
    return int(re.search(r"(\d+)", path.name).group(1))


def _split(src: Path, n: int, out: Path) -> list[Path]:
    """Each host's ``commscope_traces/`` (the i-th rank present on host i % n), later
    dumps and fatal logs included."""
    hosts = [out / f"host{i}" for i in range(n)]
    files = sorted(p for p in src.rglob("*") if p.is_file())
    ranks = sorted({_rank_of(f) for f in files})
    for f in files:
        dst = hosts[ranks.index(_rank_of(f)) % n] / "commscope_traces" / f.relative_to(src)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(f, dst)
    return hosts


def _tar(path: Path, folders: dict[str, Path], mode: str = "w:gz") -> str:
    with tarfile.open(path, mode) as tf:
        for arcname, folder in folders.items():
            tf.add(folder, arcname=arcname)
    return str(path)


def _zip(path: Path, folders: dict[str, Path]) -> str:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for arcname, folder in folders.items():
            for f in sorted(folder.rglob("*")):
                if f.is_file():
                    zf.write(f, f"{arcname}/{f.relative_to(folder)}")
    return str(path)


def _pack(layout: str, hosts: list[Path], out: Path) -> list[str]:
    if layout == "dir+deep-tgz":  # a folder, and a host's whole path in a .tar.gz
        return [str(hosts[0]), _tar(out / "hostB.tar.gz", {"hostB/tmp/job": hosts[1]})]
    if layout == "zip+dir+tar":
        return [_zip(out / "hostA.zip", {"hostA": hosts[0]}), str(hosts[1]),
                _tar(out / "hostC.tar", {".": hosts[2]}, "w")]
    if layout == "two-hosts-tgz+zip":  # a scheduler's collection of two hosts
        return [_tar(out / "hosts01.tgz", {"hostA": hosts[0], "hostB": hosts[1]}),
                _zip(out / "hostC.zip", {"x/y": hosts[2]})]
    if layout == "two-hosts-tgz+zip+dir":
        return [_tar(out / "hosts01.tgz", {"hostA": hosts[0], "hostB": hosts[1]}),
                _zip(out / "hostC.zip", {"x/y": hosts[2]}), str(hosts[3])]
    assert layout == "tar+zip"
    return [_tar(out / "a.tar", {"commscope_traces": hosts[0] / "commscope_traces"}, "w"),
            _zip(out / "b.zip", {"b": hosts[1]})]


_PARTS = {"dir+deep-tgz": 2, "zip+dir+tar": 3, "two-hosts-tgz+zip": 3,
          "two-hosts-tgz+zip+dir": 4, "tar+zip": 2}
CASES = [
    ("crash_sigkill/ours", "zip+dir+tar"),            # later dumps in commscope_later/
    ("dtype_mismatch_kills_peer/ours", "two-hosts-tgz+zip"),  # hidden fatal logs
    ("restarted_job/ours", "two-hosts-tgz+zip+dir"),  # another job's files
    ("loader_thread_deadlock/ours", "dir+deep-tgz"),  # frames read back from the files
    ("skip_new_group/ours", "tar+zip"),               # group creations
    ("mesh3d_missing/ours", "zip+dir+tar"),
    ("p2p_ring_deadlock/native", "zip+dir+tar"),      # PyTorch's own dumps
    ("wrapped_ring_missing/native", "dir+deep-tgz"),
]


def _same(result) -> dict:
    """The JSON analysis, apart from paths."""
    data = result.to_json()
    data["unreadable"] = sorted((os.path.basename(u["file"]), u["error"])
                                for u in data["unreadable"])
    data["other_jobs"] = sorted((os.path.basename(u["file"]), u["rank"], u["reason"])
                                for u in data["other_jobs"])
    return data


@pytest.mark.parametrize("name,layout", CASES)
def test_split_hosts_give_the_merged_folders_analysis(tmp_path, name, layout):
    src = SCENARIOS / name
    inputs = _pack(layout, _split(src, _PARTS[layout], tmp_path), tmp_path)
    whole = analyze(src)
    parts = analyze(inputs)
    assert _same(parts) == _same(whole)
    assert _same(analyze(inputs[::-1])) == _same(whole)  # the order of inputs is no matter
    reports = parts.extra["inputs"]
    assert [r.path for r in reports] == inputs
    assert sorted(r for rep in reports for r in rep.ranks) == whole.loaded
    # paths name the archive and the member, never the temporary folder
    shown = [d.path for d in parts.load.dumps.values()] + parts.load.ignored + [
        u.file for u in parts.unreadable + parts.load.other_jobs]
    assert all(p.startswith(tuple(inputs)) for p in shown), shown


def test_archives_keep_end_times_for_the_exports(tmp_path, capsys):
    src = SCENARIOS / "p2p_ring_deadlock" / "ours"
    inputs = _pack("dir+deep-tgz", _split(src, 2, tmp_path), tmp_path)
    result = analyze(inputs)
    assert all(d.ends is not None for d in result.load.dumps.values())
    trace = tmp_path / "t.json"
    assert main(["analyze", *inputs, "--perfetto", str(trace), "--html",
                 str(tmp_path / "r.html")]) == HANG
    want = tmp_path / "w.json"
    assert main(["analyze", str(src), "--perfetto", str(want)]) == HANG
    spans = [sorted((e["pid"], e["name"], e.get("dur")) for e in json.loads(p.read_text())[
        "traceEvents"] if e["ph"] == "X") for p in (trace, want)]
    assert spans[0] == spans[1] and spans[0]


def test_header_names_every_input_and_what_each_gave(tmp_path, capsys):
    hosts = _split(SCENARIOS / "crash_sigkill" / "ours", 2, tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("nothing here")
    tgz = _tar(tmp_path / "hostB.tar.gz", {"hostB": hosts[1]})
    assert main(["analyze", str(hosts[0]), tgz, str(empty)]) == CRASH
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"commscope analyze: 3 inputs: {hosts[0]}, {tgz}, {empty}"
    assert out[1] == f"  {hosts[0]}: ranks 0, 3"
    assert out[2] == f"  {tgz}: rank 1"
    assert out[3] == f"  {empty}: nothing used: no file named like a dump (1 other file)"
    assert out[4].startswith("dumps: ")


def test_identical_files_count_once(tmp_path, capsys):
    src = SCENARIOS / "crash_sigkill" / "ours"
    copy = tmp_path / "copy"
    shutil.copytree(src, copy)
    tgz = _tar(tmp_path / "again.tgz", {"commscope_traces": src})
    result = analyze([str(src), str(copy), tgz])
    assert _same(result) == _same(analyze(src))
    gave = [r for r in result.extra["inputs"] if r.ranks]
    assert len(gave) == 1
    idle = [r.line() for r in result.extra["inputs"] if not r.ranks]
    assert all("also in another input, counted once" in line for line in idle), idle
    # the same folder twice, too
    assert _same(analyze([str(src), str(src)])) == _same(analyze(src))


def test_two_dumps_of_one_rank_keep_the_first_of_the_incident(tmp_path):
    src = SCENARIOS / "crash_sigkill" / "ours"
    later = tmp_path / "later"
    later.mkdir()
    # rank 1's later dump (same job, written after its first), as if collected elsewhere
    shutil.copy(src / "commscope_later" / "1.signal-sigterm.pkl", later / "rank_1")
    for order in ([str(src), str(later)], [str(later), str(src)]):
        result = analyze(order)
        assert result.load.dumps[1].path == str(src / "rank_1")
        [aside] = [u for u in result.unreadable if u.file == str(later / "rank_1")]
        assert "another dump of rank 1 of the same job, in another input" in aside.error
        assert f"kept {src / 'rank_1'}" in aside.error and "s later" in aside.error
        whole = _same(analyze(src))
        mine = _same(result)
        mine["unreadable"] = [u for u in mine["unreadable"] if "another dump" not in u[1]]
        assert mine == whole


# ---------------------------------------------------------------- hostile archives


def _good(tmp_path: Path) -> tuple[str, bytes]:
    """Ranks 0-1 of tests/data/missing_rank in a folder; rank 2's bytes for an archive."""
    folder = tmp_path / "hostA"
    folder.mkdir()
    for r in (0, 1):
        shutil.copy(DATA / "missing_rank" / f"rank_{r}", folder / f"rank_{r}")
    return str(folder), (DATA / "missing_rank" / "rank_2").read_bytes()


def _member(tf: tarfile.TarFile, name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE,
            link: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    tf.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def _check_rest_analyzed(result) -> None:
    root = result.findings[0]
    assert (root.kind, root.culprit_ranks) == ("missing_rank", [2]), root.message
    assert result.loaded == [0, 1, 2]


def _errors(result) -> dict[str, str]:
    return {u.file: u.error for u in result.unreadable}


def _all_errors(result) -> str:
    return "\n".join(f"{u.file}: {u.error}" for u in result.unreadable)


def test_hostile_tar_members_are_named_and_never_written(tmp_path):
    folder, rank2 = _good(tmp_path)
    evil = tmp_path / "evil.tar.gz"
    with tarfile.open(evil, "w:gz") as tf:
        _member(tf, "hostB/rank_2", rank2)
        _member(tf, "/tmp/abs.bin", b"x")
        _member(tf, "../../up.bin", b"x")
        _member(tf, "hostB/link", kind=tarfile.SYMTYPE, link="/etc/passwd")
        _member(tf, "hostB/hard", kind=tarfile.LNKTYPE, link="hostB/rank_2")
        _member(tf, "hostB/dev", kind=tarfile.CHRTYPE)
        _member(tf, "hostB/fifo", kind=tarfile.FIFOTYPE)
        _member(tf, "hostB/bell\x1b[2J", b"x")
        _member(tf, "hostB/rank_2", b"a second one")
    result = analyze([folder, str(evil)])
    _check_rest_analyzed(result)
    errors, text = _errors(result), _all_errors(result)
    e = str(evil)
    assert f"{e}: member '/tmp/abs.bin': an absolute path: refused" in text
    assert f"{e}: member '../../up.bin': a path with '..': refused" in text
    assert "symbolic link (to '/etc/passwd')" in errors[f"{e}/hostB/link"]
    assert "hard link" in errors[f"{e}/hostB/hard"]
    assert "device" in errors[f"{e}/hostB/dev"]
    assert "FIFO" in errors[f"{e}/hostB/fifo"]
    assert "member 'hostB/bell\\x1b[2J': a name with control" in text and "\x1b" not in text
    assert "a second member with this path" in errors[f"{e}/hostB/rank_2"]
    assert not (tmp_path.parent / "up.bin").exists() and not Path("/tmp/abs.bin").exists()


def test_a_refused_member_named_like_a_dump_stands_for_its_rank(tmp_path):
    folder, _ = _good(tmp_path)
    evil = tmp_path / "hostB.tar"
    with tarfile.open(evil, "w") as tf:
        _member(tf, "commscope_traces/rank_2", kind=tarfile.SYMTYPE, link="/dev/zero")
    result = analyze([folder, str(evil)])
    assert any(f.kind == "unreadable_dump" and f.details.get("ranks") == [2]
               and "symbolic link" in f.message for f in result.findings), result.findings
    assert not any(f.kind == "crashed_rank" for f in result.findings)


def test_hostile_zip_members_are_named(tmp_path):
    folder, rank2 = _good(tmp_path)
    evil = tmp_path / "evil.zip"
    with zipfile.ZipFile(evil, "w") as zf:
        zf.writestr("h/rank_2", rank2)
        link = zipfile.ZipInfo("h/link_rank_3")
        link.create_system, link.external_attr = 3, 0o120777 << 16
        zf.writestr(link, "/etc/passwd")
        zf.writestr("h/secret", b"not really encrypted")
        zf.writestr("__MACOSX/h/._rank_2", b"Finder's metadata")  # passed over
        zf.writestr("/abs.bin", b"x")
        zf.writestr("..\\..\\win.bin", b"x")
    raw = bytearray(evil.read_bytes())  # mark h/secret encrypted, in both of its headers
    local = raw.find(b"h/secret") - 30
    central = raw.find(b"h/secret", local + 40) - 46
    raw[local + 6] |= 1
    raw[central + 8] |= 1
    evil.write_bytes(bytes(raw))
    result = analyze([folder, str(evil)])
    _check_rest_analyzed(result)
    errors, text = _errors(result), _all_errors(result)
    assert "symbolic link" in errors[f"{evil}/h/link_rank_3"]
    assert "encrypted" in errors[f"{evil}/h/secret"]
    assert "an absolute path" in text and "a Windows path" in text
    assert "MACOSX" not in text


def test_bombs_are_stopped_by_the_bytes_actually_read(tmp_path, monkeypatch):
    monkeypatch.setattr(archive, "MAX_MEMBER_BYTES", 200_000)
    monkeypatch.setattr(archive, "MAX_TOTAL_BYTES", 1_000_000)
    folder, rank2 = _good(tmp_path)
    zeros = b"\0" * 3_000_000  # compresses to a few KB
    one_big = tmp_path / "big.tgz"
    with tarfile.open(one_big, "w:gz") as tf:
        _member(tf, "rank_2", rank2)
        _member(tf, "huge.bin", zeros[:500_000])
        _member(tf, "after.txt", b"after")
    result = analyze([folder, str(one_big)])
    _check_rest_analyzed(result)
    assert "more than 195.312 KiB" in _errors(result)[f"{one_big}/huge.bin"]
    gz_bomb = tmp_path / "bomb.tar.gz"
    with tarfile.open(gz_bomb, "w:gz") as tf:
        _member(tf, "rank_2", rank2)
        for i in range(20):
            _member(tf, f"pad_{i}.bin", zeros[:190_000])
    assert os.path.getsize(gz_bomb) < 60_000
    result = analyze([folder, str(gz_bomb)])
    _check_rest_analyzed(result)
    error = _errors(result)[str(gz_bomb)]
    assert "once decompressed (a decompression bomb?)" in error and "member" in error
    zip_bomb = tmp_path / "bomb.zip"
    with zipfile.ZipFile(zip_bomb, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("rank_2", rank2)
        zf.writestr("zeros.bin", zeros)
        for i in range(10):
            zf.writestr(f"pad_{i}", zeros[:190_000])
    result = analyze([folder, str(zip_bomb)])
    _check_rest_analyzed(result)
    errors = _errors(result)
    assert "more than" in errors[f"{zip_bomb}/zeros.bin"], errors
    assert "decompression bomb" in errors[str(zip_bomb)]


def test_a_zip_that_lies_about_its_sizes_is_read_only_as_far_as_it_goes(tmp_path,
                                                                          monkeypatch):
    monkeypatch.setattr(archive, "MAX_MEMBER_BYTES", 100_000)
    folder, rank2 = _good(tmp_path)
    liar = tmp_path / "liar.zip"
    with zipfile.ZipFile(liar, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("rank_2", rank2)
        zf.writestr("zeros.bin", b"\0" * 1_000_000)
    raw = bytearray(liar.read_bytes())
    at = raw.rfind(b"zeros.bin") - 46 + 24  # its central directory entry's size field
    raw[at:at + 4] = (10).to_bytes(4, "little")  # "10 bytes once decompressed"
    liar.write_bytes(bytes(raw))
    result = analyze([folder, str(liar)])
    _check_rest_analyzed(result)
    assert "corrupt" in _errors(result)[f"{liar}/zeros.bin"]


def test_too_many_members(tmp_path, monkeypatch):
    monkeypatch.setattr(archive, "MAX_MEMBERS", 5)
    folder, rank2 = _good(tmp_path)
    many = tmp_path / "many.tar"
    with tarfile.open(many, "w") as tf:
        _member(tf, "rank_2", rank2)
        for i in range(20):
            _member(tf, f"f{i}.txt", b"x")
    result = analyze([folder, str(many)])
    _check_rest_analyzed(result)
    assert "more than 5 members" in _errors(result)[str(many)]
    many_zip = tmp_path / "many.zip"
    with zipfile.ZipFile(many_zip, "w") as zf:
        for i in range(20):
            zf.writestr(f"f{i}.txt", b"x")
    result = analyze([folder, str(many_zip)])
    assert "20 members" in _errors(result)[str(many_zip)]


def test_damaged_archives_keep_what_was_read_before(tmp_path):
    folder, rank2 = _good(tmp_path)
    whole = tmp_path / "whole.tar.gz"
    with tarfile.open(whole, "w:gz", compresslevel=0) as tf:
        _member(tf, "rank_2", rank2)
        _member(tf, "filler.bin", os.urandom(200_000))
    data = whole.read_bytes()
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(data[:len(data) // 2])  # scp stopped half-way
    result = analyze([folder, str(cut)])
    _check_rest_analyzed(result)
    error = _errors(result)[str(cut)]
    assert error.startswith("truncated archive") and "the 1 member read whole" in error
    corrupt = tmp_path / "corrupt.tgz"
    corrupt.write_bytes(data[:20] + b"\xff" * 200 + data[220:])
    result = analyze([folder, str(corrupt)])
    assert result.loaded == [0, 1]
    assert str(corrupt) in _errors(result)
    zcut = tmp_path / "cut.zip"
    with zipfile.ZipFile(zcut, "w") as zf:
        zf.writestr("rank_2", rank2)
    zcut.write_bytes(zcut.read_bytes()[:-30])
    result = analyze([folder, str(zcut)])
    assert "not a zip archive, or a truncated one" in _errors(result)[str(zcut)]


@pytest.mark.parametrize("name,content,needle", [
    ("fake.tar.gz", b"just text, not gzip" * 40, "not a tar, gzip or zip archive"),
    ("fake.tar", b"just text" * 100, "not a tar, gzip or zip archive"),
    ("fake.zip", b"PK not really" * 10, "not a zip archive"),
    ("gzip.tgz", __import__("gzip").compress(b"no tar inside" * 50), "gzip data holding no tar"),
    ("empty.tgz", b"", "empty file"),
])
def test_a_file_named_like_an_archive_but_not_one_is_named(tmp_path, name, content, needle,
                                                           capsys):
    folder, rank2 = _good(tmp_path)
    (Path(folder) / "rank_2").write_bytes(rank2)
    fake = tmp_path / name
    fake.write_bytes(content)
    result = analyze([folder, str(fake)])
    assert result.loaded == [0, 1, 2]
    assert needle in _errors(result)[str(fake)]
    assert f"{fake}: nothing used: not read: " in result.extra["inputs"][1].line()
    # alone, it is unreadable input: one line, exit 7
    assert main(["analyze", str(fake)]) == UNREADABLE
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1


# ---------------------------------------------------------------- the command


def test_bad_paths_are_one_line_and_exit_7(tmp_path, capsys):
    folder, _ = _good(tmp_path)
    xz = tmp_path / "dumps.tar.xz"
    xz.write_bytes(b"x")
    notes = tmp_path / "notes.txt"
    notes.write_text("x")
    fifo = tmp_path / "pipe.tgz"
    os.mkfifo(fifo)
    for argv, needle, code in [
        ([folder, str(tmp_path / "nope.tgz")], "nope.tgz does not exist", UNREADABLE),
        ([folder, str(xz)], ".tar.xz archives are not read", UNREADABLE),
        ([folder, str(notes)], "is neither a folder, an archive", UNREADABLE),
        ([folder, str(fifo)], "is neither a folder, a dump file nor an archive", UNREADABLE),
        ([folder, "-d", str(tmp_path)], "give the folder once", USAGE),
    ]:
        assert main(["analyze", *argv]) == code, argv
        err = capsys.readouterr().err
        assert needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_no_dump_in_any_input_is_unreadable_input(tmp_path, capsys):
    empty = tmp_path / "e"
    empty.mkdir()
    tgz = _tar(tmp_path / "notes.tgz", {"x": empty})
    assert main(["analyze", str(empty), tgz]) == UNREADABLE
    assert "no dump files in" in capsys.readouterr().err


def test_unpacking_is_reported(tmp_path, monkeypatch, capsys):
    from commscope.analyze import command

    hosts = _split(SCENARIOS / "missing_rank" / "ours", 2, tmp_path)
    tgz = _tar(tmp_path / "hostB.tgz", {"hostB": hosts[1]})
    calls = []
    analyze([str(hosts[0]), tgz], unpacking=lambda *a: calls.append(a))
    size = os.path.getsize(tgz)
    assert calls[0] == (tgz, 0, size) and calls[-1] == (tgz, size, size)
    monkeypatch.setattr(command, "_UNPACK_SHOWN_BYTES", 0)  # as if it were a big one
    assert main(["analyze", str(hosts[0]), tgz, "--json"]) == HANG
    captured = capsys.readouterr()
    assert f"commscope analyze: unpacking {tgz}" in captured.err
    assert json.loads(captured.out)["verdict"] == "hang"
    import threading

    threads = threading.active_count()
    with command.unpack_progress(enabled=True) as cb:  # the terminal's bar
        cb("a.tgz", 0, 20)
        assert threading.active_count() > threads  # drawing
        cb("a.tgz", 20, 20)
        for _ in range(100):  # stopped before any reader is forked
            if threading.active_count() == threads:
                break
            __import__("time").sleep(0.01)
        assert threading.active_count() == threads


def test_prefix_selects_members_too(tmp_path):
    hosts = _split(DATA / "missing_rank", 2, tmp_path)
    zipped = _zip(tmp_path / "b.zip", {"deep/er": hosts[1]})
    result = analyze([str(hosts[0]), zipped], prefix="rank_")
    assert result.loaded == [0, 1, 2]


def test_relative_and_absolute_inputs_mixed(tmp_path, monkeypatch, capsys):
    hosts = _split(DATA / "missing_rank", 2, tmp_path)
    tgz = _tar(tmp_path / "hostB.tgz", {"hostB": hosts[1]})
    monkeypatch.chdir(tmp_path)
    assert main(["analyze", "host0", tgz]) == HANG
    out = capsys.readouterr().out
    assert out.startswith(f"commscope analyze: 2 inputs: host0, {tgz}\n  host0: ranks 0, 2\n")
