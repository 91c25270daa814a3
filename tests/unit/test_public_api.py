"""The public surface is stated (`__all__`) and every stated name imports and is documented."""

from __future__ import annotations

import importlib
import inspect

import pytest

PUBLIC_MODULES = [
    "commscope",
    "commscope.collectives",
    "commscope.mesh",
    "commscope.mesh.errors",
    "commscope.mesh.layout",
    "commscope.mesh.topology",
    "commscope.mesh.hosts",
    "commscope.mesh.gather",
    "commscope.mesh.plan",
    "commscope.mesh.device_mesh",
    "commscope.comm",
    "commscope.flight",
    "commscope.analyze",
    "commscope.console",
    "commscope.exitcodes",
    "commscope.demo",
    "commscope.cli",
]


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_all_names_exist_and_are_documented(name):
    module = importlib.import_module(name)
    assert module.__doc__, f"{name} has no module docstring"
    exported = module.__all__
    assert len(exported) == len(set(exported)), f"{name}.__all__ repeats a name"
    for attr in exported:
        obj = getattr(module, attr)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert obj.__doc__, f"{name}.{attr} has no docstring"


def test_mesh_exports_what_it_imports():
    import commscope.mesh as mesh

    public = {n for n in dir(mesh) if not n.startswith("_")} - {
        "annotations",
        "TYPE_CHECKING",
        "Any",
        "agreement",
        "describe",
        "layout",
        "plan",
        "topology",
        "device_mesh",
        "errors",
        "groups",
        "reshape",
        "hosts",
        "gather",
    }
    assert public <= set(mesh.__all__)
    from commscope.mesh import DeviceMesh, MeshDisagreement, init_device_mesh  # lazy names

    assert DeviceMesh.__name__ == "DeviceMesh"
    assert issubclass(MeshDisagreement, ValueError)
    assert callable(init_device_mesh)


def test_planning_needs_no_torch():
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from commscope.mesh import plan_mesh, format_plan\n"
        "print(format_plan(plan_mesh((2, 4), ('dp', 'tp'), rank=5)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert "rank 5: coordinate (dp=1, tp=1)" in out.stdout


def test_cli_without_torch_for_analyze_and_mesh():
    import subprocess
    import sys
    from pathlib import Path

    data = Path(__file__).resolve().parents[1] / "data" / "missing_rank"
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from commscope.cli import main\n"
        f"assert main(['analyze', {str(data)!r}]) == 5\n"  # the verdict: hang
        "assert main(['mesh', '--shape', '2,4']) == 0\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "missing_rank" in proc.stdout
