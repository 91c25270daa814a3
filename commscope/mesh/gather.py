"""Gathering the ranks' hostnames through the job's store, once per job.

A live mesh asks the store of the default process group (the one ``init_process_group``
made), so it works the same under torchrun, Slurm ``srun``, ``mpirun`` or any other
launcher, with no collective: no communicator is created and nothing shows in a trace.
For a job of ``N`` ranks, under ``commscope/mesh/hosts/<N>/``:

1. every rank sets ``rank<r>`` to its hostname (:func:`publish`: one ``set``), before
   ``init_device_mesh``'s agreement check, so once that check has passed every rank's
   name is in the store;
2. rank 0 reads them all with one ``multi_get`` and sets ``table``: the
   :class:`~commscope.mesh.hosts.HostTable` as zlib-compressed JSON (:func:`gather_job`);
3. every other rank waits for ``table`` and gets it (one ``wait``, one ``get``).

Each rank makes three store requests whatever the size of the job; rank 0's one read
carries ``N`` short names, and every other rank's one read a table of a few kilobytes
(the host indices of a regular placement compress to almost nothing). A store without
``multi_get`` (a custom store written in Python) is read one key at a time, by rank 0
only. The table is kept per default group: a second mesh, a slice or a flattened axis
asks the store nothing.

A mesh made another way (torch's constructor, ``from_group``, ``from_torch``), where
not every rank of the job need take part, only publishes (step 1) and, when first asked
(``describe()``, ``locality()``), reads the names of its own ranks (:func:`gather_first`):
it never waits for a rank outside it. Where nothing can be gathered (torch's fake
process group, a store that refuses), the caller uses arithmetic instead.

No torch: the store is any object with torch's ``Store`` methods (``set``, ``get``,
``wait``, ``multi_get``), so the protocol is tested at scale on an in-memory store.
"""

from __future__ import annotations

import json
import socket
import weakref
import zlib
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from commscope.mesh.hosts import HostTable

__all__ = [
    "GatherFailed",
    "decode_table",
    "encode_table",
    "gather_first",
    "gather_job",
    "publish",
    "this_host",
]

_MAX_TABLE_BYTES = 64 << 20
"""The most a decoded table may take (a store is reachable by others: no zlib bomb)."""


class GatherFailed(RuntimeError):
    """The hostnames could not be gathered (the caller falls back to arithmetic)."""


@dataclass
class _Gathered:
    """What this process knows of one default group's hosts."""

    published: bool = False
    job: HostTable | None = None
    failed: str | None = None
    """Why the job's table could not be gathered (not tried again: every rank keeps the
    same answer for every mesh of the job)."""
    first: dict[int, HostTable] = field(default_factory=dict)


_known: weakref.WeakKeyDictionary[Any, _Gathered] = weakref.WeakKeyDictionary()


def _state(owner: Any) -> _Gathered:
    state = _known.get(owner)
    if state is None:
        state = _known[owner] = _Gathered()
    return state


def _key(world_size: int, what: str) -> str:
    return f"commscope/mesh/hosts/{world_size}/{what}"


def this_host() -> str:
    """The hostname of this process (what the other ranks will know it by)."""
    return socket.gethostname()


def publish(store: Any, owner: Any, rank: int, world_size: int) -> None:
    """Step 1: set this rank's hostname in the store, once per ``owner`` (the default
    process group: a new job, or a new default group, publishes again)."""
    state = _state(owner)
    if not state.published:
        store.set(_key(world_size, f"rank{rank}"), this_host())
        state.published = True


def _multi_get(store: Any, keys: list[str]) -> list[bytes]:
    try:
        return list(store.multi_get(keys))
    except (AttributeError, NotImplementedError, RuntimeError):
        # a Python store without multi_get (torch's binding asserts there): key by key
        return [store.get(k) for k in keys]


def _names(values: list[Any]) -> list[str]:
    return [bytes(v).decode("utf-8", "replace") for v in values]


