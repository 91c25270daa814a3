"""The one line rank 0 prints when ``commscope run`` starts a job."""

from __future__ import annotations

from commscope.flight.bootstrap import banner
from commscope.flight.launch import watch_env


def test_banner_says_ranks_dump_folder_and_how_to_watch(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = banner({"WORLD_SIZE": "8"})
    assert line.startswith("commscope: recording every collective of 8 ranks")
    assert f"dumps to {tmp_path}/commscope_traces/rank_<rank>" in line
    assert line.endswith("watch it live: commscope watch")  # the default watch file
    assert "\n" not in line


def test_banner_names_a_moved_watch_file_and_a_live_view_turned_off(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    env = {"WORLD_SIZE": "2", "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "d" / "trace_")}
    line = banner(env)
    assert f"dumps to {tmp_path}/d/trace_<rank>" in line
    assert line.endswith(f"commscope watch --file {tmp_path}/d/watch.json")
    off = banner({**env, "COMMSCOPE_WATCH_INTERVAL_S": "0"})
    assert off.endswith("live view off (COMMSCOPE_WATCH_INTERVAL_S=0)")


def test_only_commscope_run_asks_for_the_banner():
    assert watch_env({})["COMMSCOPE_RUN_BANNER"] == "1"
