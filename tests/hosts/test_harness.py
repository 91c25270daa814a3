"""The simulated hosts themselves: names, private /tmp, /etc/hosts, kill and freeze.

No torch job here: three hosts start in a fraction of a second.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.hosts.cluster import Cluster, wait_until
from tests.jobs.launch import REPO

pytestmark = [pytest.mark.dist]

RESOLVE = ("import socket, sys; print(socket.gethostname(), socket.getfqdn(), "
           "*[socket.gethostbyname(n) for n in sys.argv[1:]])")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with Cluster(3, tmp_path_factory.mktemp("hosts")) as c:
        yield c


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def test_each_host_has_its_name_and_resolves_every_host(cluster):
    names = [h.name for h in cluster]
    assert names == ["hostA", "hostB", "hostC"]
    for host in cluster:
        out = host.run([sys.executable, "-c", RESOLVE, *names], check=True, timeout=30)
        name, fqdn, *addresses = out.stdout.split()
        assert (name, fqdn) == (host.name, host.name)
        assert addresses == ["127.0.1.1", "127.0.1.2", "127.0.1.3"]
        assert host.address == addresses[host.index]
        assert host.run(["pwd"]).stdout.strip() == "/tmp/job"
    # the test process's own machine is untouched
    assert socket.gethostname() not in names
    with open("/etc/hosts") as f:
        assert "hostA" not in f.read()


def test_tmp_is_private_to_each_host(cluster):
    a, b = cluster["hostA"], cluster["hostB"]
    assert a.run(["stat", "-f", "-c", "%T", "/tmp"]).stdout.strip() == "tmpfs"
    a.run(["sh", "-c", "echo from-a > /tmp/job/mine"], check=True)
    assert a.read_text("/tmp/job/mine") == "from-a\n"
    assert not b.exists("/tmp/job/mine")
    assert b.run(["cat", "/tmp/job/mine"]).returncode != 0
    assert not os.path.exists("/tmp/job/mine")
    b.write_text("/tmp/job/mine", "written from outside\n")
    assert b.run(["cat", "/tmp/job/mine"]).stdout == "written from outside\n"
    assert a.read_text("/tmp/job/mine") == "from-a\n"
    copied = a.copy_out("/tmp/job", cluster.root / "copied")
    assert (copied / "mine").read_text() == "from-a\n"


def test_a_command_that_outlives_its_timeout_is_killed_with_its_children(cluster):
    c = cluster["hostC"]
    with pytest.raises(subprocess.TimeoutExpired):
        c.run(["sh", "-c", "sleep 300 & sleep 300; wait"], timeout=1)
    wait_until(lambda: c.pids() == [c.pid], 10, "hostC back to its process 1 alone")


def test_a_frozen_host_thaws_and_a_killed_host_leaves_nothing(cluster):
    b = cluster["hostB"]
    # a process tree with an orphan (reparented to the host's process 1) and a session
    # of its own: what torchrun's workers look like
    tree = b.popen(["sh", "-c", "setsid sleep 300 & (sleep 300 &) ; sleep 300"])
    wait_until(lambda: len(b.pids()) >= 4, 10, "the tree on hostB")
    pids = b.pids()
    assert b.pid in pids and tree.pid not in pids  # nsenter itself stays outside
    b.freeze()
    assert all(_state(p) == "T" for p in pids if p != b.pid)
    assert _state(b.pid) != "T"  # the harness's own process 1 keeps listening
    b.thaw()
    wait_until(lambda: all(_state(p) in ("S", "R") for p in pids), 10, "hostB thawed")
    b.freeze()  # a frozen host dies as well as a running one
    b.kill()
    assert not b.alive and b.pids() == []
    assert all(_state(p) in (None, "Z") for p in [*pids, tree.pid])
    assert tree.returncode is not None
    # the other hosts go on
    assert cluster["hostA"].run(["hostname"]).stdout.strip() == "hostA"


def test_leaving_the_cluster_ends_every_process_of_every_host(tmp_path):
    start = time.monotonic()
    with Cluster(2, tmp_path) as c:
        for host in c:
            host.popen(["sh", "-c", "sleep 300 & sleep 300"])
        wait_until(lambda: all(len(h.pids()) >= 3 for h in c), 10, "both trees")
        pids = [p for h in c for p in h.pids()]
        c["hostA"].freeze()
    assert all(_state(p) in (None, "Z") for p in pids)
    assert time.monotonic() - start < 20


def test_a_dead_test_process_takes_its_hosts_with_it(tmp_path):
    # the harness in a child Python, killed with SIGKILL: no finalizer runs, yet process 1
    # of each host sees its stdin close and the kernel ends each PID namespace
    code = ("import sys, time; from pathlib import Path; from tests.hosts.cluster import Cluster;"
            "c = Cluster(2, Path(sys.argv[1]));"
            "[h.popen(['sleep', '300']) for h in c];"
            "print(*[h.pid for h in c], flush=True); time.sleep(300)")
    child = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=REPO,
                             stdout=subprocess.PIPE, text=True)
    try:
        inits = [int(p) for p in child.stdout.readline().split()]
        assert len(inits) == 2, inits
        namespaces = [os.readlink(f"/proc/{p}/ns/pid") for p in inits]
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        child.stdout.close()

    def left() -> list[int]:
        out = []
        for entry in os.listdir("/proc"):
            try:
                if entry.isdigit() and os.readlink(f"/proc/{entry}/ns/pid") in namespaces \
                        and _state(int(entry)) not in (None, "Z"):
                    out.append(int(entry))
            except OSError:
                continue
        return out

    wait_until(lambda: not left(), 10, "the orphaned hosts to end")
