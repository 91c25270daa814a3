"""Run a training script as ``__main__`` with the flight recorder enabled.

``commscope run`` starts ``torchrun ... -m commscope.flight.bootstrap SCRIPT ARGS`` so
every worker executes this module first: it enables recording (settings from the
environment, see :mod:`commscope.flight.config`), then runs ``SCRIPT`` exactly as
``python SCRIPT ARGS`` would (``sys.argv``, ``sys.path[0]`` and ``__name__`` as usual).
The user's script is not changed. ``--module NAME`` runs a module as ``python -m NAME``.
"""

from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Sequence

__all__ = ["main"]

USAGE = "usage: python -m commscope.flight.bootstrap [--module] SCRIPT_OR_MODULE [ARGS...]"


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
    target, rest = args[0], args[1:]

    import commscope.flight as flight
    from commscope.flight.splice.selfcheck import RecorderUnsupported

    try:
        flight.enable()
    except RecorderUnsupported as exc:  # refuse to start rather than record nothing
        print(f"commscope run: {exc}", file=sys.stderr)
        raise SystemExit(3) from None
    sys.argv = [target, *rest]
    if as_module:
        runpy.run_module(target, run_name="__main__", alter_sys=True)
        return
    if not os.path.exists(target):
        print(f"commscope run: cannot find script {target!r}", file=sys.stderr)
        raise SystemExit(2)
    sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
    runpy.run_path(target, run_name="__main__")


if __name__ == "__main__":
    main()
