"""`commscope demo` runs end to end on local ranks and checks its own diagnosis."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from commscope.mesh import HostTable

pytestmark = pytest.mark.dist


def _demo(tmp_path, *args):
    out = tmp_path / "commscope_demo"  # the default name, as in the README
    proc = subprocess.run(
        [sys.executable, "-m", "commscope", "demo", "-o", str(out), *args],
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
    assert analysis["format"] == "commscope.analysis/2"
    assert analysis["findings"][0]["kind"] == "size_mismatch"
    assert analysis["findings"][0]["culprit_ranks"] == [3]
    for name in ("comm_trace.json", "comm_trace.html", "timeline.json", "report.html"):
        assert (out / name).stat().st_size > 0, name
    shown = sorted(p.name for p in (out / "traces").iterdir() if p.name[0] != ".")
    assert shown == [f"rank_{r}" for r in range(4)]


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
    assert root["culprit_ranks"] == [3] and root["waiting_ranks"] == [0, 1, 2]


def _normalized(text: str, out: str, host: str | None = None) -> list[str]:
    """Demo output without what changes from run to run (paths, timings, progress);
    ``host``: this machine's name in the mesh picture, shown as the README's ``devbox``
    (with the picture's spacing, which follows the name's length, collapsed)."""
    lines = []
    for line in text.replace(out, "<out>").splitlines():
        if re.match(r"\s+\d+ s: dumps from ranks", line) or line.startswith("analyzed in "):
            continue
        if host is not None:
            line = re.sub(rf"(?<=[ (]){re.escape(host)}(?=[ )\];]|$)", "devbox", line)
        if "devbox" in line or re.match(r"\s+tp=0\s+tp=1$", line):
            line = re.sub(r" {2,}", "  ", line.strip())
        lines.append(re.sub(r" \(\d+\.\d s\)$", "", line.rstrip()))
    return lines


def test_readme_shows_what_the_demo_prints(tmp_path):
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = readme.split("$ commscope demo\n", 1)[1].split("```", 1)[0]
    pasted_out = re.search(r"output folder: (\S+)", block).group(1)
    proc, out = _demo(tmp_path)
    assert proc.returncode == 0, proc.stderr
    host = HostTable.from_hostnames([socket.gethostname()]).labels[0]
    assert _normalized(proc.stdout, str(out), host) == _normalized(block, pasted_out)


def test_demo_watch_names_the_stall_before_the_recorder_timeout(tmp_path):
    proc, _ = _demo(tmp_path, "--watch", "--timeout-s", "8")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = proc.stdout
    watch = [line for line in text.splitlines() if "[commscope watch]" in line]
    assert watch and watch[0].strip().startswith("[commscope watch] HEALTHY"), watch
    # (on a busy machine a rank slow to start may show as a short wait before the fault)
    stuck = next(line for line in watch if "STUCK" in line and "after the fault" in line)
    assert "rank 3" in stuck and "missing_rank" in stuck, stuck
    named = next(line for line in watch if "named the stall" in line)
    after = float(named.split("named the stall ")[1].split(" s after")[0])
    assert after < 8.0, named  # before the recorder's timeout fired
    # and the post-mortem analysis agrees with the live view
    assert "the analysis names the injected fault: missing_rank, rank 3" in text
