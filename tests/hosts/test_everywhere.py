"""Every command typed everywhere: on each host of a job, on a host with no ranks, on one
host's folder, on several folders and an archive, and on uneven hosts (issue 31, item 11).

Three simulated hosts for the module: hostA and hostB run the jobs, hostC runs no rank
(a login node that reaches the store).

The hung job (2 hosts x 2 gloo ranks): rank 3 (on hostB) stalls in its data loader and
the recorder's 3 s timeout makes every rank dump on its own host's disk. Then, at once:
``commscope watch --once --json`` and ``commscope dump`` typed on hostA and hostB with no
arguments, and on hostC with ``--store``/``--token`` read from a copy of a watch file the
way docs/hosts.md says; ``commscope analyze`` of hostA's own folder typed on hostA. The
folders are copied out as a user would (one per host, all merged, ``tar czf`` of hostA's)
and analyzed here.

The uneven job (``nproc=[1, 3]``: rank 0 alone on hostA, ranks 1-3 on hostB) makes a
(dp, tp) = (2, 2) mesh with ``commscope.mesh.init_device_mesh`` before it trains, then
rank 3 stalls the same way: the mesh's picture, its warning, the dumps' host table and
the verdict must all tell the real hosts.
"""

from __future__ import annotations

import json
import pickle
import re
import shutil
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from commscope.cli import main
from commscope.exitcodes import for_verdict
from commscope.hosttable import decode_table
from tests.hosts.cluster import Cluster, Host, wait_until
from tests.hosts.job import TRACES, MultiHostJob, start_job

pytestmark = [pytest.mark.dist, pytest.mark.slow, pytest.mark.timeout(240)]

