"""One record of the flight recorder: what a rank asked one process group to do.

Field names and meanings follow PyTorch's flight-recorder entries (schema "2.10"), so a
dump is readable by PyTorch's ``fr_trace`` as well as by :mod:`commscope.analyze`. Some
fields are ours: ``peer`` (the global rank of a p2p op's other side), ``mesh_axis``
(the axis name of a group whose description is ``mesh_<axis>``), ``failed``, and, where
they apply, ``root``, ``reduce_op``, ``input_split_sizes`` and ``output_split_sizes``
(what every rank must pass alike: :mod:`commscope.flight.record.agree.arguments`).

An entry never holds a tensor: shapes are ``torch.Size`` tuples of ints, dtypes are c10
names such as ``"Float"``, and the Python stack is kept as (code object, instruction
offset) pairs that are turned into names, file names and lines only when a dump is
written. Code objects are shared and immutable and hold no local variables.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import CodeType
from typing import Any

from commscope.flight.record.stack import with_compiled_source

__all__ = ["Entry", "SCHEDULED", "STARTED", "COMPLETED", "entry_to_dict"]

SCHEDULED = "scheduled"
STARTED = "started"
COMPLETED = "completed"


class Entry:
    """One collective or p2p op as issued by this rank (mutable: its state advances).

    The recorder fills every field at creation except the state fields, which move
    from ``scheduled`` to ``started`` (handed to the backend) to ``completed`` (the
    work's future completed, successfully or with an error).
    """

    __slots__ = (
        "agree",
        "collective_seq_id",
        "device",
        "duration_ms",
        "failed",
        "frames",
        "group",
        "input_dtypes",
        "input_sizes",
        "is_p2p",
        "op_id",
        "output_dtypes",
        "output_sizes",
        "p2p_seq_id",
        "peer",
        "polled",
        "profiling_name",
        "record_id",
        "retired",
        "start_perf_ns",
        "state",
        "thread",
        "time_created_ns",
        "time_discovered_completed_ns",
        "time_discovered_started_ns",
    )

    def __init__(self) -> None:
        self.state = SCHEDULED
        self.time_discovered_started_ns: int | None = None
        self.time_discovered_completed_ns: int | None = None
        self.retired = False
        self.duration_ms: float | None = None
        self.failed = False

    # Everything else is assigned by the recorder right after construction; declaring
    # it here keeps type checkers informed without paying for defaults on the hot path.
    record_id: int
    collective_seq_id: int
    p2p_seq_id: int
    op_id: int
    profiling_name: str
    time_created_ns: int
    input_sizes: Sequence[Sequence[int]]
    input_dtypes: Sequence[str]
    output_sizes: Sequence[Sequence[int]]
    output_dtypes: Sequence[str]
    is_p2p: bool
    frames: Sequence[Any]
    """Flat ``[code, instruction offset, code, offset, ...]``, innermost first."""
    thread: tuple[str, str]
    """``(thread name, thread id)`` of the thread that issued the op."""
    peer: int | None
    start_perf_ns: int
    group: Any
    polled: bool
    device: Any
    """The first tensor's device; set only for polled (NCCL/XCCL) entries."""
    agree: tuple[Any, Any, Any, Any] | None
    """What every rank must pass alike: ``(root, reduce_op, input_splits, output_splits)``
    (see :mod:`commscope.flight.record.agree.arguments`), ``None`` when nothing applies."""

    @property
    def thread_name(self) -> str:
        """Name of the thread that issued the op."""
        return self.thread[0]

    @property
    def thread_id(self) -> str:
        """Id of the thread that issued the op (PyTorch writes it as a string)."""
        return self.thread[1]

    # The group's identity is read through ``group`` (a GroupInfo): it never changes
    # after the group is created, and not copying it keeps recording cheap.
    @property
    def pg_id(self) -> int:
        """The group's local id (creation order in this process)."""
        return self.group.pg_id

    @property
    def pg_name(self) -> str:
        """The group's name."""
        return self.group.name

    @property
    def pg_desc(self) -> str:
        """The group's description."""
        return self.group.desc

    @property
    def mesh_axis(self) -> str | None:
        """The mesh axis of a ``mesh_<axis>`` group, else ``None``."""
        return self.group.mesh_axis

    @property
    def timeout_ms(self) -> int:
        """The group's timeout in milliseconds."""
        return self.group.timeout_ms

    def __repr__(self) -> str:
        return (
            f"Entry(record_id={self.record_id}, {self.profiling_name!r}, "
            f"pg={self.pg_name!r}, seq={self.collective_seq_id}/{self.p2p_seq_id}, "
            f"state={self.state!r})"
        )


FrameCache = dict[tuple[CodeType, int], dict[str, Any]]


def line_of(code: CodeType, offset: int) -> int | None:
    """The source line of the instruction at byte ``offset`` of ``code``."""
    if offset < 0:
        return code.co_firstlineno
    for start, end, line in code.co_lines():
        if start <= offset < end:
            return line
    return None


def frame_dicts(raw: Sequence[Any], cache: FrameCache) -> list[dict[str, Any]]:
    """Frame dicts of a raw ``[code, offset, ...]`` stack (one dict per distinct frame;
    code torch.compile generated is preceded by the user's lines it came from:
    :func:`commscope.flight.record.stack.with_compiled_source`)."""
    out = []
    for i in range(0, len(raw) - 1, 2):
        key = (raw[i], raw[i + 1])
        frame = cache.get(key)
        if frame is None:
            code, offset = key
            # One dict per distinct frame: pickle's memo then stores it once per dump.
            frame = {
                "name": code.co_name,
                "filename": code.co_filename,
                "line": line_of(code, offset),
            }
            cache[key] = frame
        out.append(frame)
    return with_compiled_source(out)  # under torch.compile: the user's compiled lines


def entry_to_dict(
    entry: Entry, frame_cache: FrameCache | None = None, include_stack: bool = True
) -> dict[str, Any]:
    """The entry as a plain dict in PyTorch's field order, ready for pickle or JSON.

    ``duration_ms`` is present only when it was measured (timing on, work completed),
    as in PyTorch's dumps. ``root``, ``reduce_op``, ``input_split_sizes`` and
    ``output_split_sizes`` (ours) are present where they apply and were read.
    ``failed`` (ours) is true for a collective that ended with an error: it is retired
    but not completed.
    """
    cache: FrameCache = {} if frame_cache is None else frame_cache
    out: dict[str, Any] = {
        "frames": frame_dicts(entry.frames, cache) if include_stack else [],
        "record_id": entry.record_id,
        "pg_id": entry.pg_id,
        "process_group": (entry.pg_name, entry.pg_desc),
        "collective_seq_id": entry.collective_seq_id,
        "p2p_seq_id": entry.p2p_seq_id,
        "op_id": entry.op_id,
        "profiling_name": entry.profiling_name,
        "time_created_ns": entry.time_created_ns,
        "input_sizes": [[int(d) for d in s] for s in entry.input_sizes],
        "input_dtypes": list(entry.input_dtypes),
        "output_sizes": [[int(d) for d in s] for s in entry.output_sizes],
        "output_dtypes": list(entry.output_dtypes),
        "state": entry.state,
        "time_discovered_started_ns": entry.time_discovered_started_ns,
        "time_discovered_completed_ns": entry.time_discovered_completed_ns,
        "retired": entry.retired,
        "timeout_ms": entry.timeout_ms,
        "is_p2p": entry.is_p2p,
        "thread_name": entry.thread_name,
        "thread_id": entry.thread_id,
        "peer": entry.peer,
        "mesh_axis": entry.mesh_axis,
        "failed": entry.failed,
    }
    if entry.duration_ms is not None:
        out["duration_ms"] = entry.duration_ms
    agree = entry.agree
    if agree is not None:
        root, reduce_op, in_splits, out_splits = agree
        if root is not None:
            out["root"] = root
        if reduce_op is not None:
            out["reduce_op"] = reduce_op
        if in_splits is not None:
            out["input_split_sizes"] = list(in_splits)
        if out_splits is not None:
            out["output_split_sizes"] = list(out_splits)
    return out
