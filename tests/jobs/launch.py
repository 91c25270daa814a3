"""Start a real job with ``commscope run`` and stop it again, whatever happens."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Job:
    """A running ``commscope run`` job in ``folder``."""

    proc: subprocess.Popen
    folder: Path
    watch_file: Path
    stall_file: Path

    def watch_info(self, timeout: float = 60.0) -> dict:
        """The watch file rank 0 writes, once it is there."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.watch_file.exists():
                try:
                    return json.loads(self.watch_file.read_text())
                except ValueError:
                    pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"the job ended early: {self.log()}")
            time.sleep(0.1)
        raise TimeoutError(f"no watch file after {timeout} s: {self.log()}")

    def log(self) -> str:
        path = self.folder / "job.log"
        return path.read_text()[-3000:] if path.exists() else ""

    def stop(self) -> None:
        """End the whole job: torchrun and every process under it (torchrun's workers
        are not all in its process group, so they are found through /proc first)."""
        doomed = [self.proc.pid, *descendants(self.proc.pid)]
        for pid in doomed:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(10)
        # the others are not our children: wait until each is gone (or a zombie, whose
        # sockets are closed), so a test that follows sees the job ended, not dying
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_running(pid) for pid in doomed):
            time.sleep(0.02)


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def start(folder: Path, script: str = "watch_job.py", nproc: int = 4, interval_s: float = 0.5,
          **env: str) -> Job:
    """Launch ``tests/jobs/<script>`` on ``nproc`` gloo ranks under ``commscope run``."""
    folder.mkdir(parents=True, exist_ok=True)
    stall = folder / "stall"
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO),
                "COMMSCOPE_WATCH_INTERVAL_S": str(interval_s), "COMMSCOPE_FR_TIMEOUT_S": "600",
                "STALL_FILE": str(stall), **env}
    full_env.pop("COMMSCOPE_WATCH_TOKEN", None)
    full_env.pop("COMMSCOPE_WATCH_FILE", None)
    log = open(folder / "job.log", "wb")  # noqa: SIM115 - the child writes it
    cmd = [sys.executable, "-m", "commscope", "run", "--standalone", "--nproc-per-node",
           str(nproc), "--monitor-interval", "0.2", str(REPO / "tests" / "jobs" / script)]
    proc = subprocess.Popen(cmd, cwd=folder, env=full_env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    return Job(proc=proc, folder=folder, watch_file=folder / "commscope_traces" / "watch.json",
               stall_file=stall)
