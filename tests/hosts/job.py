"""One ``commscope run`` job across simulated hosts: one launcher per host, c10d rendezvous.

Each host runs ``python -m commscope run --nnodes N --nproc-per-node K_i --rdzv-backend c10d
--rdzv-endpoint hostA:PORT --rdzv-id JOB --rdzv-conf is_host=0|1 --local-addr NAME SCRIPT``
in its ``/tmp/job``, so its dumps (``commscope_traces/``) lie on its own disk only. What
torch 2.13 needs on hosts that share one network namespace:

- ``is_host``: the c10d backend guesses whether it serves the store by matching the
  endpoint against the machine; a loopback address matches on every host, so the harness
  says it: host A serves (``is_host=1``), the others connect (the endpoint is spelled
  ``hostA``, which alone would also be guessed right).
- ``--local-addr``: the rendezvous numbers the nodes by sorting this address (c10d ignores
  ``--node-rank``, and warns when it is given), and rank 0's node serves the workers' store
  at it; naming each host makes host A rank 0's node and the ranks follow the host order.
- gloo listens on the address its hostname resolves to (the host's ``/etc/hosts``): host
  ``i`` on ``127.0.1.<i+1>``. Connections leave from ``127.0.0.1`` (the kernel's choice on
  the shared loopback), whichever host opens them.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from tests.hosts.cluster import JOB_DIR, Cluster, Host, wait_until
from tests.jobs.launch import REPO, descendants

__all__ = ["TRACES", "MultiHostJob", "free_port", "start_job"]

TRACES = f"{JOB_DIR}/commscope_traces"


def free_port() -> int:
    """A TCP port free on every address right now (the kernel's pick, never a fixed one)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class MultiHostJob:
    """A job started by ``start_job``: one ``commscope run`` per host.

    Ended by ``stop()``, by its timeout (every process of the job killed, later waits
    raise), or with its cluster.
    """

    def __init__(self, cluster: Cluster, launchers: dict[str, subprocess.Popen],
                 endpoint: str, timeout_s: float) -> None:
        self.cluster = cluster
        self.launchers = launchers
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.expired = False
        self._stopping = threading.Lock()
        self._timer = threading.Timer(timeout_s, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def _expire(self) -> None:
        self.expired = True
        self.stop()

    @property
    def hosts(self) -> list[Host]:
        """The hosts the job runs on, in host order."""
        return [self.cluster[name] for name in self.launchers]

    def log(self, host: Host | str) -> str:
        """The end of ``commscope run``'s output on ``host`` (torchrun's and the ranks')."""
        path = self.cluster.root / f"{self.cluster[_name(host)].name}.job.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def story(self) -> str:
        """Every host's log end, for a failure message."""
        return "\n".join(f"--- {h.name} ---\n{self.log(h)}" for h in self.hosts)

    def dumps(self, host: Host | str) -> list[str]:
        """The rank dump files now in ``host``'s ``commscope_traces/`` (names, sorted)."""
        folder = self.cluster[_name(host)].path(TRACES)
        if not folder.is_dir():
            return []
        return sorted(p.name for p in folder.glob("rank_*") if not p.name.endswith(".tmp"))

    def wait_for(self, condition: Callable[[], object], timeout: float, what: str) -> object:
        """Poll ``condition`` until it is true; ``TimeoutError`` with every host's log
        after ``timeout`` s, at once when the job expired or a launcher ended."""

        def check() -> object:
            value = condition()
            if value:
                return value
            if self.expired:
                self.stop()  # returns once the timer's own stop has ended every process
                raise TimeoutError(f"the job passed its {self.timeout_s:.0f} s: {what}\n"
                                   f"{self.story()}")
            ended = {n: p.returncode for n, p in self.launchers.items() if p.poll() is not None}
            if ended:
                raise RuntimeError(f"commscope run ended on {ended} while waiting for "
                                   f"{what}\n{self.story()}")
            return None

        return wait_until(check, timeout, what, interval=0.1, story=self.story)

    def collect(self, dest: Path, merged: bool = False) -> Path:
        """Copy every host's ``commscope_traces/`` out: to ``dest/<host>/``, or with
        ``merged`` all into ``dest`` itself (what a user gets with scp). Returns ``dest``."""
        dest.mkdir(parents=True, exist_ok=True)
        for host in self.hosts:
            if host.exists(TRACES):
                host.copy_out(TRACES, dest if merged else dest / host.name)
        return dest

    def stop(self) -> None:
        """Kill every launcher and every process under it, all hosts at once (so no rank
        outlives a peer and fails on it); the hosts stay up."""
        self._timer.cancel()
        with self._stopping:  # the timer's thread and the test's may both get here
            doomed = [p for proc in self.launchers.values() if proc.poll() is None
                      for p in (proc.pid, *descendants(proc.pid))]
            for pid in doomed:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            for name, proc in self.launchers.items():
                host = self.cluster[name]
                if proc.poll() is None and host.alive:
                    host.end(proc)  # whatever started since, and the wait
                else:
                    proc.kill()
                    proc.wait(10)


def _name(host: Host | str) -> str:
    return host if isinstance(host, str) else host.name


def start_job(cluster: Cluster, script: str, *, nproc: int | Sequence[int] = 2,
              env: Mapping[str, str] | None = None,
              host_env: Mapping[str, Mapping[str, str]] | None = None,
              prefix: Mapping[str, Sequence[str]] | None = None,
              hosts: Sequence[str] | None = None, timeout_s: float = 120,
              args: Sequence[str] = (), static: bool = False) -> MultiHostJob:
    """Start ``tests/jobs/<script>`` (or a path) on ``hosts`` (default: every host of
    ``cluster``), ``nproc`` ranks a host (or one count per host, for uneven hosts).

    ``env`` goes to every host, ``host_env[name]`` to one host on top of it, and
    ``prefix[name]`` goes before that host's command (``["faketime", "-10"]``, say).
    The job is killed after ``timeout_s`` seconds whatever happens. ``static``: torchrun's
    static rendezvous (``--master-addr``, ``--node-rank``) instead of c10d's, whose
    heartbeats are wall-clock times: a host whose clock is more than about 15 s behind
    looks dead to it and is left out of the job.
    """
    names = list(hosts or [h.name for h in cluster])
    counts = [nproc] * len(names) if isinstance(nproc, int) else list(nproc)
    if len(counts) != len(names):
        raise ValueError(f"{len(counts)} rank counts for {len(names)} hosts: {names}")
    path = Path(script) if Path(script).is_absolute() else REPO / "tests" / "jobs" / script
    endpoint = f"{names[0]}:{free_port()}"
    run_id = f"hosts-{time.monotonic_ns()}"
    base = {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "COMMSCOPE_NO_RICH": "1",
            **(env or {})}
    launchers: dict[str, subprocess.Popen] = {}
    try:
        for i, (name, count) in enumerate(zip(names, counts)):
            if static:  # one count for every host: torchrun's static ranks assume it
                host, port = endpoint.rsplit(":", 1)
                rdzv = ["--node-rank", str(i), "--master-addr", host, "--master-port", port]
            else:
                rdzv = ["--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id",
                        run_id, "--rdzv-conf", f"is_host={int(i == 0)}", "--local-addr", name]
            cmd = [*(prefix or {}).get(name, ()), sys.executable, "-m", "commscope", "run",
                   "--nnodes", str(len(names)), "--nproc-per-node", str(count), *rdzv,
                   "--monitor-interval", "0.2", str(path), *args]
            with open(cluster.root / f"{name}.job.log", "wb") as log:  # the child keeps a copy
                launchers[name] = cluster[name].popen(
                    cmd, env={**base, **(host_env or {}).get(name, {})},
                    stdout=log, stderr=subprocess.STDOUT)
    except BaseException:
        for name, proc in launchers.items():
            cluster[name].end(proc)
        raise
    return MultiHostJob(cluster, launchers, endpoint, timeout_s)

