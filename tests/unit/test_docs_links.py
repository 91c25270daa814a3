"""The docs cannot rot: links, anchors, counts and pasted outputs (issue 38, item 4).

* Every relative link in README.md, DEVELOPERS.md and docs/*.md points to a file that
  exists, and every ``#anchor`` to a heading of its target, slugged as GitHub does.
* Every count the docs state of the scenario corpora equals the number of scenarios in
  the data folders.
* The README is for users: under 1 500 words (``wc -w``, code included), the two set-up
  commands first.
* Every ``$ commscope analyze PATH`` block whose PATH is checked-in data shows what the
  command prints today (the start of it where the block ends with ``...``), and the
  ``$ echo $?`` after it the exit status.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from commscope.cli import main

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "DEVELOPERS.md", *sorted((ROOT / "docs").glob("*.md"))]
README_WORDS = 1500


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


# --------------------------------------------------------------------------- links


def _prose(text: str) -> str:
    """``text`` without fenced code blocks and inline code spans (links there are not
    links), line breaks kept so that line numbers stay."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            out.append("")
            continue
        out.append("" if fenced else re.sub(r"(`+)(?:(?!\1).)+?\1", "", line))
    return "\n".join(out)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: its rendered text lower-cased, every character but
    letters, digits, ``_``, ``-`` and spaces dropped, spaces turned to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors of a Markdown file's headings (``-1``, ``-2`` for repeats)."""
    seen: dict[str, int] = {}
    out = set()
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        m = None if fenced else re.match(r"^#{1,6} +(.*?)#*\s*$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    out |= set(re.findall(r"<a (?:name|id)=\"([^\"]+)\"", text))
    return out


def links(text: str) -> list[tuple[int, str]]:
    """(line, target) of every inline link and image outside code."""
    found = []
    for i, line in enumerate(_prose(text).splitlines(), 1):
        for m in re.finditer(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", line):
            found.append((i, m.group(1)))
    return found


def broken(docs: dict[Path, str]) -> list[str]:
    """``file:line: target (why)`` for each relative link that goes nowhere."""
    bad = []
    for path, text in docs.items():
        for line, target in links(text):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            where = f"{path.relative_to(ROOT)}:{line}: {target}"
            if not dest.exists():
                bad.append(f"{where} (no such file)")
            elif anchor and dest.suffix == ".md":
                text_there = docs.get(dest) or _text(dest)
                if anchor not in anchors(text_there):
                    bad.append(f"{where} (no such heading)")
    return bad


@pytest.fixture(scope="module")
def docs() -> dict[Path, str]:
    return {p.resolve(): _text(p) for p in DOCS}


def test_every_relative_link_and_anchor_resolves(docs):
    assert broken(docs) == []


def test_slugs_are_githubs():
    assert slug("### The verdict: finding x dump reason"[4:]) == \
        "the-verdict-finding-x-dump-reason"
    assert slug("Analysis (`commscope.analysis/2`)") == "analysis-commscopeanalysis2"
    assert slug("Where it differs from PyTorch 2.13's CommDebugMode") == \
        "where-it-differs-from-pytorch-213s-commdebugmode"
    assert slug("Format `commscope.analysis/2` (the `--json` document)") == \
        "format-commscopeanalysis2-the---json-document"
    assert slug("Compared with PyTorch's `fr_trace` (measured 2026-11-22, torch 2.13.0)") == \
        "compared-with-pytorchs-fr_trace-measured-2026-11-22-torch-2130"
    assert anchors("# A\n## A\n```\n# not a heading\n```\n") == {"a", "a-1"}


def test_the_link_check_can_fail(docs):
    readme = ROOT.joinpath("README.md").resolve()
    page = ROOT.joinpath("docs", "analyze.md").resolve()
    wrong = {**docs, readme: docs[readme] + "\n[x](docs/nope.md) [y](docs/analyze.md#nope)"
             " [z](#nope) `[code](docs/nope.md)`\n"}
    assert [b.split(": ", 1)[1] for b in broken(wrong)] == [
        "docs/nope.md (no such file)", "docs/analyze.md#nope (no such heading)",
        "#nope (no such heading)"]
    renamed = {**docs, page: docs[page].replace("### Exit status", "### Exit codes")}
    assert any("analyze.md#exit-status (no such heading)" in b for b in broken(renamed))


# --------------------------------------------------------------------------- counts


def _corpus(folder: str) -> int:
    return len(list((ROOT / "tests" / "data" / folder).glob("*/scenario.json")))


COUNTS = {
    "gloo": (r"\b(\d+) (?:real )?gloo (?:jobs|scenarios)\b", lambda: _corpus("scenarios")),
    "nccl": (r"\b(\d+) NCCL (?:jobs|scenarios)\b", lambda: _corpus("nccl_scenarios")),
}
"""What the docs count, as they say it, and the real count."""


def stated_counts(docs: dict[Path, str]) -> list[tuple[str, str, int]]:
    """(file, what, number) for every count the docs state of the corpora, plus any
    "N ... scenarios" that none of :data:`COUNTS` reads (what ``None``)."""
    out = []
    for path, text in docs.items():
        name = str(path.relative_to(ROOT))
        flat = " ".join(text.split())
        spans = []
        for what, (pattern, _) in COUNTS.items():
            for m in re.finditer(pattern, flat):
                out.append((name, what, int(m.group(1))))
                spans.append(m.span())
        for m in re.finditer(r"\b(\d+) (?:[\w-]+ ){0,3}scenarios\b", flat):
            if not any(a <= m.start(1) < b for a, b in spans):
                out.append((name, None, int(m.group(1))))
    return out


def test_the_counts_the_docs_state_are_the_data_folders(docs):
    stated = stated_counts(docs)
    assert {what for _, what, _ in stated} >= set(COUNTS), "a count no doc states any more"
    real = {what: count() for what, (_, count) in COUNTS.items()}
    wrong = [(name, what, n, real.get(what)) for name, what, n in stated
             if what is None or n != real[what]]
    assert wrong == [], f"(file, corpus, stated, real); the real counts: {real}"


def test_the_count_check_can_fail(docs):
    extra = {ROOT / "x.md": "the corpus of 7 real gloo jobs, 3 NCCL scenarios and "
                            "12 other scenarios"}
    assert stated_counts(extra) == [("x.md", "gloo", 7), ("x.md", "nccl", 3),
                                    ("x.md", None, 12)]


# --------------------------------------------------------------------------- the README


def test_the_readme_is_short_and_opens_with_the_two_commands():
    readme = _text(ROOT / "README.md")
    words = len(readme.split())
    assert words < README_WORDS, f"README.md has {words} words (wc -w), {README_WORDS} at most"
    lines = readme.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("```"))
    assert all(line.startswith("#") or not line.strip() for line in lines[:start])
    block = lines[start + 1:lines.index("```", start + 1)]
    assert [line.split("#")[0].strip() for line in block] == ["make demo", "make test"]


