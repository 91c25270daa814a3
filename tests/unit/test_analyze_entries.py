"""``--entries``: each group's newest records side by side, agreeing ranks folded."""

from __future__ import annotations

from pathlib import Path

import pytest

from commscope.analyze import analyze
from commscope.analyze.present.entries import format_entries, parse_rank_spec
from commscope.analyze.synth import SyntheticJob, write_dump
from commscope.cli import main

DATA = Path(__file__).resolve().parents[1] / "data"


def _rows(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.lstrip().startswith(("#", "!#"))]


def test_missing_rank_shows_who_waits_and_who_never_issued():
    text = format_entries(analyze(DATA / "missing_rank"), last=2)
    assert "group 0 (default_pg, ranks 0-2): #3-#4 (recorded from #1)" in text
    assert _rows(text) == ["#3  broadcast [[4]] Float   0-2 done",
                           "#4  all_reduce [[4]] Float  0, 1 pending; 2 not issued"]


def test_rows_where_ranks_disagree_are_marked_and_spelled_per_rank():
    rows = _rows(format_entries(analyze(DATA / "order_mismatch")))
    assert rows[2] == ("!#3  ranks disagree: 0, 2 all_reduce [[4]] Float pending; "
                       "1 broadcast [[4]] Float pending")
    assert rows[0].startswith("#1  all_reduce")  # agreeing rows carry no mark
    sizes = _rows(format_entries(analyze(DATA / "size_mismatch")))
    assert sizes[-1].startswith("!#3  ranks disagree: 0, 2 all_reduce [[4]] Float pending; "
                                "1 all_reduce [[8]] Float")


def test_wrapped_ring_crashed_rank_and_skipped_records(tmp_path):
    rows = _rows(format_entries(analyze(DATA / "truncated_history"), last=5,
                                groups=["default_pg"]))
    assert rows[0] == "#4  all_reduce [[4]] Float  0, 1 not kept; 2 done"
    crashed = _rows(format_entries(analyze(DATA / "crashed_rank")))
    assert all(r.endswith("0, 2 done; 1 no dump") for r in crashed)
    job = SyntheticJob(3)
    for _ in range(4):
        job.collective("all_reduce")
    job.write(tmp_path, ranks=[0, 2])
    data = job.dump(1)
    del data["entries"][2]  # rank 1 has no record of #3 inside its range
    write_dump(data, str(tmp_path / "rank_1"))
    rows = _rows(format_entries(analyze(tmp_path)))
    assert rows[2].endswith("0, 2 done; 1 skipped")


def test_rank_and_group_filters_keep_the_whole_groups_range(tmp_path):
    a = analyze(DATA / "recorded" / "cross_group_deadlock")
    text = format_entries(a, ranks=[2], groups=["group_B"])
    assert "group 2 (group_B, ranks 1, 2): #1-#2, rank 2 shown" in text
    # rank 2 never issued #2; the head says what rank 1 issued there
    assert _rows(text) == ["#1  all_reduce [[4]] Float  2 done",
                           "#2  all_reduce [[4]] Float  2 not issued"]
    assert "group_A" not in text and "group_C" not in text
    with pytest.raises(ValueError, match="no group named tp"):
        format_entries(a, groups=["tp"])


def test_point_to_point_ops_are_listed_per_rank():
    text = format_entries(analyze(DATA / "p2p_unmatched"), last=2)
    assert "point-to-point, oldest to newest:" in text
    assert "rank 2: recv ← 1 #7 done, send → 3 #8 pending" in text


def test_thousand_ranks_fold_into_rank_lists(tmp_path):
    job = SyntheticJob(1000)
    job.collective("all_reduce")
    job.collective("all_reduce", ranks=[r for r in range(1000) if r != 517])
    job.write(tmp_path)
    text = format_entries(analyze(tmp_path, jobs=1))
    assert _rows(text)[-1].endswith("0-516, 518-999 pending; 517 not issued")
    assert max(map(len, text.splitlines())) < 120


@pytest.mark.parametrize("spec,ranks", [("0-3,7", [0, 1, 2, 3, 7]), ("5", [5]),
                                        (" 2 , 0-1 ", [0, 1, 2]), ("3,3-4", [3, 4])])
def test_rank_spec(spec, ranks):
    assert parse_rank_spec(spec) == ranks


@pytest.mark.parametrize("spec", ["", ",", "a", "1-", "-1", "3-1", "0-99999999"])
def test_bad_rank_spec_says_why(spec):
    with pytest.raises(ValueError, match="bad rank list"):
        parse_rank_spec(spec)


