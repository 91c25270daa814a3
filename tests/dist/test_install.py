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
        "'fastread': importlib.util.find_spec('commscope.analyze.read._fastread') is not None, "
        "'stack': importlib.util.find_spec('commscope.flight.record._stack') is not None}))")],
        capture_output=True, text=True, env=env, cwd=tmp_path, check=True)
    found = json.loads(probe.stdout)
    assert "site-packages" in found["file"]  # the installed copy, not the source tree
    # the stack walker uses CPython 3.11's frame API: on 3.10 it is not built (optional)
    expect_stack = expect_c and sys.version_info >= (3, 11)
    assert found["fastread"] is expect_c and found["stack"] is expect_stack
    cli = str(py.parent / "commscope")
    out = subprocess.run([cli, "analyze", str(FIXTURE), "--json"], capture_output=True,
                         text=True, env=env, cwd=tmp_path, timeout=120)
    assert out.returncode == 5, out.stderr  # the verdict's exit status: hang
    root = json.loads(out.stdout)["findings"][0]
    assert (root["kind"], root["culprit_ranks"]) == ("missing_rank", [3])
    html = tmp_path / "report.html"
    out = subprocess.run([cli, "analyze", str(FIXTURE), "--html", str(html), "--exit-zero"],
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


def _pip(py: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "CC": "/bin/false",
           "LDSHARED": "/bin/false"}
    env.pop("PYTHONPATH", None)
    # --no-index: whatever pip would have to fetch (a torch, say) is an error here
    return subprocess.run([str(py), "-m", "pip", "install", "--no-index",
                           "--no-build-isolation", "--quiet", *args],
                          capture_output=True, text=True, env=env, timeout=400)


def _torch_version(py: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([str(py), "-c", "import torch; print(torch.__version__)"],
                          capture_output=True, text=True, env=env, check=True).stdout.strip()


def _pip_check(py: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([str(py), "-m", "pip", "check"], capture_output=True, text=True,
                          env=env).stdout.strip()


def test_pip_install_leaves_the_installed_torch_alone(tmp_path):
    # A venv that already has a torch (borrowed), as a user's training environment does:
    # installing commscope, with or without its [torch] extra, changes nothing of it.
    import torch

    py = _fresh_env(tmp_path, "has_torch")
    before = _torch_version(py)
    assert before == torch.__version__
    src = _source_copy(tmp_path)
    for target in (str(src), f"{src}[torch]"):
        proc = _pip(py, target)
        assert proc.returncode == 0, proc.stderr[-2000:]
        # (pip swaps a torch whose own pins the environment breaks, e.g. torch 2.12 with a
        # setuptools past its <82: `pip check` then names the break)
        assert _torch_version(py) == before, (target, _pip_check(py))
        assert "torch" not in proc.stdout.lower(), proc.stdout


_NO_TORCH_DEPS = ("numpy", "rich", "markdown_it", "mdurl", "pygments", "setuptools",
                  "_distutils_hack", "pkg_resources")


def _env_without_torch(tmp_path: Path) -> Path:
    """A fresh venv that sees numpy, rich (and what rich needs) and setuptools from the
    test environment, one symlink each, and no torch at all."""
    import importlib.metadata as md

    env_dir = tmp_path / "no_torch"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "uninstall", "-y", "-q", "setuptools"],
                   capture_output=True, check=False)
    shelf = tmp_path / "shelf"
    shelf.mkdir()
    site = Path(sysconfig.get_paths()["purelib"])
    for name in _NO_TORCH_DEPS:
        for found in site.glob(f"{name}*"):
            (shelf / found.name).symlink_to(found)
    for dist_name in ("numpy", "rich", "markdown-it-py", "mdurl", "pygments", "setuptools"):
        info = Path(md.distribution(dist_name)._path)  # type: ignore[attr-defined]
        if not (shelf / info.name).exists():
            (shelf / info.name).symlink_to(info)
    purelib = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "shelf.pth").write_text(f"{shelf}\n")
    return py


def test_pip_install_without_torch_gives_the_analyzer_view_diff_and_mesh(tmp_path):
    # HTA's way: a laptop with no torch reads a cluster's dumps.
    py = _env_without_torch(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    gone = subprocess.run([str(py), "-c", "import torch"], capture_output=True, env=env)
    assert gone.returncode != 0  # really no torch here
    proc = _pip(py, str(_source_copy(tmp_path)))  # with its dependencies, from no index
    assert proc.returncode == 0, proc.stderr[-2000:]
    cli = str(py.parent / "commscope")

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([cli, *args], capture_output=True, text=True, env=env,
                              cwd=tmp_path, timeout=120)

    out = run("analyze", str(FIXTURE), "--json")
    assert out.returncode == 5, out.stderr  # hang
    assert json.loads(out.stdout)["findings"][0]["culprit_ranks"] == [3]
    assert run("mesh", "--shape", "2,4", "--names", "dp,tp").returncode == 0
    comm = REPO / "tests" / "data" / "comm"
    dump = comm / "pytorch_mlp_fwd_bwd_noise1.json"
    out = run("view", str(dump), "-o", str(tmp_path / "view.html"))
    assert out.returncode == 0, out.stderr
    out = run("diff", str(comm / "pytorch_mlp_fwd_bwd_noise0.json"), str(dump))
    assert out.returncode == 0, out.stderr
    for command in (["run", "train.py"], ["watch", "--store", "localhost:29500"]):
        out = run(*command)
        assert out.returncode == 3, (command, out.stderr)
        assert "needs PyTorch (2.6 or newer), which is not installed" in out.stderr
        assert "analyze, view, diff and mesh work without it" in out.stderr
        assert "Traceback" not in out.stderr
    lib = subprocess.run([str(py), "-c", "import commscope.flight"], capture_output=True,
                         text=True, env=env, cwd=tmp_path)
    assert "TorchMissing" in lib.stderr and "needs PyTorch" in lib.stderr
