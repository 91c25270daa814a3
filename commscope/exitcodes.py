"""The exit status of the commands that give a verdict (``commscope analyze``,
``commscope dump``): the one table, read by the CLI, the commands, their ``--help`` and
the docs' test (docs/analyze.md, "Exit status").

The numbers grow with the analyzer's severity (healthy < incomplete < desync < hang <
crash), after the two that Python and argparse already own (1: an uncaught exception,
2: a usage error), as ``diff`` and linters do. ``--exit-zero`` turns every status of the
table but 1 and 2 into 0.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "HEALTHY", "INTERNAL", "USAGE", "INCOMPLETE", "DESYNC", "HANG", "CRASH", "UNREADABLE",
    "ExitStatus", "TABLE", "for_verdict", "exit_zero", "help_table",
]

HEALTHY = 0
INTERNAL = 1
USAGE = 2
INCOMPLETE = 3
DESYNC = 4
HANG = 5
CRASH = 6
UNREADABLE = 7


@dataclass(frozen=True, slots=True)
class ExitStatus:
    """One row of the table."""

    code: int
    """The process's exit status."""
    name: str
    """The verdict it stands for (``hang``), or what went wrong (``usage error``)."""
    meaning: str
    """When it is given, in a few words."""


TABLE: tuple[ExitStatus, ...] = (
    ExitStatus(HEALTHY, "healthy", "every rank finished what it started"),
    ExitStatus(INTERNAL, "internal error", "an unexpected exception (Python's own status)"),
    ExitStatus(USAGE, "usage error", "bad arguments (argparse's own status)"),
    ExitStatus(INCOMPLETE, "incomplete", "the dumps cannot decide: ranks' files missing, "
               "history undecidable"),
    ExitStatus(DESYNC, "desync", "ranks disagreed, but nobody waits"),
    ExitStatus(HANG, "hang", "ranks wait for a collective that cannot finish"),
    ExitStatus(CRASH, "crash", "a rank died or raised"),
    ExitStatus(UNREADABLE, "unreadable input", "no dump could be read at all, or the path "
               "does not exist or holds no dump"),
)
"""Every exit status of a verdict command, by code."""

_VERDICTS = {row.name: row.code for row in TABLE if row.code not in (INTERNAL, USAGE,
                                                                     UNREADABLE)}


def for_verdict(verdict: str) -> int:
    """The exit status of an analysis whose verdict is ``verdict`` (``"hang"`` -> 5).

    A verdict the table does not know raises ``LookupError``: a verdict added to the
    analyzer must get its row here (the traceback then exits 1, an internal error)."""
    try:
        return _VERDICTS[verdict]
    except KeyError:
        raise LookupError(f"no exit status for the verdict {verdict!r}: add it to "
                          "commscope/exitcodes.py's TABLE") from None


def exit_zero(code: int) -> int:
    """``code`` under ``--exit-zero``: 0 for every verdict and for unreadable input;
    internal (1) and usage (2) errors keep theirs."""
    return code if code in (INTERNAL, USAGE) else HEALTHY


def help_table() -> str:
    """The table as a ``--help`` epilog shows it, one status per line."""
    lines = ["exit status (--exit-zero: 0 for all but 1 and 2):"]
    lines += [f"  {row.code}  {row.name}: {row.meaning}" for row in TABLE]
    return "\n".join(lines)
