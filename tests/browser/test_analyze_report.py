"""The offline HTML report in headless Chromium: loads cleanly, shows verdict and findings."""

from __future__ import annotations

from pathlib import Path

import pytest

from commscope.analyze import analyze, write_html
from commscope.analyze.answer import is_note
from commscope.analyze.present.report import group_table
from commscope.analyze.synth import SyntheticJob

pytestmark = pytest.mark.browser

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.mark.parametrize("name,verdict,kind", [
    ("missing_rank", "hang", "missing_rank"),
    ("cross_group_deadlock", "hang", "cross_group_deadlock"),
    ("crashed_rank", "crash", "crashed_rank"),
    ("recorded/healthy", "healthy", "healthy"),
    ("healthy", "healthy", None),  # the dumps caught a barrier finishing: a note, no finding
    ("scenarios/pipeline_skip_recv/ours", "hang", "p2p_unmatched"),
    ("scenarios/p2p_deadlock_send/ours", "hang", "p2p_deadlock"),
])
def test_report_shows_verdict_and_findings(page, tmp_path, name, verdict, kind):
    result = analyze(DATA / name)
    out = tmp_path / "report.html"
    write_html(result, out)
    page.goto(out.as_uri())
    page.wait_for_selector("#findings", state="attached")
    assert page.errors == []
    assert page.text_content("#verdict strong") == verdict.upper()
    # the banner says the answer: the verdict, then who and what
    assert page.text_content("#headline") == result.answer.headline.split(": ", 1)[1]
    items = page.query_selector_all("#findings li")
    shown = [f for f in result.findings if not is_note(f)]
    assert len(items) == len(shown)
    # the notes (findings that blame nobody) once, in their own list
    notes = [li.text_content() for li in page.query_selector_all("#notes li")]
    assert notes == result.answer.notes
    if kind is None:
        assert not items and notes
    else:
        first = items[0]
        assert first.query_selector(".kind").text_content() == kind
        assert first.query_selector(".message").text_content() == shown[0].message
    rows, _ = group_table(result)
    assert len(page.query_selector_all("#groups tr")) == len(rows) + 1  # and the header
    # the root cause and one line per other stuck place, as in the text report
    root = [li.text_content() for li in page.query_selector_all("#root-cause li")]
    shown = [li.text_content() for li in page.query_selector_all("#stuck li")]
    assert root == result.answer.root and shown == result.answer.stuck
    assert set(root + shown) <= set(result.stuck) | set(root)
    assert bool(root + shown) == any(f.blocking for f in result.findings) or (
        verdict in ("desync", "crash"))


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
    # the wait-for graph's labels too (drawn server-side, parsed as XML)
    assert evil in page.query_selector("#waitgraph g.edge title").text_content()
    assert page.query_selector("#waitgraph script") is None
    assert page.query_selector("#waitgraph img") is None


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


def _two_hosts_report(tmp_path, ranks=None) -> Path:
    from tests.hostdumps import blocks, write_hosts_job

    job = SyntheticJob(4)
    job.collective()
    job.collective(ranks=[0, 1, 2])
    write_hosts_job(job, tmp_path / "dumps", blocks(2), ranks=ranks)
    out = tmp_path / "report.html"
    write_html(analyze(tmp_path / "dumps", end_times=True), out)
    return out


def test_hosts_section_and_host_labels_render(page, tmp_path):
    page.goto(_two_hosts_report(tmp_path).as_uri())
    page.wait_for_selector("#hosts-table td")
    assert page.errors == []
    rows = [[td.text_content() for td in tr.query_selector_all("td")]
            for tr in page.query_selector_all("#hosts-table tr")[1:]]
    assert rows == [
        ["hostA", "0, 1", "4000-4001", "2/2", "/tmp/job/commscope_traces", ""],
        ["hostB", "2, 3", "4002-4003", "2/2", "/tmp/job/commscope_traces", "culprit: 3"]]
    assert page.get_attribute("#hosts-table tr:nth-child(3)", "class") == "blamed"
    assert [li.text_content() for li in page.query_selector_all("#by-host li")] == [
        "hostB: rank 3 is in no collective; rank 2 waits in all_reduce #2 of group 0",
        "hostA: both ranks wait in all_reduce #2 of group 0"]
    meta = page.text_content("#findings .meta")
    assert "culprits 3 (hostB, pid 4003)" in meta
    assert "waiting 0-2 (all of hostA; hostB: 2)" in meta
    assert "rank 3 · hostB · g 0" in page.text_content("#timeline")
    assert page.query_selector("#exclude-hosts") is None


def test_a_crashed_host_is_named_to_leave_out(page, tmp_path):
    page.goto(_two_hosts_report(tmp_path, ranks=[0, 1, 2]).as_uri())
    page.wait_for_selector("#hosts-table td")
    assert page.errors == []
    assert page.text_content("#exclude-hosts") == (
        "Leave out on restart: hostB (--json: exclude_hosts)")
    stops = page.text_content("#groups tr:nth-child(2) td:nth-child(7)")
    assert "no dump: 3 (hostB, pid 4003)" in stops


def test_hosts_fold_at_scale(page, tmp_path):
    from tests.hostdumps import blocks, write_hosts_job

    job = SyntheticJob(1024)
    job.collective()
    job.collective(ranks=[r for r in range(1024) if r != 41])
    write_hosts_job(job, tmp_path / "dumps", blocks(8, lambda i: f"node{i:03d}"), table_on=[0])
    out = tmp_path / "report.html"
    write_html(analyze(tmp_path / "dumps", jobs=1), out)
    page.goto(out.as_uri())
    page.wait_for_selector("#hosts-table td")
    assert page.errors == []
    assert len(page.query_selector_all("#hosts-table tr")) == 2  # header + node005
    assert page.text_content("#hosts-folded") == (
        "127 more hosts (node[000-004,006-127]): every dump here, nothing to report")
    assert [li.text_content() for li in page.query_selector_all("#by-host li")] == [
        "node005: rank 41 is in no collective; ranks 40, 42-47 wait in all_reduce #2 of group 0",
        "127 hosts (node[000-004,006-127]): all 1016 ranks wait in all_reduce #2 of group 0"]


def test_slowest_ranks_are_shown_only_where_a_rank_straggles(page, tmp_path):
    # a real gloo job where rank 2 sleeps before every collective, and a healthy one
    for name, want in [("straggler", True), ("healthy", False)]:
        result = analyze(DATA / "scenarios" / name / "ours")
        out = tmp_path / f"{name}.html"
        write_html(result, out)
        page.goto(out.as_uri())
        page.wait_for_selector("#findings li")
        assert page.errors == []
        rows = page.query_selector_all("#slowest tr")
        if want:
            assert len(rows) == 2, [r.text_content() for r in rows]  # header + one group
            text = rows[1].text_content()
            assert "rank 2: last 10/10" in text and "(straggler)" in text, text
        else:
            assert rows == []
            assert result.slowest  # the JSON keeps the figures even so
