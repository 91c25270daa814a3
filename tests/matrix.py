"""``make test-matrix``: the suite on other Pythons and PyTorch releases, one venv each.

For every cell (a Python and a torch release) asked for, one after another: create
``.venv-matrix/py<X.Y>-torch<V>`` with that Python (pyenv's, or any ``pythonX.Y`` on
PATH), install ``torch==V`` first (PyPI's Linux wheels are CUDA builds that run on CPU:
about 5.7 GB per venv), then commscope with its test extras, run the tests, print one
line per cell, and delete the venv (``--keep`` keeps it). The two installs ignore pip's
configured constraints (``PIP_CONSTRAINT`` is the empty file there, and only there; the
tests run with the environment as it is): a cell names its exact torch, and a machine-wide
cap on torch would refuse the newest release (``--keep-pip-constraint`` keeps them). At the
end: a Markdown table for docs/compat.md, with every skipped test's reason (what degrades on
that release).

    .venv/bin/python tests/matrix.py                          # the documented matrix
    .venv/bin/python tests/matrix.py --cells 3.11:2.8.0,3.13:2.15.0
    .venv/bin/python tests/matrix.py --python 3.11 --torch 2.15.0 --suite sensitive

The documented matrix (:data:`CELLS`): every minor release from the floor to the newest
on Python 3.11, and Python 3.10, 3.12 and 3.13 on the floor and on the newest.
``--suite sensitive`` runs only the version-sensitive tests (flight, mesh, comm):
what ``.ci/run`` runs on the floor and on the newest torch. ``--wheels DIR`` offers pip
``DIR/<version>`` (wheels fetched earlier with ``pip download``) before the index.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RELEASES = ("2.6.0", "2.7.1", "2.8.0", "2.9.1", "2.10.0", "2.11.0", "2.12.1", "2.13.0",
            "2.14.1", "2.15.0")
"""The newest patch release of every minor release commscope supports (floor first)."""
FLOOR, NEWEST = RELEASES[0], RELEASES[-1]
CELLS = ([("3.11", t) for t in RELEASES]
         + [(p, t) for p in ("3.10", "3.12", "3.13") for t in (FLOOR, NEWEST)])
"""The documented matrix (docs/compat.md)."""
SENSITIVE = ["tests/dist/test_flight_jobs.py", "tests/dist/test_flight_teardown.py",
             "tests/dist/test_mesh_gloo.py",
             "tests/dist/test_comm_gloo.py", "tests/dist/test_comm_pipeline.py",
             "tests/unit/test_compat.py",
             "tests/unit/test_flight_record.py",
             "tests/unit/test_flight_ring.py", "tests/unit/test_flight_dump.py",
             "tests/unit/test_flight_config.py", "tests/unit/test_flight_selfcheck.py",
             "tests/unit/test_mesh_layout.py", "tests/unit/test_mesh_vs_torch.py",
             "tests/unit/test_comm_parity.py", "tests/unit/test_comm_edges.py",
             "tests/unit/test_comm_pipeline_tags.py"]
"""The version-sensitive tests. The forked-rank files come first: on torch's CUDA builds
a rank forked after the test process itself ran a backward pass cannot use autograd
("Autograd and Fork"), and the unit files run backward passes in-process."""
BACK = ["tests/dist/test_flight_jobs.py", "tests/dist/test_flight_teardown.py",
        "tests/dist/test_flight_run.py",
        "tests/dist/test_watch_jobs.py", "tests/dist/test_mesh_gloo.py",
        "tests/unit/test_flight_record.py", "tests/unit/test_flight_ring.py",
        "tests/unit/test_flight_dump.py", "tests/unit/test_flight_config.py",
        "tests/unit/test_flight_selfcheck.py", "tests/unit/test_mesh_layout.py",
        "tests/unit/test_comm_edges.py"]
"""The parts measured below the floor (docs/compat.md, "How far back"): the recorder,
`commscope run`, watch and dump, the live mesh, and CommDebugMode's own tests."""
SUITES = {
    "sensitive": [SENSITIVE],
    "back": [BACK],
    # the whole suite in three pytest processes, forked-rank tests before any test that
    # runs autograd in the test process itself (see above)
    "full": [["tests/dist"],
             ["tests/seeds/test_device_mesh_tutorial.py",
              "tests/seeds/test_flight_recorder_tutorial.py"],
             ["tests/browser", "tests/gpu", "tests/unit",
              "tests/seeds/test_comm_debug_mode_tutorial.py"]],
}


