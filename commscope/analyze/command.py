"""What ``commscope analyze`` does once its arguments are parsed (the CLI parses them).

Loads and analyzes the folder (or several folders, dump files and archives, read as one
folder), prints the report (or writes it with ``output``), and writes the optional JSON
/ Perfetto / HTML files. A progress bar is drawn on a terminal only (stderr is a TTY,
``COMMSCOPE_NO_RICH`` unset, rich importable, 16+ files); piped output stays plain.
Unpacking an archive of 16 MiB or more is never silent: a bar on a terminal, else one
line on stderr.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from commscope.analyze.align.arrivals import STRAGGLER_MS
from commscope.analyze.analysis import Analysis, analyze
from commscope.analyze.present.entries import format_entries
from commscope.analyze.present.export import analysis_json, write_html, write_perfetto
from commscope.analyze.present.report import format_report
from commscope.analyze.read.archive import ARCHIVE_SUFFIXES, is_archive_name
from commscope.analyze.read.inputs import InputReport, Unpacking, check_paths
from commscope.analyze.read.load import discover, rank_in_name
from commscope.exitcodes import UNREADABLE, for_verdict

__all__ = ["run_analyze", "progress_bar", "unpack_progress", "UnreadableInput",
           "EntriesFilterError"]

_BAR_MIN_FILES = 16
_UNPACK_SHOWN_BYTES = 16 << 20
"""Archives from this size on are announced while unpacking."""
_INPUT_LINES = 20


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


@contextmanager
def unpack_progress(enabled: bool | None = None) -> Iterator[Unpacking]:
    """An ``unpacking(archive, done, total)`` callback: a rich bar of the archive's bytes
    on a terminal, else one line on stderr, for archives of 16 MiB or more."""
    if enabled is None:
        enabled = sys.stderr.isatty() and not os.environ.get("COMMSCOPE_NO_RICH")
    bar: Any = None
    if enabled:
        try:
            from rich.progress import BarColumn, DownloadColumn, Progress, TimeElapsedColumn

            bar = Progress("{task.description}", BarColumn(), DownloadColumn(),
                           TimeElapsedColumn(), transient=True)
        except ImportError:
            bar = None
    state: dict[str, Any] = {}

    def update(archive: str, done: int, total: int) -> None:
        if total < _UNPACK_SHOWN_BYTES:
            return
        if bar is None:
            if state.get("said") != archive:
                state["said"] = archive
                print(f"commscope analyze: unpacking {archive} ({total / 1e6:.0f} MB)",
                      file=sys.stderr, flush=True)
            return
        if state.get("task_of") != archive:
            if "task" not in state:
                bar.start()
            else:
                bar.remove_task(state["task"])
            state["task"] = bar.add_task(f"unpacking {os.path.basename(archive)}",
                                         total=total)
            state["task_of"] = archive
        bar.update(state["task"], completed=done)
        if done >= total:  # no drawing thread left when the readers are forked
            bar.stop()
            state.pop("task")
            state.pop("task_of")

    try:
        yield update
    finally:
        if "task" in state:
            bar.stop()


class UnreadableInput(ValueError):
    """No dump can be read from the inputs: a path that does not exist, that is neither a
    folder, a dump file nor an archive, or inputs that hold no file named like a dump
    (exit status :data:`~commscope.exitcodes.UNREADABLE`)."""


class EntriesFilterError(ValueError):
    """An ``--entries`` filter (ranks, groups) matches nothing: the request is wrong, not
    the dumps (a usage error)."""


def run_analyze(
    folder: str | Sequence[str],
    *,
    output: str | None = None,
    as_json: bool = False,
    perfetto: str | None = None,
    html: str | None = None,
    prefix: str | None = None,
    world_size: int | None = None,
    jobs: int | None = None,
    straggler_ms: float | None = None,
    stall_s: float = 10.0,
    entries: dict[str, Any] | None = None,
    all_groups: bool = False,
) -> int:
    """Run the analysis, write its outputs and return the exit status: the verdict's
    (:func:`commscope.exitcodes.for_verdict`), or
    :data:`~commscope.exitcodes.UNREADABLE` when no dump could be read at all.

    ``folder``: one folder or dump file as ever, or several folders, dump files and
    archives (``.tar``, ``.tar.gz``/``.tgz``, ``.zip``), read as one folder.
    ``entries`` (keyword arguments of :func:`~commscope.analyze.present.entries.format_entries`)
    appends the side-by-side view of each group's newest records to the text report.
    Raises :class:`UnreadableInput` for a missing path, a path that is neither a folder,
    a dump file nor a supported archive, or inputs with no file that looks like a dump;
    :class:`EntriesFilterError` when an ``entries`` filter matches nothing; ``OSError``
    when an output cannot be written.
    ``straggler_ms`` ``None``: the measured default
    (:data:`~commscope.analyze.align.arrivals.STRAGGLER_MS`).
    """
    paths = [folder] if isinstance(folder, str) else list(folder)
    try:
        result = _analyze_inputs(paths, prefix=prefix, world_size=world_size, jobs=jobs,
                                 straggler_ms=straggler_ms, stall_s=stall_s,
                                 end_times=bool(perfetto or html))
    except (FileNotFoundError, NotADirectoryError, ValueError) as exc:
        raise UnreadableInput(str(exc)) from None
    want_json = as_json or bool(output and output.endswith(".json"))
    reports: list[InputReport] = result.extra.get("inputs", [])
    text = (json.dumps(analysis_json(result), indent=2) + "\n") if want_json else _report(
        result, paths, reports, all_groups)
    if entries is not None and not want_json:
        try:
            text += "\n" + format_entries(result, **entries)
        except ValueError as exc:
            raise EntriesFilterError(str(exc)) from None
    _write(result, text, output=output, perfetto=perfetto, html=html)
    return UNREADABLE if not result.load.dumps else for_verdict(result.verdict)


def _analyze_inputs(paths: list[str], *, prefix: str | None, world_size: int | None,
                    jobs: int | None, straggler_ms: float | None, stall_s: float,
                    end_times: bool) -> Analysis:
    """Check the inputs, then analyze them as one folder; ``FileNotFoundError`` or
    ``ValueError`` when they hold nothing that looks like a dump."""
    if straggler_ms is None:
        straggler_ms = STRAGGLER_MS
    single = paths[0] if len(paths) == 1 and not is_archive_name(paths[0]) else None
    if single is not None:
        check_paths(paths)
        files, ignored = discover(single, prefix)
        if not files:
            raise ValueError(_no_dumps(single, prefix, len(ignored)))
    else:
        _check_inputs(paths)
    with progress_bar() as progress, unpack_progress() as unpacking:
        result = analyze(single if single is not None else paths, prefix=prefix,
                         world_size=world_size, jobs=jobs, progress=progress,
                         straggler_ms=straggler_ms, stall_s=stall_s, end_times=end_times,
                         unpacking=unpacking)
    reports: list[InputReport] = result.extra.get("inputs", [])
    if reports and not any(r.found for r in reports) and not result.load.unreadable:
        raise ValueError(_no_dumps(", ".join(paths), prefix, sum(r.ignored for r in reports)))
    if not result.load.dumps and result.unreadable and all(
            os.path.isfile(p) for p in paths) and not any(r.found for r in reports):
        # Only files given, none is a dump, no archive held one.
        raise ValueError("; ".join(f"{u.file}: {u.error}" for u in result.unreadable[:3]))
    return result


def _write(result: Analysis, text: str, *, output: str | None, perfetto: str | None,
           html: str | None) -> None:
    """The report to ``output`` (the verdict and root cause to stdout) or to stdout, then
    the Perfetto timeline and the HTML report where asked."""
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


def _no_dumps(where: str, prefix: str | None, ignored: int) -> str:
    what = f"starting with {prefix!r}" if prefix else "ending in a rank number"
    seen = f" ({ignored} other files ignored)" if ignored else ""
    return (f"no dump files in {where}: looked for names {what}, e.g. rank_0 "
            f"or nccl_trace_rank_0{seen}")


def _check_inputs(paths: list[str]) -> None:
    """Every path exists and is a folder, an archive or a file named like a dump."""
    check_paths(paths)
    for p in paths:
        if (len(paths) > 1 and os.path.isfile(p) and not is_archive_name(p)
                and rank_in_name(os.path.basename(p)) is None):
            raise ValueError(f"{p} is neither a folder, an archive "
                             f"({', '.join(ARCHIVE_SUFFIXES)}) nor a dump file (a name ending "
                             "in a rank number, e.g. rank_3)")


def _report(result: Analysis, paths: list[str], reports: list[InputReport],
            all_groups: bool) -> str:
    """The text report; with several inputs, its header names each and what it gave."""
    if len(paths) == 1:
        return format_report(result, paths[0], all_groups=all_groups)
    names = ", ".join(paths[:6]) + (f" and {len(paths) - 6} more" if len(paths) > 6 else "")
    head, _, rest = format_report(result, f"{len(paths)} inputs: {names}",
                                  all_groups=all_groups).partition("\n")
    shown = reports
    if len(reports) > _INPUT_LINES:  # those that gave nothing are always named
        shown = [r for r in reports if not r.ranks][:_INPUT_LINES]
        shown += [r for r in reports if r.ranks][:max(0, _INPUT_LINES - len(shown))]
    lines = [f"  {r.line()}" for r in shown]
    if len(shown) < len(reports):
        lines.append(f"  ... and {len(reports) - len(shown)} more inputs (see "
                     "result.extra['inputs'] from Python)")
    return "\n".join([head, *lines, rest])
