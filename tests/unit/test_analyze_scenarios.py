"""The scenario corpus: every folder of ``tests/data/scenarios`` is one real multi-process
gloo job made by ``tests/data/make_scenarios.py``, with what the analyzer must find
written beside the dumps (``scenario.json``) by the generator, from the fault it
injected. Each is analyzed as recorded by commscope (``ours/``) and, where the job
wrote them, by PyTorch's native recorder (``native/``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from commscope.analyze import analyze
from commscope.analyze.answer import is_note
from commscope.analyze.read.load import read_dump_file
from commscope.analyze.text import rank_list
from tests.needs import torch_has

DATA = Path(__file__).resolve().parents[1] / "data" / "scenarios"
SCENARIOS = sorted(p.name for p in DATA.iterdir() if (p / "scenario.json").exists())


def _meta(name: str) -> dict:
    return json.loads((DATA / name / "scenario.json").read_text())


def _check(result, expect: dict) -> None:
    root = result.findings[0]
    story = "\n".join(f"  [{f.kind}] {f.culprit_ranks} <- {f.waiting_ranks}: {f.message}"
                      for f in result.findings)
    assert result.verdict == expect["verdict"], story
    assert root.kind == expect["kind"], story
    if expect["verdict"] != "healthy":
        assert sorted(root.culprit_ranks) == sorted(expect["culprits"]), story
    assert set(expect["waiting"]) <= set(root.waiting_ranks), story
    for text in expect["says"]:
        assert text in root.message, (text, story)
    for text in expect.get("never_says", []):
        assert all(text not in f.message for f in result.findings), (text, story)
    if expect.get("group") is not None:
        assert root.group is not None and root.group.desc == expect["group"], story
    if expect.get("seq") is not None:
        assert root.collective_seq_id == expect["seq"], story
    if expect.get("victims") is not None:
        assert sorted(root.victims) == sorted(expect["victims"]), story
        assert not any(f.kind == "crashed_rank" for f in result.findings), story
    if expect.get("caught"):
        # a running job dumped on demand: one note names the ranks caught mid-collective
        notes = [f for f in result.findings if "caught_running" in f.details]
        assert len(notes) == 1 and result.verdict == "healthy", story
        assert len(notes[0].details["caught_running"]) >= expect["caught"], story
    if expect.get("ignored") is not None:
        assert len(result.load.other_jobs) == expect["ignored"], (
            [u.file for u in result.load.other_jobs], story)
    # one cause, one finding: no two blocking findings blame the same ranks
    causes = [tuple(sorted(f.culprit_ranks)) for f in result.findings if f.blocking]
    assert len(causes) == len(set(causes)), ("one cause, one finding", story)
    # one line per stuck place opens the report: the first blocking finding's culprits
    # first (issue 33 item 5); none when nothing blocks
    first = next((f for f in result.findings if f.blocking), None)
    if first is None:
        assert result.stuck == [], (result.stuck, story)
    else:
        assert result.stuck, story
        head = result.stuck[0]
        assert head.startswith(("rank ", "ranks ")), (head, story)
        if first.culprit_ranks:
            assert rank_list(first.culprit_ranks) in head, (head, story)
    # the JSON says what the text says
    data = result.to_json()["findings"][0]
    assert (data["kind"], data["culprit_ranks"]) == (root.kind, sorted(root.culprit_ranks))
    assert data["victims"] == sorted(root.victims)
    blamed = sorted({r for f in result.findings if f.blocking for r in f.culprit_ranks})
    want = expect["blamed"] if expect["blamed"] is not None else (
        expect["culprits"] if any(f.blocking for f in result.findings) else blamed)
    assert blamed == sorted(want), ("blamed", story)
    for kind, culprits in expect["also"]:  # a note blames nobody: its ranks are its own
        assert any(f.kind == kind and sorted(f.culprit_ranks or f.details.get("ranks", []))
                   == sorted(culprits) for f in result.findings), ((kind, culprits), story)
    assert not any(is_note(f) and f.culprit_ranks for f in result.findings), story
    # a thread's death is a remark naming the thread; its rank is alive, never crashed
    for rank, thread in expect.get("threads_died", []):
        assert any(f.kind == "thread_died" and f.details.get("rank") == rank
                   and f.details.get("thread") == thread and thread in f.message
                   for f in result.findings), ((rank, thread), story)
        assert not any(f.kind == "crashed_rank" and rank in f.culprit_ranks
                       for f in result.findings), story
    # a dump that reads but holds no valid record: set aside as unusable, named with why
    # (text and JSON), and its rank named by no other finding
    for rank in expect.get("unusable", []):
        assert rank not in result.loaded, story
        errors = [u.error for u in result.unreadable if u.rank == rank]
        assert errors and errors[0].startswith("unusable: none of its"), (errors, story)
        assert any(f.kind == "unreadable_dump" and f.details.get("ranks") == [rank]
                   and "unusable" in f.message for f in result.findings), story
        assert all(rank not in f.culprit_ranks + f.waiting_ranks + f.victims
                   for f in result.findings if f.kind != "unreadable_dump"), story
        assert any(u["error"] == errors[0] for u in result.to_json()["unreadable"]), story


def test_the_corpus_is_big_and_varied():
    assert len(SCENARIOS) >= 30
    worlds = {_meta(n)["world_size"] for n in SCENARIOS}
    assert min(worlds) == 2 and max(worlds) == 8
    verdicts = {_meta(n)["expect"]["verdict"] for n in SCENARIOS}
    assert {"healthy", "hang", "crash", "desync"} <= verdicts
    kinds = {_meta(n)["expect"]["kind"] for n in SCENARIOS}
    assert {"p2p_unmatched", "p2p_deadlock", "crashed_rank", "missing_rank",
            "cross_group_deadlock"} <= kinds
    assert sum((DATA / n / "native").is_dir() for n in SCENARIOS) >= 20


@pytest.mark.parametrize("name", SCENARIOS)
def test_ours(name):
    meta = _meta(name)
    _check(analyze(DATA / name / "ours"), meta["expect"])


@pytest.mark.parametrize("name", [n for n in SCENARIOS if (DATA / n / "native").is_dir()])
def test_native(name):
    meta = _meta(name)
    result = analyze(DATA / name / "native", world_size=meta["world_size"])
    if meta["native_expect"] is not None:
        _check(result, meta["native_expect"])
    entries = {r: read_dump_file(d.path)["entries"] for r, d in result.load.dumps.items()}
    if _open_records(entries) or result.missing:
        assert result.verdict != "healthy", [f.message for f in result.findings]


_ROOTED = ("broadcast", "reduce", "gather", "scatter")


def _open_records(entries: dict[int, list[dict]]) -> list[tuple[int, str, int]]:
    """``(rank, group, seq)`` of the native records not marked retired that gloo may not
    have finished. One every rank holding records of its group issued alike (the same op
    and sizes; not a rooted op, whose root native records do not keep) finished when
    another rank's record of it is retired, or a later record of its group on the same
    rank is: gloo cannot stay inside a collective all its members posted alike, only the
    mark lags (PyTorch retires a gloo call just after it returns)."""
    def key(e: dict) -> tuple:
        return (e["profiling_name"], str(e["input_sizes"]), str(e["output_sizes"]))

    by_group: dict[str, dict[int, dict[int, dict]]] = {}
    for r, es in entries.items():
        for e in es:
            by_group.setdefault(e["process_group"][0], {}).setdefault(r, {})[
                e["collective_seq_id"]] = e
    out = []
    for r, es in entries.items():
        for i, e in enumerate(es):
            if e.get("retired"):
                continue
            group, seq = e["process_group"][0], e["collective_seq_id"]
            held = [mine.get(seq) for mine in by_group[group].values()]
            alike = (all(x is not None and key(x) == key(e) for x in held)
                     and e["profiling_name"].split(":")[-1] not in _ROOTED)
            later = any(x.get("retired") and x["process_group"][0] == group for x in es[i + 1:])
            other = any(x is not None and x.get("retired") for x in held)
            if not (alike and (later or other)):
                out.append((r, group, seq))
    return out


def test_every_group_has_its_description_also_when_it_recorded_nothing():
    result = analyze(DATA / "mesh3d_crash_raise" / "ours")
    idle = [v.group for v in result.views.values() if v.max_hi == 0]
    assert idle and all(g.desc == "mesh_pp" for g in idle)  # the pp axis saw no collective
    assert all(v.group.desc for v in result.views.values())


def test_a_chain_of_waits_is_listed_transitively():
    # rank 0 waits in the default group for rank 1, which waits in pair_12 for rank 2
    root = analyze(DATA / "chain_through_subgroup" / "ours").findings[0]
    assert (root.culprit_ranks, root.waiting_ranks) == ([2], [0, 1])
    assert "rank 2 is alive and in no collective" in root.message


def test_native_dumps_say_they_cannot_tell_where_a_rank_is_now():
    root = analyze(DATA / "stall_in_data_loader" / "native").findings[0]
    assert root.culprit_ranks == [3]
    assert "PyTorch-native dump carries no thread stacks" in root.message


@pytest.mark.parametrize("name", ["pipeline_1f1b_healthy", "pipeline_drop_send"])
def test_perfetto_joins_every_send_to_its_recv_on_real_pipelines(name, tmp_path):
    # Real 4-stage gloo pipelines: activations flow down the stages, gradients (1F1B)
    # back up. Every arrow leaves a send slice of its rank and lands on the matching
    # recv slice of the peer; an unfinished send has no arrow to a recv it never met.
    from commscope.analyze.present.export import perfetto_trace

    trace = perfetto_trace(analyze(DATA / name / "ours"))
    events = trace["traceEvents"]
    slices = [e for e in events if e["ph"] == "X" and e.get("cat") == "p2p"]
    starts = {e["id"]: e for e in events if e["ph"] == "s" and e["cat"] == "p2p"}
    ends = {e["id"]: e for e in events if e["ph"] == "f" and e["cat"] == "p2p"}
    assert starts and set(starts) == set(ends)

    def slice_at(pid: int, ts: float) -> dict:
        [found] = [e for e in slices if e["pid"] == pid and e["ts"] <= ts <= e["ts"] + e["dur"]]
        return found

    hops = set()
    for i, s in starts.items():
        f = ends[i]
        src, dst = slice_at(s["pid"], s["ts"]), slice_at(f["pid"], f["ts"])
        assert src["name"].removeprefix("STUCK ") == f"send → {f['pid']}"
        assert dst["name"].removeprefix("STUCK ") == f"recv ← {s['pid']}"
        assert src["args"]["sizes"] == dst["args"]["sizes"]
        hops.add((s["pid"], f["pid"]))
    sends = sum(1 for e in slices if e["name"].removeprefix("STUCK ").startswith("send"))
    recvs = sum(1 for e in slices if e["name"].removeprefix("STUCK ").startswith("recv"))
    assert len(starts) <= min(sends, recvs)  # each op is joined at most once
    assert {(0, 1), (1, 2), (2, 3)} <= hops  # activations, stage by stage
    if name == "pipeline_1f1b_healthy":
        assert {(3, 2), (2, 1), (1, 0)} <= hops  # gradients back up
        assert len(starts) == sends == recvs  # every op paired in a healthy job


LIVE = [n for n in SCENARIOS if (DATA / n / "live" / "alive.json").is_file()]


def _live_snapshot(name: str) -> dict:
    """What ``commscope watch`` shows of the scenario's job, from the progress records the
    generator read out of the job's store while it was stuck (``live/``): the ranks dead
    by then have stopped publishing."""
    import time

    from commscope.watch.live import snapshot
    from commscope.watch.source import Beat, Fetched

    live = DATA / name / "live"
    alive = set(json.loads((live / "alive.json").read_text()))
    world = _meta(name)["world_size"]
    records = {r: json.loads((live / f"record_{r}.json").read_text()) for r in range(world)
               if (live / f"record_{r}.json").is_file()}
    configs = {r: json.loads((live / f"config_{r}.json").read_text()) for r in records
               if (live / f"config_{r}.json").is_file()}
    now = time.time_ns()
    beats = {r: Beat(beats=100, version=1, time_ns=now if r in alive else now - 60 * 10**9,
                     quiet_s=0.5 if r in alive else 60.0) for r in records}
    fetched = Fetched(records=records, configs=configs,
                      missing=sorted(set(range(world)) - set(records)), beats=beats)
    return snapshot(fetched, now_ns=now)


def test_the_live_view_is_checked_on_a_dozen_scenarios():
    assert len(LIVE) >= 12


@pytest.mark.parametrize("name", LIVE)
def test_live_view(name):
    # The live view names the culprit the analysis of the dumps names.
    expect = _meta(name)["expect"]
    snap = _live_snapshot(name)
    if not any((DATA / name / "live").glob("record_*.json")):
        # the job was over before any rank published (a crash in its first second):
        # there is nothing to watch, and the view says so rather than guessing
        assert snap["state"] == "waiting", snap["headline"]
        return
    if expect["verdict"] == "healthy":
        assert snap["state"] in ("healthy", "behind", "slow"), snap["headline"]
        assert snap["desyncs"] == [], snap["desyncs"]
        return
    if expect["verdict"] == "desync":  # the job runs on: the fingerprints tell it
        assert snap["state"] == "desync", snap["headline"]
        root = snap["desyncs"][0]
        assert root["kind"] == (expect.get("live_kind") or expect["kind"]), snap["headline"]
        assert sorted(root["culprit_ranks"]) == sorted(expect["culprits"]), snap["headline"]
        return
    assert snap["state"] == "stuck", snap["headline"]
    root = snap["findings"][0]
    story = snap["headline"] + "\n" + "\n".join(f["message"] for f in snap["findings"])
    assert root["kind"] == (expect.get("live_kind") or expect["kind"]), story
    assert sorted(root["culprit_ranks"]) == sorted(expect["culprits"]), story


def _fr_trace(folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace",
         "--allow-incomplete-ranks", str(folder)],
        capture_output=True, text=True, timeout=120)


@torch_has("torch_fr_trace", "torch_fr_trace_reads_gloo")
@pytest.mark.parametrize("name", ["size_mismatch_kills_peer", "restarted_job_killed_rank",
                                  "sigterm_handler_after_timeout", "skip_new_group"])
def test_pytorchs_fr_trace_reads_the_folders_we_write(name):
    # hidden fatal logs, later dumps in commscope_later/, group creations, signal records:
    # none of them may break PyTorch's own analyzer of the same folder
    proc = _fr_trace(DATA / name / "ours")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]


@torch_has("torch_fr_trace", "torch_fr_trace_reads_gloo")
def test_the_old_fatal_name_did_break_fr_trace(tmp_path):
    # the control: the name the recorder used before (".rank_3.fatal") holds fr_trace's
    # prefix "rank_" and crashed it ("3.fatal" is no rank), which the test above catches
    folder = tmp_path / "dumps"
    shutil.copytree(DATA / "size_mismatch_kills_peer" / "ours", folder)
    (folder / ".commscope-fatal-0.log").rename(folder / ".rank_0.fatal")
    proc = _fr_trace(folder)
    assert proc.returncode != 0 or "Traceback" in proc.stderr


def test_world_size_is_honoured_and_two_jobs_are_never_merged():
    # an 8-rank attempt left rank_4..7 beside the 4-rank restart's files
    folder = DATA / "restarted_job" / "ours"
    seen = analyze(folder)
    assert seen.expected == [0, 1, 2, 3] and seen.findings[0].culprit_ranks == [2]
    assert sorted(u.rank for u in seen.load.other_jobs) == [4, 5, 6, 7]
    assert all("another job" in u.error for u in seen.load.other_jobs)
    said = analyze(folder, world_size=8)  # the user says 8: 4-7 left no dump of this job
    assert said.expected == list(range(8)) and said.missing == [4, 5, 6, 7]
    assert sorted(u.rank for u in said.load.other_jobs) == [4, 5, 6, 7]  # still not merged
    native = analyze(DATA / "restarted_job" / "native")  # no job id: sizes and times tell
    assert native.expected == [0, 1, 2, 3] and native.load.other_jobs


def test_a_desync_that_hangs_later_is_in_the_live_view_beside_the_hang():
    # rank 3 all-reduced an int32 metric (silent), then stopped stepping: the live view
    # heads with the hang and still lists the desync its fingerprints show
    snap = _live_snapshot("desync_then_hang")
    assert snap["state"] == "stuck" and snap["findings"][0]["kind"] == "missing_rank"
    assert [(f["kind"], f["culprit_ranks"]) for f in snap["desyncs"]] == [
        ("dtype_mismatch", [3])], snap["desyncs"]