def _release(version: str) -> tuple[int, int]:
    major, minor = re.findall(r"\d+", version)[:2]
    return int(major), int(minor)


def find_python(version: str) -> str | None:
    """pyenv's newest ``version.*``, else ``python<version>`` on PATH."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    if root.is_dir():
        found = sorted((p for p in root.iterdir() if p.name.startswith(version + ".")),
                       key=lambda p: [int(x) for x in re.findall(r"\d+", p.name)])
        if found:
            return str(found[-1] / "bin" / "python")
    return shutil.which(f"python{version}")


def _counts(text: str) -> Counter[str]:
    """passed/failed/skipped/error totals over every pytest summary line of ``text``."""
    total: Counter[str] = Counter()
    for line in re.findall(r"^=*\s*(\d+ (?:passed|failed|errors?|skipped)\b.*) in [\d.]+s",
                           text, re.M):
        for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed)", line):
            total["error" if word.startswith("error") else word] += int(n)
    return total


def _skip_reasons(text: str) -> list[str]:
    """``SKIPPED [n] file:line: reason`` lines of ``-ra``, as ``reason (n)``."""
    reasons: Counter[str] = Counter()
    for n, reason in re.findall(r"^SKIPPED \[(\d+)\] [^:]+:\d+: (.*)$", text, re.M):
        reasons[reason.strip()] += int(n)
    return [f"{r} ({n})" for r, n in sorted(reasons.items())]


def run_cell(python: str, version: str, torch: str, suite: str, folder: Path,
             install_timeout: float = 3600, wheels: Path | None = None,
             keep: bool = False, keep_pip_constraint: bool = False) -> dict:
    """Build one venv, run the tests, delete the venv; return what happened.

    The installs run without pip's configured constraints unless
    ``keep_pip_constraint``: the cell asks for one exact torch.
    """
    env_dir = folder / f"py{version}-torch{torch}"
    py = env_dir / "bin" / "python"
    log = folder / f"py{version}-torch{torch}.log"
    start = time.monotonic()
    env = dict(os.environ)
    if _release(torch) < _release(FLOOR):
        # below the floor the torch-using parts refuse; measuring how far back each part
        # goes is what such a cell is for
        env["COMMSCOPE_ALLOW_OLD_TORCH"] = "1"
    # for the two installs only: a configured cap on torch (``torch<=2.14.1``, say) would
    # make ``torch==V`` of a newer release impossible; the tests run with ``env`` as is
    install_env = env if keep_pip_constraint else {**env, "PIP_CONSTRAINT": os.devnull}
    try:
        with open(log, "w") as out:
            def step(*cmd: str, timeout: float, step_env: dict[str, str] = env) -> int:
                shown = " ".join(f"{k}={v}" for k, v in step_env.items() if env.get(k) != v)
                out.write(f"\n$ {shown + ' ' if shown else ''}{' '.join(cmd)}\n")
                out.flush()
                try:
                    return subprocess.run(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                          timeout=timeout, env=step_env).returncode
                except subprocess.TimeoutExpired:
                    out.write(f"timed out after {timeout:g} s\n")
                    return 124

            if not py.exists() and step(python, "-m", "venv", str(env_dir), timeout=300):
                return {"result": "venv failed", "log": str(log)}
            pip = [str(py), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
            local = wheels / torch if wheels is not None else None
            links = ["--find-links", str(local)] if local is not None and local.is_dir() else []
            if step(*pip, *links, f"torch=={torch}", timeout=install_timeout,
                    step_env=install_env):
                return {"result": f"torch {torch} did not install", "log": str(log),
                        "uninstallable": True, "seconds": round(time.monotonic() - start)}
            # torch named again: the test extra's own needs (setuptools, say) are resolved
            # against that torch's pins, never upgraded past them (torch 2.11 and 2.12 ask
            # setuptools<82; an environment that breaks its torch's pins makes pip swap the
            # torch for another at the next install that names it)
            if step(*pip, *links, "-e", ".[test]", f"torch=={torch}", timeout=1800,
                    step_env=install_env):
                return {"result": "commscope did not install", "log": str(log)}
            code = 0
            for tests in SUITES[suite]:
                code = step(str(py), "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests,
                            timeout=3600) or code
    finally:
        if not keep:
            shutil.rmtree(env_dir, ignore_errors=True)
    text = log.read_text()
    counts = _counts(text)
    failed = sorted(set(re.findall(r"^(?:FAILED|ERROR) (\S+)", text, re.M)))
    return {"result": "pass" if code == 0 else f"exit {code}",
            "summary": ", ".join(f"{counts[k]} {k}" for k in
                                 ("passed", "failed", "error", "skipped") if counts[k]),
            "failed": failed, "skipped": _skip_reasons(text),
            "seconds": round(time.monotonic() - start), "log": str(log)}


def _cells(args: argparse.Namespace) -> list[tuple[str, str]]:
    if args.cells:
        return [tuple(c.split(":", 1)) for c in args.cells.split(",")]  # type: ignore[misc]
    if args.python or args.torch:
        pythons = (args.python or "3.11").split(",")
        torches = (args.torch or ",".join(RELEASES)).split(",")
        return [(p, t) for p in pythons for t in torches]
    return list(CELLS)


def main(argv: list[str] | None = None) -> int:
    """Run the cells asked for; exit 1 when any of them failed."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cells", help="python:torch pairs, e.g. 3.11:2.8.0,3.13:2.15.0")
    ap.add_argument("--python", help="Pythons, crossed with --torch (e.g. 3.10,3.13)")
    ap.add_argument("--torch", help="torch releases, crossed with --python")
    ap.add_argument("--suite", choices=sorted(SUITES), default="full")
    ap.add_argument("--dir", default=str(REPO / ".venv-matrix"))
    ap.add_argument("--wheels", help="a folder of <version>/ wheel folders to install from")
    ap.add_argument("--keep", action="store_true", help="keep each venv after its run")
    ap.add_argument("--install-timeout", type=float, default=3600,
                    help="seconds torch may take to install (download included)")
    ap.add_argument("--keep-pip-constraint", action="store_true",
                    help="install with pip's configured constraints (by default the "
                         "installs ignore them: a cell names its exact torch)")
    ap.add_argument("--skip-uninstallable", action="store_true",
                    help="a torch that does not install in time is reported, not a failure")
    args = ap.parse_args(argv)
    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    wheels = Path(args.wheels) if args.wheels else None
    rows = []
    worst = 0
    for version, torch in _cells(args):
        python = find_python(version)
        if python is None:
            cell: dict = {"result": f"no Python {version} here"}
        else:
            cell = run_cell(python, version, torch, args.suite, folder, args.install_timeout,
                            wheels, args.keep, args.keep_pip_constraint)
        if cell.get("uninstallable") and args.skip_uninstallable:
            cell["result"] = f"SKIPPED: {cell['result']} (see {cell['log']})"
        else:
            worst = worst or (cell["result"] != "pass")
        line = f"Python {version} x torch {torch}: {cell['result']}"
        said = [cell.get("summary"), f"{cell['seconds']} s" if "seconds" in cell else None]
        if any(said):
            line += f" ({', '.join(x for x in said if x)})"
        print(line, flush=True)
        for name in cell.get("failed", [])[:20]:
            print(f"    FAILED {name}", flush=True)
        rows.append((version, torch, cell))
    print("\n| Python | torch | suite | result | skipped, and why |\n|---|---|---|---|---|")
    for version, torch, cell in rows:
        summary = cell.get("summary") or cell["result"]
        if cell["result"] != "pass" and cell.get("summary"):
            summary = f"**{cell['result']}**: {summary}"
        why = "; ".join(cell.get("skipped", [])) or "-"
        print(f"| {version} | {torch} | {args.suite} | {summary} | {why} |")
    return 1 if worst else 0


if __name__ == "__main__":
    sys.exit(main())
