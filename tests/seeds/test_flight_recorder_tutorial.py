"""The Flight Recorder tutorial (seeds/003) works with commscope.

Only the tutorial's environment variables and `commscope run`: a hung gloo job writes one
file per rank on timeout; the dump unpickles into the structure the page shows; the
on-demand call has a public form with the same three options; `commscope analyze -d DIR
-o OUTPUT` works as the page's `fr_trace.py -d ... -o ...` habit expects.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.dist

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
ENTRY_FIELDS = {
    "frames",
    "record_id",
    "pg_id",
    "process_group",
    "collective_seq_id",
    "p2p_seq_id",
    "op_id",
    "profiling_name",
    "time_created_ns",
    "input_sizes",
    "input_dtypes",
    "output_sizes",
    "output_dtypes",
    "state",
    "time_discovered_started_ns",
    "time_discovered_completed_ns",
    "retired",
    "timeout_ms",
    "is_p2p",
}


def _tutorial_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_", "COMMSCOPE_"))}
    env.update(
        {
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(REPO),
            "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
            "TORCH_NCCL_DUMP_ON_TIMEOUT": "true",
            "TORCH_NCCL_ENABLE_TIMING": "true",
        }
    )
    env.update(extra)
    return env


def _commscope(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "commscope", *args],
        cwd=cwd,
        env=_tutorial_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_hung_job_dumps_every_rank_and_analyze_names_the_rank(tmp_path):
    script = EXAMPLES / "tutorial_flight_recorder_hang.py"
    proc = _commscope(
        "run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "--monitor-interval",
        "0.2",
        str(script),
        cwd=tmp_path,
    )
    # The job fails (gloo's own timeout fires after the dumps); what matters is the files.
    traces = tmp_path / "commscope_traces"
    files = sorted(p.name for p in traces.iterdir()
                   if not p.name.startswith(".") and p.name not in ("watch.json",
                                                                    "commscope_later"))
    assert files == ["rank_0", "rank_1"], proc.stderr[-3000:]
    # torchrun's SIGTERM to the survivor after the hang dumps again, beside the hang's
    later = traces / "commscope_later"
    if later.exists():
        assert all(re.fullmatch(r"[01]\.[a-z0-9-]+\.pkl", p.name) for p in later.iterdir())

    for rank in (0, 1):
        with open(traces / f"rank_{rank}", "rb") as fh:
            t = pickle.load(fh)  # plain pickle, as the tutorial shows
        assert t["version"] == "2.10"
        assert set(t["pg_config"]["0"]) == {"name", "desc", "ranks"}
        assert t["pg_config"]["0"]["ranks"] == "[0, 1]"
        status = t["pg_status"]["0"]
        assert set(status) == {
            "last_enqueued_collective",
            "last_started_collective",
            "last_completed_collective",
        }
        for entry in t["entries"]:
            assert set(entry) >= ENTRY_FIELDS
            assert entry["profiling_name"] == "gloo:all_reduce"
            assert entry["process_group"] == ("0", "default_pg")
        seqs = [e["collective_seq_id"] for e in t["entries"]]
        assert seqs == ([1, 2, 3, 4] if rank == 0 else [1, 2, 3])
        done = [e for e in t["entries"] if e["state"] == "completed"]
        assert len(done) == 3 and all("duration_ms" in e for e in done)  # timing on
    with open(traces / "rank_0", "rb") as fh:
        pending = pickle.load(fh)["entries"][-1]
    # rank 0's fourth all_reduce never completed: still pending, or ended by gloo's timeout
    assert pending["state"] != "completed" and "duration_ms" not in pending
    assert not pending["retired"] or pending["failed"]

    out = tmp_path / "analysis.txt"
    proc = _commscope("analyze", "-d", str(traces), "-o", str(out), cwd=tmp_path)
    assert proc.returncode == 5, proc.stderr  # the verdict's exit status: hang
    text = out.read_text()
    assert "missing_rank" in text and "Rank 1" in text
    assert "tutorial_flight_recorder_hang.py" in text  # the culprit's own frame
    # the positional form says the same; rank 0's all_reduce ended in gloo's timeout, which
    # is a hang, not a collective that completed
    proc = _commscope("analyze", str(traces), "--json", cwd=tmp_path)
    result = json.loads(proc.stdout)
    assert result["verdict"] == "hang"
    root = result["findings"][0]
    assert (root["kind"], root["culprit_ranks"], root["waiting_ranks"]) == (
        "missing_rank",
        [1],
        [0],
    )
    assert root["collective_seq_id"] == 4


def test_on_demand_dump_has_the_tutorials_three_options(tmp_path):
    script = EXAMPLES / "tutorial_flight_recorder_on_demand.py"
    proc = _commscope(
        "run", "--standalone", "--nproc-per-node", "2", str(script), cwd=tmp_path, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Both ranks print to one pipe, so their lines may interleave: count, don't split.
    assert sorted(re.findall(r"2\.10 rank (\d): \['0'\]", proc.stdout)) == ["0", "1"]
    assert proc.stdout.count("gloo:all_reduce") == 2
