"""commscope's flight recorder: every collective of a job, dumped on hang, signal or demand.

>>> import commscope.flight as flight
>>> flight.enable(timeout_s=60)            # before init_process_group
>>> # ... training ...
>>> flight.step(10)                         # optional: the step `commscope watch` shows
>>> flight.dump()                           # './commscope_traces/rank_0' (absolute path)

See ``docs/flight.md``; ``commscope run`` enables it for an unchanged script.
"""

from __future__ import annotations

import commscope.needs_torch  # noqa: F401 (first: a clear error where torch is absent)
from commscope.flight.api import (
    config,
    disable,
    dump,
    dump_trace,
    dump_trace_json,
    enable,
    is_enabled,
    snapshot,
)
from commscope.flight.config import FlightConfig
from commscope.flight.out.dump import FORMAT, SCHEMA_VERSION
from commscope.flight.out.publish import set_step as step

__all__ = [
    "FORMAT",
    "SCHEMA_VERSION",
    "FlightConfig",
    "config",
    "disable",
    "dump",
    "dump_trace",
    "dump_trace_json",
    "enable",
    "is_enabled",
    "snapshot",
    "step",
]
