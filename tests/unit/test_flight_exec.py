"""``commscope exec``: torch's env:// variables from Slurm's, MPI's or a Kubernetes
operator's (``commscope/flight/launcher_env.py``), and the environment it gives a rank."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from commscope.flight.exec import prepare_env
from commscope.flight.launcher_env import (
    LauncherEnvError,
    expand_hostlist,
    first_host,
    slurm_port,
    tasks_per_node,
    torch_env,
)


@pytest.mark.parametrize(("text", "hosts"), [
    ("node1", ["node1"]),
    ("hostA,hostB", ["hostA", "hostB"]),
    ("gpu[001-004,010],login1",
     ["gpu001", "gpu002", "gpu003", "gpu004", "gpu010", "login1"]),
    ("n[8-11]", ["n8", "n9", "n10", "n11"]),
    ("n[098-101]", ["n098", "n099", "n100", "n101"]),  # the width of the low bound
    ("rack[1-2]-node[01-02]", ["rack1-node01", "rack1-node02", "rack2-node01",
                               "rack2-node02"]),
    ("a[1,3]-ib,b[2]", ["a1-ib", "a3-ib", "b2"]),
    (" x[7] , y ", ["x7", "y"]),
])
def test_hostlists_expand_as_slurm_writes_them(text, hosts):
    assert expand_hostlist(text) == hosts
    assert first_host(text) == hosts[0]


def test_the_first_host_of_a_huge_hostlist_is_read_without_expanding_it():
    assert first_host("gpu[0000000-9999999]") == "gpu0000000"


@pytest.mark.parametrize(("text", "message"), [
    ("gpu[1-2", "'[' without ']'"),
    ("gpu1-2]", "']' without '['"),
    ("gpu[[1]]", "nested"),
    ("gpu[a-b]", "'a-b' is not a number or a range"),
    ("gpu[4-2]", "goes down"),
    ("", "names no host"),
])
def test_a_malformed_hostlist_is_one_sentence(text, message):
    with pytest.raises(LauncherEnvError, match=re.escape(message)):
        first_host(text)


@pytest.mark.parametrize(("text", "counts"), [
    ("8", [8]),
    ("8(x2)", [8, 8]),
    ("4,2", [4, 2]),
    ("2(x3),1", [2, 2, 2, 1]),
])
def test_tasks_per_node_forms(text, counts):
    assert tasks_per_node(text) == counts


def test_bad_tasks_per_node_and_job_ids():
    with pytest.raises(LauncherEnvError, match="not N or N"):
        tasks_per_node("8(2)")
    with pytest.raises(LauncherEnvError, match="set MASTER_PORT"):
        slurm_port("abc")
    assert slurm_port("1234567") == 15000 + 4567
    assert slurm_port("1234567_3") == slurm_port("1234567")  # an array task


def _slurm(procid: int, ntasks: int = 16, localid: int | None = None, nodeid: int = 0,
           **extra: str) -> dict[str, str]:
    env = {"SLURM_PROCID": str(procid), "SLURM_NTASKS": str(ntasks),
           "SLURM_LOCALID": str(procid % 8 if localid is None else localid),
           "SLURM_NODEID": str(nodeid), "SLURM_STEP_ID": "0", "SLURM_JOB_ID": "987654",
           "SLURM_JOB_NODELIST": "gpu[007-008]", "SLURM_TASKS_PER_NODE": "8(x2)"}
    env.update(extra)
    return env


def test_srun_fills_every_variable():
    assert torch_env(_slurm(9, nodeid=1)) == {
        "RANK": "9", "WORLD_SIZE": "16", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "8",
        "MASTER_ADDR": "gpu007", "MASTER_PORT": str(15000 + 7654)}


def test_srun_prefers_the_steps_own_variables():
    env = _slurm(1, ntasks=64, SLURM_STEP_NUM_TASKS="6", SLURM_STEP_NODELIST="gpu[020-021]",
                 SLURM_STEP_TASKS_PER_NODE="4,2")
    got = torch_env({**env, "SLURM_NODEID": "1"})
    assert (got["WORLD_SIZE"], got["MASTER_ADDR"], got["LOCAL_WORLD_SIZE"]) == (
        "6", "gpu020", "2")


def test_uneven_nodes_count_per_node_and_plain_ntasks_per_node():
    env = _slurm(12, ntasks=13, nodeid=1, SLURM_TASKS_PER_NODE="8,5")
    assert torch_env(env)["LOCAL_WORLD_SIZE"] == "5"
    env = _slurm(0, ntasks=2)
    del env["SLURM_TASKS_PER_NODE"]
    assert "LOCAL_WORLD_SIZE" not in torch_env(env)
    assert torch_env({**env, "SLURM_NTASKS_PER_NODE": "1"})["LOCAL_WORLD_SIZE"] == "1"


def test_a_variable_that_is_set_is_never_replaced():
    given = {"RANK": "3", "WORLD_SIZE": "16", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "8",
             "MASTER_ADDR": "head", "MASTER_PORT": "29400"}
    assert torch_env({**_slurm(9), **given}) == {}
    # only the missing ones come from the launcher; an empty one counts as missing
    got = torch_env({**_slurm(9), "MASTER_ADDR": "head", "MASTER_PORT": ""})
    assert "MASTER_ADDR" not in got and got["MASTER_PORT"] == str(15000 + 7654)


def test_a_pytorchjob_sets_everything_itself():
    env = {"RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "job-master-0",
           "MASTER_PORT": "23456", "KUBERNETES_SERVICE_HOST": "10.0.0.1"}
    assert torch_env(env) == {}


def test_open_mpi_and_the_host_of_rank_0():
    env = {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8",
           "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}
    with pytest.raises(LauncherEnvError, match=r"set MASTER_ADDR to rank 0's host.*-x"):
        torch_env(env)
    assert torch_env({**env, "MASTER_ADDR": "node1"}) == {
        "RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
        "MASTER_PORT": "29500"}
    # every rank on this host: rank 0 is here too
    one_host = {**env, "OMPI_COMM_WORLD_LOCAL_SIZE": "8"}
    assert torch_env(one_host)["MASTER_ADDR"] == "127.0.0.1"


def test_mpich_and_intel_mpi():
    env = {"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2",
           "MASTER_ADDR": "n1"}
    got = torch_env(env)
    assert (got["RANK"], got["WORLD_SIZE"], got["LOCAL_RANK"], got["LOCAL_WORLD_SIZE"]) == (
        "2", "4", "0", "2")


def test_mpirun_inside_a_slurm_allocation_ignores_the_daemons_slurm_variables():
    # mpirun's daemons were started by srun, one task per node: their SLURM_* say node 1
    # of 2, which is not this rank
    env = {**_slurm(1, ntasks=2, localid=0, nodeid=1),
           "OMPI_COMM_WORLD_RANK": "13", "OMPI_COMM_WORLD_SIZE": "16",
           "OMPI_COMM_WORLD_LOCAL_RANK": "5"}
    with pytest.raises(LauncherEnvError, match="Open MPI's launcher does not say"):
        torch_env(env)
    got = torch_env({**env, "MASTER_ADDR": "n1"})
    assert (got["RANK"], got["WORLD_SIZE"], got["LOCAL_RANK"]) == ("13", "16", "5")
    assert "LOCAL_WORLD_SIZE" not in got
    assert got["MASTER_PORT"] == str(15000 + 7654)  # the allocation's job id is the job's


def test_srun_with_pmi2_agrees_with_slurm_and_uses_its_nodelist():
    env = {**_slurm(3, ntasks=16), "PMI_RANK": "3", "PMI_SIZE": "16"}
    got = torch_env(env)
    assert (got["RANK"], got["LOCAL_RANK"], got["MASTER_ADDR"]) == ("3", "3", "gpu007")


@pytest.mark.parametrize(("env", "message"), [
    ({}, "cannot tell this process's rank: none of RANK, OMPI_COMM_WORLD_RANK"),
    ({"RANK": "0"}, "cannot tell this process's world size: none of WORLD_SIZE"),
    ({"RANK": "4", "WORLD_SIZE": "4"}, "RANK 4 is outside WORLD_SIZE 4 (ranks are 0..3)"),
    ({"RANK": "x", "WORLD_SIZE": "4"}, "RANK='x' is not a non-negative integer"),
    ({"RANK": "1", "WORLD_SIZE": "2"}, "MASTER_ADDR is not set and no launcher says"),
    (_slurm(0, SLURM_JOB_NODELIST=""),
     "none of SLURM_STEP_NODELIST, SLURM_JOB_NODELIST, SLURM_NODELIST is set"),
    ({k: v for k, v in _slurm(0).items() if k != "SLURM_STEP_ID"},
     "batch script, not a task of srun"),
    (_slurm(0, SLURM_JOB_NODELIST="gpu[1-"),
     "SLURM_JOB_NODELIST: hostlist 'gpu[1-': '[' without ']'"),
])
def test_what_cannot_be_told_is_one_sentence(env, message):
    with pytest.raises(LauncherEnvError, match=re.escape(message)):
        torch_env(env)


def test_ranks_that_all_run_here_need_no_master_addr():
    assert torch_env({"RANK": "0", "WORLD_SIZE": "1"}) == {
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    assert torch_env({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}) == {
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def test_prepare_env_is_commscope_runs_environment_and_draws_its_own_token():
    env = _slurm(9, nodeid=1, TORCH_FR_DUMP_TEMP_FILE="/data/traces/rank_")
    added = prepare_env(env)
    assert env["RANK"] == "9" and env["MASTER_ADDR"] == "gpu007"
    assert env["COMMSCOPE_WATCH_TOKEN"] and env["COMMSCOPE_WATCH_TOKEN_DRAWN"] == "1"
    assert env["COMMSCOPE_WATCH_FILE"] == "/data/traces/watch.json"
    assert env["COMMSCOPE_FR_STRICT"] == "1" and env["COMMSCOPE_RUN_BANNER"] == "1"
    assert set(added) <= set(env) and "SLURM_PROCID" not in added
    # a token the user set is kept, and not marked drawn; nothing set is replaced
    mine = {**_slurm(1), "COMMSCOPE_WATCH_TOKEN": "secret", "COMMSCOPE_FR_STRICT": "0"}
    prepare_env(mine)
    assert mine["COMMSCOPE_WATCH_TOKEN"] == "secret"
    assert "COMMSCOPE_WATCH_TOKEN_DRAWN" not in mine and mine["COMMSCOPE_FR_STRICT"] == "0"
    # an environment that cannot be told is left as it was
    bad: dict[str, str] = {"RANK": "0"}
    with pytest.raises(LauncherEnvError):
        prepare_env(bad)
    assert bad == {"RANK": "0"}


@pytest.mark.parametrize(("argv", "env", "message"), [
    (["exec", "/nonexistent-script.py"], {}, "no such script: /nonexistent-script.py"),
    (["exec", "--bogus"], {}, "unknown option '--bogus'"),
    (["exec", "-m"], {}, "-m needs a module name"),
    (["exec", "-m", "json.tool"], {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"},
     "set MASTER_ADDR to rank 0's host"),
])
def test_commscope_exec_bad_input_is_one_line_and_exit_2(argv, env, message):
    clean = {k: v for k, v in os.environ.items()
             if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")
             and not k.startswith(("SLURM_", "OMPI_", "PMI_"))}
    proc = subprocess.run([sys.executable, "-m", "commscope", *argv], capture_output=True,
                          text=True, timeout=60, env={**clean, **env})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("commscope exec: error: ") and message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
