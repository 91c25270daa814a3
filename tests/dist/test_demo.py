"""`commscope demo` runs end to end on local ranks and checks its own diagnosis."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.dist


def _demo(tmp_path, *args):
    out = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-m", "commscope", "demo", "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=150,
    )
    return proc, out


def test_demo_size_fault_is_named(tmp_path):
    proc, out = _demo(tmp_path, "--fault", "size")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = proc.stdout
    assert "DeviceMesh(dp=2, tp=2, device='cpu')" in text
    assert "*c10d_functional.all_reduce: 1" in text  # the level-0 comm table
    assert "[size_mismatch] Rank 3 called all_reduce ([[2]] Float)" in text
    assert "the analysis names the injected fault: size_mismatch, rank 3" in text
    analysis = json.loads((out / "analysis.json").read_text())
    assert analysis["format"] == "commscope.analysis/1"
    assert analysis["findings"][0]["kind"] == "size_mismatch"
    assert analysis["findings"][0]["culprit_ranks"] == [3]
    for name in ("comm_trace.json", "comm_trace.html", "timeline.json", "report.html"):
        assert (out / name).stat().st_size > 0, name
    assert sorted(p.name for p in (out / "traces").iterdir()) == [f"rank_{r}" for r in range(4)]


def test_demo_default_fault_is_the_skipped_dp_all_reduce(tmp_path):
    proc, out = _demo(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = proc.stdout
    assert "rank 3 injects the fault at step 2: skips the all_reduce on the dp axis" in text
    assert "waiting for the flight recorder (watchdog timeout 5 s)" in text
    assert "[missing_rank] Rank 3 never joined all_reduce #3" in text
    assert "the analysis names the injected fault: missing_rank, rank 3" in text
    analysis = json.loads((out / "analysis.json").read_text())
    root = analysis["findings"][0]
    assert analysis["verdict"] == "hang"
    assert root["group"]["desc"] == "mesh_dp" and root["group"]["ranks"] == [1, 3]
    assert root["culprit_ranks"] == [3] and root["waiting_ranks"] == [1]
