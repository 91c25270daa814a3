"""The README cannot rot: its commands, code and outputs are what the code does today."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


def _blocks(lang: str) -> list[str]:
    """The fenced blocks of one language ("" for plain fences), in order."""
    out, current, current_lang = [], None, ""
    for line in README.splitlines():
        if line.startswith("```"):
            if current is None:
                current, current_lang = [], line[3:].strip()
            else:
                if current_lang == lang:
                    out.append("\n".join(current) + "\n")
                current = None
        elif current is not None:
            current.append(line)
    return out


def test_readme_opens_with_the_two_commands():
    first = README.split("```", 2)[1]
    commands = [line.split("#")[0].strip() for line in first.strip().splitlines()]
    assert commands == ["make demo", "make test"]
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^demo: ", makefile, re.M) and re.search(r"^test: ", makefile, re.M)
    assert "make test" in (REPO / ".ci" / "run").read_text()


def test_every_python_block_is_in_an_example_the_tests_run():
    examples = {p.name: p.read_text().splitlines() for p in (REPO / "examples").glob("*.py")}
    blocks = _blocks("python")
    assert len(blocks) >= 3
    for block in blocks:
        wanted = [line.strip() for line in block.splitlines() if line.strip()]
        found = False
        for lines in examples.values():
            stripped = [line.strip() for line in lines]
            i = 0
            for line in stripped:  # the block's lines, in order, within one example
                if i < len(wanted) and line == wanted[i]:
                    i += 1
            found |= i == len(wanted)
        assert found, f"README block not found in any examples/*.py:\n{block}"
    tested = " ".join(p.read_text() for p in (REPO / "tests").rglob("test_*.py"))
    for name in examples:
        assert name in tested, f"examples/{name} is not run by any test"


def test_mesh_plan_output_is_current():
    block = next(b for b in _blocks("") if b.startswith("$ commscope mesh "))
    command, expected = block.split("\n", 1)
    args = command.removeprefix("$ commscope ").split()
    proc = subprocess.run(
        [sys.executable, "-m", "commscope", *args], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.rstrip() == expected.rstrip()


def test_documented_env_vars_are_read_by_the_code():
    code = " ".join(p.read_text() for p in (REPO / "commscope").rglob("*.py"))
    for var in set(re.findall(r"`((?:TORCH|COMMSCOPE)_[A-Z0-9_]+)`", README)):
        assert var in code, f"README names {var}, which no code reads"


def test_links_to_docs_exist():
    for target in set(re.findall(r"\]\(((?:docs/)?[\w./-]+\.md)", README)):
        assert (REPO / target).exists(), target
