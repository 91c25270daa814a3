"""Matching and diagnosis edge cases on small hand-made or generated dumps."""

from __future__ import annotations

import itertools

import pytest

from commscope.analyze import analyze
from commscope.analyze.synth import SyntheticJob, write_dump


def _entry(seq, name="nccl:all_reduce", sizes=((4,),), state="completed", group=("0", "default_pg"),
           record=None, dtype="Float", p2p=False, p2p_seq=0, peer=None):
    return {
        "record_id": seq if record is None else record, "pg_id": 0, "process_group": group,
        "collective_seq_id": seq, "p2p_seq_id": p2p_seq, "op_id": seq,
        "profiling_name": name, "time_created_ns": 1_000_000 * seq + 1,
        "input_sizes": [list(s) for s in sizes], "input_dtypes": [dtype] * len(sizes),
        "output_sizes": [list(s) for s in sizes], "output_dtypes": [dtype] * len(sizes),
        "state": state, "retired": state == "completed", "is_p2p": p2p,
        "time_discovered_started_ns": None, "time_discovered_completed_ns": None,
        "peer": peer,
    }


def _write(tmp_path, per_rank, world=None):
    world = world or len(per_rank)
    for r, entries in per_rank.items():
        write_dump({"version": "2.10", "commscope_format": "commscope.flight/1", "rank": r,
                    "world_size": world, "pg_config": {}, "entries": entries},
                   str(tmp_path / f"rank_{r}"))


def test_coalesced_records_share_a_sequence_number(tmp_path):
    def ranked(r):
        out = [_entry(1), _entry(2)]
        second = ((8,),) if r == 1 else ((4,),)
        out += [_entry(3, state="started"), _entry(3, sizes=second, state="started"),
                _entry(3, name="nccl:coalesced", sizes=(), state="started")]
        return out

    _write(tmp_path, {r: ranked(r) for r in range(3)})
    result = analyze(tmp_path)
    root = result.findings[0]
    assert (root.kind, root.culprit_ranks, root.collective_seq_id) == ("size_mismatch", [1], 3)
    assert "coalesced" in root.message


def test_two_sided_tie_is_broken_by_the_group_history(tmp_path):
    # 2 ranks: rank 1's [8] at #6 is unusual, [4] is what the group always used
    per = {r: [_entry(s) for s in range(1, 6)] for r in range(2)}
    per[0].append(_entry(6, state="started"))
    per[1].append(_entry(6, sizes=((8,),), state="started"))
    _write(tmp_path, per)
    root = analyze(tmp_path).findings[0]
    assert (root.kind, root.culprit_ranks, root.waiting_ranks) == ("size_mismatch", [1], [0])


def test_undecidable_tie_names_both_sides(tmp_path):
    per = {0: [_entry(1, sizes=((4,),))], 1: [_entry(1, sizes=((8,),))]}
    _write(tmp_path, per)
    root = analyze(tmp_path).findings[0]
    assert root.kind == "size_mismatch" and root.culprit_ranks == [0, 1]
    assert "no side has a majority" in root.message


@pytest.mark.parametrize("order", list(itertools.permutations(range(4)))[::5])
def test_majority_not_file_order(tmp_path, order):
    per = {r: [_entry(1), _entry(2, state="started")] for r in range(4)}
    per[2][1] = _entry(2, name="nccl:broadcast", state="started")
    _write(tmp_path, per)
    files = [str(tmp_path / f"rank_{r}") for r in order]
    root = analyze(files).findings[0]
    assert (root.kind, root.culprit_ranks, root.waiting_ranks) == ("op_mismatch", [2], [0, 1, 3])


def test_skipped_collective_is_a_missing_rank_not_a_cascade(tmp_path):
    job = SyntheticJob(3)
    job.collective("all_reduce")
    job.collective("all_reduce", sizes=[[16]], ranks=[0, 1])  # rank 2 skips it
    for _ in range(3):
        job.collective("broadcast", sizes=[[2]], ranks=[0, 1, 2])
    job.write(tmp_path)
    result = analyze(tmp_path)
    root = result.findings[0]
    assert (root.kind, root.culprit_ranks, root.collective_seq_id) == ("missing_rank", [2], 2)
    assert "skipped" in root.message
    assert [f.kind for f in result.findings].count("missing_rank") == 1


