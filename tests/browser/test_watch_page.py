"""``commscope watch --web`` in headless Chromium, on a real 4-rank gloo job: the page
updates as the job trains, shows the culprit once rank 3 stalls, and refuses a wrong
token."""

from __future__ import annotations

import time
import urllib.error
import urllib.request

import pytest

from commscope.watch.command import SnapshotMaker, resolve_address
from commscope.watch.source import StoreSource
from commscope.watch.web import WatchServer
from tests.jobs.launch import start

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]


def test_the_live_page_follows_a_real_job_and_names_the_stalled_rank(page, tmp_path):
    # The page can name the desync's kind only from a record that still holds the split:
    # a record holds the newest 16 folds, 1.6 s of steps at 10 a second, well over the
    # ranks' publishing interval (0.5 s) plus the page's refresh (0.2 s), so a busy box
    # cannot make the page miss it (at 20 steps a second the folds reached back 0.8 s,
    # and one late refresh showed only "fingerprint_mismatch").
    job = start(tmp_path / "job", interval_s=0.5, DESYNC_FILE=str(tmp_path / "desync"),
                STEP_S="0.1")
    server = None
    try:
        job.watch_info()
        address = resolve_address(None, None, str(job.watch_file))
        source = StoreSource(address)
        source.connect()
        server = WatchServer(SnapshotMaker(source), token=address.token, refresh_s=0.2)
        server.start()
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(server.url.replace(address.token, "wrong"), timeout=10)
        assert refused.value.code == 403
        page.goto(server.url)
        page.wait_for_selector("#groups td")
        assert page.errors == []

        def enqueued() -> int:
            return int(page.query_selector_all("#groups td")[3].text_content())

        before = enqueued()
        deadline = time.monotonic() + 30
        while enqueued() <= before and time.monotonic() < deadline:
            time.sleep(0.2)
        assert enqueued() > before  # the page moves with the job
        assert page.text_content("#verdict strong") in ("HEALTHY", "BEHIND")
        assert page.query_selector("#desyncs") is None
        deadline = time.monotonic() + 30  # the slowest-ranks panel, from the fingerprints

        def first_group() -> str | None:
            cells = page.query_selector_all("#slowest td")
            return cells[0].text_content() if cells else None

        while first_group() != "default_pg" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert first_group() == "default_pg", page.text_content("#app")[:2000]
        assert page.query_selector("#slowest tr.straggler") is None  # a healthy job

        # rank 1 all-reduces one batch as int32: nothing hangs, the page says so
        (tmp_path / "desync").write_text("now")
        deadline = time.monotonic() + 30
        while page.text_content("#verdict strong") != "DESYNC" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert page.text_content("#verdict strong") == "DESYNC"
        assert page.query_selector("#desyncs .kind").text_content() == "dtype_mismatch"
        assert "rank 1" in page.text_content("#headline")

        job.stall_file.write_text("now")
        deadline = time.monotonic() + 30  # (the page's CSP forbids eval: poll from here)
        while page.text_content("#verdict strong") != "STUCK" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert page.text_content("#verdict strong") == "STUCK"
        assert "rank 3" in page.text_content("#headline")
        assert "load_batch" in page.text_content("#headline")
        assert page.query_selector("#findings .kind").text_content() == "missing_rank"
        assert page.query_selector("#desyncs .kind").text_content() == "dtype_mismatch"
        culprit = page.query_selector("#ranks tr.culprit td")
        assert culprit is not None and culprit.text_content() == "3"
        assert page.get_attribute("#report-link", "href").startswith("/report?token=")
        assert page.errors == []
    finally:
        if server is not None:
            server.stop()
        job.stop()


def test_the_page_names_hosts_and_folds_them_at_scale(page):
    from tests.unit.test_watch_live import _scale_snapshot

    snaps = {"now": _scale_snapshot("stuck", world=64)}
    server = WatchServer(lambda: snaps["now"], token="t0k", refresh_s=0.2)
    server.start()
    try:
        page.goto(server.url)
        page.wait_for_selector("#ranks td")
        assert page.errors == []
        heads = [th.text_content() for th in page.query_selector_all("#ranks th")]
        assert heads[:3] == ["host", "pid", "rank"]
        assert "64 ranks on 8 hosts" in page.text_content(".meta")
        culprit = [td.text_content() for td in page.query_selector_all("#ranks tr.culprit td")]
        assert culprit[:3] == ["node005", "5041", "41"]
        cells = [[td.text_content() for td in tr.query_selector_all("td")]
                 for tr in page.query_selector_all("#ranks tr")[1:]]
        assert ["7 hosts: node[000-004,006-007]", "-", "local 1"] in [c[:3] for c in cells]
        assert len(cells) == 4
        # one host: no host column
        one = _scale_snapshot("stuck", world=8)
        snaps["now"] = one
        deadline = time.monotonic() + 10
        while page.query_selector_all("#ranks th")[0].text_content() != "rank" \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        assert page.query_selector_all("#ranks th")[0].text_content() == "rank"
        assert " on " not in page.text_content(".meta").split("·")[1]
        assert page.errors == []
    finally:
        server.stop()
