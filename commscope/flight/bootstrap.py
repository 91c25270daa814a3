"""Run a training script as ``__main__`` with the flight recorder enabled.

``commscope run`` starts ``torchrun ... -m commscope.flight.bootstrap SCRIPT ARGS`` so
every worker executes this module first: it enables recording (settings from the
environment, see :mod:`commscope.flight.config`), then runs ``SCRIPT`` exactly as
``python SCRIPT ARGS`` would (``sys.argv``, ``sys.path[0]`` and ``__name__`` as usual).
The user's script is not changed. ``--module NAME`` runs a module as ``python -m NAME``.
``commscope exec`` (:mod:`commscope.flight.exec`) runs the same :func:`run_target` in a
process some other launcher started.
"""

from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Mapping, Sequence

__all__ = ["main", "run_target", "banner"]

USAGE = "usage: python -m commscope.flight.bootstrap [--module] SCRIPT_OR_MODULE [ARGS...]"


def banner(env: Mapping[str, str]) -> str:
    """The one line rank 0 prints when ``commscope run`` starts a job: that recording is
    on, for how many ranks, where the dumps go and how to watch it."""
    from commscope.flight.config import resolve_config

    config = resolve_config(env=env)
    world = env.get("WORLD_SIZE", "?")
    prefix = os.path.abspath(config.dump_prefix)
    line = (f"commscope: recording every collective of {world} ranks; a hang, a signal "
            f"or an error dumps to {prefix}<rank>")
    if config.watch_interval_s <= 0:
        return line + "; live view off (COMMSCOPE_WATCH_INTERVAL_S=0)"
    watch_file = env.get("COMMSCOPE_WATCH_FILE") or os.path.join(
        os.path.dirname(prefix), "watch.json")
    default = os.path.abspath(os.path.join("commscope_traces", "watch.json"))
    how = "commscope watch" if os.path.abspath(watch_file) == default else (
        f"commscope watch --file {watch_file}")
    return line + f"; watch it live: {how}"


def main(argv: Sequence[str] | None = None) -> None:
    """Enable recording, then run the script (or module) named in ``argv``."""
    args = list(sys.argv[1:] if argv is None else argv)
    as_module = False
    if args and args[0] == "--module":
        as_module = True
        args = args[1:]
    if not args:
        print(USAGE, file=sys.stderr)
        raise SystemExit(2)
    run_target(args[0], args[1:], module=as_module)


def run_target(target: str, args: Sequence[str], *, module: bool = False,
               prog: str = "commscope run") -> None:
    """Enable recording (strict where the environment says so), print the banner on
    rank 0 when asked (``COMMSCOPE_RUN_BANNER=1``), then run ``target`` as ``__main__``
    exactly as ``python TARGET ARGS`` (``python -m TARGET ARGS`` with ``module``) would.
    ``prog`` names the command in its one-line errors (``SystemExit`` 2 or 3)."""
    import commscope.flight as flight
    from commscope.flight.splice.selfcheck import RecorderUnsupported

    try:
        flight.enable()
    except RecorderUnsupported as exc:  # refuse to start rather than record nothing
        print(f"{prog}: {exc}", file=sys.stderr)
        raise SystemExit(3) from None
    if os.environ.get("RANK", "0") == "0" and os.environ.get("COMMSCOPE_RUN_BANNER") == "1":
        print(banner(os.environ), file=sys.stderr, flush=True)
    sys.argv = [target, *args]
    if module:
        runpy.run_module(target, run_name="__main__", alter_sys=True)
        return
    if not os.path.exists(target):
        print(f"{prog}: cannot find script {target!r}", file=sys.stderr)
        raise SystemExit(2)
    sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
    runpy.run_path(target, run_name="__main__")


if __name__ == "__main__":
    main()
