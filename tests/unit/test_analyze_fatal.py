"""Fatal logs (Python's faulthandler output beside the dumps): parsed, never trusted."""

from __future__ import annotations

from pathlib import Path

from commscope.analyze.read.fatal import parse_fatal, read_fatal_logs

ABORT = '''Fatal Python error: Aborted

Thread 0x00007fbf6ec296c0 (most recent call first):
  File "/x/commscope/flight/watchdog.py", line 150 in _run
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Thread 0x00007fbf8e3c8b80 (most recent call first):
  File "/x/torch/distributed/distributed_c10d.py", line 3151 in broadcast
  File "/home/user/train.py", line 213 in step
  File "/home/user/train.py", line 300 in <module>

Extension modules: torch._C (total: 1)
'''


def test_the_main_thread_is_the_one_not_started_by_threading():
    log = parse_fatal(ABORT, 0, "rank_0.fatal")
    assert log.error == "Fatal Python error: Aborted"
    assert log.frames[0] == ("broadcast", "/x/torch/distributed/distributed_c10d.py", 3151)
    assert log.frames[1] == ("step", "/home/user/train.py", 213)


def test_a_single_thread_report_and_junk_parse_without_raising():
    single = 'Fatal Python error: Segmentation fault\n\nStack (most recent call first):\n' \
             '  File "/a.py", line 3 in f\n'
    assert parse_fatal(single, 1, "p").frames == (("f", "/a.py", 3),)
    junk = parse_fatal("\x00\xff garbage\n  File broken", 2, "p")
    assert junk.frames == () and junk.error


def test_only_non_empty_fatal_files_are_taken(tmp_path: Path):
    (tmp_path / "rank_0.fatal").write_text(ABORT)
    (tmp_path / "rank_1.fatal").write_bytes(b"")
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "rank_2.fatal").write_bytes(b"\xff\xfe" * 10)
    logs, rest = read_fatal_logs(sorted(str(p) for p in tmp_path.iterdir()))
    assert sorted(logs) == [0, 2]
    assert rest == [str(tmp_path / "notes.txt")]
