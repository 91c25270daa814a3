"""``pip install .`` (not editable) in a fresh virtual environment gives a working
``commscope``: the viewer files are there, the analyzer runs, with the C modules when a
compiler is there and without them (the pure-Python path) when it is not.

The fresh environment borrows torch from the project's ``.venv`` through a ``.pth``
file (installing torch again would cost minutes, and torch is not what is tested here);
commscope itself is built and installed from a copy of the source tree.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

pytestmark = [pytest.mark.dist, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "data" / "scenarios" / "stall_in_data_loader" / "ours"


def _fresh_env(tmp_path: Path, name: str) -> Path:
    env_dir = tmp_path / name
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    site = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True).stdout.strip()
    # torch, numpy, rich and a current setuptools from the environment running the tests
    # (the fresh one's own older setuptools would shadow it)
    subprocess.run([str(py), "-m", "pip", "uninstall", "-y", "-q", "setuptools"],
                   capture_output=True, check=False)
    Path(site, "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return py


def _source_copy(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    keep = ["commscope", "pyproject.toml", "setup.py", "README.md"]
    src.mkdir()
    for item in keep:
        path = REPO / item
        if path.is_dir():
            shutil.copytree(path, src / item, ignore=shutil.ignore_patterns(
                "__pycache__", "*.so", "*.egg-info"))
        else:
            shutil.copy2(path, src / item)
    return src


def _install(py: Path, src: Path, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", **env}
    full.pop("PYTHONPATH", None)
    return subprocess.run([str(py), "-m", "pip", "install", "--no-deps", "--no-build-isolation",
                           "--quiet", str(src)], capture_output=True, text=True, env=full,
                          timeout=400)


def _check(py: Path, tmp_path: Path, expect_c: bool) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)
    probe = subprocess.run([str(py), "-c", (
        "import importlib.util, commscope, json; "
        "print(json.dumps({'file': commscope.__file__, "
        "'fastread': importlib.util.find_spec('commscope.analyze._fastread') is not None, "
        "'stack': importlib.util.find_spec('commscope.flight._stack') is not None}))")],
        capture_output=True, text=True, env=env, cwd=tmp_path, check=True)
    found = json.loads(probe.stdout)
    assert "site-packages" in found["file"]  # the installed copy, not the source tree
    # the stack walker uses CPython 3.11's frame API: on 3.10 it is not built (optional)
    expect_stack = expect_c and sys.version_info >= (3, 11)
    assert found["fastread"] is expect_c and found["stack"] is expect_stack
    cli = str(py.parent / "commscope")
    out = subprocess.run([cli, "analyze", str(FIXTURE), "--json"], capture_output=True,
                         text=True, env=env, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr
    root = json.loads(out.stdout)["findings"][0]
    assert (root["kind"], root["culprit_ranks"]) == ("missing_rank", [3])
    html = tmp_path / "report.html"
    out = subprocess.run([cli, "analyze", str(FIXTURE), "--html", str(html)],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert out.returncode == 0 and "<script>" in html.read_text()  # viewer files shipped


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                    reason="no C compiler here")
def test_pip_install_with_a_compiler_builds_the_c_modules(tmp_path):
    py = _fresh_env(tmp_path, "with_cc")
    proc = _install(py, _source_copy(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    _check(py, tmp_path, expect_c=True)


def test_pip_install_without_a_compiler_uses_the_pure_python_path(tmp_path):
    py = _fresh_env(tmp_path, "without_cc")
    proc = _install(py, _source_copy(tmp_path), CC="/bin/false", LDSHARED="/bin/false")
    assert proc.returncode == 0, proc.stderr[-2000:]
    _check(py, tmp_path, expect_c=False)
