"""Where this rank runs, and where every rank of its job runs: the job's host table.

A job spans hosts, and each host keeps its own ranks' dumps on its own disk. So that one
host's folder knows where the other ranks ran (and where their dumps went), every dump
carries this rank's *place* (``commscope_place``: host, pid, node rank, local rank, dump
folder) and, once gathered, the job's *host table* (``commscope_hosts``: every rank's
host, pid and dump folder). docs/formats.md has both shapes.

Gathering (:class:`HostTableGatherer`, driven by the watchdog thread, never the training
thread), through the job's own store, once per job attempt:

1. every rank sets ``commscope/place/<rank>`` to its place (one ``set``);
2. rank 0 asks whether every rank's key is there (``check``, in chunks of
   :data:`_CHUNK` keys); once they all are, it reads them (``multi_get``) and writes the
   table, run-length encoded, to ``commscope/hosts``;
3. every other rank looks for ``commscope/hosts`` until it has it.

Looks back off from every watchdog round to every :data:`_SLOW_POLL_S` seconds after
:data:`_PATIENCE_S` (a rank that never starts must not cost a store round trip per
round for the whole job). A table is only ever whole: until it is, dumps carry the
rank's own place only.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Mapping
from typing import Any

from commscope.hosttable import decode_table, encode_table

__all__ = ["this_place", "launcher_of", "HostTableGatherer", "PLACE_KEY", "TABLE_KEY"]

logger = logging.getLogger(__name__)

PLACE_KEY = "commscope/place/{rank}"
TABLE_KEY = "commscope/hosts"
_CHUNK = 1024
_PATIENCE_S = 60.0
_SLOW_POLL_S = 10.0

_LOCAL_RANK_ENV = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK",
                   "MPI_LOCALRANKID")
_NODE_RANK_ENV = ("GROUP_RANK", "SLURM_NODEID")


def _first_int(env: Mapping[str, str], names: tuple[str, ...]) -> int | None:
    for name in names:
        text = env.get(name)
        if text is not None and text.strip().lstrip("-").isdigit():
            return int(text)
    return None


def launcher_of(env: Mapping[str, str]) -> str:
    """Which launcher started this process, from the variables it sets."""
    if env.get("TORCHELASTIC_RUN_ID") is not None or env.get("GROUP_RANK") is not None:
        return "torchrun"
    if env.get("SLURM_PROCID") is not None:
        return "slurm"
    if env.get("OMPI_COMM_WORLD_RANK") is not None or env.get("PMI_RANK") is not None:
        return "mpi"
    return ""


def this_place(rank: int, dump_prefix: str,
               env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The place of this process in the job: ``{"rank", "host", "pid", "node_rank",
    "local_rank", "dump_dir", "launcher"}`` (``None`` where the launcher does not say)."""
    env = os.environ if env is None else env
    return {
        "rank": rank,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "node_rank": _first_int(env, _NODE_RANK_ENV),
        "local_rank": _first_int(env, _LOCAL_RANK_ENV),
        "dump_dir": os.path.dirname(os.path.abspath(dump_prefix)),
        "launcher": launcher_of(env),
    }


class HostTableGatherer:
    """One rank's part in gathering the job's host table (see module doc)."""

    def __init__(self, place: dict[str, Any], rank: int, world_size: int) -> None:
        self.place = place
        self.rank = rank
        self.world_size = world_size
        self.table: dict[str, Any] | None = None
        """The encoded table once gathered (what dumps carry)."""
        self._posted = False
        self._started = time.monotonic()
        self._next_look = 0.0
        self.errors = 0

    @property
    def done(self) -> bool:
        """The table is here (nothing more to do)."""
        return self.table is not None

    def tick(self, store: Any, now: float | None = None) -> None:
        """Do the next step when due; never raises (a store that went away is retried)."""
        if self.table is not None or store is None or self.world_size <= 0:
            return
        now = time.monotonic() if now is None else now
        if now < self._next_look:
            return
        waited = now - self._started
        self._next_look = now + (_SLOW_POLL_S if waited > _PATIENCE_S else 0.0)
        try:
            if not self._posted:
                store.set(PLACE_KEY.format(rank=self.rank),
                          json.dumps(self.place, separators=(",", ":")))
                self._posted = True
            if self.rank == 0:
                self._gather(store)
            elif store.check([TABLE_KEY]):
                table = json.loads(bytes(store.get(TABLE_KEY)).decode("utf-8"))
                if decode_table(table) is not None:
                    self.table = table
        except Exception as exc:
            self.errors += 1
            if self.errors in (1, 100):
                logger.debug("commscope flight: host table: %r", exc)

    def _gather(self, store: Any) -> None:
        keys = [PLACE_KEY.format(rank=r) for r in range(self.world_size)]
        for i in range(0, len(keys), _CHUNK):
            if not store.check(keys[i:i + _CHUNK]):
                return  # some rank has not posted yet: next round
        raw: list[Any] = []
        for i in range(0, len(keys), _CHUNK):
            chunk = keys[i:i + _CHUNK]
            if hasattr(store, "multi_get"):
                raw.extend(store.multi_get(chunk))
            else:  # torch releases without multi_get
                raw.extend(store.get(k) for k in chunk)
        places = []
        for value in raw:
            try:
                place = json.loads(bytes(value).decode("utf-8"))
            except (UnicodeDecodeError, ValueError):
                place = {}
            places.append(place if isinstance(place, dict) else {})
        table = encode_table(places)
        store.set(TABLE_KEY, json.dumps(table, separators=(",", ":")))
        self.table = table
