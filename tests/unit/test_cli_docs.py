"""The CLI's conventions and its docs, held to each other (commscope/cli.py's docstring).

* Every option a subcommand's ``--help`` shows is mentioned in the docs (README.md,
  docs/*.md) where that subcommand is spoken of: on a ``commscope SUB ...`` command line,
  in a section whose heading names ``commscope SUB``, or in a paragraph that does.
* Every option the docs name for a subcommand (on a ``commscope SUB ...`` command line,
  or in an option table under a heading that names it) exists in that subcommand's
  parser, and none is a renamed option's old spelling.
* One style: upper-case noun metavars from one vocabulary, every default shown.

The parsers are walked from :func:`commscope.cli.build_parser`; ``run`` and ``exec``
take torchrun's and the script's arguments, so what follows them on a command line is
not checked against our parser.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from commscope import exitcodes
from commscope.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PASS_THROUGH = {"run", "exec"}
"""Subcommands whose command lines carry another program's options."""
METAVARS = {"FILE", "DIR", "N", "SECONDS", "MS", "NS", "SPEC", "NAME", "NAMES", "PREFIX",
            "SIZES", "HOST", "PORT", "HOST:PORT", "TOKEN", "GBPS", "PERCENT", "A", "B"}
"""The metavar vocabulary: upper-case nouns (a unit where the value is a number of one)."""


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _listed(parser: argparse.ArgumentParser) -> set[str]:
    """The subcommands ``commscope --help`` lists (job-log is started by run, unlisted)."""
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {a.dest for a in action._choices_actions}


PARSER = build_parser()
SUBS = _subparsers(PARSER)
LISTED = sorted(_listed(PARSER))


def _shown(p: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    """The options ``--help`` shows (not -h, not hidden aliases)."""
    for action in p._actions:
        if action.option_strings and action.help is not argparse.SUPPRESS and not isinstance(
                action, argparse._HelpAction):
            yield action


def _option_re(option: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![\w-]){re.escape(option)}(?![\w-])")


# --------------------------------------------------------------------------- the docs


def _joined_lines(text: str) -> list[str]:
    """The text's lines, a line ending in a backslash joined with the next."""
    return text.replace("\\\n", " ").splitlines()


def command_lines(text: str, sub: str) -> list[str]:
    """Each ``commscope SUB ...`` in ``text`` up to where the command ends: a closing
    backtick, a comment, a table's or a shell's pipe, ``;`` or ``&&``, the line's end."""
    found = []
    for line in _joined_lines(text):
        for m in re.finditer(rf"(?<![\w/-])commscope {re.escape(sub)}(?![\w-])", line):
            rest = re.split(r"`| #| \| |;|&&", line[m.end():], maxsplit=1)[0]
            found.append(rest)
    return found


def options_in(command: str) -> set[str]:
    """The ``-x``/``--xyz`` words of a command line (``--opt=value`` and ``[--opt]``
    too)."""
    out = set()
    command = re.sub(r"\$\([^)]*\)", "", command)  # a shell's $(...): another program's
    for word in command.split():
        m = re.match(r"^[\[(\"']*(--?[A-Za-z][\w-]*)", word)
        if m:
            out.add(m.group(1))
    return out


def sections(text: str) -> Iterator[tuple[str, str]]:
    """(every heading above a line, joined; the line), for each line outside code."""
    stack: list[tuple[int, str]] = []
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        m = None if fenced else re.match(r"^(#{1,6}) (.*)", line)
        if m:
            level = len(m.group(1))
            stack = [(lvl, h) for lvl, h in stack if lvl < level] + [(level, m.group(2))]
            continue
        yield " / ".join(h for _, h in stack), line


def _names(heading_or_text: str, sub: str) -> bool:
    return re.search(rf"(?<![\w/-])commscope {re.escape(sub)}(?![\w-])", heading_or_text) \
        is not None


def context(docs: dict[str, str], sub: str) -> str:
    """All the docs say where ``sub`` is spoken of: its command lines, the sections under
    a heading naming it, the paragraphs naming it."""
    parts = []
    for text in docs.values():
        parts += command_lines(text, sub)
        parts += [line for heading, line in sections(text) if _names(heading, sub)]
        parts += [block for block in re.split(r"\n\s*\n", text) if _names(block, sub)]
    return "\n".join(parts)


def named_for(docs: dict[str, str], sub: str) -> set[str]:
    """Every option the docs name for ``sub``: on its command lines, and in the first
    cell of option tables (rows starting ``| `-``) under a heading naming it."""
    out: set[str] = set()
    for text in docs.values():
        for command in command_lines(text, sub):
            out |= options_in(command)
        for heading, line in sections(text):
            if _names(heading, sub) and line.startswith("| `-"):
                first = line.split(" | ")[0]
                out |= {o for cell in re.findall(r"`([^`]*)`", first)
                        for o in options_in(cell.replace("/", " "))}
    return out


# --------------------------------------------------------------------------- the checks


def undocumented(docs: dict[str, str], subs: dict[str, argparse.ArgumentParser],
                 listed: list[str]) -> list[str]:
    """``SUB --opt`` for each option ``--help`` shows that the docs never mention
    where ``SUB`` is spoken of."""
    missing = []
    for sub in listed:
        text = context(docs, sub)
        for action in _shown(subs[sub]):
            missing += [f"{sub} {o}" for o in action.option_strings
                        if not _option_re(o).search(text)]
    return missing


def unknown(docs: dict[str, str], subs: dict[str, argparse.ArgumentParser],
            listed: list[str]) -> list[str]:
    """``SUB --opt`` for each option the docs name for ``SUB`` that its parser does not
    have, or has only as a renamed option's old spelling."""
    wrong = []
    for sub in listed:
        if sub in PASS_THROUGH:
            continue
        p = subs[sub]
        known = {o for a in p._actions for o in a.option_strings}
        old = {o for a in p._actions if getattr(a, "renamed", False) for o in a.option_strings}
        for option in sorted(named_for(docs, sub)):
            if option not in known:
                wrong.append(f"{sub} {option}: no such option")
            elif option in old:
                wrong.append(f"{sub} {option}: an old spelling")
    return wrong


@pytest.fixture(scope="module")
def docs() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for p in DOC_FILES}


