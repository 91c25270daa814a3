"""``commscope analyze``: both folder forms, -o, --json, --perfetto, --html, bad input, and
running where torch cannot be imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import pytest

from commscope.cli import main
from commscope.exitcodes import CRASH, DESYNC, HANG, UNREADABLE

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"


def test_positional_and_dash_d_give_the_same_report(capsys):
    assert main(["analyze", str(DATA / "missing_rank")]) == HANG  # the verdict's status
    one = capsys.readouterr().out
    assert main(["analyze", "-d", str(DATA / "missing_rank")]) == HANG
    two = capsys.readouterr().out
    strip = [line for line in one.splitlines() if not line.startswith("analyzed in")]
    assert strip == [line for line in two.splitlines() if not line.startswith("analyzed in")]
    assert "verdict: HANG" in one
    assert "1. [missing_rank] Rank 2 never joined all_reduce #4" in one


def test_output_file_gets_the_report(tmp_path, capsys):
    out = tmp_path / "analysis.txt"
    assert main(["analyze", "-d", str(DATA / "op_mismatch"), "-o", str(out)]) == HANG
    printed = capsys.readouterr().out
    assert "analysis written to" in printed and printed.startswith("hang: Rank 1")
    text = out.read_text()
    assert "[op_mismatch]" in text and "verdict: HANG" in text


def test_json_to_stdout_and_to_a_json_file(tmp_path, capsys):
    assert main(["analyze", str(DATA / "dtype_mismatch"), "--json"]) == DESYNC
    data = json.loads(capsys.readouterr().out)
    assert data["format"] == "commscope.analysis/2" and data["verdict"] == "desync"
    out = tmp_path / "a.json"
    assert main(["analyze", str(DATA / "dtype_mismatch"), "-o", str(out)]) == DESYNC
    assert json.loads(out.read_text()) == data
    assert data["wait_graph"] is None  # a desync the job went through: nobody waits
    capsys.readouterr()
    assert main(["analyze", str(DATA / "missing_rank"), "--json"]) == HANG
    graph = json.loads(capsys.readouterr().out)["wait_graph"]
    culprit = next(n for n in graph["nodes"] if "root" in n["states"])
    assert culprit["ranks"] == [2]
    assert [(e["to"], e["labels"]) for e in graph["edges"]] == [
        (culprit["id"], ["all_reduce #4 of default_pg"])]


def test_perfetto_trace_structure(tmp_path, capsys):
    trace = tmp_path / "trace.json"
    assert main(["analyze", str(DATA / "missing_rank"), "--perfetto", str(trace)]) == HANG
    events = json.loads(trace.read_text())["traceEvents"]
    names = {(e["pid"], e["args"]["name"]) for e in events
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {(0, "rank 0"), (1, "rank 1"), (2, "rank 2")}
    threads = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert threads == {"group 0 (default_pg)"}
    slices = [e for e in events if e["ph"] == "X"]
    assert len(slices) == 4 + 4 + 3
    stuck = sorted((e["pid"], e["name"]) for e in slices if e["args"]["stuck"])
    assert stuck == [(0, "STUCK all_reduce #4"), (1, "STUCK all_reduce #4")]
    assert all(e.get("cname") == "terrible" for e in slices if e["args"]["stuck"])
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    assert starts and set(starts) == set(ends)
    for fid, s in starts.items():
        assert s["name"] == ends[fid]["name"] and s["pid"] != ends[fid]["pid"]
    # every slice of one rank and group is a proper sequence (no overlap)
    for pid in range(3):
        mine = sorted((e["ts"], e["ts"] + e["dur"]) for e in slices if e["pid"] == pid)
        assert all(a[1] <= b[0] + 1e-6 for a, b in pairwise(mine))


def test_html_is_self_contained(tmp_path, capsys):
    page = tmp_path / "report.html"
    assert main(["analyze", str(DATA / "cross_group_deadlock"), "--html", str(page)]) == HANG
    text = page.read_text()
    assert '<script type="application/json" id="commscope-data">' in text
    assert "http://" not in text.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in text
    assert "cross_group_deadlock" in text


@pytest.mark.parametrize("argv,needle", [
    (["analyze"], "give the folder of dumps"),
    (["analyze", "a", "-d", "b"], "give the folder once"),
    (["analyze", str(DATA / "healthy"), "--world-size", "0"], "--world-size must be >= 1"),
    (["analyze", str(DATA / "healthy"), "--ranks", "0"], "add --entries"),
    (["analyze", str(DATA / "healthy"), "--entries", "0"], "--entries must be >= 1"),
    (["analyze", str(DATA / "healthy"), "--entries", "--json"], "cannot go into --json"),
    (["analyze", str(DATA / "healthy"), "--entries", "--ranks", "3-1"], "runs backwards"),
    (["analyze", str(DATA / "healthy"), "--entries", "--ranks", "x"], "expected ranks like"),
    (["analyze", str(DATA / "healthy"), "--entries", "--ranks", "99"], "none of ranks 99"),
    (["analyze", str(DATA / "healthy"), "--entries", "--group", "tp"], "no group named tp"),
])
def test_bad_input_is_one_line_and_exit_2(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("argv,needle", [
    (["analyze", "/no/such/folder"], "does not exist"),
    (["analyze", str(DATA / "healthy"), "--prefix", "nothing_"], "no dump files"),
])
def test_no_dump_at_the_path_is_one_line_and_exit_7(argv, needle, capsys):
    assert main(argv) == UNREADABLE
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_empty_folder_is_unreadable_input(tmp_path, capsys):
    assert main(["analyze", str(tmp_path)]) == UNREADABLE
    assert "no dump files" in capsys.readouterr().err


_NO_TORCH = """
import sys
sys.modules["torch"] = None          # any `import torch` now raises ImportError
import commscope.analyze as A
from commscope.cli import main
r = A.analyze(sys.argv[1])
assert r.findings[0].kind == "cross_group_deadlock", r.findings[0]
A.write_html(r, sys.argv[2] + "/r.html")
A.write_perfetto(r, sys.argv[2] + "/t.json")
code = main(["analyze", sys.argv[1], "--json"])
assert not any(m == "torch" or m.startswith("torch.") for m in sys.modules
               if sys.modules[m] is not None), "torch got imported"
