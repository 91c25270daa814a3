"""The wait-for graph's model and drawing (commscope/analyze/present/waitgraph.py and
waitsvg.py): arrows from waiters to whom they wait for, labelled as the stuck lines say,
cycles kept as cycles, crashed, silent and killed ranks marked, alike ranks folded at
4 096 ranks, every name escaped."""

from __future__ import annotations

import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from commscope.analyze import analyze
from commscope.analyze.present.waitgraph import MAX_NODES, WaitForGraph, wait_graph
from commscope.analyze.present.waitsvg import render_svg
from commscope.analyze.synth import SyntheticJob
from tests.hostdumps import blocks, write_hosts_job

DATA = Path(__file__).resolve().parents[1] / "data"
SVG = "{http://www.w3.org/2000/svg}"


def _arrows(g: WaitForGraph) -> set[tuple[str, str, str, str]]:
    """(who waits, for whom, kind, label), by each node's first line."""
    return {(g.node(e.source).lines[0], g.node(e.target).lines[0], e.kind, e.label)
            for e in g.edges}


def _states(g: WaitForGraph) -> dict[str, list[str]]:
    return {n.lines[0]: n.states for n in g.nodes}


def _parsed(svg: str) -> ET.Element:
    root = ET.fromstring(svg)  # well-formed XML: the pages parse it as such
    assert root.tag == f"{SVG}svg"
    return root


def _drawn(svg: str) -> tuple[dict[str, tuple[str, str]], list[tuple[str, str, str, str]]]:
    """Node id → (classes, first line); arrows as (classes, from, to, label)."""
    root = _parsed(svg)
    nodes, edges = {}, []
    for g in root.iter(f"{SVG}g"):
        classes = g.get("class", "")
        if classes.startswith("node ") and g.get("data-id"):
            texts = [t.text for t in g.iter(f"{SVG}text")]
            nodes[g.get("data-id")] = (classes, texts[0])
        elif classes.startswith("edge "):
            label = g.find(f"{SVG}text")  # its lines are tspans: the label is their text
            edges.append((classes, g.get("data-from"), g.get("data-to"),
                          "".join(label.itertext()) if label is not None else None))
    return nodes, edges


def test_the_demo_story_draws_the_cycle_its_skip_closed():
    # commscope demo's story, recorded (tests/data/make_recorded_fixtures.py): rank 3
    # skipped its mesh_dp all_reduce #3 and waits in world #5 for rank 1, which waits for
    # it in mesh_dp #3; ranks 0 and 2 wait in world #5 for rank 1
    a = analyze(DATA / "recorded" / "skipped_then_blocked")
    g = wait_graph(a)
    assert _states(g) == {"ranks 0, 2": ["waiting"], "rank 1": ["cycle", "waiting"],
                          "rank 3": ["root", "culprit", "cycle"]}
    assert _arrows(g) == {
        ("rank 1", "rank 3", "cycle", "all_reduce #3 of mesh_dp"),
        ("rank 3", "rank 1", "cycle", "all_reduce #5 of default_pg"),
        ("ranks 0, 2", "rank 1", "wait", "all_reduce #5 of default_pg")}
    # the labels are the stuck lines' words
    stuck = " ".join(a.stuck)
    assert all(e.label in stuck for e in g.edges)
    assert g.folded and g.caption.startswith("4 ranks in 3 nodes: alike ranks folded")
    nodes, edges = _drawn(render_svg(g))
    assert nodes["n2"] == ("node root culprit cycle", "rank 3")
    assert ("edge cycle", "n1", "n2", "all_reduce #3 of mesh_dp") in edges
    assert len(edges) == 3


def test_a_cross_group_cycle_is_drawn_on_a_ring():
    g = wait_graph(analyze(DATA / "cross_group_deadlock"))
    assert _arrows(g) == {("rank 0", "rank 1", "cycle", "all_reduce #2 of group_A"),
                          ("rank 1", "rank 2", "cycle", "all_reduce #2 of group_B"),
                          ("rank 2", "rank 0", "cycle", "all_reduce #2 of group_C")}
    assert all("cycle" in s and "culprit" in s for s in _states(g).values())
    root = _parsed(render_svg(g))
    centres = []
    for rect in root.iter(f"{SVG}rect"):
        if rect.get("width") == "18":
            continue  # the legend's swatches
        centres.append((float(rect.get("x")) + float(rect.get("width")) / 2,
                        float(rect.get("y")) + float(rect.get("height")) / 2))
    (x0, y0), (x1, y1), (x2, y2) = centres
    area = abs((x1 - x0) * (y2 - y0) - (x2 - x0) * (y1 - y0)) / 2
    assert area > 10_000  # a triangle, not a row: the cycle reads as one


