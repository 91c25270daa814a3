"""Before any group exists, make sure every rank asked for the same mesh.

``init_device_mesh`` is a collective: every rank must call it with the same shape and
names. When one does not, PyTorch hangs inside group creation (measured: over 150 s
with a 15 s timeout) and nothing says why. Here every rank posts what it asked for in
the job's store, the ranks wait until all have arrived, and any disagreement becomes
the same clear error on every rank, naming the ranks and what each asked for.

Per rank the cost is constant (two writes, one read of rank 0's request, one wait), so
the store sees O(world size) small requests in total.
"""

from __future__ import annotations

import itertools
import json
import logging
from datetime import timedelta
from typing import Any

from commscope.mesh.layout import MeshError

__all__ = ["check_ranks_agree", "MeshDisagreement"]

logger = logging.getLogger(__name__)

_calls = itertools.count()
_SCAN_LIMIT = 1024  # name the missing ranks only in jobs small enough to ask about each


class MeshDisagreement(MeshError):
    """Ranks asked for different meshes, or some never asked before the timeout."""


def _key(call: int, what: str) -> str:
    return f"commscope/mesh/{call}/{what}"


def check_ranks_agree(
    store: Any,
    rank: int,
    world_size: int,
    request: dict[str, Any],
    timeout: timedelta,
) -> None:
    """Raise :class:`MeshDisagreement` on every rank unless all ranks posted ``request``.

    ``store`` is the job's ``torch.distributed.Store``; ``request`` a JSON-able
    description of what this rank asked for (shape, names, device type). Calls are
    numbered per process, so the n-th mesh of every rank is compared with the n-th mesh
    of the others.
    """
    call = next(_calls)
    mine = json.dumps(request, sort_keys=True)
    store.set(_key(call, f"rank{rank}"), mine)
    if rank == 0:
        store.set(_key(call, "reference"), mine)
    try:
        store.wait([_key(call, "reference")], timeout)
        reference = store.get(_key(call, "reference")).decode()
    except Exception as exc:
        raise MeshDisagreement(
            f"rank {rank}: rank 0 did not reach init_device_mesh within "
            f"{timeout.total_seconds():.0f} s ({exc}); every rank must create the same "
            "meshes in the same order"
        ) from None
    if mine != reference:
        slot = store.add(_key(call, "mismatches"), 1)
        store.set(_key(call, f"mismatch{slot}"), str(rank))
    arrived = store.add(_key(call, "arrived"), 1)
    if arrived == world_size:
        store.set(_key(call, "done"), "1")
    try:
        store.wait([_key(call, "done")], timeout)
    except Exception:
        arrived = store.add(_key(call, "arrived"), 0)
        missing = (
            f"; missing ranks: {_short(_missing_ranks(store, call, world_size))}"
            if world_size <= _SCAN_LIMIT
            else ""
        )
        raise MeshDisagreement(
            f"only {arrived} of {world_size} ranks reached init_device_mesh within "
            f"{timeout.total_seconds():.0f} s{missing}. Every rank must create the same "
            "meshes in the same order."
        ) from None
    mismatches = store.add(_key(call, "mismatches"), 0)
    if mismatches:
        raise MeshDisagreement(
            _describe_disagreement(store, call, world_size, reference, mismatches)
        )


def _missing_ranks(store: Any, call: int, world_size: int) -> list[int]:
    return [r for r in range(world_size) if not store.check([_key(call, f"rank{r}")])]


_SHOWN = 16


def _describe_disagreement(
    store: Any, call: int, world_size: int, reference: str, mismatches: int
) -> str:
    """Name what rank 0 asked for and what the (first few) disagreeing ranks asked for.

    Reads only the disagreeing ranks' requests, so the error path stays cheap at scale.
    """
    by_request: dict[str, list[int]] = {}
    for slot in range(1, min(mismatches, _SHOWN) + 1):
        r = int(store.get(_key(call, f"mismatch{slot}")).decode())
        by_request.setdefault(store.get(_key(call, f"rank{r}")).decode(), []).append(r)
    agreeing = world_size - mismatches
    parts = [f"rank 0 and {agreeing - 1} other ranks asked for {_what(reference)}"]
    for text, ranks in sorted(by_request.items(), key=lambda kv: min(kv[1])):
        parts.append(f"ranks {_short(sorted(ranks))} asked for {_what(text)}")
    if mismatches > _SHOWN:
        parts.append(f"{mismatches - _SHOWN} more ranks disagree too")
    return (
        "ranks disagree on the mesh: " + "; ".join(parts) + ". Every rank must call "
        "init_device_mesh with the same shape and names."
    )


def _what(text: str) -> str:
    req = json.loads(text)
    shape, names = req.get("shape"), req.get("names")
    return f"shape {tuple(shape)}" + (f" names {tuple(names)}" if names else "")


def _short(ranks: list[int]) -> str:
    if len(ranks) <= 8:
        return str(ranks)
    return f"[{', '.join(map(str, ranks[:6]))}, ... {ranks[-1]}] ({len(ranks)} ranks)"
