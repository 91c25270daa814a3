"""The offline HTML report in headless Chromium: loads cleanly, shows verdict and findings."""

from __future__ import annotations

from pathlib import Path

import pytest

from commscope.analyze import analyze, write_html
from commscope.analyze.synth import SyntheticJob

pytestmark = pytest.mark.browser

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.mark.parametrize("name,verdict,kind", [
    ("missing_rank", "hang", "missing_rank"),
    ("cross_group_deadlock", "hang", "cross_group_deadlock"),
    ("crashed_rank", "crash", "crashed_rank"),
    ("recorded/healthy", "healthy", "healthy"),
    ("healthy", "incomplete", "stalled_collective"),
    ("scenarios/pipeline_skip_recv/ours", "hang", "p2p_unmatched"),
    ("scenarios/p2p_deadlock_send/ours", "hang", "p2p_deadlock"),
])
def test_report_shows_verdict_and_findings(page, tmp_path, name, verdict, kind):
    result = analyze(DATA / name)
    out = tmp_path / "report.html"
    write_html(result, out)
    page.goto(out.as_uri())
    page.wait_for_selector("#findings li")
    assert page.errors == []
    assert page.text_content("#verdict strong") == verdict.upper()
    items = page.query_selector_all("#findings li")
    assert len(items) == len(result.findings)
    first = items[0]
    assert first.query_selector(".kind").text_content() == kind
    assert first.query_selector(".message").text_content() == result.findings[0].message
    assert page.query_selector_all("#groups tr")  # header + one row per group
    assert len(page.query_selector_all("#groups tr")) == len(result.groups) + 1


def test_timeline_marks_stuck_collectives(page, tmp_path):
    out = tmp_path / "report.html"
    write_html(analyze(DATA / "missing_rank"), out)
    page.goto(out.as_uri())
    page.wait_for_selector("#timeline svg")
    assert page.errors == []
    assert len(page.query_selector_all("#timeline rect.stuck")) == 2  # ranks 0 and 1 in #4
    assert len(page.query_selector_all("#timeline rect.ok")) == 9


def test_hostile_names_are_text_not_markup(page, tmp_path):
    job = SyntheticJob(2)
    evil = "</script><script>window.pwned = 1</script><img src=x onerror=window.pwned=2>"
    job.group("1", evil, [0, 1])
    job.collective("all_reduce", group="1")
    job.collective("all_reduce", group="1", ranks=[0])
    job.write(tmp_path / "dumps")
    out = tmp_path / "report.html"
    write_html(analyze(tmp_path / "dumps"), out)
    page.goto(out.as_uri())
    page.wait_for_selector("#findings li")
    assert page.evaluate("window.pwned === undefined")
    assert page.errors == []
    assert evil in page.text_content("#findings")


def test_timeline_draws_p2p_lanes(page, tmp_path):
    out = tmp_path / "report.html"
    write_html(analyze(DATA / "p2p_unmatched"), out)
    page.goto(out.as_uri())
    page.wait_for_selector("#timeline svg")
    assert page.errors == []
    text = page.text_content("#timeline")
    assert "p2p" in text
    # rank 2's last send to rank 3 is the only stuck op of the job
    assert len(page.query_selector_all("#timeline rect.stuck")) == 1


def test_other_jobs_and_victims_are_shown(page, tmp_path):
    # a restarted job: the earlier attempt's files are listed, not merged
    result = analyze(DATA / "scenarios" / "restarted_job" / "ours")
    assert result.load.other_jobs
    out = tmp_path / "restarted.html"
    write_html(result, out)
    page.goto(out.as_uri())
    page.wait_for_selector("#other-jobs")
    assert page.errors == []
    rows = page.query_selector_all("#other-jobs tr")
    assert len(rows) == len(result.load.other_jobs) + 1
    assert "another job" in rows[1].text_content()
    # a wrong-size collective whose receivers gloo aborted: they are its victims
    result = analyze(DATA / "scenarios" / "size_mismatch_kills_peer" / "ours")
    assert result.findings[0].victims
    write_html(result, out)
    page.goto(out.as_uri())
    page.wait_for_selector("#findings li")
    assert "victims" in page.query_selector("#findings li .meta").text_content()
