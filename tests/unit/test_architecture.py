"""The house rules, checked on the code's own imports (docs/architecture.md).

* No import circle anywhere in ``commscope/``, function-level imports included.
* Layers: the ground (collectives, compat, console, the probe's parent side, mesh)
  imports nothing above it; comm, flight and analyze import the ground only (and not
  each other); watch imports flight and analyze; demo, the CLI and the probe's child job
  sit on top.
* Stages: inside analyze, comm and flight, a stage imports only the stages before it
  (the data model at the bottom), never a sibling or a later one, nor its own facade.
* No folder of the product keeps more than a dozen modules flat.
* docs/architecture.md names every package, and every package it names exists.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "commscope"

LAYER = {
    # the ground, itself in order: what needs torch and the mesh build on the compat table
    "collectives": 0, "compat": 0, "console": 0, "exitcodes": 0, "hosttable": 0,
    "needs_torch": 0.1, "probe": 0.1, "mesh": 0.2,
    "comm": 1, "flight": 1, "analyze": 1,
    "watch": 2,
    "demo": 3, "probe_job": 3, "cli": 4, "__main__": 5,
}
"""Top-level name under ``commscope`` -> layer (an import may only go to a lower layer,
or stay inside its own top-level package)."""

STAGES = {
    "analyze": {"text": 0, "model": 1, "read": 2, "align": 3, "diagnose": 4, "summary": 4,
                "answer": 4.5,
                "analysis": 5,
                "present": 6, "command": 7, "synth": 7, "__init__": 8},
    "comm": {"trace": 0, "present": 1, "capture": 2, "examples": 3, "__init__": 4},
    "flight": {"config": 0, "launcher_env": 0, "record": 1, "splice": 2, "out": 3, "api": 4,
               "__init__": 5, "bootstrap": 6, "launch": 6, "exec": 7},
}
"""Inside a staged package: first part of the module's path -> rank. A module may
import its own stage (same first part) or a stage of lower rank."""

MAX_FLAT = 12


def _modules() -> dict[str, Path]:
    found = {}
    for path in PKG.rglob("*"):
        if path.suffix not in (".py", ".c") or "__pycache__" in path.parts:
            continue
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """Every commscope module ``name`` imports, at module level or inside functions."""
    if path.suffix != ".py":
        return set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in MODULES)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                full = f"{source}.{alias.name}"
                if full in MODULES:
                    out.add(full)
                elif source in MODULES:
                    out.add(source)
    out.discard(name)
    return {m for m in out if m.startswith("commscope")}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _cycles() -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return found


def _top(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _stage(name: str) -> tuple[str, str] | None:
    """``("analyze", "read")`` for ``commscope.analyze.read.load``, else ``None``."""
    parts = name.split(".")
    if len(parts) < 2 or parts[1] not in STAGES:
        return None
    return parts[1], parts[2] if len(parts) > 2 else "__init__"


def test_the_import_graph_is_read_from_the_code():
    # the checks below are only as good as the graph: it must see real edges
    assert "commscope.analyze.read.load" in GRAPH["commscope.analyze.analysis"]
    assert "commscope.flight.record.recorder" in GRAPH["commscope.flight.splice.backend"]
    assert "commscope.analyze.read._fastread" in GRAPH["commscope.analyze.read.load"]
    # function-level imports count too
    assert "commscope.demo.run" in GRAPH["commscope.cli"]


def test_no_import_circles():
    assert _cycles() == []


def test_every_top_level_module_has_a_layer():
    assert {_top(m) for m in MODULES} - {"__init__"} == set(LAYER)


def test_no_import_goes_up_a_layer():
    wrong = []
    for name, targets in GRAPH.items():
        if name == "commscope":
            continue
        here = _top(name)
        for target in targets:
            there = _top(target)
            if there == "__init__" or there == here:
                continue
            if LAYER[there] >= LAYER[here]:
                wrong.append(f"{name} -> {target}")
    assert wrong == []


@pytest.mark.parametrize("package", sorted(STAGES))
def test_each_stage_imports_only_the_stages_before_it(package):
    ranks = STAGES[package]
    present = {_stage(m)[1] for m in MODULES if (_stage(m) or ("",))[0] == package}
    assert present == set(ranks), f"stages of commscope.{package}"
    wrong = []
    for name, targets in GRAPH.items():
        mine = _stage(name)
        if mine is None or mine[0] != package:
            continue
        for target in targets:
            theirs = _stage(target)
            if theirs is None or theirs[0] != package or theirs[1] == mine[1]:
                continue
            if ranks[theirs[1]] >= ranks[mine[1]]:
                wrong.append(f"{name} -> {target}")
    assert wrong == []


def test_no_folder_keeps_more_than_a_dozen_modules_flat():
    crowded = {}
    for folder in [PKG, *[p for p in PKG.rglob("*") if p.is_dir()]]:
        if "__pycache__" in folder.parts:
            continue
        flat = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
        if len(flat) > MAX_FLAT:
            crowded[str(folder.relative_to(ROOT))] = len(flat)
    assert crowded == {}


def _packages() -> set[str]:
    return {str(p.parent.relative_to(ROOT)) + "/" for p in PKG.rglob("__init__.py")
            if "__pycache__" not in p.parts}


def test_the_architecture_document_names_every_package_and_only_those():
    text = (ROOT / "docs" / "architecture.md").read_text()
    named = set(re.findall(r"`(commscope/(?:[a-z_]+/)*)`", text))
    assert named - _packages() == set(), "named in docs/architecture.md but not in the code"
    assert _packages() - named == set(), "in the code but not in docs/architecture.md"


def test_subpackages_of_staged_packages_are_plain_folders():
    # a stage's __init__ holds its docstring only, so importing one module of a stage
    # never drags in its siblings (and no circle can hide in a package import)
    for package in STAGES:
        for init in (PKG / package).glob("*/__init__.py"):
            tree = ast.parse(init.read_text())
            body = [n for n in tree.body if not isinstance(n, ast.Expr)]
            assert body == [], f"{init.relative_to(ROOT)} does more than document its stage"


def test_dependents_are_known():
    # who imports whom, for the architecture document's pictures: watch reads flight's
    # progress records and runs the analyzer; nothing below imports watch
    users = defaultdict(set)
    for name, targets in GRAPH.items():
        for target in targets:
            users[_top(target)].add(_top(name))
    assert users["watch"] <= {"watch", "demo", "cli"}
    assert "flight" in users and {"watch", "demo"} <= users["flight"]
    assert users["analyze"] - {"analyze"} <= {"watch", "demo", "cli"}
