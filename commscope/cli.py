"""The ``commscope`` command: the only place that parses command-line arguments.

Each subcommand has one ``_add_<name>`` function that declares its options (with an
example in its ``--help``) and one ``_run_<name>`` function that calls the library.
Library code never sees ``argparse``. Bad input ends in one clear line on stderr and
exit code 2 (:class:`UsageError`), never a traceback. ``analyze`` and ``dump`` exit with
their verdict (:mod:`commscope.exitcodes`; ``--exit-zero``: 0).

One set of conventions across subcommands: one name per concept (``--world-size`` is
the job's rank count, ``-o/--output`` the main output, a duration names its unit:
``--stall-s``, ``--wait-s``, ``--timeout-s``, ``--straggler-ms``), upper-case noun
metavars (``FILE``, ``DIR``, ``N``, ``SECONDS``...), every default in ``--help``. A
renamed option keeps its old spelling as a hidden alias (:func:`_option`);
``tests/unit/test_cli_docs.py`` holds the docs and the parsers to each other.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from typing import Any

from commscope import __version__, exitcodes
from commscope.compat import TorchMissing, TorchTooOld, need_torch

__all__ = ["main", "build_parser", "UsageError"]


class UsageError(Exception):
    """A problem with what the user asked for: printed as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    """argparse with our exit convention: one line on stderr, code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(exitcodes.USAGE, f"{self.prog}: error: {message}\n")


def _formatter(prog: str) -> argparse.HelpFormatter:
    return argparse.RawDescriptionHelpFormatter(prog, max_help_position=32)


def _option(p: argparse.ArgumentParser, *names: str, old: Sequence[str] = (),
            compat: Sequence[str] = (), **kwargs: Any) -> argparse.Action:
    """``p.add_argument(*names, **kwargs)``, and hidden aliases of it: same destination,
    type and arity, no help line, no default of their own, nothing printed when used.
    ``old``: what the option was called before (marked ``renamed``: the docs' test keeps
    old spellings out of the docs); ``compat``: another tool's spelling (fr_trace's)."""
    action = p.add_argument(*names, **kwargs)
    alias_kwargs = {k: v for k, v in kwargs.items()
                    if k not in ("help", "default", "required", "dest")}
    for spellings, renamed in ((old, True), (compat, False)):
        if spellings:
            alias = p.add_argument(*spellings, dest=action.dest, default=argparse.SUPPRESS,
                                   help=argparse.SUPPRESS, **alias_kwargs)
            alias.renamed = renamed  # type: ignore[attr-defined]
    return action


def _exit_zero_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--exit-zero", action="store_true",
                   help="exit 0 whatever the verdict (still 2 for a usage error, 1 for an "
                   "internal one)")


def _fail(args: argparse.Namespace, message: str, code: int) -> int:
    """Say ``message`` in one line on stderr and return ``code``."""
    print(f"commscope {args.command}: error: {message}", file=sys.stderr)
    return code


# --------------------------------------------------------------------------- mesh


def _add_mesh(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "mesh",
        help="plan a device mesh of any size, with no processes",
        formatter_class=_formatter,
        description="Print the plan of a device mesh: groups per axis, one rank's "
        "coordinate and groups, which axes stay inside a host, and how many process "
        "groups each rank must create. No process is started.",
        epilog="example:\n"
        "  commscope mesh --world-size 16384 --shape 2,1024,8 --names dp,fsdp,tp "
        "--ranks-per-host 8 --rank 5",
    )
    p.add_argument("--shape", required=True, metavar="SIZES", help="axis sizes, e.g. 2,4")
    p.add_argument("--names", metavar="NAMES",
                   help="axis names, e.g. dp,tp (default: dim_0,dim_1,...)")
    _option(p, "--world-size", old=["--world"], type=int, metavar="N",
            help="ranks in the job (default: the product of --shape)")
    p.add_argument("--ranks-per-host", type=int, metavar="N", help="ranks per host "
                   "(default: 8)")
    p.add_argument("--rank", type=int, default=0, metavar="N",
                   help="the rank to show (default: 0)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(run=_run_mesh)


def _run_mesh(args: argparse.Namespace) -> int:
    from commscope.mesh.plan import (
        AXIS_COLUMNS,
        format_plan,
        plan_mesh,
        plan_parts,
        plan_to_json,
    )

    shape = _int_list(args.shape, "--shape")
    names = _name_list(args.names, "--names") if args.names else None
    try:
        plan = plan_mesh(
            shape,
            names,
            world_size=args.world_size,
            rank=args.rank,
            ranks_per_host=args.ranks_per_host,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    from commscope.console import Console, use_rich

    if args.json or not use_rich(sys.stdout):
        print(plan_to_json(plan) if args.json else format_plan(plan))
        return 0
    heading, rows, rest = plan_parts(plan)  # a terminal: the axis table drawn by rich
    con = Console(sys.stdout)
    con.line("\n".join(heading))
    con.table(AXIS_COLUMNS, rows)
    con.line("\n".join(rest))
    return 0


# --------------------------------------------------------------------------- demo


def _add_demo(sub: argparse._SubParsersAction) -> None:
    from commscope.demo.faults import FAULTS

    p = sub.add_parser(
        "demo",
        help="run the end-to-end demo on local CPU ranks",
        formatter_class=_formatter,
        description="Launch local CPU ranks with gloo: build a (2, N/2) mesh, trace a "
        "tensor-parallel MLP with CommDebugMode, train a few steps with the flight "
        "recorder on, inject a fault on rank 3, dump every rank and analyze the dumps. "
        "Exits 0 when the analysis names the injected fault, 1 when it does not.",
        epilog="examples:\n  commscope demo\n  commscope demo --fault size -o /tmp/demo\n\n"
        "exit status: 0 the analysis names the injected fault, 1 it does not, 2 usage "
        "error, 3 no usable torch",
    )
    _option(p, "--world-size", old=["--ranks"], type=int, default=4, metavar="N",
            help="local ranks, even, >= 4 (default: 4)")
    p.add_argument("--fault", choices=FAULTS, default="missing", metavar="NAME",
                   help=f"what rank 3 does wrong: {', '.join(FAULTS)} (default: missing = "
                   "skips an all_reduce on dp)")
    _option(p, "-o", "--output", old=["--out"], default="commscope_demo", metavar="DIR",
            help="output folder (default: ./commscope_demo)")
    _option(p, "--timeout-s", old=["--timeout"], type=float, default=5.0, metavar="SECONDS",
            help="flight-recorder watchdog timeout (default: 5)")
    p.add_argument("--watch", action="store_true",
                   help="also show commscope watch's live verdict as the job runs and stalls")
    p.set_defaults(run=_run_demo)


def _run_demo(args: argparse.Namespace) -> int:
    need_torch('commscope demo (local gloo ranks)')
    from commscope.demo.run import run_demo

    if args.world_size < 4 or args.world_size % 2:
        raise UsageError(f"--world-size must be an even number >= 4, got {args.world_size}")
    if args.timeout_s <= 0:
        raise UsageError(f"--timeout-s must be > 0 seconds, got {args.timeout_s}")
    return run_demo(ranks=args.world_size, fault=args.fault, out=args.output,
                    timeout_s=args.timeout_s, watch=args.watch)


# --------------------------------------------------------------------------- view


def _add_view(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "view",
        help="write the offline HTML viewer for a comm-trace JSON dump",
        formatter_class=_formatter,
        description="Write one self-contained HTML page (no network) showing a "
        "CommDebugMode JSON dump: the module tree, each module's forward and backward "
        "collectives with counts, bytes and mesh axis, parameters and their sharding, and "
        "the ops at noise level >= 1. Reads commscope's dumps and PyTorch's. Without a "
        "dump (or with --blank) the page is blank and loads a dump dropped onto it.",
        epilog="examples:\n"
        "  commscope view comm_mode_log.json -o comm.html --open\n"
        "  commscope view --blank -o viewer.html",
    )
    p.add_argument("dump", nargs="?", metavar="FILE",
                   help="JSON written by generate_json_dump()")
    p.add_argument("-o", "--output", metavar="FILE", help="HTML file to write (default: the "
                   "dump's name with .html, or commscope_viewer.html for a blank page)")
    p.add_argument("--blank", action="store_true", help="write the blank drop-a-file page")
    p.add_argument("--open", action="store_true", help="open the page in a web browser")
    p.set_defaults(run=_run_view)


def _run_view(args: argparse.Namespace) -> int:
    import json
    import os

    from commscope.comm.present.viewer import write_viewer

    data = None
    if args.dump and args.blank:
        raise UsageError(f"give a dump or --blank, not both (got {args.dump!r} and --blank)")
    if args.dump:
        try:
            with open(args.dump, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            raise UsageError(f"no such file: {args.dump}") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise UsageError(f"cannot read {args.dump} as JSON: {exc}") from None
        from commscope.comm.trace.schema import is_comm_dump

        if not is_comm_dump(data):
            got = f"keys {sorted(data)[:5]}" if isinstance(data, dict) else type(data).__name__
            raise UsageError(
                f"{args.dump} is not a CommDebugMode JSON dump (expected an object with "
                f"'fqn' and 'children', got {got}); write one with generate_json_dump()"
            )
    default = "commscope_viewer.html"
    if args.dump:
        default = os.path.splitext(args.dump)[0] + ".html"
    output = args.output or default
    title = f"commscope comm trace: {os.path.basename(args.dump)}" if args.dump else None
    try:
        write_viewer(output, data, title=title)
    except ValueError as exc:
        raise UsageError(f"{args.dump}: {exc}") from None
    except OSError as exc:
        raise UsageError(f"cannot write {output}: {exc}") from None
    print(output)
    if args.open:
        import webbrowser

        webbrowser.open("file://" + os.path.abspath(output))
    return 0


# --------------------------------------------------------------------------- diff


def _add_diff(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "diff",
        help="compare two comm-trace JSON dumps: what a change added to communication",
        formatter_class=_formatter,
        description="Compare two CommDebugMode JSON dumps (A before, B after; commscope's "
        "or PyTorch's) per module, phase, collective and mesh axis: calls and bytes on "
        "each side, the change, and the estimated time change at a bus bandwidth "
        "(nccl-tests model, decimal GB/s), biggest change first. Each collective counts "
        "once, at the module it is charged to. PyTorch's dumps have counts only: their "
        "bytes and axes show as '?'. Exit status: 0, or 1 when --fail-on-increase trips, "
        "2 for unreadable input.",
        epilog="examples:\n"
        "  commscope diff before.json after.json\n"
        "  commscope diff before.json after.json --html diff.html --bandwidth-gbps 400\n"
        "  commscope diff before.json after.json --json --all -o diff.json\n"
        "  commscope diff main.json pr.json --fail-on-increase 5   # in CI",
    )
    p.add_argument("a", metavar="A", help="the dump before the change")
    p.add_argument("b", metavar="B", help="the dump after the change")
    p.add_argument("-o", "--output", metavar="FILE", help="write the comparison (text, or "
                   "JSON with --json or a .json name) to this file (default: stdout)")
    p.add_argument("--json", action="store_true",
                   help="print the comparison as JSON (format commscope.comm.diff/1)")
    p.add_argument("--bandwidth-gbps", type=float, default=100.0, metavar="GBPS",
                   help="bus bandwidth for time estimates, decimal GB/s (default: 100)")
    p.add_argument("--all", action="store_true", help="also show rows that did not change")
    p.add_argument("--html", metavar="FILE", help="also write an offline page showing A and "
                   "B side by side, changes highlighted")
    p.add_argument("--fail-on-increase", type=float, metavar="PERCENT",
                   help="exit 1 when B's total estimated time (its link traffic: bytes x "
                   "bus-bandwidth factor) exceeds A's by more than PERCENT; total calls "
                   "when a dump is PyTorch's (default: never)")
    p.set_defaults(run=_run_diff)


def _run_diff(args: argparse.Namespace) -> int:
    import json
    import math

    from commscope.comm.present.compare import diff
    from commscope.comm.present.compare_report import diff_to_json, format_diff, growth_text
    from commscope.comm.present.compare_types import DiffInputError
    from commscope.comm.present.compare_viewer import write_diff_viewer
    from commscope.console import use_rich

    if not (args.bandwidth_gbps > 0 and math.isfinite(args.bandwidth_gbps)):
        raise UsageError(f"--bandwidth-gbps must be a number > 0, got {args.bandwidth_gbps}")
    limit = args.fail_on_increase
    if limit is not None and not (limit >= 0 and math.isfinite(limit)):
        raise UsageError(f"--fail-on-increase must be a percentage >= 0, got {limit}")
    try:
        d = diff(args.a, args.b, bandwidth_gbps=args.bandwidth_gbps)
    except DiffInputError as exc:
        raise UsageError(str(exc)) from None
    if args.html:
        try:
            write_diff_viewer(args.html, d)
        except OSError as exc:
            raise UsageError(f"cannot write {args.html}: {exc}") from None
    as_json = args.json or (args.output or "").endswith(".json")
    if args.output:
        text = (json.dumps(diff_to_json(d, unchanged=args.all), indent=2) + "\n" if as_json
                else format_diff(d, unchanged=args.all, hint="--all to show"))
        _write_text(args.output, text)
        print(f"wrote {args.output}")
    elif as_json:
        print(json.dumps(diff_to_json(d, unchanged=args.all), indent=2))
    elif use_rich(sys.stdout):
        _print_diff_rich(d, args.all)
    else:
        print(format_diff(d, unchanged=args.all, hint="--all to show"), end="")
    if args.html:
        print(f"wrote {args.html}", file=sys.stderr if as_json and not args.output
              else sys.stdout)
    if limit is not None and d.growth().percent > limit:
        print(f"commscope diff: {growth_text(d)}, more than --fail-on-increase {limit:g}%",
              file=sys.stderr)
        return 1
    return 0


def _write_text(path: str, text: str) -> None:
    """Write ``text`` to ``path``; a path that cannot be written is a usage error."""
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc}") from None


def _print_diff_rich(d: Any, unchanged: bool) -> None:
    """The diff on a terminal: a rich table at its natural width (never cropped),
    numbers right-aligned, increases red, decreases green."""
    import shutil

    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from commscope.comm.present.compare_report import diff_columns, diff_parts

    columns = diff_columns(d)
    heading, rows, _, rest = diff_parts(d, unchanged=unchanged, hint="--all to show")
    widths = [max(len(r[i]) for r in [columns, *rows]) for i in range(len(columns))]
    width = max(shutil.get_terminal_size().columns, sum(widths) + 2 * len(widths))
    con = Console(file=sys.stdout, highlight=False, width=width)
    con.print(Text("\n".join(heading)))
    if rows:
        table = Table(box=None, pad_edge=False, show_edge=False)
        for i, name in enumerate(columns):
            table.add_column(name, justify="left" if i < 4 else "right", no_wrap=True)
        for row in rows:
            cells = []
            for name, text in zip(columns, row):
                style = ""
                if "+/-" in name and text[:1] in ("+", "-"):
                    style = "red" if text[0] == "+" else "green"
                cells.append(Text(text, style=style))
            table.add_row(*cells)
        con.print(table)
        con.print()
    con.print(Text("\n".join(rest)))


# --------------------------------------------------------------------------- analyze


def _add_analyze(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "analyze",
        help="say why a distributed job is stuck, from every rank's flight-recorder dump",
        formatter_class=_formatter,
        description="Read every rank's flight-recorder dump in a folder (PyTorch's native "
        "pickles and commscope's pickle/JSON, optionally .gz; names like rank_<N>, "
        "nccl_trace_rank_<N>, comm_traces/rank_<N>), line up each group's collectives "
        "across ranks and report, root cause first: missing or crashed ranks, op/size/"
        "dtype/order mismatches, unmatched p2p, cross-group deadlocks, stragglers. "
        "Several folders, dump files and archives (.tar, .tar.gz/.tgz, .zip: one per "
        "host, say) are read as one folder. Needs no torch. Unreadable files and "
        "refused archive members are named and skipped. PyTorch's fr_trace command lines "
        "work too: -d DIR, -j/--just_print_entries, --selected-ranks, --pg-filters, "
        "--allow-incomplete-ranks.",
        epilog="examples:\n"
        "  commscope analyze ./commscope_traces\n"
        "  commscope analyze hostA/commscope_traces hostB.tar.gz hostC.zip\n"
        "  commscope analyze -d /tmp/dumps -o analysis.txt\n"
        "  commscope analyze dumps/ --json --perfetto trace.json --html report.html\n"
        "  commscope analyze dumps/ --prefix nccl_trace_rank_ --world-size 8\n"
        "  commscope analyze dumps/ --entries 5 --ranks 0-3 --group mesh_dp\n"
        "  commscope analyze -d dumps/ -j --selected-ranks 0 3 --pg-filters dp   # fr_trace's\n"
        "  commscope analyze dumps/ --exit-zero   # in a script that must not stop here\n\n"
        + exitcodes.help_table(),
    )
    _analyze_input_options(p)
    _analyze_output_options(p)
    _analyze_threshold_options(p)
    _analyze_entries_options(p)
    _exit_zero_option(p)
    p.set_defaults(run=_run_analyze, entries_dirs=())


def _analyze_input_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("folder", nargs="*", metavar="DIR",
                   help="folder of dumps (or one dump file); several folders, dump files and "
                   "archives (.tar, .tar.gz, .tgz, .zip) are read as one folder")
    p.add_argument("-d", "--dir", dest="dir", metavar="DIR",
                   help="the folder, as PyTorch's fr_trace takes it")
    p.add_argument("-p", "--prefix", metavar="PREFIX", help="only files whose name starts "
                   "with this prefix (default: every name ending in a rank number)")
    p.add_argument("--world-size", type=int, metavar="N", help="ranks in the job, when the "
                   "dumps cannot tell, e.g. gloo dumps and a rank with no file (default: what "
                   "the dumps say)")
    p.add_argument("--jobs", type=int, metavar="N", help="processes reading files (default: "
                   "one per CPU, up to 8, from 64 files or 32 MB of dumps on)")
    p.add_argument("--allow-incomplete-ranks", action="store_true", help=argparse.SUPPRESS)


def _analyze_output_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", metavar="FILE", help="write the report (text, or JSON "
                   "with --json or a .json name) to this file (default: stdout)")
    p.add_argument("--json", action="store_true",
                   help="the analysis as JSON (format commscope.analysis/2)")
    p.add_argument("--perfetto", metavar="FILE",
                   help="also write a Perfetto/Chrome timeline (open in ui.perfetto.dev)")
    p.add_argument("--html", metavar="FILE", help="also write an offline HTML report")
    p.add_argument("--all-groups", action="store_true",
                   help="list every group in the groups table (without it, one-member groups "
                   "that recorded nothing, such as mesh axes of size 1, are counted, and at "
                   "most 40 groups are listed)")


def _analyze_threshold_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--straggler-ms", type=float, default=None, metavar="MS",
                   help="median lag from which a rank that keeps arriving last is reported "
                   "(default: 30, measured on real jobs: docs/analyze.md)")
    p.add_argument("--stall-s", type=float, default=10.0, metavar="SECONDS",
                   help="in dumps asked for while the job ran (API, commscope dump, SIGUSR1), "
                   "an op unfinished for less than this was caught in flight, not stuck "
                   "(default: 10)")


_ENTRIES_LAST = 8
"""``--entries`` without a number: the newest 8 (the analyzer's ``DEFAULT_LAST``)."""


class _CountOrDir(argparse.Action):
    """``--entries [N]``: the word after it is the count when it is a number, else a
    folder to analyze (``--entries DIR``), the count then being the default."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        count = self.const
        if values is not None:
            try:
                count = int(values)
            except ValueError:
                namespace.entries_dirs = (*namespace.entries_dirs, values)
        setattr(namespace, self.dest, count)


def _analyze_entries_options(p: argparse.ArgumentParser) -> None:
    # fr_trace's -j/--just_print_entries take no number; ours may
    _option(p, "--entries", compat=["-j", "--just_print_entries", "--just-print-entries"],
            action=_CountOrDir, nargs="?", const=_ENTRIES_LAST, metavar="N",
            help="also print the newest N collectives of each group side by side across its "
            "ranks, agreeing ranks folded (default: 8; fr_trace's -j/--just_print_entries)")
    _option(p, "--ranks", compat=["--selected-ranks"], nargs="+", metavar="SPEC",
            help="with --entries: only these ranks, e.g. 0-3,7 or 0 1 2 3 7 (default: all)")
    _option(p, "--group", compat=["--pg-filters"], action="extend", nargs="+", metavar="NAME",
            help="with --entries: only these groups, by name or description (default: all)")


def _entries_options(args: argparse.Namespace) -> dict[str, Any] | None:
    """``--entries N [--ranks SPEC] [--group NAME]`` as keyword arguments, checked."""
    from commscope.analyze.present.entries import parse_rank_spec

    if args.entries is None:
        if args.ranks is not None or args.group:
            raise UsageError("--ranks and --group choose what --entries shows: add --entries")
        return None
    if args.entries < 1:
        raise UsageError(f"--entries must be >= 1, got {args.entries}")
    if args.json or (args.output or "").endswith(".json"):
        raise UsageError("--entries adds a text table to the report: it cannot go into --json")
    try:
        ranks = parse_rank_spec(",".join(args.ranks)) if args.ranks is not None else None
    except ValueError as exc:
        hint = ("; put the folder before --ranks" if any(os.path.exists(t) for t in args.ranks)
                else "")
        raise UsageError(f"--ranks: {exc}{hint}") from None
    return {"last": args.entries, "ranks": ranks, "groups": args.group}


def _analyze_folders(args: argparse.Namespace) -> list[str]:
    """The inputs: the positional folders (and any that ``--entries`` took), or ``-d``."""
    given = [*args.folder, *args.entries_dirs]
    if given and args.dir and given != [args.dir]:
        got = " ".join(repr(f) for f in given)
        raise UsageError(f"give the folder once: got {got} and -d {args.dir!r}")
    folder = given or ([args.dir] if args.dir else [])
    if not folder:
        raise UsageError("give the folder of dumps: commscope analyze DIR [DIR ...] (or -d DIR)")
    return folder


def _run_analyze(args: argparse.Namespace) -> int:
    from commscope.analyze.command import EntriesFilterError, UnreadableInput, run_analyze

    entries = _entries_options(args)  # first: --ranks may have swallowed the folder
    folder = _analyze_folders(args)
    if args.world_size is not None and args.world_size < 1:
        raise UsageError(f"--world-size must be >= 1, got {args.world_size}")
    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs must be >= 1, got {args.jobs}")
    if args.stall_s <= 0:
        raise UsageError(f"--stall-s must be > 0 seconds, got {args.stall_s}")
    try:
        return run_analyze(
            folder if len(folder) > 1 else folder[0],
            output=args.output,
            as_json=args.json,
            perfetto=args.perfetto,
            html=args.html,
            prefix=args.prefix,
            world_size=args.world_size,
            jobs=args.jobs,
            straggler_ms=args.straggler_ms,
            stall_s=args.stall_s,
            entries=entries,
            all_groups=args.all_groups,
        )
    except UnreadableInput as exc:
        return _fail(args, str(exc), exitcodes.UNREADABLE)
    except EntriesFilterError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"cannot write output: {exc}") from None


# --------------------------------------------------------------------------- run


def _add_run(sub: argparse._SubParsersAction) -> None:
    # "+" as the option prefix: every "-" argument belongs to torchrun or the script.
    p = sub.add_parser(
        "run",
        help="launch a script with torchrun and the flight recorder on, script unchanged",
        formatter_class=_formatter,
        prefix_chars="+",
        add_help=False,
        usage="commscope run [-h] [OPTION ...] SCRIPT [ARG ...]\n"
        "       commscope run [-h] [OPTION ...] -m MODULE [ARG ...]",
        description="Run torchrun with every worker recording every collective of every "
        "process group. Takes torchrun's arguments (OPTION), every one passed to torchrun as it is "
        "(`torchrun --help` lists them: --nproc-per-node, --nnodes, --node-rank, "
        "--rdzv-backend, --rdzv-endpoint, --rdzv-id, --standalone, --max-restarts, -m, "
        "...), then the script and its arguments, untouched. On a hang (timeout, "
        "COMMSCOPE_FR_TIMEOUT_S or the group's own) every rank writes <prefix><rank>; "
        "SIGTERM, SIGUSR1 and uncaught exceptions dump too. Settings come from PyTorch's "
        "variables: TORCH_FR_BUFFER_SIZE, TORCH_FR_DUMP_TEMP_FILE (default: "
        "./commscope_traces/rank_; COMMSCOPE_FR_DUMP_PREFIX wins over it, to keep ours apart "
        "from PyTorch's own NCCL dumps), TORCH_NCCL_ENABLE_TIMING, TORCH_NCCL_DUMP_ON_TIMEOUT; "
        "COMMSCOPE_RUN_REPORT=0 turns off the job log's incident report.",
        epilog="options of its own:\n"
        "  -h, --help   show this help (as the first argument only; later, it is "
        "torchrun's or the script's)\n"
        "every other argument is torchrun's, or the script's after it.\n\n"
        "examples:\n"
        "  commscope run --nproc-per-node 4 train.py --epochs 1\n"
        "  COMMSCOPE_FR_TIMEOUT_S=60 commscope run --nproc-per-node 8 -m my.trainer\n"
        "  commscope analyze ./commscope_traces\n\n"
        "exit status: torchrun's (the job's); 2 usage error (no script, --no-python); "
        "3 no usable torch",
    )
    p.add_argument("torchrun_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    p.set_defaults(run=_run_run, run_parser=p)


def _run_run(args: argparse.Namespace) -> int:
    need_torch('commscope run (torchrun with the recorder)')
    from commscope.flight.launch import run, torchrun_command

    argv = list(args.torchrun_args)
    if not argv or argv[0] in ("-h", "--help"):
        args.run_parser.print_help(sys.stdout)
        return 0 if argv else 2
    try:
        torchrun_command(argv)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return run(argv)


def _add_exec(sub: argparse._SubParsersAction) -> None:
    # "+" as the option prefix: after -m/--module, every argument belongs to the script.
    p = sub.add_parser(
        "exec",
        help="record one rank started by srun, mpirun or a Kubernetes operator, script "
        "unchanged",
        formatter_class=_formatter,
        prefix_chars="+",
        add_help=False,
        usage="commscope exec [-h] SCRIPT [ARG ...]\n"
        "       commscope exec [-h] -m MODULE [ARG ...]",
        description="Run SCRIPT in this process as `python SCRIPT ARGS` would (`-m MODULE`: "
        "as `python -m MODULE`), with the flight recorder on, as one rank of a job that "
        "another launcher started (one process per rank, no torchrun). torch's RANK, "
        "WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT are filled "
        "from Slurm's (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, the first host of "
        "SLURM_JOB_NODELIST, a port from SLURM_JOB_ID) or MPI's (OMPI_COMM_WORLD_*, "
        "PMI_RANK/PMI_SIZE; MASTER_ADDR must be given) where they are not set; a "
        "variable already set is never replaced. Dumps, watch and the watch file on "
        "every host work as under `commscope run` (docs/hosts.md).",
        epilog="options of its own (first, before the script):\n"
        "  -h, --help             show this help\n"
        "  -m, --module MODULE    run a module, as python -m MODULE\n"
        "every argument after SCRIPT or MODULE is the script's.\n\n"
        "examples:\n"
        "  srun --ntasks-per-node 8 commscope exec train.py --epochs 1\n"
        "  mpirun -np 16 -x MASTER_ADDR=node1 commscope exec train.py\n"
        "  commscope exec -m my.trainer          # in a PyTorchJob container\n\n"
        "exit status: the script's; 2 usage error; 3 no usable torch",
    )
    p.add_argument("exec_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    p.set_defaults(run=_run_exec, run_parser=p)


def _run_exec(args: argparse.Namespace) -> int:
    argv = list(args.exec_args)
    if not argv or argv[0] in ("-h", "--help"):
        args.run_parser.print_help(sys.stdout)
        return 0 if argv else 2
    module = argv[0] in ("-m", "--module")
    if module:
        argv = argv[1:]
        if not argv:
            raise UsageError("-m needs a module name; usage: commscope exec -m MODULE [ARGS]")
    elif argv[0].startswith("-"):
        raise UsageError(f"unknown option {argv[0]!r}; usage: commscope exec [-m MODULE | "
                         f"SCRIPT] [ARG ...]")
    target, rest = argv[0], argv[1:]
    if not module and not os.path.isfile(target):
        raise UsageError(f"no such script: {target}")
    need_torch("commscope exec (the recorder in this rank)")
    from commscope.flight.exec import exec_target, prepare_env
    from commscope.flight.launcher_env import LauncherEnvError

    try:
        prepare_env()
    except LauncherEnvError as exc:
        raise UsageError(str(exc)) from None
    exec_target(target, rest, module=module)
    return 0


def _add_watch(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "watch",
        help="see a running job's collectives live, and why it is stuck, without stopping it",
        formatter_class=_formatter,
        description="Attach to a running job whose ranks record with commscope (commscope "
        "run, or flight.enable()) and publish progress every COMMSCOPE_WATCH_INTERVAL_S "
        "(default 2 s) into the job's own store. Shows per-group progress and lag, the "
        "slowest ranks and the live verdict of the same analysis as `commscope analyze`. "
        "Leaving never touches the job.",
        epilog="examples:\n"
        "  commscope watch                         # reads commscope_traces/watch.json\n"
        "  commscope watch --once --json           # one snapshot for scripts\n"
        "  commscope watch --web                   # a local page, 127.0.0.1 only\n"
        "  commscope watch --store HOST:PORT --token TOKEN   # both from any host's "
        "watch.json\n"
        "                                          # (not the rendezvous endpoint)\n\n"
        "exit status: 0 after --once or when you leave (Ctrl-C); 1 the job cannot be "
        "reached, has ended or went away while watched; 2 usage error; 3 no usable torch "
        "(watch gives no verdict in its status: commscope dump does)",
    )
    _address_options(p)
    p.add_argument("--once", action="store_true", help="print one snapshot and leave")
    p.add_argument("--json", action="store_true", help="with --once: the snapshot as JSON")
    p.add_argument("--web", action="store_true",
                   help="serve the live view as a local web page (read-only, token in the URL)")
    p.add_argument("--host", default="127.0.0.1", metavar="HOST",
                   help="with --web: the address the page binds to (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=0, metavar="PORT",
                   help="with --web: the page's port (default: 0, any free one)")
    p.add_argument("--stall-s", type=float, default=None, metavar="SECONDS",
                   help="an op unfinished this long means stuck (default: 2 publishing "
                   "intervals)")
    p.set_defaults(run=_run_watch)


def _address_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", metavar="HOST:PORT", help="the job's store, torchrun's "
                   "MASTER_ADDR:MASTER_PORT (default: the watch file's)")
    p.add_argument("--token", default=None, metavar="TOKEN",
                   help="the job's watch token (default: the watch file's)")
    p.add_argument("--file", default=None, metavar="FILE", help="the watch file the first "
                   "rank of each host writes (default: commscope_traces/watch.json)")


def _run_watch(args: argparse.Namespace) -> int:
    if args.json and not args.once:
        raise UsageError("--json prints one snapshot: add --once")
    if args.stall_s is not None and args.stall_s <= 0:
        raise UsageError(f"--stall-s must be > 0 seconds, got {args.stall_s}")
    _torch_installed("commscope watch (it talks to the job's store)")
    address = _job_address(args)
    if address is None:
        return 1
    need_torch("commscope watch (it talks to the job's store)")
    from commscope.watch.command import run_watch

    return run_watch(address, once=args.once, as_json=args.json, web=args.web,
                     host=args.host, port=args.port, stall_s=args.stall_s)


def _add_dump(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "dump",
        help="ask every rank of a running job for its flight-recorder dump, then analyze",
        formatter_class=_formatter,
        description="Asks every rank of a running job (through its store) to write its "
        "dump now, waits for the files and prints `commscope analyze`'s report, or, when "
        "some files are on other hosts, the verdict of every rank's live record. The job "
        "keeps running. Exits with the verdict, as `commscope analyze` does.",
        epilog="examples:\n"
        "  commscope dump                          # reads commscope_traces/watch.json\n"
        "  commscope dump --file /shared/job42/traces/watch.json --wait-s 120\n"
        "  commscope dump --exit-zero              # in a script that must not stop here\n\n"
        + exitcodes.help_table()
        + "\n(7 here also: the job cannot be reached, or no rank wrote a dump)",
    )
    _address_options(p)
    p.add_argument("--wait-s", type=float, default=60.0, metavar="SECONDS",
                   help="how long to wait for the files (default: 60)")
    _exit_zero_option(p)
    p.set_defaults(run=_run_dump)


def _run_dump(args: argparse.Namespace) -> int:
    feature = "commscope dump (it talks to the job's store)"
    try:
        _torch_installed(feature)
    except (TorchMissing, TorchTooOld) as exc:  # not 3: that status means "incomplete"
        raise UsageError(str(exc)) from None
    address = _job_address(args)
    if address is None:
        return exitcodes.UNREADABLE
    try:
        need_torch(feature)
    except (TorchMissing, TorchTooOld) as exc:
        raise UsageError(str(exc)) from None
    from commscope.watch.command import run_dump

    return run_dump(address, wait_s=args.wait_s)


def _add_job_log(sub: argparse._SubParsersAction) -> None:
    # not listed (no help=): `commscope run` starts it beside torchrun on every host
    p = sub.add_parser(
        "job-log",
        formatter_class=_formatter,
        description="Started by `commscope run` beside torchrun: when the job hangs or "
        "fails, print into the job's log where this host's ranks dumped and, on rank 0's "
        "host, the whole-job verdict from every rank's live record with every dump as "
        "host:folder (docs/hosts.md). Reads `end RC` from stdin when the job ended.",
    )
    p.add_argument("--file", required=True, metavar="FILE", help="this host's watch file")
    p.add_argument("--since-ns", type=int, default=0, metavar="NS",
                   help="ignore a watch file and this host's dumps older than this time, "
                   "in ns since the epoch (default: 0)")
    p.add_argument("--local-ranks", type=int, default=0, metavar="N",
                   help="how many ranks run on this host (default: 0, unknown)")
    p.add_argument("--settle-s", type=float, default=5.0, metavar="SECONDS",
                   help="how long to wait for every rank's dump note after an incident "
                   "(default: 5)")
    p.add_argument("--poll-s", type=float, default=1.0, metavar="SECONDS",
                   help="how often to look for an incident (default: 1)")
    p.set_defaults(run=_run_job_log)


def _run_job_log(args: argparse.Namespace) -> int:
    if args.settle_s < 0 or args.poll_s <= 0:
        raise UsageError(f"--settle-s must be >= 0 and --poll-s > 0, got {args.settle_s} "
                         f"and {args.poll_s}")
    from commscope.watch.joblog import run_job_log

    return run_job_log(args.file, since_ns=args.since_ns, local_ranks=args.local_ranks,
                       settle_s=args.settle_s, poll_s=args.poll_s)


def _torch_installed(feature: str) -> None:
    """Say torch is missing before anything else (without importing it when present)."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        need_torch(feature)  # raises TorchMissing, which names what to install


def _job_address(args: argparse.Namespace) -> Any:
    """The running job's address from --store/--token/--file, once something listens
    there; ``None`` (after one sentence on stderr) when the watch file cannot be used or
    the job has ended; a bad --store is a usage error. Imports no torch: a job that has
    ended is told in milliseconds, with none of torch's connection retries."""
    from commscope.watch.address import WatchError, check_listening, resolve_address

    try:
        address = resolve_address(args.store, args.token, args.file)
    except WatchError as exc:
        if args.store:
            raise UsageError(str(exc)) from None
        print(f"commscope {args.command}: {exc}", file=sys.stderr)
        return None
    try:
        check_listening(address)
    except WatchError as exc:
        print(f"commscope {args.command}: {exc}", file=sys.stderr)
        return None
    # torch's store client logs every failed reconnect as a C++ warning: a job that ends
    # while watched gets our one sentence, not pages of them
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    return address


# --------------------------------------------------------------------------- helpers


def _int_list(text: str, option: str) -> list[int]:
    parts = [part.strip() for part in re.split(r"[,x]", text)]
    if not all(part.isdigit() for part in parts):
        raise UsageError(f"{option} wants integers separated by commas, e.g. 2,4; got {text!r}")
    return [int(part) for part in parts]


def _name_list(text: str, option: str) -> list[str]:
    names = [part.strip() for part in text.split(",")]
    if any(not n for n in names):
        raise UsageError(f"{option} has an empty name in {text!r}")
    return names


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``commscope`` and all its subcommands."""
    parser = _Parser(
        prog="commscope",
        description="See your distributed PyTorch job: meshes, collectives, hangs.",
        formatter_class=_formatter,
    )
    parser.add_argument("--version", action="version", version=f"commscope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    _add_demo(sub)
    _add_mesh(sub)
    _add_view(sub)
    _add_diff(sub)
    _add_analyze(sub)
    _add_run(sub)
    _add_exec(sub)
    _add_watch(sub)
    _add_dump(sub)
    _add_job_log(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``commscope`` with ``argv`` (default ``sys.argv[1:]``); return the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help(sys.stdout)
        return 0
    try:
        code = int(args.run(args) or 0)
    except UsageError as exc:
        return _fail(args, str(exc), exitcodes.USAGE)
    except (TorchMissing, TorchTooOld) as exc:
        print(f"commscope {args.command}: {exc}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader (`| head`) went away: not an error of ours.
        sys.stderr.close()
        return 0
    return exitcodes.exit_zero(code) if getattr(args, "exit_zero", False) else code
