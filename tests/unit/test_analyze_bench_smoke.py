"""bench/analyze_scale.py runs end to end at a tiny size (the real benchmark is not a test)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from commscope import compat

ROOT = Path(__file__).resolve().parents[2]


def test_bench_script_smoke(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "analyze_scale.py"), "--ranks", "4,8",
         "--entries", "30", "--torch-max", "4", "--dir", str(tmp_path)],
        capture_output=True, text=True, timeout=110,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    row4 = next(line for line in lines if line.split()[:1] == ["4"])
    row8 = next(line for line in lines if line.split()[:1] == ["8"])
    if compat.has("torch_fr_trace"):
        assert "ours yes, torch yes" in row4
    else:  # torch before 2.10 ships no fr_trace module to compare with
        assert row4.rstrip().endswith("ours yes") and "has no fr_trace" in proc.stdout
    assert row8.rstrip().endswith("ours yes")
    assert "1.0 = linear" in proc.stdout
