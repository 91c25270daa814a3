"""The recorder's fatal log: written by a rank that dies in C, gone after a clean exit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = """
import os, sys
from commscope.flight.out import fatal
path = fatal.arm(sys.argv[1], 3)
print(path, flush=True)
def stuck_in_native_code():
    os.abort()
if sys.argv[2] == "abort":
    stuck_in_native_code()
"""


def _run(tmp_path: Path, how: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONFAULTHANDLER": ""}
    env.pop("PYTHONFAULTHANDLER")
    return subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "rank_"), how],
                          capture_output=True, text=True, timeout=60, env=env)


def test_a_rank_that_aborts_leaves_its_python_stack(tmp_path):
    proc = _run(tmp_path, "abort")
    assert proc.returncode == -6
    text = (tmp_path / ".commscope-fatal-3.log").read_text()
    assert text.startswith("Fatal Python error: Aborted")
    assert "in stuck_in_native_code" in text


def test_a_clean_exit_leaves_no_file(tmp_path):
    proc = _run(tmp_path, "exit")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(tmp_path / ".commscope-fatal-3.log")
    assert not (tmp_path / ".commscope-fatal-3.log").exists()


def test_someone_elses_faulthandler_is_left_alone(tmp_path):
    code = ("import faulthandler, sys; faulthandler.enable(); from commscope.flight.out import "
            f"fatal; print(fatal.arm({str(tmp_path / 'r_')!r}, 0))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60).stdout
    assert out.strip() == "None" and not list(tmp_path.iterdir())