FR_TIMEOUT_S = 3  # 2 s can fire in a slow init_process_group on two busy cores
CULPRIT = 3
LIVE = "live verdict (every rank's record, all hosts): "
JOB_ENV = {"COMMSCOPE_FR_TIMEOUT_S": str(FR_TIMEOUT_S), "COMMSCOPE_WATCH_INTERVAL_S": "0.5",
           "STALL_RANK": str(CULPRIT), "STALL_FILE": "stall"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with Cluster(3, tmp_path_factory.mktemp("everywhere") / "hosts") as c:
        yield c


@dataclass
class Ran:
    """One command typed on a host: its exit status, output and wall time."""

    host: str
    argv: list[str]
    rc: int
    out: str
    err: str
    seconds: float

    def __str__(self) -> str:
        return f"{self.host}$ {' '.join(self.argv)} -> {self.rc}\n{self.out}\n{self.err}"


@dataclass
class _Running:
    host: Host
    argv: list[str]
    proc: subprocess.Popen
    out: Path
    err: Path
    start: float = field(default_factory=time.monotonic)


def _start(host: Host, argv: list[str], root: Path, name: str) -> _Running:
    """Start ``argv`` on ``host``, its output into files (many run at once)."""
    out, err = root / f"{name}.out", root / f"{name}.err"
    with open(out, "wb") as o, open(err, "wb") as e:  # the child keeps its copies
        proc = host.popen(argv, stdout=o, stderr=e)
    return _Running(host, argv, proc, out, err)


def _finish(run: _Running, timeout: float) -> Ran:
    try:
        run.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        run.host.end(run.proc)
    return Ran(run.host.name, run.argv, run.proc.returncode, run.out.read_text(),
               run.err.read_text(), time.monotonic() - run.start)


def _from_watch_file(command: str) -> list[str]:
    """``commscope COMMAND --store ... --token ...`` with both read from ``watch.json``
    in the working folder, as docs/hosts.md shows it (``jq``; Python's json without it)."""
    def field_of(key: str) -> str:
        if shutil.which("jq"):
            return f'"$(jq -r .{key} watch.json)"'
        return (f'"$({sys.executable} -c \'import json; '
                f'print(json.load(open("watch.json"))["{key}"])\')"')

    extra = "--once --json" if command == "watch" else ""
    return ["sh", "-c", f"{sys.executable} -m commscope {command} {extra} "
            f"--store {field_of('store')} --token={field_of('token')}"]


@dataclass
class Hung:
    """The hung 2 x 2 job's answers, typed everywhere, and its dumps copied out."""

    endpoint: str
    watch_files: dict[str, dict]
    watch_file_modes: dict[str, int]
    watch: dict[str, Ran]
    dump: dict[str, Ran]
    analyze_on_hostA: Ran
    per_host: Path
    merged: Path
    archive: Path
    seconds: dict[str, float]


def _dumps_complete(job: MultiHostJob, per_host: int) -> bool:
    return all(len(job.dumps(h)) == per_host for h in job.hosts)


@pytest.fixture(scope="module")
def hung(cluster, tmp_path_factory):
    root = tmp_path_factory.mktemp("hung")
    hostA, hostB, hostC = cluster["hostA"], cluster["hostB"], cluster["hostC"]
    start = time.monotonic()
    job = start_job(cluster, "hosts_job.py", nproc=2, hosts=["hostA", "hostB"], env=JOB_ENV,
                    timeout_s=150)
    seconds = {}
    try:
        job.wait_for(lambda: all(h.exists(f"{TRACES}/watch.json") for h in job.hosts), 60,
                     "a watch file on each host of the job")
        seconds["start"] = time.monotonic() - start
        files = {h.name: json.loads(h.read_text(f"{TRACES}/watch.json")) for h in job.hosts}
        modes = {h.name: stat.S_IMODE(h.path(f"{TRACES}/watch.json").stat().st_mode)
                 for h in job.hosts}
        hostB.write_text("/tmp/job/stall", "now")
        job.wait_for(lambda: _dumps_complete(job, 2), 60, "2 dumps on each host")
        seconds["hang"] = time.monotonic() - start - seconds["start"]
        # the incident's files, copied out before anyone asks for more dumps
        per_host = job.collect(root / "per_host")
        merged = job.collect(root / "merged", merged=True)
        hostA.run(["tar", "czf", "/tmp/hostA.tar.gz", "-C", "/tmp/job", "commscope_traces"],
                  check=True)
        archive = root / "hostA.tar.gz"
        shutil.copyfile(hostA.path("/tmp/hostA.tar.gz"), archive)
        # a login node with no ranks: a copy of a watch file (scp) gives store and token
        hostC.write_text("/tmp/job/watch.json", hostA.read_text(f"{TRACES}/watch.json"))
        begin = time.monotonic()
        running = {}
        for host in (hostA, hostB):
            running[f"watch {host.name}"] = _start(
                host, [sys.executable, "-m", "commscope", "watch", "--once", "--json"], root,
                f"watch-{host.name}")
            running[f"dump {host.name}"] = _start(
                host, [sys.executable, "-m", "commscope", "dump", "--wait-s", "60"], root,
                f"dump-{host.name}")
        running["watch hostC"] = _start(hostC, _from_watch_file("watch"), root, "watch-hostC")
        running["dump hostC"] = _start(hostC, _from_watch_file("dump"), root, "dump-hostC")
        running["analyze"] = _start(
            hostA, [sys.executable, "-m", "commscope", "analyze", TRACES, "--json"], root,
            "analyze-hostA")
        ran = {key: _finish(r, 90) for key, r in running.items()}
        seconds["commands"] = time.monotonic() - begin
    finally:
        job.stop()
    seconds["job"] = time.monotonic() - start
    yield Hung(job.endpoint, files, modes,
               {k.split()[1]: v for k, v in ran.items() if k.startswith("watch")},
               {k.split()[1]: v for k, v in ran.items() if k.startswith("dump")},
               ran["analyze"], per_host, merged, archive, seconds)


def _analyze(inputs: list[Path], capsys) -> dict:
    code = main(["analyze", *map(str, inputs), "--json"])
    result = json.loads(capsys.readouterr().out)
    assert code == for_verdict(result["verdict"])  # the exit status says the verdict
    return result


def _gist(result: dict) -> dict:
    """What must be the same however the dumps were brought together."""
    return {
        "verdict": result["verdict"],
        "findings": [(f["kind"], f["culprit_ranks"], f["waiting_ranks"], f["message"])
                     for f in result["findings"]],
        "loaded": result["ranks"]["loaded"],
        "missing": result["ranks"]["missing"],
        "hosts": result["hosts"],
        "exclude_hosts": result["exclude_hosts"],
    }


# ---------------------------------------------------------------- the hung 2 x 2 job


def test_every_hosts_watch_file_gives_a_store_a_host_without_ranks_reaches(hung, cluster):
    # docs/hosts.md: "give the store's address and the token, both in any host's watch
    # file": the address is the workers' store on rank 0's host, by a name another
    # machine resolves (not a loopback), the same in every host's file. Under c10d
    # rendezvous torchrun serves it on a port of its own choosing, not the endpoint's
    # (torch 2.13, DynamicRendezvousHandler): only the watch file says which
    a, b = hung.watch_files["hostA"], hung.watch_files["hostB"]
    assert a["store"] == b["store"] and a["store"].startswith("hostA:"), (a, b)
    assert a["store"] != hung.endpoint, (a["store"], hung.endpoint)
    assert a["token"] == b["token"] and len(a["token"]) >= 16
    assert (a["host"], b["host"]) == ("hostA", "hostB")
    assert set(hung.watch_file_modes.values()) == {0o600}, hung.watch_file_modes
    resolved = cluster["hostC"].run(["getent", "hosts", a["store"].rsplit(":", 1)[0]])
    assert resolved.stdout.split()[:1] == [cluster["hostA"].address], resolved


@pytest.mark.parametrize("host", ["hostA", "hostB", "hostC"])
def test_watch_once_typed_anywhere_sees_the_whole_job_stuck_on_rank_3(hung, host):
    ran = hung.watch[host]
    assert ran.rc == 0, ran
    snap = json.loads(ran.out)
    assert snap["world_size"] == 4 and snap["missing"] == [] and snap["silent"] == [], snap
    assert [row["rank"] for row in snap["ranks"]] == [0, 1, 2, 3]
    assert snap["state"] == "stuck", snap["headline"]
    root = snap["findings"][0]
    assert (root["kind"], root["culprit_ranks"]) == ("missing_rank", [CULPRIT]), root
    assert "load_batch" in snap["headline"], snap["headline"]
    assert "Rank 3 (hostB, pid " in root["message"], root["message"]
    assert snap["store"] == hung.watch_files["hostA"]["store"]
    assert ran.seconds < 60, ran.seconds


@pytest.mark.parametrize("host", ["hostA", "hostB", "hostC"])
def test_dump_typed_anywhere_gives_the_whole_job_verdict_and_every_dumps_place(hung, host):
    ran = hung.dump[host]
    assert ran.rc == for_verdict("hang"), ran  # the live verdict's: some files are away
    out = ran.out
    assert f"{LIVE}STUCK" in out and "load_batch" in out, ran
    assert "[missing_rank] Rank 3 (hostB, pid " in out, ran
    assert "dumps (4 ranks, 2 host(s)):" in out, ran
    # the ranks had dumped for the hang: the dumps on request lie beside, in commscope_later/
    for name, ranks in (("hostA", "0, 1"), ("hostB", "2, 3")):
        assert re.search(rf"^  {name}:{TRACES}/(commscope_later/)?  ranks {ranks}$", out,
                         re.M), ran
    away = {"hostA": "2 rank(s) are on other hosts (hostB)",
            "hostB": "2 rank(s) are on other hosts (hostA)",
            "hostC": "4 rank(s) are on other hosts (hostA, hostB)"}[host]
    assert f"the files of {away}, not readable from here" in out, ran
    assert "Traceback" not in ran.err, ran
    # it never waits out its --wait-s for files on other hosts' disks
    assert ran.seconds < 45, ran


def test_one_hosts_folder_typed_on_that_host_is_partial_never_a_crash(hung):
    ran = hung.analyze_on_hostA
    assert ran.rc == for_verdict("hang"), ran
    result = json.loads(ran.out)
    assert result["ranks"]["loaded"] == [0, 1]
    kinds = [f["kind"] for f in result["findings"]]
    assert "crashed_rank" not in kinds and result["exclude_hosts"] == [], kinds
    assert result["verdict"] == "hang", (result["verdict"], kinds)
    elsewhere = [f for f in result["findings"] if f["kind"] == "dumps_elsewhere"]
    assert len(elsewhere) == 1, result["findings"]
    message = elsewhere[0]["message"]
    assert "Ranks 2, 3 ran on hostB" in message and f"hostB:{TRACES}/" in message, message
    rows = {row["host"]: row for row in result["hosts"]}
    assert rows["hostA"]["dumps_here"] == [0, 1] and rows["hostB"]["dumps_here"] == [], rows


def test_both_folders_as_two_arguments_give_the_merged_folders_verdict(hung, capsys):
    merged = _analyze([hung.merged], capsys)
    assert merged["verdict"] == "hang" and merged["ranks"]["loaded"] == [0, 1, 2, 3]
    root = merged["findings"][0]
    assert (root["kind"], root["culprit_ranks"]) == ("missing_rank", [CULPRIT]), root
    assert "dumps_elsewhere" not in [f["kind"] for f in merged["findings"]]
    two = _analyze([hung.per_host / "hostA", hung.per_host / "hostB"], capsys)
    assert _gist(two) == _gist(merged)


def test_an_archive_of_one_host_and_the_other_folder_give_the_merged_verdict(hung, capsys):
    merged = _analyze([hung.merged], capsys)
    mixed = _analyze([hung.archive, hung.per_host / "hostB"], capsys)
    assert _gist(mixed) == _gist(merged)


# ---------------------------------------------------------------- uneven hosts


@dataclass
class Uneven:
    """The uneven job's pictures (by rank), logs and merged dumps."""

    pictures: dict[int, str]
    logs: dict[str, str]
    merged: Path
    seconds: float


@pytest.fixture(scope="module")
def uneven(cluster, hung, tmp_path_factory):  # after the hung job: one job at a time
    root = tmp_path_factory.mktemp("uneven")
    hostA, hostB = cluster["hostA"], cluster["hostB"]
    for host in (hostA, hostB):  # the hosts outlive each job: start from a clean folder
        host.run(["sh", "-c", "rm -rf /tmp/job/* /tmp/job/.[!.]*"], check=True)
    start = time.monotonic()
    job = start_job(cluster, "mesh_hosts_job.py", nproc=[1, 3], hosts=["hostA", "hostB"],
                    env=JOB_ENV, timeout_s=150)
    try:
        where = {0: hostA, 1: hostB, 2: hostB, 3: hostB}
        job.wait_for(lambda: all(h.exists(f"/tmp/job/mesh.{r}.txt") for r, h in where.items()),
                     60, "every rank's mesh picture")
        pictures = {r: h.read_text(f"/tmp/job/mesh.{r}.txt") for r, h in where.items()}
        hostB.write_text("/tmp/job/stall", "now")
        job.wait_for(lambda: len(job.dumps(hostA)) == 1 and len(job.dumps(hostB)) == 3, 60,
                     "1 dump on hostA, 3 on hostB")
        merged = job.collect(root / "merged", merged=True)
        logs = {h.name: job.log(h) for h in job.hosts}
    finally:
        job.stop()
    yield Uneven(pictures, logs, merged, time.monotonic() - start)


def test_uneven_hosts_every_rank_draws_the_real_hosts(uneven):
    for rank, picture in uneven.pictures.items():
        assert "DeviceMesh(dp=2, tp=2, device='cpu'): 4 ranks, 2 hosts (hostA: 1" in picture
        assert ", hostB: 3)" in picture, picture
        assert re.search(r"dp=0 +\[?0 hostA\]? +\[?1 hostB\]?\n", picture), picture
        assert re.search(r"dp=1 +\[?2 hostB\]? +\[?3 hostB\]?\n", picture), picture
        assert "tp  2 ranks per group, 2 groups: crosses hosts (1 of 2 groups spans 2 hosts)" \
            in picture
        host = "hostA" if rank == 0 else "hostB"
        assert f"rank {rank}: " in picture and f"host {host}; groups:" in picture, picture
    # the same picture on every rank but for the rank marked and its own line
    strip = {re.sub(r"[\[\] ]+", " ", p.rsplit("\nrank ", 1)[0]).replace(" \n", "\n")
             for p in uneven.pictures.values()}
    assert len(strip) == 1, strip


def test_uneven_hosts_the_topology_warning_comes_once_from_rank_0s_host(uneven):
    warning = "commscope mesh: mesh axis 'tp' (2 ranks) crosses hosts"
    assert uneven.logs["hostA"].count(warning) == 1, uneven.logs["hostA"]
    assert warning not in uneven.logs["hostB"], uneven.logs["hostB"]
    line = next(x for x in uneven.logs["hostA"].splitlines() if warning in x)
    assert "group [0, 1] joins hostA (rank 0) and hostB (rank 1)" in line, line
    assert "launch the same number of ranks on every host" in line, line


def test_uneven_hosts_every_dump_carries_the_real_host_table(uneven):
    for rank in range(4):
        with open(uneven.merged / f"rank_{rank}", "rb") as f:
            dump = pickle.load(f)
        host = "hostA" if rank == 0 else "hostB"
        place = dump["commscope_place"]
        assert (place["host"], place["node_rank"], place["local_rank"]) == (
            host, 0 if rank == 0 else 1, 0 if rank == 0 else rank - 1), place
        table = decode_table(dump["commscope_hosts"])
        assert table is not None and sorted(table) == [0, 1, 2, 3], dump["commscope_hosts"]
        assert [table[r][0] for r in range(4)] == ["hostA", "hostB", "hostB", "hostB"]
        assert table[rank][2] == place["pid"]
        assert dump["commscope_hosts"]["runs"] == [[0, 0, 0], [1, 3, 1]]


def test_uneven_hosts_the_verdict_and_host_table_are_right(uneven, capsys):
    result = _analyze([uneven.merged], capsys)
    assert result["verdict"] == "hang" and result["ranks"]["loaded"] == [0, 1, 2, 3]
    root = result["findings"][0]
    assert (root["kind"], root["culprit_ranks"]) == ("missing_rank", [CULPRIT]), root
    assert root["waiting_ranks"] == [0, 1, 2] and "load_batch" in root["message"]
    assert "Rank 3 (hostB, pid " in root["message"], root["message"]
    rows = [(row["host"], row["ranks"], row["dumps_here"], row["culprit_ranks"])
            for row in result["hosts"]]
    assert rows == [("hostA", [0], [0], []), ("hostB", [1, 2, 3], [1, 2, 3], [3])], rows
    assert result["exclude_hosts"] == []  # alive and stalled: not the machine's fault
    assert main(["analyze", str(uneven.merged)]) == for_verdict("hang")
    text = capsys.readouterr().out
    table = text.split("\nhosts:\n", 1)[1]
    assert re.search(r"^  hostA +0 +1/1 +/tmp/job/commscope_traces *$", table, re.M), text
    assert re.search(r"^  hostB +1-3 +3/3 +/tmp/job/commscope_traces +culprit: 3$", table,
                     re.M), text


def test_no_job_leaves_a_process_behind(cluster, hung, uneven):
    # MultiHostJob.stop() returns once its processes are SIGKILLed, not once the kernel
    # has torn them down (a rank with a dozen threads takes a moment): give it that
    for host in cluster:
        wait_until(lambda h=host: h.pids() == [h.pid], 10, f"{host.name} back to its "
                   f"process 1 alone", story=lambda h=host: h.run(["ps", "-ef"]).stdout)
    took = ", ".join(f"{k} {v:.1f} s" for k, v in hung.seconds.items())
    print(f"hung 2x2 job: {took}; uneven job: {uneven.seconds:.1f} s")
