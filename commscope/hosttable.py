"""The job's host table: which host (process, dump folder) every rank ran on, encoded.

Written by the flight recorder (:mod:`commscope.flight.record.placement` gathers it
through the job's store and puts it in every dump as ``commscope_hosts``) and read by
the analyzer, which must not import the recorder: so the format lives here, at the
ground, with no torch.

Shape (docs/formats.md): ``{"version": 1, "hosts": [[name, dump_dir, node_rank], ...],
"runs": [[first, last, host index], ...], "pids": [pid or null, one per rank]}``.
Consecutive ranks on one host are one run, so a 4 096-rank job on 512 hosts costs 512
runs, not 4 096 entries.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TABLE_VERSION", "encode_table", "decode_table"]

TABLE_VERSION = 1
MAX_RANKS = 1 << 20
"""A table claiming more ranks than this is not read (a hostile value)."""


def encode_table(places: list[dict[str, Any]]) -> dict[str, Any]:
    """The host table of ``places`` (one per rank, in rank order): ``{"version",
    "hosts": [[name, dump_dir, node_rank], ...], "runs": [[first, last, host index], ...],
    "pids": [pid per rank]}``; consecutive ranks on one host are one run, so a
    4 096-rank job on 512 hosts costs 512 runs."""
    hosts: list[list[Any]] = []
    index: dict[tuple[str, str], int] = {}
    runs: list[list[int]] = []
    pids: list[int | None] = []
    for rank, place in enumerate(places):
        key = (str(place.get("host") or ""), str(place.get("dump_dir") or ""))
        at = index.get(key)
        if at is None:
            at = index[key] = len(hosts)
            hosts.append([key[0], key[1], place.get("node_rank")])
        if runs and runs[-1][2] == at and runs[-1][1] == rank - 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank, at])
        pid = place.get("pid")
        pids.append(pid if type(pid) is int else None)
    return {"version": TABLE_VERSION, "hosts": hosts, "runs": runs, "pids": pids}


def decode_table(table: Any) -> dict[int, tuple[str, str, int | None, int | None]] | None:
    """Rank → ``(host, dump_dir, pid, node_rank)`` of an encoded table; ``None`` when ``table`` is
    not one (a hostile or foreign value is never trusted further than its shape)."""
    if not isinstance(table, dict) or table.get("version") != TABLE_VERSION:
        return None
    hosts, runs, pids = table.get("hosts"), table.get("runs"), table.get("pids")
    if not (isinstance(hosts, list) and isinstance(runs, list) and isinstance(pids, list)):
        return None
    if len(pids) > MAX_RANKS:
        return None
    out: dict[int, tuple[str, str, int | None, int | None]] = {}
    for run in runs:
        if not (isinstance(run, list) and len(run) == 3 and all(type(x) is int for x in run)):
            return None
        first, last, at = run
        if not (0 <= first <= last < len(pids) and 0 <= at < len(hosts)):
            return None
        host = hosts[at]
        if not (isinstance(host, list) and len(host) >= 2 and isinstance(host[0], str)
                and isinstance(host[1], str)):
            return None
        for rank in range(first, last + 1):
            pid = pids[rank]
            node = host[2] if len(host) > 2 and type(host[2]) is int else None
            out[rank] = (host[0], host[1], pid if type(pid) is int else None, node)
    return out


