"""Settings come from enable() arguments first, then PyTorch's own variables."""

from __future__ import annotations

import pytest

from commscope.flight.config import DEFAULT_BUFFER_SIZE, DEFAULT_DUMP_PREFIX, resolve_config


def test_defaults_without_environment():
    cfg = resolve_config(env={})
    assert cfg.buffer_size == DEFAULT_BUFFER_SIZE == 2000
    assert cfg.dump_prefix == DEFAULT_DUMP_PREFIX
    assert cfg.timeout_s is None
    assert cfg.timing is False
    assert cfg.dump_on_timeout is True
    assert cfg.dump_format == "pickle"


def test_torch_variables_are_honoured_new_names_first():
    env = {
        "TORCH_FR_BUFFER_SIZE": "77",
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "55",
        "TORCH_FR_DUMP_TEMP_FILE": "/x/fr_",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/y/nccl_",
        "TORCH_NCCL_ENABLE_TIMING": "true",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "0",
        "COMMSCOPE_FR_TIMEOUT_S": "2.5",
    }
    cfg = resolve_config(env=env)
    assert (cfg.buffer_size, cfg.dump_prefix) == (77, "/x/fr_")
    assert cfg.timing is True and cfg.dump_on_timeout is False and cfg.timeout_s == 2.5


def test_legacy_names_when_new_ones_are_absent():
    cfg = resolve_config(
        env={"TORCH_NCCL_TRACE_BUFFER_SIZE": "55", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/y/n_"}
    )
    assert (cfg.buffer_size, cfg.dump_prefix) == (55, "/y/n_")


def test_arguments_win_over_environment():
    env = {"TORCH_FR_BUFFER_SIZE": "77", "COMMSCOPE_FR_TIMEOUT_S": "9"}
    cfg = resolve_config(buffer_size=5, timeout_s=1.0, dump_format="json", env=env)
    assert (cfg.buffer_size, cfg.timeout_s, cfg.dump_format) == (5, 1.0, "json")


@pytest.mark.parametrize(
    ("kwargs", "env", "needle"),
    [
        ({}, {"TORCH_FR_BUFFER_SIZE": "lots"}, "TORCH_FR_BUFFER_SIZE='lots'"),
        ({"buffer_size": -1}, {}, "buffer_size must be >= 0"),
        ({"timeout_s": 0}, {}, "timeout_s must be > 0"),
        ({"dump_format": "xml"}, {}, "dump_format must be one of"),
        ({}, {"TORCH_NCCL_ENABLE_TIMING": "maybe"}, "TORCH_NCCL_ENABLE_TIMING='maybe'"),
    ],
)
def test_bad_settings_name_the_value(kwargs, env, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(")):
        resolve_config(env=env, **kwargs)


@pytest.mark.parametrize(("preset", "expected"), [(None, "1"), ("0", "0"), ("1", "1")])
def test_timing_turns_on_nccls_own_timing_unless_set(monkeypatch, tmp_path, preset, expected):
    import os

    import commscope.flight as flight

    # setenv first, so monkeypatch restores the variable whatever enable() does to it
    monkeypatch.setenv("TORCH_NCCL_ENABLE_TIMING", preset or "")
    if preset is None:
        monkeypatch.delenv("TORCH_NCCL_ENABLE_TIMING")
    try:
        flight.enable(timing=True, watchdog=False, handle_signals=False,
                      dump_on_exception=False, dump_prefix=str(tmp_path / "r_"))
        assert os.environ.get("TORCH_NCCL_ENABLE_TIMING") == expected
    finally:
        flight.disable()


def test_our_own_prefix_keeps_our_dumps_apart_from_pytorchs():
    # PyTorch's NCCL recorder writes <TORCH_FR_DUMP_TEMP_FILE><rank> too: ours can go elsewhere
    env = {"TORCH_FR_DUMP_TEMP_FILE": "/tmp/nccl_trace_rank_",
           "COMMSCOPE_FR_DUMP_PREFIX": "/tmp/job/commscope_rank_"}
    assert resolve_config(env=env).dump_prefix == "/tmp/job/commscope_rank_"
    assert resolve_config(env={"TORCH_FR_DUMP_TEMP_FILE": "/tmp/t_"}).dump_prefix == "/tmp/t_"


def test_commscope_run_puts_the_watch_file_beside_our_dumps():
    from commscope.flight.launch import watch_env

    env = watch_env(env={"TORCH_FR_DUMP_TEMP_FILE": "/a/nccl_",
                         "COMMSCOPE_FR_DUMP_PREFIX": "/b/ours/rank_"})
    assert env["COMMSCOPE_WATCH_FILE"] == "/b/ours/watch.json"


def test_a_drawn_watch_token_never_reads_as_an_option(capsys):
    # One urlsafe token in 64 starts with "-": `--token -Evl...` was refused by argparse
    # on a login node (seen in the simulated-hosts test).
    from commscope.cli import main
    from commscope.flight.launch import draw_token, watch_env

    tokens = [draw_token() for _ in range(4000)]
    assert not any(t.startswith("-") for t in tokens)
    assert len(set(tokens)) == len(tokens) and {len(t) for t in tokens} == {24}
    assert not watch_env(env={})["COMMSCOPE_WATCH_TOKEN"].startswith("-")
    # a token set by hand may start with "-": the documented `--token=...` form takes it
    code = main(["watch", "--once", "--json", "--store", "127.0.0.1:1", "--token=-abc"])
    err = capsys.readouterr().err
    assert "expected one argument" not in err and code != 2, err