def test_no_records_is_incomplete_not_healthy(tmp_path):
    _write(tmp_path, {0: [], 1: []})
    result = analyze(tmp_path)
    assert result.verdict == "incomplete"
    assert result.findings[0].kind == "truncated_history"


def test_nothing_readable_is_incomplete(tmp_path):
    (tmp_path / "rank_0").write_bytes(b"\x00\x01")
    (tmp_path / "rank_1").write_bytes(b"")
    result = analyze(tmp_path)
    assert result.verdict == "incomplete"
    assert {f.kind for f in result.findings} == {"unreadable_dump"}
    assert result.missing == [0, 1]


def test_two_cycles_each_reported_once(tmp_path):
    job = SyntheticJob(4)
    a = job.group("1", "a", [0, 1])
    b = job.group("2", "b", [0, 1])
    c = job.group("3", "c", [2, 3])
    d = job.group("4", "d", [2, 3])
    for g in (a, b, c, d):
        job.collective("all_reduce", group=g)
    job.collective("all_reduce", group=a, ranks=[0])
    job.collective("all_reduce", group=b, ranks=[1])
    job.collective("all_reduce", group=c, ranks=[2])
    job.collective("all_reduce", group=d, ranks=[3])
    job.write(tmp_path)
    result = analyze(tmp_path)
    cycles = [f for f in result.findings if f.kind == "cross_group_deadlock"]
    assert sorted(f.culprit_ranks for f in cycles) == [[0, 1], [2, 3]]
    assert not [f for f in result.findings if f.kind == "missing_rank"]


def test_chain_blames_its_end_only(tmp_path):
    # rank 0 waits for 1 in group a; rank 1 waits for 2 in group b; rank 2 is elsewhere
    job = SyntheticJob(3)
    a = job.group("1", "a", [0, 1])
    b = job.group("2", "b", [1, 2])
    job.collective("all_reduce", group=a)
    job.collective("all_reduce", group=b)
    job.collective("all_reduce", group=a, ranks=[0])
    job.collective("all_reduce", group=b, ranks=[1])
    job.write(tmp_path)
    result = analyze(tmp_path)
    missing = [f for f in result.findings if f.kind == "missing_rank"]
    assert [(f.culprit_ranks, f.group.name) for f in missing] == [([2], "2")]


def test_p2p_pairs_by_order_per_pair(tmp_path):
    job = SyntheticJob(2)
    for _ in range(3):
        job.p2p(0, 1)
        job.p2p(1, 0)
    job.p2p(1, 0, post="recv")  # rank 0 waits in a recv from 1, which never sends
    job.write(tmp_path)
    root = analyze(tmp_path).findings[0]
    assert (root.kind, root.culprit_ranks, root.waiting_ranks, root.op) == (
        "p2p_unmatched", [1], [0], "recv")


def test_native_p2p_names_resolve_group_local_ranks(tmp_path):
    # PyTorch's native records name group-local ranks and carry no peer field
    job = SyntheticJob(4, ours=False)
    g = job.group("1", "pp", [2, 3])
    job.p2p(2, 3, group=g, post="send")
    job.write(tmp_path)
    root = analyze(tmp_path).findings[0]
    assert (root.kind, root.culprit_ranks, root.waiting_ranks) == ("p2p_unmatched", [3], [2])


def test_big_job_is_linear_enough(tmp_path):
    import time

    from commscope.analyze.synth import write_scale_dumps

    write_scale_dumps(tmp_path, 128, 60, missing_rank=77)
    start = time.perf_counter()
    result = analyze(tmp_path, jobs=1)
    elapsed = time.perf_counter() - start
    root = result.findings[0]
    assert (root.kind, root.culprit_ranks, root.collective_seq_id) == ("missing_rank", [77], 60)
    assert len(root.waiting_ranks) == 127
    assert elapsed < 10, elapsed


def test_an_older_dump_with_a_complete_history_is_not_a_crash(tmp_path):
    job = SyntheticJob(3)
    for _ in range(4):
        job.collective("all_reduce")
    late = job.clock + 600 * 10**9
    job.write(tmp_path, dump_times={0: late, 1: late - 300 * 10**9, 2: late})
    result = analyze(tmp_path)
    assert result.verdict == "healthy", result.findings[0].message
