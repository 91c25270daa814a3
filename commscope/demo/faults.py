"""The faults ``commscope demo`` can inject, and what the analysis must call each one.

Pure data (no torch): the CLI reads it to build its ``--fault`` choices, and the
analyzer-only install never imports the demo's torch code.
"""

from __future__ import annotations

__all__ = ["FAULTS", "EXPECTED", "FAULT_RANK", "FAULT_STEP", "STEPS", "FAULT_WORDS"]

FAULTS = ("missing", "size", "dtype", "order", "crash", "none")
"""The ``--fault`` choices; ``missing`` is the default."""
EXPECTED = {
    "missing": ("missing_rank",),
    "size": ("size_mismatch",),
    "dtype": ("dtype_mismatch",),
    "order": ("order_mismatch", "cross_group_deadlock"),
    "crash": ("crashed_rank",),
    "none": ("healthy",),
}
"""Finding kinds that count as naming each fault correctly (root cause first)."""
FAULT_WORDS = {
    "missing": "skips the all_reduce on the dp axis",
    "size": "logs its loss with the wrong size",
    "dtype": "logs its loss as int32 instead of float32",
    "order": "swaps its two async logging collectives",
    "crash": "exits in the middle of the step",
    "none": "nothing: a healthy run",
}
"""What the faulty rank does, in words, for the demo's output."""
FAULT_RANK = 3
"""The rank that misbehaves."""
FAULT_STEP = 2
"""The training step at which it misbehaves."""
STEPS = 4
"""Training steps the demo runs."""