def test_cli_appends_the_entries_to_the_text_report(tmp_path, capsys):
    out = tmp_path / "report.txt"
    assert main(["analyze", str(DATA / "missing_rank"), "--entries", "1", "-o", str(out)]) == 5
    text = out.read_text()
    assert text.index("findings (root cause first)") < text.index("entries (newest 1")
    assert "#4  all_reduce [[4]] Float  0, 1 pending; 2 not issued" in text


def test_coalesced_records_show_their_members(tmp_path):
    from tests.unit.test_analyze_match import _entry, _write

    def ranked(r):
        second = ((8,),) if r == 1 else ((4,),)
        return [_entry(1), _entry(3, state="started"), _entry(3, sizes=second, state="started"),
                _entry(3, name="nccl:coalesced", sizes=(), state="started")]

    _write(tmp_path, {r: ranked(r) for r in range(3)})
    rows = _rows(format_entries(analyze(tmp_path)))
    assert rows[-1] == ("!#3  ranks disagree: 0, 2 coalesced(all_reduce [[4]] Float, all_reduce "
                        "[[4]] Float) started; 1 coalesced(all_reduce [[4]] Float, all_reduce "
                        "[[8]] Float) started")
    assert " ".join(rows[1].split()) == "#2 (no record) 0-2 skipped"  # no rank has #2


def test_fr_trace_spellings_work(capsys):
    folder = str(DATA / "recorded" / "cross_group_deadlock")
    hang = 5
    assert main(["analyze", "-d", folder, "--just_print_entries", "--selected-ranks", "0", "2",
                 "--pg-filters", "group_A", "group_C", "--allow-incomplete-ranks"]) == hang
    fr_style = capsys.readouterr().out
    assert main(["analyze", folder, "--entries", "--ranks", "0,2", "--group", "group_A",
                 "--group", "group_C"]) == hang
    ours = capsys.readouterr().out
    assert fr_style.split("entries (")[1] == ours.split("entries (")[1]  # not the timing
    # fr_trace's short -j, the folder first or last (python -m ...fr_trace DIR -j)
    assert main(["analyze", folder, "-j", "--selected-ranks", "0", "2", "--pg-filters",
                 "group_A", "group_C"]) == hang
    assert capsys.readouterr().out.split("entries (")[1] == ours.split("entries (")[1]
    assert main(["analyze", "-j", folder, "--selected-ranks", "0", "2", "--pg-filters",
                 "group_A", "group_C"]) == hang
    assert capsys.readouterr().out.split("entries (")[1] == ours.split("entries (")[1]
    assert "group_B" not in ours.split("entries (")[1]
    assert "#2  all_reduce [[4]] Float  0 not issued; 2 started" in ours


def test_ranks_that_swallowed_the_folder_get_a_hint(capsys):
    assert main(["analyze", "--entries", "--ranks", "0", str(DATA / "missing_rank")]) == 2
    assert "put the folder before --ranks" in capsys.readouterr().err


def test_point_to_point_listing_is_capped_with_the_stuck_ranks_kept(tmp_path):
    job = SyntheticJob(40)
    for r in range(39):
        job.p2p(r, r + 1)
    job.p2p(39, 0, post="send")  # the only unfinished op: rank 39's send
    job.write(tmp_path)
    text = format_entries(analyze(tmp_path, jobs=1), last=2)
    listed = [line.split(":")[0].strip() for line in text.splitlines()
              if line.startswith("   rank ")]
    assert len(listed) == 16 and "rank 39" in listed
    assert "... and 24 more ranks with sends or recvs (choose them with --ranks)" in text
    assert "rank 39: recv ← 38 #1 done, send → 0 #2 pending" in text


def test_many_groups_are_capped_with_the_stopped_one_kept(tmp_path):
    job = SyntheticJob(40)
    names = [job.group(str(i + 1), f"tp{i}", [2 * i, 2 * i + 1]) for i in range(20)]
    for name in names:
        job.collective("all_reduce", group=name)
    job.collective("all_reduce", group=names[17], ranks=[34])  # rank 35 never joins
    job.write(tmp_path)
    a = analyze(tmp_path, jobs=1)
    assert a.findings[0].group.desc == "tp17"
    text = format_entries(a)
    headers = [line for line in text.splitlines() if line.startswith("group ")]
    assert len(headers) == 16 and any("tp17" in h for h in headers)
    assert "... and 4 more groups" in text  # group 0 has no record: not counted
    assert "34 pending; 35 not issued" in text
    assert len(format_entries(a, groups=["tp3", "tp4"]).splitlines()) == 1 + 2 * 2
