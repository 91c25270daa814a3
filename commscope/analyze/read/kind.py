"""What kind of dump a file is: backend, full or active-only, timing, stacks.

Nothing in a flight-recorder dump says which of these it is, yet each changes what its
records mean (``../shared/spec/nccl_flight_recorder.md`` §3.3 and §8.1 measured the
evidence). Algorithm (:func:`detect_kind`), from the strongest evidence to the weakest:

1. **Backend**: the prefix most of the records' names carry (``nccl:all_reduce``), else
   the library version (``comm_lib_version``, ``nccl_version`` before 2.10: an NCCL
   version means NCCL; gloo writes ``""``); ``""`` when neither tells (an empty dump).
   It is a device backend (calls return at once) when it is one of
   :data:`~commscope.analyze.model.DEVICE_BACKENDS` or the dump names it so
   (commscope's dumps carry ``commscope_device_backends``).
2. **Active-only** (device backends; gloo's filter keeps everything, commscope dumps say
   so themselves with ``commscope_only_active``): ``record_id`` gaps between kept
   records mean entries were dropped; contiguous ids from 0 mean a full dump; contiguous
   ids from later on with no finished entry among them mean a suffix of unfinished
   entries (a full ring that wrapped holds finished ones too); no entry at all beside
   ``pg_status`` rows (which exist only for groups that recorded entries) means every
   entry was finished and dropped. Otherwise unknown.
3. **Timing** (device backends): a discovered start time or ``last_started_collective``
   >= 0 means start events exist; finished work (an entry, or a ``pg_status`` row's
   ``last_completed_collective``) without any start ever seen means they do not (with
   timing on, the watchdog notes every work it sees started); otherwise unknown.
Whether the entries carry stacks is not looked at here (loading never reads frames):
``stacks`` stays ``None`` until a reader of frames fills it in.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from itertools import pairwise
from typing import Any

from commscope.analyze.model import DEVICE_BACKENDS, DumpKind, RankDump

__all__ = ["detect_kind", "backend_of", "looks_active_only"]


def backend_of(names: Sequence[str], lib_version: str | None) -> str:
    """The backend the records' names say (the most common prefix), else the library
    version's (an NCCL version string means NCCL)."""
    prefixes = Counter(n.partition(":")[0] for n in names if ":" in n)
    if prefixes:
        return prefixes.most_common(1)[0][0]
    if lib_version:
        return "nccl"
    return ""


def looks_active_only(record_ids: Sequence[int], done: Sequence[bool],
                      status_rows: int) -> bool | None:
    """Step 2 of the module doc for a device backend's records (in file order)."""
    if not record_ids:
        return True if status_rows else None
    first, last = record_ids[0], record_ids[-1]
    if last - first != len(record_ids) - 1 or any(b <= a for a, b in pairwise(record_ids)):
        return True
    if first == 0:
        return False
    return not any(done)


def detect_kind(dump: RankDump, data: dict[str, Any]) -> DumpKind:
    """The :class:`~commscope.analyze.model.DumpKind` of one extracted dump (see module
    doc); ``data`` is the file's top level."""
    backend = dump.backend or backend_of((), dump.lib_version)
    named = data.get("commscope_device_backends")
    device = backend in DEVICE_BACKENDS or (isinstance(named, list) and backend in named[:64])
    said = data.get("commscope_only_active")
    if type(said) is bool:
        active: bool | None = said
    elif not device:
        active = False  # gloo's records never finish in the filter's sense: kept
    elif dump.n_entries == 0:
        active = True if dump.pg_status else None
    else:
        active = dump.active_hint
    timing: bool | None = None
    if device and "commscope_format" not in data:  # ours: "started" means handed over
        if dump.started_seen or any(v[1] >= 0 for v in dump.pg_status.values()):
            timing = True
        elif dump.done_seen or any(v[2] >= 0 for v in dump.pg_status.values()):
            timing = False  # work finished and nothing ever showed a start event
    return DumpKind(backend=backend, device=device, active_only=active, timing=timing,
                    stacks=None)
