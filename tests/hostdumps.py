"""Synthetic dumps of one job across several hosts, for the tests of every view.

:class:`commscope.analyze.synth.SyntheticJob` writes one hostname for every rank; here each
dump gets the fields a rank of a multi-host job writes (docs/formats.md): its own place
(``commscope_place``: host, pid, node and local rank, dump folder, path) and the job's
host table (``commscope_hosts``, encoded by the recorder's own
:func:`commscope.hosttable.encode_table`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Container, Iterable
from pathlib import Path
from typing import Any

from commscope.analyze.synth import SyntheticJob, write_dump
from commscope.hosttable import encode_table

__all__ = ["blocks", "place_of", "write_hosts_job"]

DUMP_DIR = "/tmp/job/commscope_traces"


def blocks(per_host: int, names: Callable[[int], str] = lambda i: f"host{chr(65 + i)}"
           ) -> Callable[[int], str]:
    """Rank → host for ``per_host`` consecutive ranks a host (torchrun's placement)."""
    return lambda rank: names(rank // per_host)


def place_of(rank: int, host: str, local: int, node: int) -> dict[str, Any]:
    """The ``commscope_place`` of ``rank``: pid ``4000 + rank``."""
    return {"rank": rank, "host": host, "pid": 4000 + rank, "node_rank": node,
            "local_rank": local, "dump_dir": DUMP_DIR, "launcher": "torchrun",
            "path": f"{DUMP_DIR}/rank_{rank}"}


def write_hosts_job(job: SyntheticJob, folder: str | os.PathLike[str],
                    host_of: Callable[[int], str], *, ranks: Iterable[int] | None = None,
                    table_on: Container[int] | None = None) -> list[str]:
    """Write ``job``'s dumps (``ranks``, default all) into ``folder`` as the ranks of a
    job on several hosts write them: each with its place, its job id and the job's host
    table (only on the ranks in ``table_on`` when given: every rank's own place already
    places it)."""
    hosts = [host_of(r) for r in range(job.world_size)]
    nodes = {h: i for i, h in enumerate(dict.fromkeys(hosts))}
    places = [place_of(r, h, hosts[:r].count(h), nodes[h]) for r, h in enumerate(hosts)]
    table = encode_table(places)
    Path(folder).mkdir(parents=True, exist_ok=True)
    paths = []
    table_on = range(job.world_size) if table_on is None else table_on
    for r in range(job.world_size) if ranks is None else ranks:
        data = job.dump(r)
        data.update(hostname=hosts[r], pid=4000 + r, commscope_place=places[r],
                    commscope_job={"id": "hostsjob", "restart": 0, "world_size": job.world_size})
        if r in table_on:
            data["commscope_hosts"] = table
        paths.append(write_dump(data, os.path.join(os.fspath(folder), f"rank_{r}")))
    return paths