def test_a_send_recv_deadlock_and_a_crash():
    g = wait_graph(analyze(DATA / "scenarios" / "p2p_deadlock_send" / "ours"))
    assert _arrows(g) == {("rank 0", "rank 1", "cycle", "send of default_pg"),
                          ("rank 1", "rank 0", "cycle", "send of default_pg")}
    g = wait_graph(analyze(DATA / "crashed_rank"))
    assert _states(g)["rank 1"] == ["root", "culprit", "crashed"]
    assert _arrows(g) == {("ranks 0, 2", "rank 1", "wait", "all_reduce #4 of default_pg")}
    nodes, _ = _drawn(render_svg(g))
    assert nodes["n1"][0] == "node root culprit crashed"


def test_victims_point_at_their_killer_and_chains_at_the_next_rank():
    g = wait_graph(analyze(DATA / "scenarios" / "size_mismatch_kills_peer" / "ours"))
    assert _states(g)["ranks 0, 2"] == ["victim"]
    assert _arrows(g) == {
        ("ranks 0, 2", "rank 1", "victim", "died in broadcast #4 of default_pg")}
    # rank 0 waits in default_pg #2 for ranks 1 and 2, who never got there
    g = wait_graph(analyze(DATA / "scenarios" / "chain_through_subgroup" / "ours"))
    assert _arrows(g) == {("rank 1", "rank 2", "wait", "all_reduce #1 of pair_12"),
                          ("rank 0", "rank 1", "wait", "all_reduce #2 of default_pg"),
                          ("rank 0", "rank 2", "wait", "all_reduce #2 of default_pg")}
    # two causes: two culprits, the first one the root
    g = wait_graph(analyze(DATA / "scenarios" / "crash_and_stall" / "ours"))
    assert _states(g)["rank 0"] == ["root", "culprit", "crashed"]
    assert _states(g)["rank 3"] == ["culprit"]


def test_nobody_waits_in_a_healthy_job_and_silent_ranks_are_marked():
    g = wait_graph(analyze(DATA / "scenarios" / "healthy" / "ours"))
    assert not g and render_svg(g) == ""
    a = analyze(DATA / "crashed_rank")
    g = wait_graph(a, silent={1})
    assert _states(g)["rank 1"] == ["root", "culprit", "crashed", "silent"]
    assert "silent" in g.nodes[1].lines[1]
    back = WaitForGraph.from_json(g.to_json())
    assert back == g and render_svg(back) == render_svg(g)


def test_hostile_group_names_stay_text():
    job = SyntheticJob(2)
    evil = "</script><svg onload=alert(1)><script>x()</script>&amp; \x01\u2028"
    job.group("1", evil, [0, 1])
    job.collective("all_reduce", group="1")
    job.collective("all_reduce", group="1", ranks=[0])
    a = analyze_job(job)
    svg = render_svg(wait_graph(a))
    root = _parsed(svg)
    assert not [e for e in root.iter() if e.tag.endswith("script")]
    assert not [e for e in root.iter() if any(k.startswith("on") for k in e.attrib)]
    texts = ["".join(t.itertext()) for t in root.iter(f"{SVG}text")]
    labels = [t for t in texts if "all_reduce" in t]
    assert labels and labels[0].startswith("all_reduce #2 of </script><svg")


def analyze_job(job: SyntheticJob, **kw):
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        job.write(d)
        return analyze(d, **kw)


