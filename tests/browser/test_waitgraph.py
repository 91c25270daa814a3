"""Who waits for whom, drawn, in headless Chromium: the HTML report on the demo's story,
a deadlock cycle, a crash and a 4 096-rank synthetic hang, and the live page of
``commscope watch --web``. Each test saves a screenshot of the drawing (its path is
printed: ``pytest -s`` shows it) and checks that the culprit node and the arrows are
there with the right labels."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from commscope.analyze import analyze, write_html
from commscope.analyze.synth import SyntheticJob
from commscope.watch.live import Thresholds, snapshot
from commscope.watch.web import WatchServer
from tests.hostdumps import blocks, write_hosts_job
from tests.unit.test_watch_live import _record, _source, _store

pytestmark = [pytest.mark.browser, pytest.mark.timeout(60)]

DATA = Path(__file__).resolve().parents[1] / "data"


def _shot(page: Any, tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"waitgraph_{name}.png"
    # one shot of where the section is (the live page redraws it every refresh)
    page.screenshot(path=str(path), full_page=True,
                    clip=page.locator("#waitgraph").bounding_box())
    print(f"screenshot: {path}")
    assert path.stat().st_size > 1000
    return path


def _report(page: Any, tmp_path: Path, folder: Path, name: str, **kw: Any) -> None:
    out = tmp_path / f"{name}.html"
    write_html(analyze(folder, **kw), out)
    page.goto(out.as_uri())
    page.wait_for_selector("#findings li")
    assert page.errors == []


def _nodes(page: Any) -> dict[str, tuple[set[str], str]]:
    """Node id → (its classes, its first line), as drawn."""
    out = {}
    for g in page.query_selector_all("#waitgraph svg g.node[data-id]"):
        classes = set(g.get_attribute("class").split()) - {"node"}
        out[g.get_attribute("data-id")] = (classes, g.query_selector("text.who").text_content())
    return out


def _arrows(page: Any) -> set[tuple[str, str, str, str]]:
    """(from, to, kind, label) of every arrow, nodes by their first line."""
    names = {i: who for i, (_, who) in _nodes(page).items()}
    out = set()
    for g in page.query_selector_all("#waitgraph svg g.edge"):
        kind = (set(g.get_attribute("class").split()) - {"edge"}).pop()
        assert g.query_selector("title").text_content()  # the long form, on hover
        assert g.query_selector("path") is not None and g.query_selector("polygon") is not None
        out.add((names[g.get_attribute("data-from")], names[g.get_attribute("data-to")], kind,
                 g.query_selector("text").text_content()))
    return out


def _culprits(page: Any) -> list[tuple[set[str], str]]:
    return [node for node in _nodes(page).values() if "culprit" in node[0]]


def test_the_demo_story_shows_rank_3_closing_a_cycle(page, tmp_path):
    # commscope demo's hang, recorded by tests/data/make_recorded_fixtures.py (the demo
    # itself takes ~15 s to run): rank 3 skipped its mesh_dp all_reduce
    _report(page, tmp_path, DATA / "recorded" / "skipped_then_blocked", "demo")
    _shot(page, tmp_path, "demo")
    assert page.text_content("#waitgraph h2") == "Who waits for whom"
    assert _culprits(page) == [({"root", "culprit", "cycle"}, "rank 3")]
    assert _arrows(page) == {
        ("rank 1", "rank 3", "cycle", "all_reduce #3 of mesh_dp"),
        ("rank 3", "rank 1", "cycle", "all_reduce #5 of default_pg"),
        ("ranks 0, 2", "rank 1", "wait", "all_reduce #5 of default_pg")}
    # above the findings, below the stuck lines
    ys = [page.locator(sel).bounding_box()["y"] for sel in ("#stuck", "#waitgraph", "#findings")]
    assert ys == sorted(ys)


@pytest.mark.parametrize("name,folder,hops", [
    ("cross_group_cycle", "cross_group_deadlock", [
        ("rank 0", "rank 1", "cycle", "all_reduce #2 of group_A"),
        ("rank 1", "rank 2", "cycle", "all_reduce #2 of group_B"),
        ("rank 2", "rank 0", "cycle", "all_reduce #2 of group_C")]),
    ("p2p_ring", "scenarios/p2p_ring_deadlock/ours", [
        (f"rank {r}", f"rank {(r + 1) % 4}", "cycle", "send of default_pg") for r in range(4)]),
])
def test_a_deadlock_cycle_is_drawn_as_a_ring(page, tmp_path, name, folder, hops):
    _report(page, tmp_path, DATA / folder, name)
    _shot(page, tmp_path, name)
    assert _arrows(page) == set(hops)
    nodes = _nodes(page)
    assert all({"culprit", "cycle"} <= classes for classes, _ in nodes.values())
    # on a ring: the nodes' centres span both directions
    boxes = [page.locator(f'#waitgraph g.node[data-id="{i}"] rect').bounding_box()
             for i in nodes]
    xs = {round(b["x"] + b["width"] / 2) for b in boxes}
    ys = {round(b["y"] + b["height"] / 2) for b in boxes}
    assert len(xs) > 1 and len(ys) > 1


def test_a_crash_marks_the_dead_rank(page, tmp_path):
    _report(page, tmp_path, DATA / "crashed_rank", "crash")
    _shot(page, tmp_path, "crash")
    assert _culprits(page) == [({"root", "culprit", "crashed"}, "rank 1")]
    assert _arrows(page) == {("ranks 0, 2", "rank 1", "wait", "all_reduce #4 of default_pg")}
    assert "crashed" in page.text_content("#waitgraph g.node.crashed[data-id]")


def test_4096_ranks_on_512_hosts_fold_into_two_nodes(page, tmp_path):
    # rank 41 (node005) never reaches all_reduce #2: 4 095 ranks wait for it (the chain
    # of a 2-D mesh at this scale is tests/unit/test_waitgraph.py's)
    job = SyntheticJob(4096)
    job.collective()
    job.collective(ranks=[r for r in range(4096) if r != 41])
    write_hosts_job(job, tmp_path / "dumps", blocks(8, lambda i: f"node{i:03d}"), table_on=[0])
    _report(page, tmp_path, tmp_path / "dumps", "scale", jobs=1)
    _shot(page, tmp_path, "4096")
    assert _culprits(page) == [({"root", "culprit"}, "rank 41")]
    assert _arrows(page) == {
        ("ranks 0-40, 42-4095 (4095)", "rank 41", "wait", "all_reduce #2 of default_pg")}
    assert len(_nodes(page)) == 2
    assert "node005, pid 4041" in page.text_content("#waitgraph g.node.culprit[data-id]")
    waiting = page.text_content("#waitgraph g.node.waiting[data-id]")
    assert "all of 511 hosts; 7 of node005" in waiting
    assert page.text_content("#waitgraph-caption").startswith("4096 ranks in 2 nodes")


def test_no_section_where_nobody_waits(page, tmp_path):
    _report(page, tmp_path, DATA / "scenarios" / "healthy" / "ours", "healthy")
    assert page.query_selector("#waitgraph") is None


def test_the_live_page_draws_the_same_graph_and_follows_it(page, tmp_path):
    now = time.time_ns()
    done = [(s, "completed") for s in range(1, 5)]
    records = {r: _record(r, 4, [*done, (5, "started")], now) for r in range(3)}
    records[3] = _record(3, 4, done, now, main=("load_batch", "/home/u/loader.py", 7,
                                                "time.sleep(60)"))
    stuck = snapshot(_source(_store(records, 4)).fetch(), thresholds=Thresholds(0.5),
                     now_ns=now)
    records[3] = _record(3, 4, done, now, age_s=9)  # then rank 3 goes silent
    silent = snapshot(_source(_store(records, 4)).fetch(), thresholds=Thresholds(0.5),
                      now_ns=now)
    assert stuck["state"] == silent["state"] == "stuck" and silent["silent"] == [3]
    snaps = {"now": stuck}
    server = WatchServer(lambda: snaps["now"], token="t0k", refresh_s=0.2)
    server.start()
    try:
        page.goto(server.url)
        page.wait_for_selector("#waitgraph svg g.edge")
        assert page.errors == []
        _shot(page, tmp_path, "watch")
        assert _culprits(page) == [({"root", "culprit"}, "rank 3")]
        assert _arrows(page) == {("ranks 0-2", "rank 3", "wait", "all_reduce #5 of default_pg")}
        snaps["now"] = silent
        deadline = time.monotonic() + 10
        while page.query_selector("#waitgraph g.node.silent[data-id]") is None \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        _shot(page, tmp_path, "watch_silent")
        assert _culprits(page) == [({"root", "culprit", "silent", "crashed"}, "rank 3")]
        assert "silent" in page.text_content("#waitgraph g.node.silent[data-id]")
        assert page.errors == []
    finally:
        server.stop()
