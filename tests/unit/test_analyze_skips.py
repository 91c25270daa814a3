"""A rank that skipped a collective and went on is ``missing_rank``, not a deadlock, when
the ranks outside the cycle show the order (tests/data/recorded/skipped_then_blocked:
``commscope demo``'s story recorded on real gloo ranks). Variants are the same dumps with
the witnesses' records edited; and readable names for hash-named groups."""

from __future__ import annotations

import pickle
import random
import re
import shutil
from pathlib import Path

from commscope.analyze import analyze, format_report
from commscope.analyze.align.match import short_names

DATA = Path(__file__).resolve().parents[1] / "data" / "recorded" / "skipped_then_blocked"
DP13 = "d876ba237e5099dbfad9b1471bd79bb9a4de2974"
WITNESSES = (0, 2)


def _load(rank: int) -> dict:
    with open(DATA / f"rank_{rank}", "rb") as fh:
        return pickle.load(fh)  # our own committed fixture


def _copy_with(tmp_path: Path, edit) -> Path:
    """The fixture with ``edit(rank, entries)`` applied to each witness's entries."""
    for r in range(4):
        dump = _load(r)
        if r in WITNESSES:
            dump["entries"] = edit(r, dump["entries"])
        with open(tmp_path / f"rank_{r}", "wb") as fh:
            pickle.dump(dump, fh, protocol=2)
    return tmp_path


def _is(entry: dict, desc: str, seq: int) -> bool:
    return entry["process_group"][1] == desc and entry["collective_seq_id"] == seq


def _dp3_after_world(entries: list[dict]) -> list[dict]:
    dp3 = [e for e in entries if _is(e, "mesh_dp", 3)]
    return [e for e in entries if not _is(e, "mesh_dp", 3)] + dp3


def test_the_skip_is_the_root_cause_and_the_cycle_its_consequence():
    result = analyze(DATA)
    root = result.findings[0]
    assert (root.kind, root.culprit_ranks, root.waiting_ranks) == ("missing_rank", [3], [0, 1, 2])
    assert (root.group.name, root.collective_seq_id, root.op) == (DP13, 3, "all_reduce")
    assert result.verdict == "hang"
    assert [f.kind for f in result.findings] == ["missing_rank"]
    msg = root.message
    for part in ("Rank 3 never joined all_reduce #3 ([[6]] Float)",
                 "group mesh_dp (ranks 1, 3; d876ba23)", "which rank 1 waits in",
                 "all_reduce #5 of group 0 (default_pg, ranks 0-3)", "ranks 0, 2",
                 "in skipped_then_blocked"):
        assert part in msg, (part, msg)
    assert DP13 not in msg


def test_verdict_does_not_depend_on_file_order():
    files = sorted(str(p) for p in DATA.iterdir())
    reference = analyze(files).to_json()
    rng = random.Random(3)
    for _ in range(3):
        rng.shuffle(files)
        assert analyze(list(files)).to_json() == reference


def test_without_witness_records_the_cycle_stays_a_deadlock(tmp_path):
    # the witnesses never issued their mesh_dp #3: nothing says which link is wrong
    _copy_with(tmp_path, lambda r, es: [e for e in es if not _is(e, "mesh_dp", 3)])
    root = analyze(tmp_path).findings[0]
    assert (root.kind, root.culprit_ranks, root.waiting_ranks) == (
        "cross_group_deadlock", [1, 3], [0, 2])


def test_a_tie_between_witnesses_stays_a_deadlock(tmp_path):
    _copy_with(tmp_path, lambda r, es: _dp3_after_world(es) if r == 2 else es)
    assert analyze(tmp_path).findings[0].kind == "cross_group_deadlock"


def test_the_witnesses_order_decides_which_rank_is_the_culprit(tmp_path):
    # had every witness issued the world's #5 before its mesh_dp #3, rank 1 is the one
    # that went on: it never joined all_reduce #5 of the world, where 0, 2, 3 wait
    _copy_with(tmp_path, lambda r, es: _dp3_after_world(es))
    root = analyze(tmp_path).findings[0]
    assert (root.kind, root.culprit_ranks, root.collective_seq_id) == ("missing_rank", [1], 5)
    assert root.group.name == "0" and root.waiting_ranks == [0, 2, 3]


def test_a_sibling_group_call_from_other_code_is_no_evidence(tmp_path):
    def move(r: int, entries: list[dict]) -> list[dict]:
        for e in entries:
            if _is(e, "mesh_dp", 3):
                e["frames"] = [dict(f, line=f["line"] + 1000) for f in e["frames"]]
        return entries

    _copy_with(tmp_path, move)
    assert analyze(tmp_path).findings[0].kind == "cross_group_deadlock"


def test_recorded_three_group_cycle_has_no_witness():
    root = analyze(DATA.parent / "cross_group_deadlock").findings[0]
    assert root.kind == "cross_group_deadlock" and root.culprit_ranks == [0, 1, 2]


def test_hash_named_groups_are_shortened_in_the_text_only(tmp_path):
    result = analyze(DATA)
    text = format_report(result)
    assert not re.search(r"[0-9a-f]{40}", text), text
    assert "d876ba23  mesh_dp" in text
    assert result.to_json()["findings"][0]["group"]["name"] == DP13
    shutil.copy(DATA / "rank_0", tmp_path / "rank_0")  # one file: still short names
    assert not re.search(r"[0-9a-f]{40}", format_report(analyze(tmp_path)))


def test_short_names_are_unambiguous():
    a = "d876ba23" + "0" * 32
    b = "d876ba23" + "1" + "0" * 31
    c = "4314d7ee" + "f" * 32
    names = short_names([a, b, c, "0", "d876ba230"])
    assert names[c] == "4314d7ee"
    assert names[a] == "d876ba2300" and names[b] == "d876ba231"
    assert "0" not in names and "d876ba230" not in names
    assert len(set(names.values())) == 3
