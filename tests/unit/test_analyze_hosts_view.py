"""Hosts in every answer of ``commscope analyze``: the text report, the HTML report's data
and the Perfetto timeline name each rank's host and pid when the job spans hosts, fold
the ranks by host at scale (4 096 ranks on 512 hosts), and say nothing of hosts when the
job ran on one (synthetic dumps carrying ``commscope_place`` and ``commscope_hosts``,
``tests/hostdumps.py``)."""

from __future__ import annotations

import json
import time

import pytest

from commscope.analyze import analyze, format_report
from commscope.analyze.model import HostMap, RankPlace
from commscope.analyze.present.byhost import HostView, host_names, ranks_with_hosts
from commscope.analyze.present.export import html_report, perfetto_trace
from commscope.analyze.synth import SyntheticJob
from commscope.analyze.text import rank_list
from tests.hostdumps import blocks, write_hosts_job


def _node(i: int) -> str:
    return f"node{i:03d}"


def _view(hosts: dict[str, list[int]]) -> HostView:
    places = {r: RankPlace(host=h, pid=4000 + r) for h, rs in hosts.items() for r in rs}
    m = HostMap({})
    m.places = places
    return HostView.of(m)


def _processes(trace: dict) -> dict[int, tuple[str, int]]:
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    order = {e["pid"]: e["args"]["sort_index"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_sort_index"}
    return {r: (names[r], order[r]) for r in names}


@pytest.mark.parametrize("names,text", [
    ([_node(i) for i in range(512) if i != 5], "node[000-004,006-511]"),
    (["hostA", "hostB"], "hostA, hostB"),
    (["gpu1", "gpu2", "gpu3", "gpu10", "login1"], "gpu[1-3,10], login1"),
    (["a07"], "a07"),
    ([f"host{chr(65 + i)}" for i in range(12)],
     "hostA, hostB, hostC, hostD, hostE, hostF, hostG, hostH, ... (12 hosts)"),
])
def test_host_names_fold_like_slurm_hostlists(names, text):
    assert host_names(names) == text


def test_rank_lists_name_their_hosts_only_when_the_job_spans_hosts():
    two = _view({"hostA": [0, 1], "hostB": [2, 3]})
    assert ranks_with_hosts([3], two) == "3 (hostB, pid 4003)"
    assert ranks_with_hosts([0, 1], two) == "0, 1 (all of hostA)"
    assert ranks_with_hosts([0, 1, 2], two) == "0-2 (all of hostA; hostB: 2)"
    assert ranks_with_hosts([], two) == "none"
    assert ranks_with_hosts([0, 1], _view({"node0": [0, 1, 2, 3]})) == "0, 1"
    big = _view({_node(i): list(range(8 * i, 8 * i + 8)) for i in range(512)})
    waiting = [r for r in range(4096) if r != 41]
    assert ranks_with_hosts(waiting, big) == (
        "0-40, 42-4095 (all of 511 hosts: node[000-004,006-511]; node005: 40, 42-47)")
    every_other = list(range(0, 4096, 2))  # local ranks 0, 2, 4, 6 of every host
    assert ranks_with_hosts(every_other, big, 4) == (
        "0, 2, 4, 6, ... (2048 ranks) (local ranks 0, 2, 4, 6 of 512 hosts: node[000-511])")
    scattered = [8 * h + h % 8 for h in range(512)]  # a different local rank on each host
    assert ranks_with_hosts(scattered, big, 4).endswith("(node000: 0; node001: 9; node002: 18; "
                                                        "509 more hosts in part)")
    assert ranks_with_hosts(scattered, big, 4, compact_only=True) == rank_list(scattered, 4)


def _missing_rank_job(world: int, culprit: int) -> SyntheticJob:
    job = SyntheticJob(world)
    job.collective()
    job.collective(ranks=[r for r in range(world) if r != culprit])
    return job


def test_two_hosts_text_report_names_hosts_and_tells_the_job_by_host(tmp_path):
    write_hosts_job(_missing_rank_job(4, 3), tmp_path, blocks(2))
    a = analyze(tmp_path)
    text = format_report(a)
    assert "Rank 3 (hostB, pid 4003)'s thread stopped issuing: it never issued all_reduce " \
           "#2" in text
    assert "by host:\n  hostB: rank 3 is in no collective; rank 2 waits in all_reduce #2 of " \
           "group 0\n  hostA: both ranks wait in all_reduce #2 of group 0\n" in text
    assert "#2: 0-2 wait; 3 (hostB, pid 4003) never came" in text
    trace = perfetto_trace(a)
    assert _processes(trace)[3] == ("rank 3 (hostB, pid 4003)", 3)
    assert trace["otherData"]["hosts"] == {"hostA": "0, 1", "hostB": "2, 3"}


def test_a_crashed_rank_s_host_is_left_out_everywhere(tmp_path):
    write_hosts_job(_missing_rank_job(4, 3), tmp_path, blocks(2), ranks=[0, 1, 2])
    a = analyze(tmp_path)
    text = format_report(a)
    assert "leave out on restart: hostB (--json: exclude_hosts)" in text
    assert "hostB: rank 3 left no dump (crashed); rank 2 waits in all_reduce #2" in text
    assert "no dump: 3 (hostB, pid 4003)" in text
    data = _html_data(a)
    assert data["hosts"]["exclude"] == ["hostB"]
    row = data["hosts"]["rows"][1]
    assert (row["host"], row["pids"], row["dumps_here"], row["blamed"]) == (
        "hostB", "4002-4003", "1/2", True)
    assert row["notes"] == "crashed: 3; missing: 3"
    assert data["finding_ranks"][0]["culprits"] == "3 (hostB, pid 4003)"
    assert data["finding_ranks"][0]["waiting"] == "0-2 (all of hostA; hostB: 2)"


def test_one_host_adds_no_host_words(tmp_path):
    job = _missing_rank_job(4, 3)
    job.write(tmp_path)  # every rank on node0
    a = analyze(tmp_path)
    text = format_report(a).split("\n", 1)[1]  # (the folder's name is the test's)
    assert "node0" not in text and "host" not in text
    assert "#2: 0-2 wait; 3 never came" in text
    data = _html_data(a)
    assert data["finding_ranks"] is None
    assert data["hosts"]["by_host"] == [] and len(data["hosts"]["rows"]) == 1
    assert all("host" not in lane for lane in data["timeline"]["lanes"])
    # the timeline still says where each rank ran
    assert _processes(perfetto_trace(a))[3] == ("rank 3 (node0, pid 1003)", 3)


def test_timeline_keeps_a_host_s_ranks_together_whatever_the_placement(tmp_path):
    job = SyntheticJob(4)
    job.collective()
    write_hosts_job(job, tmp_path, lambda r: "hostA" if r % 2 == 0 else "hostB")  # cyclic
    procs = _processes(perfetto_trace(analyze(tmp_path)))
    assert sorted(procs.values(), key=lambda p: p[1]) == [
        ("rank 0 (hostA, pid 4000)", 0), ("rank 2 (hostA, pid 4002)", 1),
        ("rank 1 (hostB, pid 4001)", 2), ("rank 3 (hostB, pid 4003)", 3)]


def _html_data(a) -> dict:
    page = html_report(a)
    start = page.index('id="commscope-data">') + len('id="commscope-data">')
    return json.loads(page[start:page.index("</script>", start)].replace("<\\/", "</"))


def test_4096_ranks_on_512_hosts_fold_by_host(tmp_path):
    # every rank carries its own place; the table on rank 0 only keeps the test quick
    write_hosts_job(_missing_rank_job(4096, 41), tmp_path, blocks(8, _node), table_on=[0])
    a = analyze(tmp_path, jobs=1)
    start = time.perf_counter()
    text = format_report(a)
    data = _html_data(a)
    trace = perfetto_trace(a)
    assert time.perf_counter() - start < 10  # the views themselves, not the loading
    by_host = text.split("by host:\n")[1].split("groups:")[0]
    assert by_host == (
        "  node005: rank 41 is in no collective; ranks 40, 42-47 wait in all_reduce #2 of "
        "group 0\n"
        "  511 hosts (node[000-004,006-511]): all 4088 ranks wait in all_reduce #2 of group 0\n")
    assert "  node005  40-47  8/8" in text
    assert "  + 511 more hosts: every dump here, nothing to report" in text
    hosts = data["hosts"]
    assert [r["host"] for r in hosts["rows"]] == ["node005"]
    assert hosts["rows"][0]["pids"] == "4040-4047"
    assert (hosts["quiet"], hosts["quiet_names"]) == (511, "node[000-004,006-511]")
    assert hosts["by_host"] == [line.strip() for line in by_host.splitlines()]
    assert data["finding_ranks"][0]["waiting"] == (
        "0-40, 42-4095 (all of 511 hosts: node[000-004,006-511]; node005: 40, 42-47)")
    assert {lane["host"] for lane in data["timeline"]["lanes"]} >= {"node005"}
    procs = _processes(trace)
    assert len(procs) == 128 and procs[41][0] == "rank 41 (node005, pid 4041)"


def test_hosts_that_split_alike_by_local_rank_fold_into_one_line(tmp_path):
    # tp inside each host, dp across them: rank 41 skipped its dp all_reduce, so local
    # rank 1 of every other host waits in dp and its tp peers wait for it in tp
    world, per = 512, 8
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
    write_hosts_job(job, tmp_path, blocks(per, _node), table_on=[0])
    text = format_report(analyze(tmp_path, jobs=1))
    assert ("  63 hosts (node[000-004,006-063]): local ranks 0, 2-7 wait in all_reduce #2 of "
            "mesh_tp; local rank\n    1 waits in all_reduce #2 of mesh_dp\n") in text
    assert "  node005: rank 41 is in no collective; ranks 40, 42-47 have no unfinished work" \
        in text
    # the cut list of who waits in dp is whole again by host
    assert ("#2: 1, 9, 17, 25, ... (63 ranks) (local rank 1 of 63 hosts: "
            "node[000-004,006-063]) wait; 41 (node005, pid 4041) never came") in text


def test_one_host_s_folder_says_the_others_dumps_are_there(tmp_path):
    write_hosts_job(_missing_rank_job(4, 3), tmp_path, blocks(2), ranks=[0, 1])
    text = format_report(analyze(tmp_path))
    assert "  hostB: both ranks have their dumps there, not here\n" in text
    assert "no dump: 2, 3 (all of hostB)" in text


def test_past_the_limit_the_hosts_left_are_counted():
    from types import SimpleNamespace

    from commscope.analyze.present.byhost import State, host_lines

    view = {_node(h): [2 * h, 2 * h + 1] for h in range(20)}
    m = HostMap({})
    m.places = {r: RankPlace(host=h) for h, rs in view.items() for r in rs}
    states = {r: State(f"waits in #{r // 2}", f"wait in #{r // 2}") if r % 2 else
              State("has no unfinished work", "have no unfinished work") for r in range(40)}
    lines = host_lines(SimpleNamespace(hosts=m), limit=12, states=states)  # type: ignore[arg-type]
    assert lines[0] == "node000: rank 0 has no unfinished work; rank 1 waits in #0"
    assert len(lines) == 13 and lines[-1] == "... and 8 more hosts (--json: hosts)"
