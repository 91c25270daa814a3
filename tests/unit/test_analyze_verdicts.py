"""The verdict never contradicts its findings (issue 32, item 3).

The table (finding, dump reason) -> verdict is written once in the code
(:data:`commscope.analyze.diagnose.findings.VERDICT_TABLE`) and shown in
``docs/analyze.md``; these tests read the docs' table, check it against the code cell
by cell, and check every scenario of the corpus against the docs' table: each finding
is one the table allows for the dumps' reason, and the verdict is the worst of the
findings' cells. Synthetic dumps then pin down how the ages of unfinished ops decide.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from commscope.analyze import KINDS, analyze
from commscope.analyze.diagnose.findings import ROLES, SEVERITY, VERDICT_TABLE, role, verdict
from commscope.analyze.diagnose.mismatch import MISMATCH_KINDS
from commscope.analyze.diagnose.timing import REASONS, job_reason, reason_class
from commscope.analyze.model import Finding
from commscope.analyze.synth import SyntheticJob, write_dump

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "analyze.md"
DATA = ROOT / "tests" / "data" / "scenarios"
HEADING = "### The verdict: finding x dump reason"


def _docs_table() -> tuple[list[str], dict[str, dict[str, str | None]]]:
    """The columns and rows of the table under :data:`HEADING`, cells as the code spells
    them (``hang``; ``None`` for ``—``), rows named as the code names roles."""
    lines = DOC.read_text().splitlines()
    start = lines.index(HEADING)
    table = []
    for line in lines[start + 1:]:
        if line.startswith("|"):
            table.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif table:
            break
    header, rule, *body = table
    assert set("".join(rule)) <= set("-:"), rule
    columns = header[1:]
    rows = {}
    for cells in body:
        name = cells[0].replace("`", "")
        assert name not in rows, f"row {name!r} twice"
        rows[name] = {col: (None if cell == "—" else cell.lower())
                      for col, cell in zip(columns, cells[1:], strict=True)}
    return columns, rows


def test_the_table_in_the_docs_is_the_codes():
    columns, rows = _docs_table()
    assert columns == list(REASONS)
    assert list(rows) == list(ROLES)
    for name in ROLES:
        for reason in REASONS:
            assert rows[name][reason] == VERDICT_TABLE[name][reason], (name, reason)
    assert {v for row in rows.values() for v in row.values()} - {None} <= set(SEVERITY)


def _finding(kind: str, blocking: bool = False, **details: object) -> Finding:
    return Finding(kind=kind, group=None, collective_seq_id=None, op=None, culprit_ranks=[],
                   waiting_ranks=[], message="", blocking=blocking, details=dict(details))


def test_every_kind_in_every_shape_has_its_row():
    shapes = [{}, {"undecided": True}, {"caught": {0: 1}}, {"killed": True},
              {"caught_running": {0: 1}}]
    for kind in {*KINDS, *MISMATCH_KINDS}:
        for blocking in (False, True):
            for details in shapes:
                assert role(_finding(kind, blocking, **details)) in ROLES, (kind, details)
    # the verdict of an analysis is the worst of its findings'
    assert verdict([]) == "healthy"
    assert verdict([_finding("straggler"), _finding("missing_rank", blocking=False)]) == "desync"
    assert verdict([_finding("healthy", caught_running={1: 5}),
                    _finding("stalled_collective", caught={0: 5})]) == "healthy"
    assert verdict([_finding("stalled_collective", undecided=True),
                    _finding("missing_rank", blocking=True),
                    _finding("size_mismatch", True, killed=True)]) == "crash"


def test_dump_reasons_fall_in_their_columns():
    assert [reason_class(r) for r in (
        "api", "request from commscope dump", "signal SIGUSR1", "timeout",
        "collective error", "request from rank 3", "signal SIGTERM", "exception",
        "exception in thread loader", "checkpoint", None)] == [
        "on demand", "on demand", "on demand", "timeout", "timeout", "timeout", "signal",
        "exception", "thread exception", "other", "none"]
    assert job_reason(["request from rank 0", "timeout"]) == "timeout"
    assert job_reason(["exception", "signal SIGTERM", "request from rank 5"]) == "exception"
    assert job_reason(["api", "signal SIGUSR1"]) == "on demand"
    assert job_reason([None, None]) == "none"


SCENARIOS = sorted(p.name for p in DATA.iterdir() if (p / "scenario.json").exists())
FOLDERS = [(n, sub) for n in SCENARIOS for sub in ("ours", "native") if (DATA / n / sub).is_dir()]


@pytest.mark.parametrize("name,sub", FOLDERS)
def test_every_scenario_verdict_agrees_with_its_findings_per_the_docs_table(name, sub):
    _, rows = _docs_table()
    world = json.loads((DATA / name / "scenario.json").read_text())["world_size"]
    result = analyze(DATA / name / sub, world_size=world if sub == "native" else None)
    column = job_reason(d.dump_reason for d in result.load.dumps.values())
    story = "\n".join(f"  [{role(f)}] {f.message}" for f in result.findings)
    cells = []
    for f in result.findings:
        cell = rows[role(f)][column]
        assert cell is not None, (f"{role(f)} is never made for {column} dumps", story)
        if "not a hang" in f.message or "not stuck" in f.message:
            assert cell not in ("hang", "incomplete"), story
        cells.append(cell)
    assert result.verdict == max(cells, key=SEVERITY.index), (column, story)


# ------------------------------------------------------------- ages decide (synthetic)


def _job_with_one_rank_unfinished(folder: Path, reasons: list[str], age_s: float,
                                  ours: bool = True) -> Path:
    """3 ranks ran three all_reduces; rank 0 has not finished the third (the others
    have) and had been in it ``age_s`` at its dump time."""
    job = SyntheticJob(3, backend="gloo", ours=ours)
    for _ in range(3):
        job.collective()
    created = job.ranks[0].entries[-1]["time_created_ns"]
    os.makedirs(folder, exist_ok=True)
    for r in range(3):
        data = job.dump(r, reason=reasons[r], dump_time_ns=created + int(age_s * 1e9))
        if r == 0:
            data["entries"][-1].update(state="started", retired=False,
                                       time_discovered_completed_ns=None)
            data["entries"][-1].pop("duration_ms", None)
        write_dump(data, str(folder / f"rank_{r}"))
    return folder


def test_a_rank_caught_finishing_an_op_is_not_a_hang(tmp_path):
    # ranks stopped by SIGTERM while running: rank 0 was 5 ms into an all_reduce that
    # ranks 1 and 2 had already left
    result = analyze(_job_with_one_rank_unfinished(tmp_path, ["signal SIGTERM"] * 3, 0.005))
    [f] = result.findings
    assert (result.verdict, role(f)) == ("healthy", "stalled_collective, caught finishing")
    assert "though ranks 1, 2 finished it" in f.message and "not a hang" in f.message
    assert "5.00 ms" in f.message and not f.blocking


def test_a_timeout_dump_is_judged_by_the_ages(tmp_path):
    # the rank's own watchdog fired: its op is past the recorder's timeout, stuck
    own = analyze(_job_with_one_rank_unfinished(
        tmp_path / "own", ["timeout", "request from rank 0", "request from rank 0"], 0.005))
    assert own.verdict == "hang" and role(own.findings[0]) == "stalled_collective, stuck"
    assert "watchdog dumped on timeout: stuck there" in own.findings[0].message
    # asked by another rank's timeout: older than the stall threshold is stuck, younger
    # was finishing
    asked = ["request from rank 1", "timeout", "request from rank 1"]
    old = analyze(_job_with_one_rank_unfinished(tmp_path / "old", asked, 30.0))
    assert old.verdict == "hang" and "for 30.0 s" in old.findings[0].message
    young = analyze(_job_with_one_rank_unfinished(tmp_path / "young", asked, 0.5))
    assert young.verdict == "healthy"
    assert role(young.findings[0]) == "stalled_collective, caught finishing"
    # --stall-s moves the line
    strict = analyze(tmp_path / "young", stall_s=0.1)
    assert strict.verdict == "hang"


def test_with_no_dump_time_gloo_finishes_what_every_member_posted_alike(tmp_path):
    # PyTorch's native gloo dumps: no time, no reason. Rank 0 had not finished the
    # all_reduce ranks 1 and 2 finished, and every member issued it alike: gloo cannot
    # stay inside it, so the dump caught rank 0 finishing (PyTorch retires a gloo call
    # just after it returns)
    result = analyze(_job_with_one_rank_unfinished(tmp_path, ["x"] * 3, 0.005, ours=False),
                     world_size=3)
    [f] = result.findings
    assert (result.verdict, role(f)) == ("healthy", "stalled_collective, caught finishing")
    assert "every member issued it alike" in f.message and "not a hang" in f.message


def test_with_no_dump_time_finishing_or_stuck_cannot_be_told(tmp_path):
    # a broadcast whose root the native records do not keep: alike sizes say too little
    # (two ranks may each broadcast from themselves and hang), so it cannot be told
    job = SyntheticJob(3, backend="gloo", ours=False)
    for _ in range(3):
        job.collective("broadcast")
    os.makedirs(tmp_path / "bcast")
    for r in range(3):
        data = job.dump(r)
        if r == 0:
            data["entries"][-1].update(state="started", retired=False)
        write_dump(data, str(tmp_path / "bcast" / f"rank_{r}"))
    result = analyze(tmp_path / "bcast", world_size=3)
    [f] = result.findings
    assert (result.verdict, role(f)) == ("incomplete", "stalled_collective, age unknown")
    assert "not a hang" not in f.message and "cannot be told" in f.message
    # every member inside an all_reduce they all issued alike, none finished it: caught
    # in flight, or a stuck transport; with no time it cannot be told, never a hang
    job = SyntheticJob(3, backend="gloo", ours=False)
    job.collective()
    job.collective(stuck=True)
    job.write(tmp_path / "flight")
    result = analyze(tmp_path / "flight", world_size=3)
    [f] = result.findings
    assert (result.verdict, role(f)) == ("incomplete", "stalled_collective, age unknown")
    assert "caught in flight or stuck cannot be told" in f.message and not f.blocking


def test_a_collective_before_a_finished_one_of_its_group_finished(tmp_path):
    # rank 0's record of all_reduce #2 is not marked finished, but its #3, which every
    # member issued alike, is: a group's calls finish in turn on gloo, only the mark lags
    for ours in (True, False):
        job = SyntheticJob(3, backend="gloo", ours=ours)
        for _ in range(3):
            job.collective()
        folder = tmp_path / str(ours)
        os.makedirs(folder)
        for r in range(3):
            data = job.dump(r, reason="api")
            if r == 0:
                data["entries"][1].update(state="started", retired=False,
                                          time_discovered_completed_ns=None)
            write_dump(data, str(folder / f"rank_{r}"))
        result = analyze(folder, world_size=3)
        assert [f.kind for f in result.findings] == ["healthy"], result.findings


def test_a_dump_on_demand_of_a_running_job_is_healthy_with_a_note(tmp_path):
    result = analyze(_job_with_one_rank_unfinished(tmp_path / "a", ["api"] * 3, 0.005))
    [f] = result.findings
    assert (result.verdict, role(f)) == ("healthy", "healthy, caught running")
    assert f.details["caught_running"] == {0: 5_000_000}
    assert "rank 0 was inside a collective for at most 5.00 ms" in f.message
    stuck = analyze(_job_with_one_rank_unfinished(tmp_path / "b", ["api"] * 3, 12.0))
    assert stuck.verdict == "hang"
    assert not any("caught_running" in f.details for f in stuck.findings)


def test_a_rank_that_dumped_alone_on_sigusr1_was_not_stopped_by_it(tmp_path):
    # rank 2 was asked for a dump (SIGUSR1) between two all_reduces; later the others
    # timed out waiting for it in the next one: it is missing there, alive, not crashed
    job = SyntheticJob(3, backend="gloo")
    for _ in range(3):
        job.collective()
    early = job.dump(2, reason="signal SIGUSR1", dump_time_ns=job.clock + 1_000_000)
    job.collective(ranks=[0, 1])
    for r in (0, 1):
        write_dump(job.dump(r, reason="timeout", dump_time_ns=job.clock + 2_000_000_000),
                   str(tmp_path / f"rank_{r}"))
    write_dump(early, str(tmp_path / "rank_2"))
    result = analyze(tmp_path)
    assert result.verdict == "hang", [f.message for f in result.findings]
    assert (result.findings[0].kind, result.findings[0].culprit_ranks) == ("missing_rank", [2])
    assert not any(f.kind == "crashed_rank" for f in result.findings)
