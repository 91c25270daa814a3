"""Process 1 of one simulated host (run by ``tests/hosts/cluster.py``, never imported).

``python hostinit.py NAME HOSTS_FILE`` runs as the first process of fresh UTS, mount and
PID namespaces (``unshare --uts --mount --pid --fork --mount-proc``). It makes the host:
its hostname, ``HOSTS_FILE`` bound over ``/etc/hosts``, a private tmpfs on ``/tmp`` with
``/tmp/job`` in it. Then it prints ``ready`` and reaps every orphan of the namespace until
its stdin closes: the harness holds the other end, so the host ends (and the kernel kills
every process in its PID namespace) when the harness closes it or dies itself.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys


def _reap(signum: int, frame: object) -> None:
    """Collect every child that ended (orphans of the namespace are reparented here)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def main(name: str, hosts_file: str, *keep: str) -> int:
    signal.signal(signal.SIGCHLD, _reap)
    socket.sethostname(name)
    # the bind first: HOSTS_FILE lies under the outer /tmp, hidden once the tmpfs is on
    subprocess.run(["mount", "--bind", hosts_file, "/etc/hosts"], check=True)
    # folders under the outer /tmp the host must still see (the project and its venv,
    # when a clone lies there, as CI's may): bound aside on a scratch tmpfs over /mnt,
    # bound back over the new /tmp, and /mnt given back (all inside this namespace)
    kept = [p for p in keep if os.path.realpath(p).startswith("/tmp/")]
    if kept:
        subprocess.run(["mount", "-t", "tmpfs", "tmpfs", "/mnt"], check=True)
        for i, path in enumerate(kept):
            os.mkdir(f"/mnt/keep{i}")
            subprocess.run(["mount", "--bind", path, f"/mnt/keep{i}"], check=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=1777,size=512m", "tmpfs", "/tmp"],
                   check=True)
    for i, path in enumerate(kept):
        os.makedirs(path, exist_ok=True)
        subprocess.run(["mount", "--bind", f"/mnt/keep{i}", path], check=True)
    if kept:
        subprocess.run(["umount", "-l", "/mnt"], check=True)
    os.mkdir("/tmp/job")
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    sys.stdin.buffer.read()  # until the harness lets go; the SIGCHLD handler runs meanwhile
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