def test_every_listed_subcommand_is_walked():
    assert set(LISTED) >= {"demo", "mesh", "view", "diff", "analyze", "run", "exec",
                           "watch", "dump"}
    assert "job-log" in SUBS and "job-log" not in LISTED


def test_every_option_in_help_is_in_the_docs(docs):
    assert undocumented(docs, SUBS, LISTED) == []


def test_every_option_the_docs_name_exists(docs):
    assert unknown(docs, SUBS, LISTED) == []


def test_the_checks_can_fail(docs):
    # a mention removed: the option shows as undocumented
    gone = {name: _option_re("--wait-s").sub("--wait", text) for name, text in docs.items()}
    assert undocumented(gone, SUBS, LISTED) == ["dump --wait-s"]
    # an option that does not exist, an old spelling, each on a command line
    wrong = {**docs, "extra.md": "```\ncommscope analyze DIR --no-such-option\n"
             "commscope mesh --world 8 --shape 2,4\n"
             "commscope run --nproc-per-node 2 train.py --lr 1\n```\n"}
    assert unknown(wrong, SUBS, LISTED) == ["analyze --no-such-option: no such option",
                                            "mesh --world: an old spelling"]
    # in an option table under a heading naming the subcommand
    table = {**docs, "t.md": "## (`commscope watch`)\n\n| `--nope S` | x |\n"}
    assert unknown(table, SUBS, LISTED) == ["watch --nope: no such option"]


def test_command_lines_are_cut_where_the_command_ends():
    text = ("run `commscope analyze DIR -o x.txt` then `--json`\n"
            "$ commscope diff a.json b.json --all | head   # not --html\n"
            "commscope view --blank \\\n    -o viewer.html\n")
    assert command_lines(text, "analyze") == [" DIR -o x.txt"]
    assert options_in(command_lines(text, "diff")[0]) == {"--all"}
    assert options_in(command_lines(text, "view")[0]) == {"--blank", "-o"}
    assert options_in("[-o <output file>] (--entries 5) --x=1") == {"-o", "--entries", "--x"}


# --------------------------------------------------------------------------- the style


@pytest.mark.parametrize("sub", sorted(SUBS))
def test_metavars_are_upper_case_nouns_of_one_vocabulary(sub):
    odd = []
    for action in SUBS[sub]._actions:
        if action.help is argparse.SUPPRESS or action.nargs == 0:
            continue
        if isinstance(action, argparse._HelpAction):
            continue
        if action.metavar not in METAVARS:
            odd.append(f"{'/'.join(action.option_strings) or action.dest}: {action.metavar}")
    assert odd == []


@pytest.mark.parametrize("sub", sorted(SUBS))
def test_every_default_is_shown(sub):
    # a default value, or a default told in words (None: "what the dumps say"), is shown
    # as "(default: ...)"; an option with none (--html FILE: also write a page) says none
    unsaid = []
    for action in _shown(SUBS[sub]):
        text = action.help or ""
        has_default = action.default not in (None, False, argparse.SUPPRESS)
        if (has_default or "default" in text) and "(default: " not in text:
            unsaid.append("/".join(action.option_strings))
    assert unsaid == []


def test_durations_name_their_unit():
    bare = []
    for sub, p in SUBS.items():
        for action in _shown(p):
            long = [o for o in action.option_strings if o.startswith("--")]
            if action.metavar in ("SECONDS", "MS", "NS") and not any(
                    o.endswith(("-s", "-ms", "-ns")) for o in long):
                bare.append(f"{sub} {long}")
    assert bare == []


@pytest.mark.parametrize(("sub", "concept", "name"), [
    ("mesh", "ranks in the job", "--world-size"),
    ("demo", "local ranks", "--world-size"),
    ("analyze", "ranks in the job", "--world-size"),
    ("demo", "output folder", "--output"),
    ("view", "HTML file to write", "--output"),
    ("diff", "write the comparison", "--output"),
    ("analyze", "write the report", "--output"),
])
def test_one_name_per_concept(sub, concept, name):
    action = next(a for a in _shown(SUBS[sub]) if concept in (a.help or ""))
    assert name in action.option_strings


# --------------------------------------------------------------------------- exit status


def test_the_exit_status_table_is_in_the_docs_and_the_help(docs, capsys):
    page = docs["docs/analyze.md"]
    for row in exitcodes.TABLE:
        assert re.search(rf"^\| {row.code} \| {re.escape(row.name)} \|", page, re.M), row
    for sub in ("analyze", "dump"):
        with pytest.raises(SystemExit):
            PARSER.parse_args([sub, "--help"])
        out = capsys.readouterr().out
        assert exitcodes.help_table() in out and "--exit-zero" in out
    assert "--exit-zero" in docs["README.md"] and "exit status" in docs["docs/watch.md"]


def test_run_help_says_it_takes_torchruns_arguments(capsys):
    from commscope.cli import main

    assert main(["run", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "Takes torchrun's arguments (OPTION), every one passed to torchrun as it is" in out
    assert "options of its own: -h, --help" in out and "exit status: torchrun's" in out
