"""Stragglers in the offline HTML report, drawn by headless Chromium: the slowest-ranks
table shows a slow rank of a real gloo job and a whole slow host, and nothing for a
healthy job with ordinary jitter (issue 33 items 1 and 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from commscope.analyze import analyze, write_html
from tests.unit.test_analyze_stragglers import MS, TWO_BY_TWO, _job

pytestmark = [pytest.mark.browser, pytest.mark.timeout(120)]

DATA = Path(__file__).resolve().parents[1] / "data" / "scenarios"


def _rows(page, folder: Path, out: Path) -> list[str]:
    write_html(analyze(folder), out)
    page.goto(out.as_uri())
    page.wait_for_selector("#findings li")
    assert page.errors == []
    return [r.text_content() for r in page.query_selector_all("#slowest tr")]


@pytest.mark.parametrize("name, want", [
    ("straggler_data_loader", "rank 2: last "),
    ("straggler_compute_heavy", "rank 1: last "),
    ("healthy_jitter", None),
    ("healthy_uneven_work", None),
])
def test_slow_ranks_of_real_jobs_and_none_for_jitter(page, tmp_path, name, want):
    rows = _rows(page, DATA / name / "ours", tmp_path / f"{name}.html")
    if want is None:
        assert rows == []
        return
    assert len(rows) == 2, rows  # header + the one group
    assert want in rows[1] and "(straggler)" in rows[1], rows


def test_a_slow_host_is_told_as_one(page, tmp_path):
    folder = _job(tmp_path / "d", TWO_BY_TWO, {2: [40 * MS, 30 * MS], 3: [30 * MS, 40 * MS]})
    rows = _rows(page, folder, tmp_path / "host.html")
    assert len(rows) == 2, rows
    assert "hostB (ranks 2, 3): last 24/24, lag median 40 ms" in rows[1], rows
    assert "(slow host)" in rows[1] and "(straggler)" not in rows[1], rows