# --------------------------------------------------------------------------- outputs


def shown_runs(text: str) -> list[tuple[list[str], list[str], bool, int | None]]:
    """(arguments, lines shown, whether the block cuts the output short with ``...``, the
    exit status shown or None) of each block that starts ``$ commscope analyze``."""
    runs = []
    for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, re.M | re.S):
        lines = block.splitlines()
        if not lines or not lines[0].startswith("$ commscope analyze "):
            continue
        args = shlex.split(lines[0].removeprefix("$ commscope "))
        shown, cut, status = [], False, None
        rest = lines[1:]
        for i, line in enumerate(rest):
            if line == "...":
                cut = True
            elif line == "$ echo $?":
                status = int(rest[i + 1])
                break
            elif not cut:
                shown.append(line)
        runs.append((args, shown, cut, status))
    return runs


def _lines(text: str) -> list[str]:
    """Output lines without the run's timing (``analyzed in 0.002 s``)."""
    return [line.rstrip() for line in text.rstrip("\n").splitlines()
            if not line.startswith("analyzed in ")]


def _run(args: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        status = main(args)
    return status, out.getvalue()


def _pasted() -> list[tuple[str, list[str], list[str], bool, int | None]]:
    found = []
    for path in DOCS:
        for args, shown, cut, status in shown_runs(_text(path)):
            inputs = [a for a in args[1:] if not a.startswith("-")]
            if inputs and all((ROOT / a).exists() for a in inputs):
                found.append((str(path.relative_to(ROOT)), args, shown, cut, status))
    return found


PASTED = _pasted()


def test_the_readme_shows_analyze_outputs():
    readme = [p for p in PASTED if p[0] == "README.md"]
    assert len(readme) >= 2 and all(status is not None for *_, status in readme)


@pytest.mark.parametrize(("doc", "args", "shown", "cut", "status"), PASTED,
                         ids=[f"{p[0]}:{p[1][1]}" for p in PASTED])
def test_pasted_analyze_output_is_what_it_prints_today(doc, args, shown, cut, status,
                                                       monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("COMMSCOPE_NO_RICH", "1")
    code, out = _run(args)
    printed = _lines(out)
    expected = _lines("\n".join(shown))
    if cut:
        printed = printed[:len(expected)]
    assert printed == expected, f"{doc}: paste `commscope {' '.join(args)}` again"
    if status is not None:
        assert code == status


def test_the_output_check_can_fail():
    text = ("```\n$ commscope analyze tests/data/missing_rank\nsomething else\n...\n"
            "$ echo $?\n0\n```\n")
    [(args, shown, cut, status)] = shown_runs(text)
    assert (args, shown, cut, status) == (["analyze", "tests/data/missing_rank"],
                                         ["something else"], True, 0)
    code, out = _run(args)
    assert _lines(out)[:1] != shown and code != status
