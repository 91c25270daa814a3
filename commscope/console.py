"""Terminal output for the demo: rich tables and a live status line on a terminal,
plain text when piped (or when ``COMMSCOPE_NO_RICH`` or ``NO_COLOR`` is set)."""

from __future__ import annotations

import os
from typing import Any, TextIO

__all__ = ["Console", "use_rich"]


def use_rich(stream: TextIO) -> bool:
    """True when ``stream`` is a terminal and nothing asks for plain text."""
    if os.environ.get("COMMSCOPE_NO_RICH") or os.environ.get("NO_COLOR"):
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class Console:
    """Lines, tables and a one-line progress display, rich or plain."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self._rich: Any = None
        self._status: Any = None
        self._last_plain = ""
        if use_rich(stream):
            from rich.console import Console as RichConsole

            self._rich = RichConsole(file=stream, highlight=False)

    def line(self, text: str = "") -> None:
        """Print one line (or several) as they are."""
        self.end_progress()
        if self._rich is not None:
            self._rich.print(text, markup=False, soft_wrap=True)
        else:
            print(text, file=self.stream, flush=True)

    def table(self, header: list[str], rows: list[list[str]]) -> None:
        """An aligned table: a rich table on a terminal, padded columns otherwise."""
        self.end_progress()
        if self._rich is not None:
            from rich.table import Table

            t = Table(*header, box=None, pad_edge=False, show_edge=False)
            for row in rows:
                t.add_row(*row)
            self._rich.print(t)
            return
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        for row in [header, *rows]:
            text = "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip()
            print("  " + text, file=self.stream, flush=True)

    def progress(self, text: str) -> None:
        """Show a changing status: a spinner line on a terminal, a new line when piped."""
        if self._rich is not None:
            if self._status is None:
                self._status = self._rich.status(text)
                self._status.start()
            else:
                self._status.update(text)
        elif text != self._last_plain:
            self._last_plain = text
            print(text, file=self.stream, flush=True)

    def end_progress(self) -> None:
        """Remove the live status line, if any."""
        if self._status is not None:
            self._status.stop()
            self._status = None
