"""``commscope demo``: the whole story on local CPU ranks, in one command.

1. 4 ranks (gloo, forked, no network) build a ``(2, 2)`` mesh ``("dp", "tp")``;
2. a tensor-parallel MLP runs forward and backward under ``CommDebugMode``: the level-0
   table, a JSON dump and the offline viewer;
3. a few training steps run with the flight recorder on, then rank 3 injects a fault;
4. the watchdog sees the hang and every rank dumps (or, for faults that do not hang,
   every rank dumps at the end);
5. ``analyze`` reads the dumps and says what went wrong; it writes a Perfetto timeline
   and an HTML report;
6. the files written, and what to open them with.

Exit code 0 when the diagnosis names the injected fault (so CI can run the demo).
Modules: :mod:`~.faults` (what can be injected, no torch), :mod:`~.launch` (forked local
ranks), :mod:`~.story` (what each rank does), :mod:`~.run` (the parent: output).
"""

from __future__ import annotations

from typing import Any

from commscope.demo.faults import FAULTS

__all__ = ["FAULTS", "run_demo"]


def __getattr__(name: str) -> Any:
    if name == "run_demo":  # imports torch: loaded on first use only
        from commscope.demo.run import run_demo

        return run_demo
    raise AttributeError(f"module 'commscope.demo' has no attribute {name!r}")
