"""The quick-start scripts in examples/ (shown in the README) run as they are."""

from __future__ import annotations

import contextlib
import io
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def _run(rank, world, name, workdir):
    os.chdir(workdir)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        g = runpy.run_path(str(EXAMPLES / name), run_name="__main__")
    keep = {k: g[k] for k in ("coordinate", "dp_ranks") if k in g}
    return out.getvalue(), keep


@pytest.mark.dist
def test_quickstart_mesh(ranks, tmp_path):
    results = ranks(_run, 8, "quickstart_mesh.py", str(tmp_path), timeout=120)
    _, g = results[5]
    # torch's get_coordinate, which ours keeps: a list on older releases, a tuple later
    assert {**g, "coordinate": tuple(g["coordinate"])} == {"coordinate": (1, 1),
                                                           "dp_ranks": [1, 5]}
    text = results[0][0]
    assert text.startswith("DeviceMesh(dp=2, tp=4, device='cpu')\n")
    assert "tp  4 ranks per group, 2 groups: inside a host" in text


@pytest.mark.dist
def test_quickstart_comm(ranks, tmp_path):
    results = ranks(_run, 4, "quickstart_comm.py", str(tmp_path), timeout=120)
    text = results[0][0]
    assert "MLPModule.net2\n          FORWARD PASS" in text
    assert "all_reduce  tp    4          1    1    0          0  320 B" in text
    for rank in range(4):
        assert (tmp_path / f"comm_rank{rank}.json").stat().st_size > 0


def test_quickstart_analyze_without_torch(tmp_path):
    code = (
        "import runpy, sys; sys.modules['torch'] = None; "
        f"sys.argv = ['x', {str(REPO / 'tests' / 'data' / 'missing_rank')!r}]; "
        f"runpy.run_path({str(EXAMPLES / 'quickstart_analyze.py')!r}, run_name='__main__')"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("hang missing_rank [")
    assert (tmp_path / "timeline.json").exists() and (tmp_path / "report.html").exists()
