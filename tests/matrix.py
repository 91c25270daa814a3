"""``make test-matrix``: the suite on other Pythons and PyTorch releases, one venv each.

For every (Python, torch) pair asked for: create ``.venv-matrix/py<X.Y>-torch<V>`` with
that Python (pyenv's, or any ``pythonX.Y`` on PATH), install ``torch==V`` first (PyPI's
Linux wheels are CUDA builds that run on CPU: about 2.5-3 GB of downloads per venv, less
where this machine has the file on disk), then commscope with its test extras, then run
the tests and print one line per cell and a Markdown table for docs/compat.md.

    .venv/bin/python tests/matrix.py                                  # the whole matrix
    .venv/bin/python tests/matrix.py --python 3.11 --torch 2.14.1 --suite sensitive

``--suite sensitive`` runs only the version-sensitive tests (flight, mesh, comm): what
``.ci/run`` runs on the newest torch.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYTHONS = ("3.10", "3.11", "3.12", "3.13")
TORCHES = ("2.13.0", "2.14.1")
"""The declared range's ends (pyproject.toml). torch 2.6 was measured and fails: ask for
it with --torch 2.6.0 to see how."""
SENSITIVE = ["tests/dist/test_flight_jobs.py", "tests/dist/test_mesh_gloo.py",
             "tests/dist/test_comm_gloo.py", "tests/dist/test_comm_pipeline.py",
             "tests/unit/test_flight_record.py",
             "tests/unit/test_flight_ring.py", "tests/unit/test_flight_dump.py",
             "tests/unit/test_flight_config.py", "tests/unit/test_flight_selfcheck.py",
             "tests/unit/test_mesh_layout.py", "tests/unit/test_mesh_vs_torch.py",
             "tests/unit/test_comm_parity.py", "tests/unit/test_comm_edges.py",
             "tests/unit/test_comm_pipeline_tags.py"]
"""The version-sensitive tests. The forked-rank files come first: on torch's CUDA builds
a rank forked after the test process itself ran a backward pass cannot use autograd
("Autograd and Fork"), and the unit files run backward passes in-process."""
SUITES = {
    "sensitive": [SENSITIVE],
    # the whole suite in three pytest processes, forked-rank tests before any test that
    # runs autograd in the test process itself (see above)
    "full": [["tests/dist"],
             ["tests/seeds/test_device_mesh_tutorial.py",
              "tests/seeds/test_flight_recorder_tutorial.py"],
             ["tests/browser", "tests/gpu", "tests/unit",
              "tests/seeds/test_comm_debug_mode_tutorial.py"]],
}


def find_python(version: str) -> str | None:
    """pyenv's newest ``version.*``, else ``python<version>`` on PATH."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    if root.is_dir():
        found = sorted((p for p in root.iterdir() if p.name.startswith(version + ".")),
                       key=lambda p: [int(x) for x in re.findall(r"\d+", p.name)])
        if found:
            return str(found[-1] / "bin" / "python")
    return shutil.which(f"python{version}")


def run_cell(python: str, version: str, torch: str, suite: str, folder: Path,
             install_timeout: float = 3600) -> dict:
    """Build one venv and run the tests; return what happened."""
    env_dir = folder / f"py{version}-torch{torch}"
    py = env_dir / "bin" / "python"
    log = folder / f"py{version}-torch{torch}.log"
    start = time.monotonic()
    with open(log, "w") as out:
        def step(*cmd: str, timeout: float) -> int:
            out.write(f"\n$ {' '.join(cmd)}\n")
            out.flush()
            try:
                return subprocess.run(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                      timeout=timeout).returncode
            except subprocess.TimeoutExpired:
                out.write(f"timed out after {timeout:g} s\n")
                return 124

        if not py.exists() and step(python, "-m", "venv", str(env_dir), timeout=300):
            return {"result": "venv failed", "log": str(log)}
        pip = [str(py), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
        if step(*pip, f"torch=={torch}", timeout=install_timeout):
            return {"result": f"torch {torch} did not install", "log": str(log),
                    "uninstallable": True}
        if step(*pip, "-e", ".[test]", timeout=1800):
            return {"result": "commscope did not install", "log": str(log)}
        code = 0
        for tests in (SUITES[suite]):
            code = step(str(py), "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests,
                        timeout=3600) or code
    text = log.read_text()
    summary = [" + ".join(m.strip("= ") for m in re.findall(
        r"^(.*\b(?:passed|failed|errors?)\b.*?) in [\d.]+s", text, re.M))]
    failed = sorted(set(re.findall(r"^FAILED (\S+)", text, re.M)))
    return {"result": "pass" if code == 0 else f"exit {code}", "summary": summary[-1:] or [],
            "failed": failed, "seconds": round(time.monotonic() - start), "log": str(log)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", default=",".join(PYTHONS))
    ap.add_argument("--torch", default=",".join(TORCHES))
    ap.add_argument("--suite", choices=("full", "sensitive"), default="full")
    ap.add_argument("--dir", default=str(REPO / ".venv-matrix"))
    ap.add_argument("--install-timeout", type=float, default=3600,
                    help="seconds torch may take to install (download included)")
    ap.add_argument("--skip-uninstallable", action="store_true",
                    help="a torch that does not install in time is reported, not a failure")
    args = ap.parse_args(argv)
    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    worst = 0
    for version in args.python.split(","):
        python = find_python(version)
        for torch in args.torch.split(","):
            if python is None:
                cell = {"result": f"no Python {version} here"}
            else:
                cell = run_cell(python, version, torch, args.suite, folder,
                                args.install_timeout)
            if cell.get("uninstallable") and args.skip_uninstallable:
                cell["result"] = f"SKIPPED: {cell['result']} (see {cell['log']})"
            else:
                worst = worst or (cell["result"] != "pass")
            line = f"Python {version} x torch {torch}: {cell['result']}"
            line += f" ({'; '.join(cell.get('summary', []))}, {cell.get('seconds', '?')} s)"
            print(line, flush=True)
            for name in cell.get("failed", [])[:20]:
                print(f"    FAILED {name}")
            rows.append((version, torch, cell))
    print("\n| Python | torch | suite | result |\n|---|---|---|---|")
    for version, torch, cell in rows:
        summary = "; ".join(cell.get("summary", [])) or cell["result"]
        print(f"| {version} | {torch} | {args.suite} | {summary} |")
    return 1 if worst else 0


if __name__ == "__main__":
    sys.exit(main())