def _mesh_job(world: int, per: int) -> SyntheticJob:
    # tp inside each host, dp across hosts: rank 41 never reaches its dp all_reduce #2,
    # its dp peers (local rank 1 of every other host) wait for it, and their tp peers
    # wait for them in tp #2
    job = SyntheticJob(world)
    tp = [job.group(f"tp{h}", "mesh_tp", range(h * per, h * per + per))
          for h in range(world // per)]
    dp = [job.group(f"dp{i}", "mesh_dp", range(i, world, per)) for i in range(per)]
    for g in tp + dp:
        job.collective(group=g)
    for g in dp:
        job.collective(group=g, ranks=[r for r in job.groups[g][1] if r != 41])
    for g in tp:
        job.collective(group=g, ranks=[r for r in job.groups[g][1] if r % per != 1 or r == 41])
    return job


@pytest.mark.timeout(60)
def test_4096_ranks_fold_into_three_nodes(tmp_path):
    write_hosts_job(_mesh_job(4096, 8), tmp_path, blocks(8, lambda i: f"node{i:03d}"),
                    table_on=[0])
    a = analyze(tmp_path, jobs=1)
    start = time.perf_counter()
    g = wait_graph(a)
    svg = render_svg(g)
    assert time.perf_counter() - start < 2.0
    assert [(n.lines, n.states, len(n.ranks)) for n in g.nodes] == [
        (["ranks 0, 2-8, ... (3577 ranks)", "waiting", "local ranks 0, 2-7 of 511 hosts"],
         ["waiting"], 3577),
        (["ranks 1, 9, ... (511 ranks)", "waiting", "local rank 1 of 511 hosts"],
         ["waiting"], 511),
        (["rank 41", "root cause", "node005, pid 4041"], ["root", "culprit"], 1)]
    assert [(e.source, e.target, e.label, e.waiters) for e in g.edges] == [
        ("n1", "n2", "all_reduce #2 of mesh_dp", 511),
        ("n0", "n1", "all_reduce #2 of mesh_tp", 3577)]
    assert g.folded and g.caption.startswith("4089 ranks in 3 nodes")
    nodes, edges = _drawn(svg)
    assert nodes["n2"] == ("node root culprit", "rank 41")
    assert len(edges) == 2 and len(svg) < 20_000


def test_a_ring_too_long_to_draw_folds_into_one_node_that_waits_for_itself():
    job = SyntheticJob(64)
    job.collective()
    for r in range(64):
        job.p2p(r, (r + 1) % 64, post="send")
    g = wait_graph(analyze_job(job))
    assert [(n.lines[0], n.states) for n in g.nodes] == [
        ("ranks 0-63 (64)", ["root", "culprit", "cycle"])]
    assert _arrows(g) == {("ranks 0-63 (64)", "ranks 0-63 (64)", "cycle", "send of default_pg")}
    _, edges = _drawn(render_svg(g))
    assert edges == [("edge cycle", "n0", "n0", "send of default_pg")]


def test_many_different_places_still_fold_under_the_node_limit():
    # 40 pairs, each stuck in its own group at its own sequence number: 80 ranks that
    # differ by label; folding drops the labels before it exceeds the limit
    world = 80
    job = SyntheticJob(world)
    pairs = [job.group(f"p{i}", f"pair{i}", [2 * i, 2 * i + 1]) for i in range(world // 2)]
    for i, g in enumerate(pairs):
        for _ in range(i % 3):
            job.collective(group=g)
        job.collective(group=g, ranks=[2 * i])
    g = wait_graph(analyze_job(job))
    assert len(g.nodes) <= MAX_NODES
    assert {r for n in g.nodes for r in n.ranks} == set(range(world))
    assert any(len(e.labels) > 1 for e in g.edges)  # "all_reduce #1 of pair0 +N more"
    _parsed(render_svg(g))


def test_the_live_snapshot_carries_the_graph_and_the_page_gets_it_drawn():
    from commscope.watch.live import Thresholds, snapshot
    from commscope.watch.web import WatchServer
    from tests.unit.test_watch_live import _record, _source, _store

    now = time.time_ns()
    done = [(s, "completed") for s in range(1, 5)]
    records = {r: _record(r, 4, [*done, (5, "started")], now) for r in range(3)}
    records[3] = _record(3, 4, done, now, age_s=9)  # silent
    snap = snapshot(_source(_store(records, 4)).fetch(), thresholds=Thresholds(0.5),
                    now_ns=now)
    g = WaitForGraph.from_json(snap["wait_graph"])
    assert _states(g)["rank 3"] == ["root", "culprit", "crashed", "silent"]
    assert _arrows(g) == {("ranks 0-2", "rank 3", "wait", "all_reduce #5 of default_pg")}
    server = WatchServer(lambda: snap, token="t")
    try:
        server.refresh()
        assert server.latest["wait_graph_svg"] == render_svg(g)
    finally:
        server.httpd.server_close()
    # every rank inside the same op: nobody to wait for, one node and no arrow
    records[3] = _record(3, 4, [*done, (5, "started")], now)
    slow = snapshot(_source(_store(records, 4)).fetch(), thresholds=Thresholds(0.5),
                    now_ns=now)
    g = WaitForGraph.from_json(slow["wait_graph"])
    assert [(n.lines, n.states) for n in g.nodes] == [
        (["ranks 0-3 (4)", "stuck in all_reduce #5 of default_pg"], ["stuck"])]
    assert g.edges == []
