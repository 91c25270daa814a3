"""What the recorder knows about each process group: identity, members and counters.

One :class:`GroupInfo` per group this rank is a member of, created when the group is
created (or adopted) and attached to the recording process group as
``_commscope_info``. Its counters follow NCCL's semantics (see
``docs/flight.md``): a collective bumps ``collective_seq_id``, a p2p op bumps
``p2p_seq_id`` and carries the current collective count, and ``op_id`` counts both.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["ENQUEUE_ONLY_BACKENDS", "POLLED_BACKENDS", "GroupInfo", "mesh_axis_of",
           "device_backends", "is_device_backend", "DEVICE_BACKENDS_ENV"]

ENQUEUE_ONLY_BACKENDS = frozenset({"gloo", "fake"})
"""Backends whose collective calls only queue the op for their own worker threads and
return, so handing an op over never blocks the caller (NCCL's can: its communicator is
set up lazily, inside the first collective of a group)."""

POLLED_BACKENDS = frozenset({"nccl", "xccl"})
"""Backends whose work futures complete at enqueue (device-side completion): the
recorder polls their works instead of wrapping them."""

DEVICE_BACKENDS_ENV = "COMMSCOPE_DEVICE_BACKENDS"
"""More backends (comma-separated names) whose calls return once the op is queued on a
device, as NCCL's do: their works are polled, their dumps read as device queues."""

_DEVICE_CACHE: dict[str, frozenset[str]] = {}


def device_backends() -> frozenset[str]:
    """:data:`POLLED_BACKENDS` and the ones :data:`DEVICE_BACKENDS_ENV` names."""
    text = os.environ.get(DEVICE_BACKENDS_ENV, "")
    found = _DEVICE_CACHE.get(text)
    if found is None:
        named = {n.strip().lower() for n in text.split(",") if n.strip()}
        found = _DEVICE_CACHE[text] = POLLED_BACKENDS | named
    return found


def is_device_backend(name: str) -> bool:
    """Whether ``name``'s works complete on a device (see :func:`device_backends`)."""
    return name in device_backends()


def mesh_axis_of(desc: str) -> str | None:
    """The axis name of a mesh group (``"mesh_tp"`` → ``"tp"``), else ``None``."""
    if desc.startswith("mesh_") and len(desc) > 5:
        return desc[5:]
    return None


class GroupInfo:
    """Identity, membership and sequence counters of one process group on this rank."""

    __slots__ = (
        "backends",
        "batch_p2p_seq",
        "coalesced_seq",
        "coalescing",
        "collective_seq_id",
        "default_backend",
        "desc",
        "fp",
        "last_completed",
        "last_enqueued",
        "last_started",
        "mesh_axis",
        "multi_backend",
        "name",
        "op_id",
        "p2p_seq_id",
        "pg_id",
        "pg_ref",
        "polled",
        "profiling_names",
        "rank",
        "ranks",
        "record_first",
        "size",
        "timeout_ms",
    )

    def __init__(
        self,
        pg_id: int,
        name: str,
        desc: str,
        ranks: list[int],
        rank: int,
        backends: dict[str, str],
        timeout_ms: int,
    ) -> None:
        self.pg_id = pg_id
        self.name = name
        self.desc = desc
        self.ranks = ranks
        """Global ranks of the members, in group-rank order."""
        self.rank = rank
        """This process's rank inside the group."""
        self.size = len(ranks)
        self.mesh_axis = mesh_axis_of(desc)
        self.backends = backends
        """Device type → backend name, e.g. ``{"cpu": "gloo", "cuda": "nccl"}``."""
        self.default_backend = next(iter(backends.values()), "unknown")
        self.multi_backend = len(set(backends.values())) > 1
        """True when devices use different backends (``cpu:gloo,cuda:nccl``)."""
        self.polled = is_device_backend(self.default_backend)
        """Whether the default backend's works are polled (:func:`device_backends`)."""
        self.profiling_names: dict[str, str] = {}
        """Op name → ``"<backend>:<op>"``, built once and shared by the entries."""
        self.record_first = not set(backends.values()) <= ENQUEUE_ONLY_BACKENDS
        """Record each op before handing it to the backend (see ``Recorder.run``): true
        unless every backend of the group is known to only enqueue ops."""
        self.timeout_ms = timeout_ms
        self.collective_seq_id = 0
        self.p2p_seq_id = 0
        self.op_id = 0
        self.last_enqueued = -1
        self.last_started = -1
        self.last_completed = -1
        self.coalescing = False
        """True between ``_start_coalescing`` and ``_end_coalescing``."""
        self.coalesced_seq: int | None = None
        """The collective seq id shared by the ops of the current coalesced block."""
        self.pg_ref: Any = None
        """Weak reference to the recording group (set when the group is registered)."""
        self.batch_p2p_seq: int | None = None
        """The p2p seq id shared by the ops of the current ``batch_isend_irecv``."""
        self.fp: Any = None
        """The group's running :class:`~commscope.flight.record.agree.fingerprint.Fingerprint`
        (set by the recorder when fingerprints are on)."""

    def alive(self) -> bool:
        """Whether the group object still exists and is still known to torch."""
        pg = self.pg_ref() if self.pg_ref is not None else None
        if pg is None:
            return False
        try:
            import torch.distributed.distributed_c10d as c10d

            return pg in c10d._world.pg_names
        except Exception:
            return True

    def set_identity(self, name: str, desc: str) -> None:
        """Update name and description (set by torch after the group object exists)."""
        self.name = name
        self.desc = desc
        self.mesh_axis = mesh_axis_of(desc)

    def backend_for(self, device_type: str) -> str:
        """The backend name that serves tensors of ``device_type`` in this group."""
        return self.backends.get(device_type, self.default_backend)

    def global_rank(self, group_rank: int) -> int | None:
        """The global rank of a group rank; ``None`` when out of range (e.g. -1)."""
        if 0 <= group_rank < self.size:
            return self.ranks[group_rank]
        return None

    def config(self) -> dict[str, str]:
        """The group's ``pg_config`` item, ranks in PyTorch's string form."""
        return {"name": self.name, "desc": self.desc, "ranks": str(list(self.ranks))}

    def status(self) -> dict[str, int]:
        """The group's ``pg_status`` item: last enqueued/started/completed seq ids."""
        return {
            "last_enqueued_collective": self.last_enqueued,
            "last_started_collective": self.last_started,
            "last_completed_collective": self.last_completed,
        }

    def __repr__(self) -> str:
        return f"GroupInfo(pg_id={self.pg_id}, name={self.name!r}, desc={self.desc!r})"
