"""`commscope mesh` and the CLI's error convention."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from commscope.cli import main


def test_mesh_plan_text(capsys):
    code = main(
        [
            "mesh",
            "--world-size",
            "16384",
            "--shape",
            "2,1024,8",
            "--names",
            "dp,fsdp,tp",
            "--ranks-per-host",
            "8",
            "--rank",
            "5",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "mesh (dp=2, fsdp=1024, tp=8) over 16384 ranks, 2048 hosts of 8 ranks" in out
    assert "rank 5: coordinate (dp=0, fsdp=0, tp=5), host 0" in out
    assert "dp    group [5, 8197]" in out
    assert "fsdp  group [5, 13, 21, ..., 8189] (1024 ranks, step 8)" in out
    assert "tp    group [0..7]" in out
    assert "tp         8     2048        1  inside a host" in out
    assert "commscope: 3" in out and "10256 new_group calls" in out


def test_mesh_plan_json_and_warning(capsys):
    assert (
        main(["mesh", "--shape", "4,2", "--names", "tp,dp", "--ranks-per-host", "2", "--json"]) == 0
    )
    plan = json.loads(capsys.readouterr().out)
    assert plan["format"] == "commscope.mesh-plan/1"
    assert plan["world_size"] == 8 and plan["names"] == ["tp", "dp"]
    assert [a["intra_host"] for a in plan["axes"]] == [False, True]
    assert plan["axes"][0]["group_of_rank"] == [0, 2, 4, 6]
    assert any("'tp'" in w for w in plan["warnings"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["mesh", "--shape", "2,4", "--names", "dp,tp", "--world-size", "6"],
            "dp(2) * tp(4) = 8 != world size 6",
        ),
        (["mesh", "--shape", "2,x"], "--shape wants integers"),
        (["mesh", "--shape", "2,2", "--names", "dp,dp"], "'dp' appears more than once"),
        (["mesh", "--shape", "2,2", "--rank", "9"], "rank 9 is outside the mesh"),
        (["mesh", "--shape", "2,2", "--names", "dp,"], "empty name"),
        (["mesh"], "the following arguments are required: --shape"),
        (["nosuchcommand"], "invalid choice"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, message):
    proc = subprocess.run(
        [sys.executable, "-m", "commscope", *argv], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) <= 3  # argparse adds a usage line


def test_help_shows_an_example(capsys):
    with pytest.raises(SystemExit):
        main(["mesh", "--help"])
    assert "example:\n  commscope mesh --world-size 16384" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["view", "/etc/hostname"], "cannot read /etc/hostname as JSON"),
        (["run", "/nonexistent-script.py"], "no such script: /nonexistent-script.py"),
        (["demo", "--world-size", "3"], "--world-size must be an even number >= 4"),
        (["demo", "--ranks", "3"], "--world-size must be an even number >= 4"),  # old name
        (["demo", "--fault", "bogus"], "invalid choice: 'bogus'"),
    ],
)
def test_other_commands_bad_input_is_one_line_and_exit_2(argv, message):
    proc = subprocess.run(
        [sys.executable, "-m", "commscope", *argv], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
