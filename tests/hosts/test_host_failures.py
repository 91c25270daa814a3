"""Hosts dying and freezing (issue 31, item 10), on simulated hosts with real gloo jobs.

One cluster of four hosts for the module, one job per case, in this order:

- **hostB frozen** (every process SIGSTOPped, thawed before the job stops), 2 hosts x 2
  ranks: a watcher attached on hostA names hostB silent, as a host, within the silent
  threshold; `commscope watch` typed on hostA says it in its headline and findings;
  `commscope dump` typed on hostA stops waiting for hostB's ranks (they cannot answer),
  says so by host, gives the live verdict and lists hostA's dumps; after the recorder's
  timeout, hostA's dumps name hostB's ranks as the missing culprits.
- **hostB killed** (its whole PID namespace), 2 hosts x 2 ranks, the survivors staying
  alive after their all_reduce fails (``SURVIVE=1``, as a rank blocked until an NCCL
  timeout would): the watcher names hostB gone, `commscope dump` does not wait for it,
  and `commscope analyze` of hostA's folder calls hostB's ranks crashed, as a host, with
  hostB in ``exclude_hosts``.
- **hostA killed**, the host that serves the job's store, 3 hosts x 1 rank: a live
  `commscope watch` on hostC ends with one sentence naming hostA, and `watch`/`dump`
  typed on hostC after that answer in one sentence, exit 1, within seconds; the
  survivors' dumps (torchrun stops them: their all_reduce failed) tell hostA's rank as
  gone, with hostA to leave out.

The times measured are printed (``-s``).
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from commscope.cli import main
from commscope.exitcodes import for_verdict
from commscope.watch.address import Address
from commscope.watch.command import SnapshotMaker
from commscope.watch.live import Thresholds
from commscope.watch.source import StoreSource
from tests.hosts.cluster import Cluster, Host, wait_until
from tests.hosts.job import TRACES, MultiHostJob, start_job

pytestmark = [pytest.mark.dist, pytest.mark.slow, pytest.mark.timeout(300)]

INTERVAL_S = 0.5
SILENT_S = Thresholds(INTERVAL_S).silent  # 5 s: three intervals, at least 5 s
ENV = {"COMMSCOPE_WATCH_INTERVAL_S": str(INTERVAL_S),
       "COMMSCOPE_FR_TIMEOUT_S": "8"}  # past a slow start on two busy cores
SLACK_S = 3.0
"""What two busy cores add to a bound (a refresh's analysis, a publish that comes late)."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with Cluster(4, tmp_path_factory.mktemp("failures") / "hosts") as c:
        yield c


@dataclass
class Ran:
    """One command typed on a host: exit status, output, and how long it took (all of
    it, and from its first line on, which leaves out Python's and torch's start)."""

    rc: int
    out: str
    err: str
    took_s: float
    after_first_line_s: float | None


def _run(host: Host, *argv: str, timeout: float = 120) -> Ran:
    """``commscope ARGV`` typed on ``host``."""
    start = time.monotonic()
    proc = host.popen([sys.executable, "-m", "commscope", *argv], stdout=subprocess.PIPE,
                      stderr=subprocess.PIPE, text=True)
    killer = threading.Timer(timeout, host.end, [proc])
    killer.start()
    first = None
    lines = []
    try:
        assert proc.stdout is not None and proc.stderr is not None
        for line in proc.stdout:
            first = first or time.monotonic()
            lines.append(line)
        err = proc.stderr.read()
        proc.wait()
    finally:
        killer.cancel()
    end = time.monotonic()
    return Ran(proc.returncode, "".join(lines), err, end - start,
               end - first if first else None)


def _attach(cluster: Cluster, host: Host) -> SnapshotMaker:
    """A watcher attached from outside (the store's host by its address) to the job whose
    watch file is on ``host``, as `commscope watch` keeps one."""
    info = json.loads(host.read_text(f"{TRACES}/watch.json"))
    name, port = info["store"].rsplit(":", 1)
    source = StoreSource(Address(cluster[name].address, int(port), info["token"]))
    source.connect()
    return SnapshotMaker(source)


def _start(cluster: Cluster, hosts: list[str], nproc: int, **env: str) -> MultiHostJob:
    for name in hosts:  # the hosts outlive each job: start from a clean folder
        cluster[name].run(["rm", "-rf", TRACES], check=True)
    return start_job(cluster, "hosts_job.py", nproc=nproc, hosts=hosts, timeout_s=200,
                     env={**ENV, **env})


def _stepping(job: MultiHostJob, make: SnapshotMaker, world: int) -> dict:
    """Wait until the job's host table is gathered and every rank publishes and has
    marked a few steps (a start on two busy cores can stall a second or two, which the
    live view rightly calls stuck)."""

    def ready() -> dict | None:
        snap = make()
        rows = snap["ranks"]
        moving = len(rows) == world and all((r["step"] or 0) >= 2 for r in rows)
        return snap if moving and snap["state"] in ("healthy", "behind") else None

    def gathered() -> bool:  # the job's host table, which every later dump carries
        keys = make.source._store.list_keys()  # torch 2.13's client lists every key
        return any(str(k).endswith("commscope/hosts") for k in keys)

    job.wait_for(gathered, 90, "the job's host table")
    return job.wait_for(ready, 90, f"{world} ranks stepping")  # type: ignore[return-value]


def _lost(make: SnapshotMaker, host: str, how: str) -> dict | None:
    snap = make()
    names = [(h["host"], h["how"]) for h in snap.get("lost_hosts", [])]
    return snap if (host, how) in names else None


def _reasons(host: Host) -> dict[str, str]:
    out = {}
    for path in sorted(host.path(TRACES).glob("rank_*")):
        try:
            with open(path, "rb") as f:
                out[path.name] = pickle.load(f)["dump_reason"]  # our own test dump
        except (OSError, EOFError, pickle.UnpicklingError):
            continue
    return out


def _say(capsys, text: str) -> None:
    """A measured time, shown with ``-s`` (outside what the test captures)."""
    with capsys.disabled():
        print(f"\n{text}", end="")


def _analyze(capsys, *folders: Path) -> dict:
    code = main(["analyze", *map(str, folders), "--json"])
    result = json.loads(capsys.readouterr().out)
    assert code == for_verdict(result["verdict"])  # the exit status says the verdict
    return result


def _one_sentence(ran: Ran, command: str) -> str:
    lines = ran.err.strip().splitlines()
    # watch: 1; dump: the verdict table's 7, no dump could be read
    assert ran.rc == (1 if command == "watch" else 7) and len(lines) == 1, ran
    assert lines[0].startswith(f"commscope {command}: ") and "Traceback" not in ran.err
    return lines[0]


def test_a_frozen_host_is_named_silent_and_dump_does_not_wait_for_it(cluster, tmp_path,
                                                                      capsys):
    hostA, hostB = cluster["hostA"], cluster["hostB"]
    job = _start(cluster, ["hostA", "hostB"], 2)
    try:
        job.wait_for(lambda: hostA.exists(f"{TRACES}/watch.json"), 90, "hostA's watch file")
        make = _attach(cluster, hostA)
        _stepping(job, make, 4)
        hostB.freeze()
        frozen = time.monotonic()
        snap = job.wait_for(lambda: _lost(make, "hostB", "silent"), 60, "hostB silent")
        seen_s = time.monotonic() - frozen
        _say(capsys, f"frozen host: the attached watcher named hostB silent {seen_s:.1f} s after "
              f"the freeze (silent threshold {SILENT_S:g} s)")
        _say(capsys, f"  {snap['headline']}")
        assert seen_s <= SILENT_S + INTERVAL_S + SLACK_S, seen_s
        assert snap["state"] == "stuck", snap["headline"]
        assert "] hostB: ranks 2-3 silent since " in snap["headline"], snap["headline"]
        assert "ranks 0, 1 wait in all_reduce #" in snap["headline"], snap["headline"]

        # typed on hostA: one snapshot, the host named once in headline and findings
        watched = _run(hostA, "watch", "--once", "--json")
        assert watched.rc == 0, watched
        typed = json.loads(watched.out)
        root = typed["findings"][0]
        assert (root["kind"], root["culprit_ranks"]) == ("crashed_rank", [2, 3]), root
        assert root["message"].startswith("hostB: ranks 2-3 silent since "), root["message"]
        assert "frozen, or gone" in root["message"] and "Ranks 2, 3" not in root["message"]
        assert typed["lost_hosts"][0]["ranks"] == [2, 3]
        assert typed["exclude_hosts"] == ["hostB"]  # the host a restart leaves out

        # commscope dump: hostB's ranks cannot answer; it says so instead of waiting
        dumped = _run(hostA, "dump", "--wait-s", "60")
        _say(capsys, f"frozen host: `commscope dump` on hostA took {dumped.took_s:.1f} s, "
              f"{dumped.after_first_line_s:.1f} s of it after asking")
        assert dumped.rc not in (1, 2, 7) and "Traceback" not in dumped.err, dumped  # a verdict
        out = dumped.out
        _say(capsys, "  " + "\n  ".join(out.splitlines()[:5]))
        assert "hostB: ranks 2-3 did not answer: no record since " in out, out
        assert "frozen, or gone with their host); no dump of theirs" in out, out
        assert "live verdict (every rank's record, all hosts): STUCK: " in out, out
        assert "hostB: ranks 2-3 silent since" in out, out
        assert "  hostA:/tmp/job/commscope_traces/" in out and "ranks 0, 1" in out, out
        assert dumped.after_first_line_s is not None
        assert dumped.after_first_line_s <= SILENT_S + SLACK_S, dumped.after_first_line_s

        # the recorder's timeout on hostA: its dumps name hostB's ranks as the culprits
        job.wait_for(lambda: set(_reasons(hostA).values()) == {"timeout"}, 60,
                     "hostA's timeout dumps")
        assert hostB.pids() and not job.dumps(hostB)  # frozen: nothing written there
        folder = hostA.copy_out(TRACES, tmp_path / "hostA")
    finally:
        hostB.thaw()
        job.stop()
    result = _analyze(capsys, folder)
    root = result["findings"][0]
    _say(capsys, f"  analyze hostA's folder: [{root['kind']}] {root['message']}")
    assert result["verdict"] == "hang", result["findings"]
    assert (root["kind"], root["culprit_ranks"], root["waiting_ranks"]) == (
        "dumps_elsewhere", [2, 3], [0, 1]), root
    assert root["message"].startswith("Ranks 2, 3 ran on hostB, and no dump of hostB is here")
    assert "if hostB holds none, ranks 2, 3 froze or died" in root["message"]
    assert result["exclude_hosts"] == []  # nothing here says a process died
    hosts = {h["host"]: h for h in result["hosts"]}
    assert hosts["hostB"]["culprit_ranks"] == [2, 3] and hosts["hostA"]["culprit_ranks"] == []


def test_a_killed_host_is_named_gone_and_its_ranks_crashed(cluster, tmp_path, capsys):
    hostA, hostB = cluster["hostA"], cluster["hostB"]
    job = _start(cluster, ["hostA", "hostB"], 2, SURVIVE="1")
    try:
        job.wait_for(lambda: hostA.exists(f"{TRACES}/watch.json"), 90, "hostA's watch file")
        make = _attach(cluster, hostA)
        _stepping(job, make, 4)
        hostB.kill()
        killed = time.monotonic()
        # hostB's launcher died with it: wait_until, which does not stop on that
        snap = wait_until(lambda: _lost(make, "hostB", "gone"), 60, "hostB gone")
        seen_s = time.monotonic() - killed
        _say(capsys, f"killed host: the attached watcher named hostB gone {seen_s:.1f} s after the "
              "kill")
        _say(capsys, f"  {snap['headline']}")
        assert seen_s <= SILENT_S + INTERVAL_S + SLACK_S, seen_s
        assert "] hostB: ranks 2-3 gone since " in snap["headline"], snap["headline"]
        # the survivors' collective fails when gloo sees the dead connection, and their
        # next record says so: at most an interval or two after hostB was named gone
        snap = wait_until(lambda: (lambda s: s if "ranks 0, 1 failed in all_reduce #"
                                   in s["headline"] else None)(make()),
                          2 * INTERVAL_S + SLACK_S, "the survivors' failed all_reduce",
                          story=lambda: make()["headline"])
        root = snap["findings"][0]
        assert (root["kind"], root["culprit_ranks"]) == ("crashed_rank", [2, 3]), root
        assert root["message"].startswith("hostB: ranks 2-3 gone since "), root["message"]
        # the survivors' work failed on the dead host, and each dumped on it
        wait_until(lambda: set(_reasons(hostA).values()) == {"collective error"}, 60,
                   "the survivors' dumps")

        dumped = _run(hostA, "dump", "--wait-s", "60")
        _say(capsys, f"killed host: `commscope dump` on hostA took {dumped.took_s:.1f} s, "
              f"{dumped.after_first_line_s:.1f} s of it after asking")
        assert dumped.rc not in (1, 2, 7) and "Traceback" not in dumped.err, dumped  # a verdict
        out = dumped.out
        assert "hostB: ranks 2-3 did not answer: no record since " in out, out
        assert "live verdict (every rank's record, all hosts): STUCK: " in out, out
        assert "verdict: CRASH" in out and "[crashed_rank] hostB: ranks 2-3 gone at" in out, out
        assert dumped.after_first_line_s is not None
        assert dumped.after_first_line_s <= SILENT_S + SLACK_S, dumped.after_first_line_s
        folder = hostA.copy_out(TRACES, tmp_path / "hostA")
    finally:
        job.stop()
    result = _analyze(capsys, folder)
    assert result["verdict"] == "crash", result["findings"]
    root = result["findings"][0]
    _say(capsys, f"  analyze hostA's folder: [{root['kind']}] {root['message']}")
    assert (root["kind"], root["culprit_ranks"]) == ("crashed_rank", [2, 3]), root
    assert root["message"].startswith("hostB: ranks 2-3 gone at "), root["message"]
    assert "no dump" in root["message"] and "failed in it" in root["message"]
    assert "dumps_elsewhere" not in [f["kind"] for f in result["findings"]]
    assert result["exclude_hosts"] == ["hostB"]


def test_the_store_host_killed_is_one_sentence_at_once(cluster, tmp_path, capsys):
    hostA, hostC, hostD = cluster["hostA"], cluster["hostC"], cluster["hostD"]
    job = _start(cluster, ["hostA", "hostC", "hostD"], 1)
    try:
        job.wait_for(lambda: all(h.exists(f"{TRACES}/watch.json") for h in (hostA, hostC)),
                     90, "the watch files")
        _stepping(job, _attach(cluster, hostC), 3)
        live = hostC.popen([sys.executable, "-m", "commscope", "watch"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        time.sleep(2 * SILENT_S)  # attached and drawing (torch's import is slow here)
        assert live.poll() is None, live.communicate()
        hostA.kill()
        killed = time.monotonic()
        _, err = live.communicate(timeout=60)
        ended_s = time.monotonic() - killed
        _say(capsys, f"store host killed: the live watch on hostC ended {ended_s:.1f} s after")
        lines = err.strip().splitlines()
        _say(capsys, f"  {err.strip()}")
        assert live.returncode == 1 and len(lines) == 1, err
        assert "stopped answering" in lines[0] and "hostA" in lines[0], lines[0]
        assert ended_s <= 5 + SLACK_S, ended_s  # the store client's timeout
        for command in ("watch", "dump"):
            ran = _run(hostC, command)
            _say(capsys, f"store host killed: `commscope {command}` on hostC: {ran.took_s:.2f} s")
            line = _one_sentence(ran, command)
            assert "has ended: nothing listens there any more" in line, line
            assert ran.took_s <= 5, ran.took_s  # no torch import: one refused connect
        wait_until(lambda: job.dumps(hostC) and job.dumps(hostD), 60, "the survivors' dumps")
        folders = [job.cluster[h].copy_out(TRACES, tmp_path / h) for h in ("hostC", "hostD")]
    finally:
        job.stop()
    result = _analyze(capsys, *folders)
    assert result["verdict"] == "crash", result["findings"]
    root = result["findings"][0]
    _say(capsys, f"  analyze hostC's and hostD's folders: [{root['kind']}] {root['message']}")
    assert (root["kind"], root["culprit_ranks"]) == ("crashed_rank", [0]), root
    assert root["message"].startswith("hostA: rank 0 gone at "), root["message"]
    assert result["exclude_hosts"] == ["hostA"]
    # hostC's folder alone misses hostA's and hostD's dumps: its failed work does not
    # say which host died, so neither is called crashed
    alone = _analyze(capsys, folders[0])
    kinds = {f["kind"]: f for f in alone["findings"]}
    assert "crashed_rank" not in kinds and alone["exclude_hosts"] == [], alone["findings"]
    elsewhere = [f["message"] for f in alone["findings"] if f["kind"] == "dumps_elsewhere"]
    # ("may have died" is added only when hostC's dump caught its work failing, which
    # depends on whether it dumped before or after the kill: not asserted)
    assert len(elsewhere) == 2 and all("no dump of" in m for m in elsewhere), elsewhere
