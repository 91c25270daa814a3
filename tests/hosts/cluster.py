"""Simulated hosts on one machine: Linux namespaces, one set per host.

Each host is a process tree under ``unshare --uts --mount --pid --fork --mount-proc``
whose first process is ``hostinit.py``: its own hostname, its own ``/tmp`` (a tmpfs,
``/tmp/job`` the working folder of its jobs), its own ``/etc/hosts`` mapping every host's
name to ``127.0.1.<i>`` (host ``i`` counted from 1), and its own PID namespace, so a host
is killed or frozen whole. The network namespace is shared: every host talks over the
machine's loopback. The test process stays outside and reaches a host through
``/proc/<its process 1>/root`` (files) and ``nsenter`` (commands).
"""

from __future__ import annotations

import functools
import os
import select
import shutil
import signal
import string
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType

from tests.jobs.launch import descendants

__all__ = ["Cluster", "Host", "namespaces_unavailable", "wait_until"]

HERE = Path(__file__).resolve().parent
INIT = HERE / "hostinit.py"
REPO = HERE.parents[1]
"""The project: kept visible inside a host even when it lies under the outer /tmp."""
JOB_DIR = "/tmp/job"
_NAMESPACES = ["--uts", "--mount", "--pid"]


def wait_until(condition: Callable[[], object], timeout: float, what: str,
               interval: float = 0.05, story: Callable[[], str] | None = None) -> object:
    """Poll ``condition`` until it returns something true (returned); ``TimeoutError``
    naming ``what`` (and ``story()``, when given) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            detail = f"\n{story()}" if story else ""
            raise TimeoutError(f"not after {timeout:.0f} s: {what}{detail}")
        time.sleep(interval)


def _state(pid: int) -> str | None:
    """The state letter of ``pid`` (``Z`` for a zombie), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _kill(pids: Sequence[int], sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


@functools.cache
def namespaces_unavailable() -> str | None:
    """Why simulated hosts cannot run here (None when they can); probed once."""
    if not sys.platform.startswith("linux"):
        return f"simulated hosts need Linux namespaces; this is {sys.platform}"
    for tool in ("unshare", "nsenter", "mount"):
        if shutil.which(tool) is None:
            return f"simulated hosts need `{tool}` (util-linux), not found on PATH"
    probe = ("hostname probe-host && mount -t tmpfs tmpfs /tmp && touch /tmp/x"
             " && test \"$(hostname)\" = probe-host")
    try:
        proc = subprocess.run(["unshare", *_NAMESPACES, "--fork", "--mount-proc", "sh", "-c",
                               probe], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"simulated hosts: `unshare` did not run ({exc})"
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        return (f"simulated hosts need UTS, mount and PID namespaces (root or CAP_SYS_ADMIN); "
                f"`unshare {' '.join(_NAMESPACES)} --fork` failed here: {why}")
    return None


class Host:
    """One simulated host: its name, its loopback address and its process 1."""

    def __init__(self, name: str, index: int, root: Path, hosts_file: Path,
                 env: Mapping[str, str]) -> None:
        self.name = name
        self.index = index
        self.address = f"127.0.1.{index + 1}"
        self.log_path = root / f"{name}.init.log"
        self._children: list[subprocess.Popen] = []
        self._env = dict(env)
        with open(self.log_path, "wb") as log:
            self._unshare = subprocess.Popen(
                ["unshare", *_NAMESPACES, "--fork", "--mount-proc", sys.executable, str(INIT),
                 name, str(hosts_file), str(REPO)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                start_new_session=True, env=self._env)
        self.pid = 0
        self.pidns = ""

    def _wait_ready(self, deadline: float) -> None:
        """Block until process 1 has made the host (or raise with its log)."""
        assert self._unshare.stdout is not None
        fd = self._unshare.stdout.fileno()
        line = b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            ready, _, _ = select.select([fd], [], [], max(left, 0))
            chunk = os.read(fd, 64) if ready else b""
            if not chunk:
                raise RuntimeError(f"host {self.name} did not start: {self.init_log()}")
            line += chunk
        children = Path(f"/proc/{self._unshare.pid}/task/{self._unshare.pid}/children")
        self.pid = int(children.read_text().split()[0])
        self.pidns = os.readlink(f"/proc/{self.pid}/ns/pid")

    def init_log(self) -> str:
        """What process 1 wrote on stderr (a failed mount, say)."""
        return self.log_path.read_text(errors="replace")[-2000:]

    # ------------------------------------------------------------------ files
    def path(self, inner: str) -> Path:
        """The outside path of ``inner``, a path as the host sees it (its /tmp included)."""
        return Path(f"/proc/{self.pid}/root") / inner.lstrip("/")

    def read_text(self, inner: str) -> str:
        """The text of ``inner`` on this host."""
        return self.path(inner).read_text()

    def exists(self, inner: str) -> bool:
        """Whether ``inner`` exists on this host."""
        return self.path(inner).exists()

    def write_text(self, inner: str, text: str) -> None:
        """Write ``inner`` on this host, whole or not at all."""
        target = self.path(inner)
        tmp = target.with_name(target.name + ".harness-tmp")
        tmp.write_text(text)
        os.replace(tmp, target)

    def copy_out(self, inner: str, dest: Path) -> Path:
        """Copy the folder ``inner`` of this host to ``dest`` (created), returned."""
        shutil.copytree(self.path(inner), dest, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns(".*.tmp"))
        return dest

    # ------------------------------------------------------------------ commands
    def command(self, argv: Sequence[str], cwd: str = JOB_DIR) -> list[str]:
        """The outside command line that runs ``argv`` on this host, in ``cwd``.

        ``nsenter`` is killed when the thread that started it ends (``setpriv
        --pdeathsig``): a stopped one left behind would keep its host from ending."""
        guard = ["setpriv", "--pdeathsig", "KILL", "--"] if shutil.which("setpriv") else []
        return [*guard, "nsenter", "-t", str(self.pid), *_NAMESPACES, "--", "env", "-C", cwd,
                *argv]

    def popen(self, argv: Sequence[str], *, cwd: str = JOB_DIR,
              env: Mapping[str, str] | None = None, **kwargs: object) -> subprocess.Popen:
        """Start ``argv`` on this host (the Popen is of ``nsenter``, which waits for it);
        ended with the host at the latest."""
        proc = subprocess.Popen(self.command(argv, cwd), env={**self._env, **(env or {})},
                                start_new_session=True, **kwargs)  # type: ignore[call-overload]
        self._children = [p for p in self._children if p.returncode is None]
        self._children.append(proc)
        return proc

    def run(self, argv: Sequence[str], *, cwd: str = JOB_DIR,
            env: Mapping[str, str] | None = None, timeout: float = 60,
            check: bool = False) -> subprocess.CompletedProcess:
        """Run ``argv`` on this host and return its result (text); on a timeout, the
        command and everything it started is killed and ``TimeoutExpired`` raised."""
        proc = self.popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.end(proc)
            raise
        result = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        if check:
            result.check_returncode()
        return result

    def end(self, proc: subprocess.Popen) -> None:
        """Kill ``proc`` (started by ``popen``) and everything under it on this host."""
        doomed = [proc.pid, *descendants(proc.pid)]
        _kill(doomed)
        proc.kill()
        proc.communicate()
        wait_until(lambda: not any(_state(p) not in (None, "Z") for p in doomed), 10,
                   f"the processes of {proc.args[-1]!r} on {self.name} to end")

    # ------------------------------------------------------------------ the host
    def pids(self) -> list[int]:
        """Outside pids of every live process of this host (zombies left out)."""
        out = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                if os.readlink(f"/proc/{entry}/ns/pid") != self.pidns:
                    continue
            except OSError:
                continue
            if _state(int(entry)) not in (None, "Z"):
                out.append(int(entry))
        return out

    @property
    def alive(self) -> bool:
        """Whether process 1 of this host still runs."""
        return self.pid != 0 and _state(self.pid) not in (None, "Z")

    def freeze(self) -> None:
        """SIGSTOP every process of this host but the harness's own process 1 (which must
        still notice the harness going away); returns once each one is stopped.

        The ``nsenter`` processes outside that started commands here are stopped first:
        ``nsenter`` mirrors its child, and on resuming sends it SIGCONT."""
        _kill([p.pid for p in self._children if p.poll() is None], signal.SIGSTOP)
        stopped: set[int] = {self.pid}
        while True:  # again until no new process appears (one may be forking)
            fresh = [p for p in self.pids() if p not in stopped]
            if not fresh:
                break
            _kill(fresh, signal.SIGSTOP)
            stopped.update(fresh)
        # a signal is delivered a moment later
        wait_until(lambda: all(_state(p) in (None, "Z", "T", "t") for p in stopped
                               if p != self.pid), 10, f"the processes of {self.name} to stop")

    def thaw(self, timeout: float = 10) -> None:
        """SIGCONT every process of this host and every ``nsenter`` that started one;
        returns once none of them has been stopped for three polls in a row (a resumed
        ``nsenter`` may still read its child's old stop and stop itself once more)."""
        quiet = 0
        deadline = time.monotonic() + timeout
        while quiet < 3 and time.monotonic() < deadline:
            outside = [p.pid for p in self._children if p.poll() is None]
            stopped = [p for p in [*self.pids(), *outside] if _state(p) in ("T", "t")]
            if not stopped and quiet == 0 and not outside:
                return  # nothing to resume, nobody to re-stop
            quiet = 0 if stopped else quiet + 1
            _kill(stopped, signal.SIGCONT)
            time.sleep(0.05)

    def kill(self, timeout: float = 20) -> None:
        """SIGKILL the whole host (its process 1 takes its PID namespace with it) and wait
        until none of its processes is left."""
        if self.pid:
            _kill([self.pid, *self.pids()])
        if self._unshare.stdin is not None and not self._unshare.stdin.closed:
            self._unshare.stdin.close()
        if self._unshare.poll() is None and not self.pid:
            self._unshare.kill()
        # The PID namespace ends once every process in it is reaped, and a command's
        # parent is its nsenter, outside: a frozen one (nsenter stops with its child) must
        # run to reap it, and may stop once more on its child's old stop: resume until
        # each one has ended, SIGKILL at the last (its orphan is then reaped slowly).
        deadline = time.monotonic() + 3
        while live := [p.pid for p in self._children if p.poll() is None]:
            if time.monotonic() > deadline:
                _kill(live)
                break
            _kill(live, signal.SIGCONT)
            time.sleep(0.02)
        for proc in [self._unshare, *self._children]:
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                _kill([proc.pid, *descendants(proc.pid)])
                proc.wait(5)
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        if self.pidns:
            wait_until(lambda: not self.pids(), timeout, f"every process of {self.name} to end")

    def __repr__(self) -> str:
        return f"Host({self.name!r}, {self.address}, pid {self.pid})"


def host_names(n: int) -> list[str]:
    """``hostA``, ``hostB``, ... for ``n`` hosts (they sort in host order)."""
    if not 1 <= n <= 26:
        raise ValueError(f"1 to 26 simulated hosts, not {n}")
    return [f"host{c}" for c in string.ascii_uppercase[:n]]


class Cluster:
    """``n`` simulated hosts, started together and always torn down together.

    ``with Cluster(4, tmp_path) as cluster:`` starts ``hostA`` ... ``hostD``; leaving the
    block (or ``close()``) thaws and kills every host and waits until no process of any
    host is left. ``root`` (outside) holds the hosts file and the logs.
    """

    def __init__(self, n: int, root: Path, start_timeout: float = 30) -> None:
        why = namespaces_unavailable()
        if why:
            raise RuntimeError(why)
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        names = host_names(n)
        hosts_file = root / "etc-hosts"
        hosts_file.write_text("127.0.0.1 localhost\n::1 localhost ip6-localhost\n" + "".join(
            f"127.0.1.{i + 1} {name}\n" for i, name in enumerate(names)))
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("COMMSCOPE_WATCH_", "TORCHELASTIC_", "PYTEST_"))
               and k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                             "TMPDIR")}
        env["OMP_NUM_THREADS"] = "1"
        self.hosts: list[Host] = []
        try:
            for i, name in enumerate(names):
                self.hosts.append(Host(name, i, root, hosts_file, env))
            deadline = time.monotonic() + start_timeout
            for host in self.hosts:
                host._wait_ready(deadline)
        except BaseException:
            self.close()
            raise

    def __getitem__(self, key: int | str) -> Host:
        if isinstance(key, int):
            return self.hosts[key]
        for host in self.hosts:
            if host.name == key:
                return host
        raise KeyError(f"no host {key!r}; hosts: {[h.name for h in self.hosts]}")

    def __iter__(self) -> Iterator[Host]:
        return iter(self.hosts)

    def __len__(self) -> int:
        return len(self.hosts)

    def close(self) -> None:
        """Thaw and kill every host; wait until none of their processes is left."""
        for host in self.hosts:
            if host.pidns:
                host.thaw()
        errors = []
        for host in self.hosts:
            try:
                host.kill()
            except Exception as exc:  # keep killing the others
                errors.append(exc)
        if errors:
            raise errors[0]

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
