"""Run a peer suite in a child pytest, reap every process it started, and read the result.

Three modes:

* ``ci`` — the whole file, ranks forked (``plugin.py``), then the suite's spawn sample
  with torch's own harness; about half a minute on 2 cores (what ``make test`` runs).
* ``fork`` — the whole file, ranks forked, without the spawn sample.
* ``all`` — the whole file with torch's own harness as PyTorch runs it (a fresh
  interpreter per rank: 40+ minutes for ``test_device_mesh.py`` on 2 cores).

``against="torch"`` runs the file unswapped, on torch's own classes: the baseline.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.peer.suites import BUILD, REPO, Suite

__all__ = ["MODES", "Outcome", "prepare", "run_suite"]

MODES = ("ci", "fork", "all")

_INI = """[pytest]
# written by tests/peer/runner.py for a peer run: none of the project's own settings
addopts = -p no:cacheprovider
"""


@dataclass
class Outcome:
    """What one child pytest run of a peer file gave."""

    suite: str
    against: str
    start: str
    """How ranks were started: ``fork`` or ``spawn``."""
    selection: str
    passed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    returncode: int | None = None
    timed_out: bool = False
    output: str = ""
    not_run: str | None = None
    """Why nothing ran (the file is absent, or this torch cannot import it)."""

    @property
    def ok(self) -> bool:
        """Ran, and nothing failed."""
        return self.not_run is None and not self.failed and not self.timed_out and bool(
            self.passed or self.skipped
        )

    def line(self) -> str:
        """One line for a summary table."""
        if self.not_run:
            return f"{self.suite:12s} {self.against:9s} {self.start:5s} not run: {self.not_run}"
        state = "TIMED OUT" if self.timed_out else ("ok" if self.ok else "FAILED")
        return (
            f"{self.suite:12s} {self.against:9s} {self.start:5s} {len(self.passed):3d} passed "
            f"{len(self.failed):3d} failed {len(self.skipped):3d} skipped  "
            f"{self.seconds:6.1f} s  {state}  ({self.selection})"
        )


def prepare(suite: Suite, against: str = "commscope", dest: Path = BUILD) -> Path | None:
    """Write the (swapped) copy of the suite's file under ``dest``; ``None`` if absent."""
    source = suite.locate()
    if source is None:
        return None
    folder = dest / f"{suite.name}-{against}"
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / suite.file
    target.write_text(suite.swapped(source.read_text(), against))
    (folder / "pytest.ini").write_text(_INI)
    return target


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _read_junit(path: Path, outcome: Outcome) -> None:
    if not path.exists():
        return
    for case in ET.parse(path).getroot().iter("testcase"):
        node = f"{case.get('classname', '')}::{case.get('name', '')}"
        if case.find("failure") is not None or case.find("error") is not None:
            outcome.failed.append(node)
        elif (skip := case.find("skipped")) is not None:
            outcome.skipped[node] = skip.get("message", "")
        else:
            outcome.passed.append(node)


def _not_importable(output: str) -> str | None:
    """The import error of a file this torch cannot load (it is for another release)."""
    if "ERROR collecting" not in output:
        return None
    for line in output.splitlines():
        if line.startswith("E   ") and ("ImportError" in line or "ModuleNotFoundError" in line):
            return line[4:].strip()
    return None


def _child(
    suite: Suite,
    path: Path,
    against: str,
    start: str,
    keyword: str | None,
    extra: Sequence[str],
    timeout: float,
    per_test: int,
) -> Outcome:
    selection = f"-k {keyword!r}" if keyword else "whole file"
    outcome = Outcome(suite.name, against, start, selection)
    xml = path.with_name(f"{start}-{zlib.crc32(selection.encode()):08x}.xml")
    xml.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pytest", str(path), "-q", "-rfEs", "-c",
           str(path.with_name("pytest.ini")), "--rootdir", str(path.parent),
           "-p", "tests.peer.plugin", f"--junitxml={xml}", f"--timeout={per_test}"]
    cmd += [f"--deselect={path.name}::{node}" for node in suite.out_of_scope]
    if keyword:
        cmd += ["-k", keyword]
    cmd += list(extra)
    package = "commscope" if against == "commscope" else "torch"
    env = dict(os.environ)
    env.update({
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
        "OMP_NUM_THREADS": "1",
        "COMMSCOPE_NO_RICH": "1",
        "COMMSCOPE_PEER_START": start,
        "COMMSCOPE_PEER_EXPECT": f"{package}:{','.join(suite.ours)}",
    })
    began = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=path.parent, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        outcome.timed_out = True
        _kill_group(proc)
        out, _ = proc.communicate()
    finally:
        _kill_group(proc)  # every rank it started, whatever happened
    outcome.seconds = time.monotonic() - began
    outcome.returncode = proc.returncode
    outcome.output = out
    _read_junit(xml, outcome)
    if not (outcome.passed or outcome.failed or outcome.skipped):
        reason = _not_importable(out)
        if reason is not None:
            outcome.not_run = f"this torch cannot import PyTorch's {suite.file}: {reason}"
    return outcome


def run_suite(
    suite: Suite,
    *,
    against: str = "commscope",
    mode: str = "ci",
    keyword: str | None = None,
    extra: Sequence[str] = (),
    timeout: float = 600.0,
    dest: Path = BUILD,
) -> list[Outcome]:
    """Run one peer suite; one :class:`Outcome` per child run (see the module docstring).

    ``keyword`` narrows every run (pytest's ``-k``); ``timeout`` bounds each child run
    as a whole, after which every process it started is killed.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    path = prepare(suite, against, dest)
    if path is None:
        return [Outcome(suite.name, against, "-", "-", not_run=suite.missing_reason())]
    if mode == "all":
        return [_child(suite, path, against, "spawn", keyword, extra, timeout, 900)]
    outcomes = [_child(suite, path, against, "fork", keyword, extra, timeout, 120)]
    if mode == "ci" and outcomes[0].not_run is None:
        for sample in suite.spawn_sample:
            chosen = f"({keyword}) and ({sample})" if keyword else sample
            outcomes.append(_child(suite, path, against, "spawn", chosen, extra, timeout, 300))
    return outcomes
