"""`commscope demo` runs end to end on local ranks and checks itself."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.dist


def test_demo_prints_the_mesh_and_succeeds():
    proc = subprocess.run(
        [sys.executable, "-m", "commscope", "demo"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "DeviceMesh(dp=2, tp=4, device='cpu'): 8 ranks, 2 hosts of 4 ranks" in out
    assert "dp  2 ranks per group, 4 groups: crosses hosts" in out
    assert "tp  4 ranks per group, 2 groups: inside a host" in out
    assert "  5     (1, 1)    [1, 5]    [4..7]" in out
    assert "every group checked with an all_reduce of its ranks' ids: ok" in out