sys.exit(0 if code == 5 else 100 + code)  # 5: the verdict, hang
"""


def test_runs_where_torch_cannot_be_imported(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", _NO_TORCH, str(DATA / "cross_group_deadlock"), str(tmp_path)],
        capture_output=True, text=True, timeout=60, env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["verdict"] == "hang"


def test_console_script_runs_without_torch_import(tmp_path):
    # the installed entry point must not drag torch in either
    code = ("import sys; sys.modules['torch'] = None; from commscope.cli import main; "
            "sys.exit(main(sys.argv[1:]))")
    proc = subprocess.run([sys.executable, "-c", code, "analyze", str(DATA / "crashed_rank")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == CRASH, proc.stderr
    assert "verdict: CRASH" in proc.stdout


def test_progress_is_reported_while_loading(tmp_path):
    from commscope.analyze import load_dumps
    from commscope.analyze.synth import SyntheticJob

    SyntheticJob(5).write(tmp_path)
    calls = []
    load_dumps(tmp_path, progress=lambda done, total: calls.append((done, total)))
    assert calls[0] == (0, 5) and calls[-1] == (5, 5)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)


def test_progress_bar_only_on_a_terminal(capsys):
    from commscope.analyze.command import progress_bar

    with progress_bar(enabled=False) as cb:
        assert cb is None
    with progress_bar() as cb:  # pytest's stderr is not a terminal
        assert cb is None
    import threading

    threads = threading.active_count()
    with progress_bar(enabled=True) as cb:  # forced: a rich bar, drawn from 16 files on
        assert callable(cb)
        cb(0, 20)  # no drawing thread yet: the reader processes are forked after this
        assert threading.active_count() == threads
        for i in range(1, 21):
            cb(i, 20)
        assert threading.active_count() > threads


def test_public_surface_is_importable_and_documented():
    import commscope.analyze as A

    for name in A.__all__:
        obj = getattr(A, name)
        assert obj is not None
        if callable(obj):
            assert obj.__doc__, name
    assert A.FORMAT == "commscope.analysis/2"
    assert set(A.KINDS) >= {"missing_rank", "size_mismatch", "dtype_mismatch", "op_mismatch",
                            "order_mismatch", "p2p_unmatched", "crashed_rank",
                            "cross_group_deadlock", "truncated_history", "straggler",
                            "healthy"}


def test_perfetto_draws_p2p_ops_and_joins_each_send_to_its_recv(tmp_path, capsys):
    # p2p_unmatched: a pipeline 0 → 1 → 2 → 3, four sends each, and rank 3 posted only
    # three recvs, so rank 2's last send to 3 never completes.
    trace = tmp_path / "trace.json"
    assert main(["analyze", str(DATA / "p2p_unmatched"), "--perfetto", str(trace)]) == HANG
    events = json.loads(trace.read_text())["traceEvents"]
    p2p_threads = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M"
                   and e["name"] == "thread_name" and e["args"]["name"].startswith("p2p, ")}
    assert {pid for pid, _ in p2p_threads} == {0, 1, 2, 3}
    slices = [e for e in events if e["ph"] == "X" and e["cat"] == "p2p"]
    assert all((e["pid"], e["tid"]) in p2p_threads for e in slices)
    assert sorted(e["name"] for e in slices if e["pid"] == 3) == ["recv ← 2"] * 3
    stuck = [(e["pid"], e["name"]) for e in slices if e["args"]["stuck"]]
    assert stuck == [(2, "STUCK send → 3")]
    at = {(e["pid"], e["ts"]): e for e in slices}
    starts = {e["id"]: e for e in events if e["ph"] == "s" and e["cat"] == "p2p"}
    ends = {e["id"]: e for e in events if e["ph"] == "f" and e["cat"] == "p2p"}
    assert set(starts) == set(ends)
    hops = sorted((s["pid"], ends[i]["pid"]) for i, s in starts.items())
    assert hops == [(0, 1)] * 4 + [(1, 2)] * 4 + [(2, 3)] * 3
    for i, s in starts.items():
        # each arrow leaves a send slice and lands on a recv slice, on those ranks
        src = next(e for (pid, ts), e in at.items() if pid == s["pid"]
                   and ts <= s["ts"] <= ts + e["dur"])
        dst = next(e for (pid, ts), e in at.items() if pid == ends[i]["pid"]
                   and ts <= ends[i]["ts"] <= ts + e["dur"])
        assert src["name"].endswith(f"send → {ends[i]['pid']}")
        assert dst["name"] == f"recv ← {s['pid']}"
    # the HTML timeline draws the same ops in lanes of their own
    from commscope.analyze import analyze
    from commscope.analyze.present.export import timeline_data

    lanes = timeline_data(analyze(str(DATA / "p2p_unmatched")))["lanes"]
    p2p = [lane for lane in lanes if lane["group"].startswith("p2p ")]
    assert {lane["rank"] for lane in p2p} == {0, 1, 2, 3}
    assert [item[2:] for lane in p2p if lane["rank"] == 2
            for item in lane["items"]][-1] == ["send → 3", 1]


def test_exports_use_end_times_kept_while_loading(tmp_path):
    import shutil

    from commscope.analyze import analyze
    from commscope.analyze.present.export import perfetto_trace, timeline_data

    folder = tmp_path / "dumps"
    shutil.copytree(DATA / "recorded" / "straggler", folder)
    kept = analyze(folder, end_times=True)
    plain = analyze(folder)
    before = (perfetto_trace(kept), timeline_data(kept))
    assert before == (perfetto_trace(plain), timeline_data(plain))
    for f in folder.iterdir():
        f.write_bytes(b"")  # the files are gone: nothing can be read back
    assert (perfetto_trace(kept), timeline_data(kept)) == before
    # without kept end times the slices fall back to the next record's start
    assert perfetto_trace(plain) != before[0]


def test_one_member_groups_with_no_record_are_folded_into_a_count(tmp_path, capsys):
    # torchtitan's mesh: pp, cp and dp_replicate of size 1 give one-member groups that
    # never record anything; the table counts them and --all-groups lists them
    from commscope.analyze.synth import SyntheticJob

    job = SyntheticJob(2)
    job.group("1", "mesh_tp", [0, 1])
    for r in range(2):
        for axis in ("pp", "cp", "dp_replicate"):
            job.group(f"{axis}{r}", f"mesh_{axis}", [r])
    job.collective("all_reduce", group="1")
    job.collective("all_reduce", group="1", ranks=[0], stuck=True)
    job.write(tmp_path / "d")
    assert main(["analyze", str(tmp_path / "d")]) == HANG
    out = capsys.readouterr().out
    table = out[out.index("groups:"):]
    assert "mesh_pp" not in table.splitlines()[2]
    assert "+ 6 one-member groups with no record (mesh_cp, mesh_dp_replicate, mesh_pp" in table
    assert main(["analyze", str(tmp_path / "d"), "--all-groups"]) == HANG
    full = capsys.readouterr().out
    rows = [line for line in full[full.index("groups:"):].splitlines() if "mesh_" in line]
    assert len(rows) == 7 and "one-member" not in full


def test_group_creation_shows_in_the_groups_table(capsys):
    folder = DATA / "scenarios" / "skip_new_group" / "ours"
    assert main(["analyze", str(folder)]) == HANG
    out = capsys.readouterr().out
    assert "0-2 never came (creating experts)" in out
    assert "being created: 0-2 wait at make_scenarios.py:" in out


def test_other_jobs_and_later_dumps_are_listed_not_merged(capsys):
    folder = DATA / "scenarios" / "restarted_job_killed_rank" / "ours"
    assert main(["analyze", str(folder)]) == CRASH
    out = capsys.readouterr().out
    assert "other jobs in this folder, not analyzed" in out
    assert "rank_3: rank 3's file belongs to another job" in out
    assert "later dumps, set aside in commscope_later/" in out