def gather_job(
    store: Any, owner: Any, rank: int, world_size: int, timeout: timedelta
) -> HostTable:
    """Steps 2 and 3: the table of every rank of the job, the same on every rank.

    Every rank of the job must call it after :func:`publish`, and rank 0 only once
    every rank has published (``init_device_mesh`` calls it after its agreement check).
    Cached per ``owner``. Raises :class:`GatherFailed` (on every rank, without waiting
    out ``timeout``, when rank 0 fails; again, without a request, on later calls).
    """
    state = _state(owner)
    if state.job is not None:
        return state.job
    if state.failed is not None:
        raise GatherFailed(state.failed)
    try:
        state.job = _gather_job(store, rank, world_size, timeout)
    except GatherFailed as exc:
        state.failed = str(exc)
        raise
    return state.job


def _gather_job(store: Any, rank: int, world_size: int, timeout: timedelta) -> HostTable:
    table_key = _key(world_size, "table")
    if world_size == 1:
        return HostTable.from_hostnames([this_host()])
    if rank == 0:
        try:
            keys = [_key(world_size, f"rank{r}") for r in range(world_size)]
            table = HostTable.from_hostnames(_names(_multi_get(store, keys)))
            store.set(table_key, encode_table(table))
            return table
        except Exception as exc:
            try:
                store.set(table_key, b"")  # the others stop waiting: there is no table
            except Exception:
                pass
            raise GatherFailed(f"rank 0 could not read the ranks' hostnames: {exc}") from exc
    try:
        store.wait([table_key], timeout)
        blob = bytes(store.get(table_key))
    except Exception as exc:
        raise GatherFailed(
            f"rank 0 did not publish the host table within "
            f"{timeout.total_seconds():.0f} s: {exc}"
        ) from exc
    if not blob:
        raise GatherFailed("rank 0 could not read the ranks' hostnames")
    return decode_table(blob, world_size)


def gather_first(
    store: Any, owner: Any, n: int, world_size: int, timeout: timedelta
) -> HostTable:
    """The table of ranks ``0..n-1`` (a mesh's ranks), read by this rank alone.

    The job's table where this process already has it; else the names those ranks
    published (:func:`publish`), waited for at most ``timeout``, in one ``multi_get``.
    Never waits for a rank outside ``0..n-1``. Cached per ``owner`` and ``n``.
    """
    state = _state(owner)
    if state.job is not None:
        return state.job.first(n)
    cached = state.first.get(n)
    if cached is not None:
        return cached
    keys = [_key(world_size, f"rank{r}") for r in range(n)]
    try:
        store.wait(keys, timeout)
        table = HostTable.from_hostnames(_names(_multi_get(store, keys)))
    except Exception as exc:
        raise GatherFailed(
            f"ranks 0..{n - 1} did not all publish their hostnames within "
            f"{timeout.total_seconds():.0f} s: {exc}"
        ) from exc
    state.first[n] = table
    return table


def encode_table(table: HostTable) -> bytes:
    """The table as the store holds it: zlib-compressed JSON
    ``{"version": 1, "hosts": [names], "rank_host": [host index by rank]}``."""
    data = {"version": 1, "hosts": list(table.names), "rank_host": table.host_index.tolist()}
    return zlib.compress(json.dumps(data, separators=(",", ":")).encode("utf-8"))


def decode_table(blob: bytes, world_size: int) -> HostTable:
    """The table :func:`encode_table` wrote; raises :class:`GatherFailed` for anything
    else (a store is reachable by others: nothing but the expected shape is trusted)."""
    try:
        inflater = zlib.decompressobj()
        text = inflater.decompress(blob, _MAX_TABLE_BYTES)
        if inflater.unconsumed_tail:
            raise ValueError("too large")
        data = json.loads(text.decode("utf-8"))
        hosts, rank_host = data["hosts"], data["rank_host"]
        ok = (
            data.get("version") == 1
            and isinstance(hosts, list)
            and all(isinstance(h, str) for h in hosts)
            and isinstance(rank_host, list)
            and len(rank_host) == world_size
            and all(type(i) is int and 0 <= i < len(hosts) for i in rank_host)
        )
        if not ok:
            raise ValueError("not a host table")
        return HostTable.from_hostnames([hosts[i] for i in rank_host])
    except (zlib.error, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise GatherFailed(f"the store's host table is unreadable: {exc}") from None
