"""What ``commscope analyze`` does once its arguments are parsed (the CLI parses them).

Loads and analyzes the folder, prints the report (or writes it with ``output``), and
writes the optional JSON / Perfetto / HTML files. A progress bar is drawn on a terminal
only (stderr is a TTY, ``COMMSCOPE_NO_RICH`` unset, rich importable, 16+ files); piped
output stays plain.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from commscope.analyze.analysis import analyze
from commscope.analyze.present.entries import format_entries
from commscope.analyze.present.export import write_html, write_perfetto
from commscope.analyze.present.report import format_report
from commscope.analyze.read.load import discover

__all__ = ["run_analyze", "progress_bar"]

_BAR_MIN_FILES = 16


@contextmanager
def progress_bar(enabled: bool | None = None) -> Iterator[Callable[[int, int], None] | None]:
    """A ``progress(done, total)`` callback drawing a rich bar on a terminal, else ``None``."""
    if enabled is None:
        enabled = sys.stderr.isatty() and not os.environ.get("COMMSCOPE_NO_RICH")
    if not enabled:
        yield None
        return
    try:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
    except ImportError:
        yield None
        return
    state: dict[str, object] = {}
    bar = Progress("reading dumps", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   transient=True, console=None)

    def update(done: int, total: int) -> None:
        if total < _BAR_MIN_FILES:
            return
        if "task" not in state:
            if done == 0:
                # Not before the first files are in: the reader processes are forked
                # by then, and a fork must not copy the bar's thread in mid-write.
                return
            bar.start()
            state["task"] = bar.add_task("read", total=total)
        bar.update(state["task"], completed=done)  # type: ignore[arg-type]

    try:
        yield update
    finally:
        if "task" in state:
            bar.stop()


def run_analyze(
    folder: str,
    *,
    output: str | None = None,
    as_json: bool = False,
    perfetto: str | None = None,
    html: str | None = None,
    prefix: str | None = None,
    world_size: int | None = None,
    jobs: int | None = None,
    straggler_ms: float = 50.0,
    entries: dict[str, Any] | None = None,
    all_groups: bool = False,
) -> int:
    """Run the analysis and write its outputs; return the exit code (0).

    ``entries`` (keyword arguments of :func:`~commscope.analyze.present.entries.format_entries`)
    appends the side-by-side view of each group's newest records to the text report.
    Raises ``FileNotFoundError`` for a missing folder and ``ValueError`` when it holds
    no file that looks like a dump, or when an ``entries`` filter matches nothing.
    """
    files, ignored = discover(folder, prefix)
    if not files:
        what = f"starting with {prefix!r}" if prefix else "ending in a rank number"
        seen = f" ({len(ignored)} other files ignored)" if ignored else ""
        raise ValueError(f"no dump files in {folder}: looked for names {what}, e.g. rank_0 "
                         f"or nccl_trace_rank_0{seen}")
    with progress_bar() as progress:
        result = analyze(folder, prefix=prefix, world_size=world_size, jobs=jobs,
                         progress=progress, straggler_ms=straggler_ms,
                         end_times=bool(perfetto or html))
    if os.path.isfile(folder) and not result.load.dumps and result.unreadable:
        # One file given, and it is not a dump: a usage error, not an analysis.
        raise ValueError(f"{folder}: {result.unreadable[0].error}")
    want_json = as_json or bool(output and output.endswith(".json"))
    text = (json.dumps(result.to_json(), indent=2) + "\n") if want_json else format_report(
        result, folder, all_groups=all_groups)
    if entries is not None and not want_json:
        text += "\n" + format_entries(result, **entries)
    if output:
        with open(output, "w", encoding="utf-8") as f:
            f.write(text)
        root = result.findings[0]
        print(f"{result.verdict}: {root.message}\nanalysis written to {output}")
    else:
        sys.stdout.write(text)
    if perfetto:
        write_perfetto(result, perfetto)
        print(f"timeline written to {perfetto} (open it in https://ui.perfetto.dev)",
              file=sys.stderr)
    if html:
        write_html(result, html)
        print(f"HTML report written to {html}", file=sys.stderr)
    return 0
