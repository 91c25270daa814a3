"""bench/flight_overhead.py --in-place runs end to end (the real benchmark is not a test)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.dist

ROOT = Path(__file__).resolve().parents[2]


def test_in_place_breakdown_smoke():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "flight_overhead.py"), "--in-place",
         "--iters", "2000", "--depth", "2"],
        capture_output=True, text=True, timeout=110,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.strip().startswith("rank ")]
    assert len(rows) == 2, proc.stdout
    for row in rows:
        for step in ("run", "begin", "complete"):
            m = re.search(rf"{step} ([\d.]+) / ([\d.]+) / ([\d.]+)", row)
            assert m, row
            median, p90, _ = (float(x) for x in m.groups())
            assert 0 < median <= p90, row
