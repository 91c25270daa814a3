"""The exit status of ``commscope analyze`` and ``commscope dump`` says the verdict
(:mod:`commscope.exitcodes`, docs/analyze.md "Exit status"), ``--exit-zero`` turns it
into 0 (not a usage or an internal error), and the renamed options keep their old
spellings, hidden.

Real dump folders of the scenario corpus (``tests/data/scenarios/<name>/ours``); the CLI
through ``commscope.cli.main(argv)``, and in a child process where the process's own
status matters (an uncaught exception, argparse's exit).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from commscope import exitcodes
from commscope.cli import build_parser, main
from commscope.compat import TorchMissing

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "tests" / "data" / "scenarios"


def _ours(name: str) -> str:
    return str(SCENARIOS / name / "ours")


@pytest.fixture
def incomplete(tmp_path: Path) -> str:
    """A healthy job whose rank 1 left an unreadable file: the dumps cannot decide."""
    folder = tmp_path / "incomplete"
    shutil.copytree(_ours("healthy"), folder)
    (folder / "rank_1").write_bytes(b"not a dump")
    return str(folder)


@pytest.fixture
def junk(tmp_path: Path) -> str:
    """Files named like dumps, none of them one: no dump could be read at all."""
    folder = tmp_path / "junk"
    folder.mkdir()
    for r in range(3):
        (folder / f"rank_{r}").write_text(f"junk {r}\n")
    return str(folder)


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "commscope", *argv], capture_output=True,
                          text=True, timeout=120, env=env)


# --------------------------------------------------------------------------- the table


def test_the_table_has_every_verdict_in_severity_order():
    from commscope.analyze.diagnose.findings import SEVERITY

    codes = [exitcodes.for_verdict(v) for v in SEVERITY]
    assert codes == [0, 3, 4, 5, 6]  # healthy, incomplete, desync, hang, crash
    assert [row.code for row in exitcodes.TABLE] == list(range(8))
    with pytest.raises(LookupError, match="no exit status for the verdict 'bogus'"):
        exitcodes.for_verdict("bogus")
    assert [exitcodes.exit_zero(c) for c in range(8)] == [0, 1, 2, 0, 0, 0, 0, 0]


# --------------------------------------------------------------------------- analyze


@pytest.mark.parametrize(("name", "code"), [
    ("healthy", exitcodes.HEALTHY),
    ("dtype_mismatch", exitcodes.DESYNC),  # ranks disagreed, the collective completed
    ("missing_rank", exitcodes.HANG),
    ("crash_raise", exitcodes.CRASH),
])
def test_analyze_exits_with_the_verdict(name, code, capsys):
    assert main(["analyze", _ours(name)]) == code
    out = capsys.readouterr().out
    verdict = next(v for v in ("healthy", "desync", "hang", "crash")
                   if exitcodes.for_verdict(v) == code)
    assert f"verdict: {verdict.upper()}" in out
    assert main(["analyze", _ours(name), "--exit-zero"]) == 0
    assert f"verdict: {verdict.upper()}" in capsys.readouterr().out  # the same report


def test_dumps_that_cannot_decide_exit_3(incomplete, capsys):
    assert main(["analyze", incomplete]) == exitcodes.INCOMPLETE
    assert "verdict: INCOMPLETE" in capsys.readouterr().out
    assert main(["analyze", incomplete, "--exit-zero"]) == 0


def test_no_dump_read_at_all_exits_7_with_the_report(junk, capsys):
    assert main(["analyze", junk]) == exitcodes.UNREADABLE
    out = capsys.readouterr().out
    assert "rank_0: not a flight-recorder dump" in out  # each file is named, with why


@pytest.mark.parametrize("what", ["empty", "missing", "a file"])
def test_a_path_with_no_dump_exits_7_in_one_line(what, tmp_path, capsys):
    path = {"empty": tmp_path, "missing": tmp_path / "nope",
            "a file": ROOT / "pyproject.toml"}[what]
    assert main(["analyze", str(path)]) == exitcodes.UNREADABLE
    err = capsys.readouterr().err
    assert err.startswith("commscope analyze: error: ") and len(err.splitlines()) == 1
    assert main(["analyze", str(path), "--exit-zero"]) == 0


def test_the_process_status_usage_and_internal_errors_survive_exit_zero(tmp_path):
    hang = _run("analyze", _ours("missing_rank"))
    assert hang.returncode == exitcodes.HANG, hang.stderr
    assert _run("analyze", _ours("missing_rank"), "--exit-zero").returncode == 0
    usage = _run("analyze", _ours("missing_rank"), "--exit-zero", "--no-such-option")
    assert usage.returncode == exitcodes.USAGE and "unrecognized arguments" in usage.stderr
    # an unexpected exception: Python's own status and traceback, --exit-zero or not
    code = ("import sys, commscope.analyze.command as c\n"
            "def boom(*a, **k): raise RuntimeError('a bug')\n"
            "c.run_analyze = boom\n"
            "from commscope.cli import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    bug = subprocess.run([sys.executable, "-c", code, "analyze", _ours("healthy"),
                          "--exit-zero"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert bug.returncode == exitcodes.INTERNAL and "RuntimeError: a bug" in bug.stderr


def test_entries_filters_that_match_nothing_stay_usage_errors(capsys):
    argv = ["analyze", _ours("missing_rank"), "--entries", "--group", "nope", "--exit-zero"]
    assert main(argv) == exitcodes.USAGE
    assert "no group named nope" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["--entries", "{dir}"],
    ["--entries", "3", "{dir}"],
    ["{dir}", "--entries", "3"],
    ["-j", "{dir}"],  # fr_trace's -j, then the folder
])
def test_entries_takes_a_count_or_lets_the_folder_follow(argv, capsys):
    folder = _ours("missing_rank")
    assert main(["analyze", *(a.format(dir=folder) for a in argv)]) == exitcodes.HANG
    out = capsys.readouterr().out
    last = 3 if "3" in argv else 8
    assert f"entries (newest {last} per group" in out


# --------------------------------------------------------------------------- dump


def test_dump_with_no_job_to_ask_exits_7(tmp_path, capsys):
    argv = ["dump", "--file", str(tmp_path / "watch.json")]
    assert main(argv) == exitcodes.UNREADABLE
    assert "commscope dump: " in capsys.readouterr().err
    assert main([*argv, "--exit-zero"]) == 0


def test_dump_usage_errors_exit_2_even_with_exit_zero(monkeypatch, capsys):
    assert main(["dump", "--store", "localhost", "--exit-zero"]) == exitcodes.USAGE
    capsys.readouterr()

    def missing(feature: str) -> None:
        raise TorchMissing(f"{feature} needs PyTorch, which is not installed")

    monkeypatch.setattr("commscope.cli.need_torch", missing)
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None)
    # not 3, the status of "incomplete"
    assert main(["dump", "--store", "localhost:1"]) == exitcodes.USAGE
    assert "needs PyTorch" in capsys.readouterr().err


@pytest.mark.parametrize(("state", "kinds", "verdict"), [
    ("stuck", ["missing_rank"], "hang"),
    ("stuck", ["crashed_rank", "missing_rank"], "crash"),
    ("desync", [], "desync"),
    ("healthy", [], "healthy"),
    ("behind", [], "healthy"),
    ("gone", [], "incomplete"),
])
def test_dump_without_the_files_exits_with_the_live_verdict(state, kinds, verdict,
                                                             monkeypatch):
    from commscope.watch import command

    snap = {"state": state, "headline": "h",
            "findings": [{"kind": k, "message": "m"} for k in kinds]}
    monkeypatch.setattr(command, "SnapshotMaker", lambda *a, **k: lambda: snap)
    lines: list[str] = []
    assert command._live_verdict(None, lines.append) == verdict  # type: ignore[arg-type]
    assert lines[0] == f"live verdict (every rank's record, all hosts): {state.upper()}: h"


# --------------------------------------------------------------------------- old names


@pytest.mark.parametrize(("argv", "dest", "value"), [
    (["mesh", "--shape", "2,4", "--world", "8"], "world_size", 8),
    (["demo", "--ranks", "6"], "world_size", 6),
    (["demo", "--out", "/tmp/x"], "output", "/tmp/x"),
    (["demo", "--timeout", "3"], "timeout_s", 3.0),
    (["analyze", "d", "--selected-ranks", "0", "1", "--entries"], "ranks", ["0", "1"]),
    (["analyze", "d", "--pg-filters", "tp", "--entries"], "group", ["tp"]),
    (["analyze", "d", "--just_print_entries", "4"], "entries", 4),
])
def test_old_and_other_tools_spellings_still_work(argv, dest, value):
    assert getattr(build_parser().parse_args(argv), dest) == value


def test_old_spellings_are_hidden_and_defaults_unchanged(capsys):
    args = build_parser().parse_args(["demo"])
    assert (args.world_size, args.output, args.timeout_s) == (4, "commscope_demo", 5.0)
    for sub, old in (("demo", "--ranks"), ("demo", "--out"), ("demo", "--timeout"),
                     ("mesh", "--world"), ("analyze", "--selected-ranks"),
                     ("analyze", "--just_print_entries"), ("analyze", "-j"),
                     ("analyze", "--allow-incomplete-ranks")):
        with pytest.raises(SystemExit):
            main([sub, "--help"])
        out = capsys.readouterr().out
        usage, options = out.split("\n\n")[0], out.split("\noptions:\n")[1].split("\n\n")[0]
        names = [re.split(r"\s{2,}", line.strip())[0] for line in options.splitlines()
                 if line.startswith("  -")]  # the description and help may name them
        for shown in (usage, *names):
            assert not re.search(rf"(?<![\w-]){re.escape(old)}(?![\w-])", shown), (sub, old)


# --------------------------------------------------------------------------- -o everywhere


def test_diff_writes_its_comparison_with_dash_o(tmp_path, capsys):
    comm = ROOT / "tests" / "data" / "comm"
    a, b = (str(comm / f"pytorch_mlp_fwd_bwd_noise{n}.json") for n in (0, 1))
    assert main(["diff", a, b]) == 0
    shown = capsys.readouterr().out
    text, data = tmp_path / "d.txt", tmp_path / "d.json"
    assert main(["diff", a, b, "-o", str(text)]) == 0
    assert capsys.readouterr().out == f"wrote {text}\n"
    assert text.read_text() == shown  # what stdout would have shown (not a terminal)
    assert main(["diff", a, b, "--output", str(data)]) == 0  # a .json name: JSON
    assert json.loads(data.read_text()) == json.loads(
        subprocess.run([sys.executable, "-m", "commscope", "diff", a, b, "--json"],
                       capture_output=True, text=True, timeout=120).stdout)
    assert main(["diff", a, b, "-o", str(tmp_path / "no" / "such" / "dir.txt")]) == 2
