"""Synthetic flight-recorder dumps: a documented generator for tests and benchmarks.

Real dumps come from real jobs (``tests/data/make_native_fixtures.py``). Some things a
gloo job cannot record (p2p, timings) or that need thousands of ranks are produced here
instead, in exactly the agreed format (``docs/formats.md``, "commscope.flight/1") or in
PyTorch's native 2.10 format (``ours=False``: no commscope fields, a correct
``pg_config`` as an NCCL job writes it).

:class:`SyntheticJob` plays a program step by step. Every call names the ranks that
issue it (default: all members of its group); the generator keeps, per rank, the
counters PyTorch keeps: ``record_id`` per process, ``collective_seq_id`` and
``p2p_seq_id`` per group, ``op_id`` per group for both. A collective that every member
issued completes (state ``completed``, ``retired``, timestamps, ``duration_ms``) unless
``stuck=True``; one that some member did not issue stays ``scheduled`` and unretired on
the ranks that did, as in a hang. ``arrive`` delays chosen ranks (stragglers). A p2p
send/recv pair completes when both sides are posted; a lone one stays pending.

:func:`write_scale_dumps` writes N identical-but-for-timing ranks quickly for the
benchmark (one default group, a mix of ops, the last collective missing on one rank).
:func:`megatron_job` plays an NCCL job of hundreds or thousands of ranks with
Megatron's groups that stops on one rank, for the report's size at scale.
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

__all__ = ["SyntheticJob", "write_dump", "write_scale_dumps", "megatron_job"]

T0_NS = 1_790_000_000_000_000_000
_TORCH_FRAMES = [
    {"name": "all_reduce", "filename": "/opt/venv/lib/python3.11/site-packages/torch/"
     "distributed/distributed_c10d.py", "line": 3245},
    {"name": "wrapper", "filename": "/opt/venv/lib/python3.11/site-packages/torch/"
     "distributed/c10d_logger.py", "line": 83},
]
_OUTER = {"name": "<module>", "filename": "/home/user/train.py", "line": 300}


@dataclass
class _Rank:
    rank: int
    entries: list[dict[str, Any]] = field(default_factory=list)
    record_id: int = 0
    seq: dict[str, int] = field(default_factory=dict)
    p2p_seq: dict[str, int] = field(default_factory=dict)
    op_id: dict[str, int] = field(default_factory=dict)
    pg_ids: dict[str, int] = field(default_factory=dict)


class SyntheticJob:
    """A synthetic job whose every rank records what it issues (see module doc)."""

    def __init__(self, world_size: int, *, ours: bool = True, backend: str = "nccl",
                 step_ns: int = 5_000_000, duration_ns: int = 1_000_000,
                 ring: int = 2000, timing: bool = True, hostname: str = "node0") -> None:
        self.world_size = world_size
        self.ours = ours
        self.backend = backend
        self.step_ns = step_ns
        self.duration_ns = duration_ns
        self.ring = ring
        self.timing = timing
        self.hostname = hostname
        self.clock = T0_NS
        self.groups: dict[str, tuple[str, list[int]]] = {
            "0": ("default_pg", list(range(world_size)))}
        self.ranks = [_Rank(r) for r in range(world_size)]
        self._frames: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
        for r in self.ranks:
            r.pg_ids["0"] = 0

    def group(self, name: str, desc: str, ranks: Sequence[int]) -> str:
        """Declare a group (every member creates it, in declaration order)."""
        self.groups[name] = (desc, sorted(ranks))
        for r in ranks:
            rk = self.ranks[r]
            rk.pg_ids[name] = len(rk.pg_ids)
        return name

    def _frames_for(self, where: tuple[str, str, int]) -> list[dict[str, Any]]:
        frames = self._frames.get(where)
        if frames is None:
            user = {"name": where[0], "filename": where[1], "line": where[2]}
            frames = self._frames[where] = [*_TORCH_FRAMES, user, _OUTER]
        return frames

    def _entry(self, rk: _Rank, group: str, name: str, sizes: Any, out_sizes: Any,
               dtype: str, created: int, p2p: bool, peer: int | None,
               where: tuple[str, str, int]) -> dict[str, Any]:
        rk.op_id[group] = rk.op_id.get(group, 0) + 1
        if p2p:
            rk.p2p_seq[group] = rk.p2p_seq.get(group, 0) + 1
        else:
            rk.seq[group] = rk.seq.get(group, 0) + 1
        desc = self.groups[group][0]
        e: dict[str, Any] = {
            "frames": self._frames_for(where),
            "record_id": rk.record_id, "pg_id": rk.pg_ids.get(group, 0),
            "process_group": (group, desc), "collective_seq_id": rk.seq.get(group, 0),
            "p2p_seq_id": rk.p2p_seq.get(group, 0), "op_id": rk.op_id[group],
            "profiling_name": f"{self.backend}:{name}", "time_created_ns": created,
            "input_sizes": sizes, "input_dtypes": [dtype] * len(sizes),
            "output_sizes": out_sizes, "output_dtypes": [dtype] * len(out_sizes),
            "state": "scheduled", "time_discovered_started_ns": None,
            "time_discovered_completed_ns": None, "retired": False, "timeout_ms": 600_000,
            "is_p2p": p2p, "thread_name": "MainThread", "thread_id": "1",
        }
        if self.ours:
            e["peer"] = peer
            e["mesh_axis"] = desc[5:] if desc.startswith("mesh_") else None
        rk.record_id += 1
        rk.entries.append(e)
        return e

    def _finish(self, e: dict[str, Any], start: int, end: int) -> None:
        e["state"] = "completed"
        e["retired"] = True
        if self.timing:
            e["time_discovered_started_ns"] = start
            e["time_discovered_completed_ns"] = end
            e["duration_ms"] = (end - start) / 1e6

    def collective(self, op: str = "all_reduce", *, group: str = "0",
                   sizes: Sequence[Sequence[int]] = ((4,),), dtype: str = "Float",
                   ranks: Iterable[int] | None = None, dtypes: dict[int, str] | None = None,
                   rank_sizes: dict[int, Any] | None = None, rank_ops: dict[int, str] | None = None,
                   arrive: dict[int, int] | None = None, stuck: bool = False,
                   where: tuple[str, str, int] = ("train_step", "/home/user/train.py", 42),
                   ) -> None:
        """One collective of ``group`` issued by ``ranks`` (default: every member).

        ``dtypes``/``rank_sizes``/``rank_ops`` override what single ranks pass;
        ``arrive`` delays ranks by ns; ``stuck`` leaves it unfinished everywhere.
        """
        members = self.groups[group][1]
        issuing = sorted(members if ranks is None else ranks)
        self.clock += self.step_ns
        created = {r: self.clock + (arrive or {}).get(r, 0) for r in issuing}
        entries = {}
        for r in issuing:
            s = [list(x) for x in (rank_sizes or {}).get(r, sizes)]
            name = (rank_ops or {}).get(r, op)
            out = [[len(members) * s[0][0], *s[0][1:]]] if name == "all_gather" and s else s
            entries[r] = self._entry(self.ranks[r], group, name, s, out,
                                     (dtypes or {}).get(r, dtype), created[r], False, None,
                                     where)
        if not stuck and set(issuing) == set(members):
            start = max(created.values())
            for r, e in entries.items():
                self._finish(e, created[r], start + self.duration_ns)
        self.clock = max(created.values(), default=self.clock)

    def p2p(self, src: int, dst: int, *, group: str = "0", sizes: Sequence[Sequence[int]] = ((4,),),
            dtype: str = "Float", post: str = "both", recv_sizes: Any = None,
            where: tuple[str, str, int] = ("pipeline_step", "/home/user/train.py", 77)) -> None:
        """A send from ``src`` to ``dst`` and its recv; ``post`` = both/send/recv."""
        members = self.groups[group][1]
        ls, ld = members.index(src), members.index(dst)
        self.clock += self.step_ns
        made = []
        if post in ("both", "send"):
            made.append(self._entry(self.ranks[src], group, f"send {ls}->{ld}",
                                    [list(x) for x in sizes], [list(x) for x in sizes], dtype,
                                    self.clock, True, dst, where))
        if post in ("both", "recv"):
            rs = [list(x) for x in (recv_sizes or sizes)]
            made.append(self._entry(self.ranks[dst], group, f"recv {ld}<-{ls}", rs, rs, dtype,
                                    self.clock, True, src, where))
        if post == "both" and recv_sizes is None:
            for e in made:
                self._finish(e, self.clock, self.clock + self.duration_ns)

    def dump(self, rank: int, *, reason: str = "timeout", dump_time_ns: int | None = None
             ) -> dict[str, Any]:
        """The dump dict ``rank`` would write now."""
        rk = self.ranks[rank]
        entries = rk.entries[-self.ring:] if self.ring else []
        config = {name: {"name": name, "desc": desc, "ranks": str(members)}
                  for name, (desc, members) in self.groups.items() if rank in members}
        status = {}
        for name, pg_id in rk.pg_ids.items():
            mine = [e for e in rk.entries if e["process_group"][0] == name and not e["is_p2p"]]
            done = [e["collective_seq_id"] for e in mine if e["retired"]]
            status[str(pg_id)] = {
                "last_enqueued_collective": mine[-1]["collective_seq_id"] if mine else -1,
                "last_started_collective": -1,
                "last_completed_collective": max(done) if done else -1,
            }
        d: dict[str, Any] = {"version": "2.10"}
        if self.ours:
            d.update({"commscope_format": "commscope.flight/1", "commscope_version": "0.1.0",
                      "rank": rank, "world_size": self.world_size, "hostname": self.hostname,
                      "pid": 1000 + rank, "dump_reason": reason,
                      "dump_time_ns": dump_time_ns or self.clock + 1_000_000_000})
        d.update({"pg_config": config, "pg_status": status,
                  "comm_lib_version": "2.21.5" if self.backend == "nccl" else "",
                  "entries": entries})
        return d

    def write(self, folder: str | os.PathLike[str], *, ranks: Iterable[int] | None = None,
              fmt: str = "pickle", compress: bool = False,
              dump_times: dict[int, int] | None = None) -> list[str]:
        """Write ``rank_<N>`` files (``fmt`` pickle or json, optionally gzip)."""
        os.makedirs(folder, exist_ok=True)
        paths = []
        for r in range(self.world_size) if ranks is None else ranks:
            data = self.dump(r, dump_time_ns=(dump_times or {}).get(r))
            paths.append(write_dump(data, os.path.join(os.fspath(folder), f"rank_{r}"),
                                    fmt=fmt, compress=compress))
        return paths


def write_dump(data: dict[str, Any], path: str, *, fmt: str = "pickle",
               compress: bool = False) -> str:
    """Write one dump dict as a pickle (protocol 2) or JSON, optionally gzip; return path."""
    if fmt == "json":
        raw = json.dumps(data).encode()
        path += ".json"
    else:
        raw = pickle.dumps(data, protocol=2)
    if compress:
        raw = gzip.compress(raw, compresslevel=1)
        path += ".gz"
    with open(path, "wb") as f:
        f.write(raw)
    return path


def write_scale_dumps(folder: str | os.PathLike[str], world_size: int, entries: int = 2000,
                      *, missing_rank: int | None = None) -> list[str]:
    """The benchmark's dumps: ``world_size`` ranks x ``entries`` records in PyTorch's
    native format with a correct ``pg_config`` (one default group, all_reduce /
    all_gather / reduce_scatter / broadcast in turn, NCCL names that fr_trace accepts,
    timings), the newest
    collective unfinished everywhere and never issued by ``missing_rank`` (default: the
    middle rank)."""
    missing = world_size // 2 if missing_rank is None else missing_rank
    os.makedirs(folder, exist_ok=True)
    ops = [("all_reduce", [[1024, 1024]], [[1024, 1024]]),
           ("all_gather", [[4096]], [[4096 * world_size]]),
           ("_reduce_scatter_base", [[4096 * world_size]], [[4096]]),
           ("broadcast", [[256]], [[256]])]
    frames = [[*_TORCH_FRAMES, {"name": f"layer_{i}", "filename": "/home/user/model.py",
                                "line": 100 + i}, _OUTER] for i in range(len(ops))]
    ranks_text = str(list(range(world_size)))
    paths = []
    for rank in range(world_size):
        n = entries - 1 if rank == missing else entries
        ents = []
        for i in range(n):
            seq = i + 1
            name, ins, outs = ops[i % len(ops)]
            created = T0_NS + i * 3_000_000 + rank * 1_000
            last = seq == entries
            ents.append({
                "frames": frames[i % len(ops)], "record_id": i, "pg_id": 0,
                "process_group": ("0", "default_pg"), "collective_seq_id": seq,
                "p2p_seq_id": 0, "op_id": seq, "profiling_name": f"nccl:{name}",
                "time_created_ns": created, "input_sizes": ins, "input_dtypes": ["BFloat16"],
                "output_sizes": outs, "output_dtypes": ["BFloat16"],
                "state": "started" if last else "completed",
                "time_discovered_started_ns": created + 10_000,
                "time_discovered_completed_ns": None if last else created + 900_000,
                "retired": not last, "timeout_ms": 600_000, "is_p2p": False,
                "thread_name": "MainThread", "thread_id": "1",
                **({} if last else {"duration_ms": 0.89}),
            })
        done = n - 1 if n == entries else n
        data = {"version": "2.10",
                "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": ranks_text}},
                "pg_status": {"0": {"last_enqueued_collective": n, "last_started_collective": n,
                                    "last_completed_collective": done}},
                "comm_lib_version": "2.21.5", "entries": ents}
        path = os.path.join(os.fspath(folder), f"rank_{rank}")
        with open(path, "wb") as f:
            pickle.dump(data, f, protocol=2)
        paths.append(path)
    return paths


def megatron_job(world: int, fault: str, steps: int = 3) -> tuple[SyntheticJob, int]:
    """A synthesized ``world``-rank NCCL job (tp 8, pp 4, dp world/32) that stops at
    ``fault`` (``thread`` or ``device``) on one rank of the middle; returns the job and
    the faulty rank."""
    tp, pp = 8, 4
    dp = world // (tp * pp)
    job = SyntheticJob(world, ours=False, timing=True)
    tp_groups, dp_groups, pp_groups = [], [], []
    for start in range(0, world, tp):
        tp_groups.append(job.group(f"tp{start // tp}", "TENSOR_MODEL_PARALLEL_GROUP",
                                   range(start, start + tp)))
    for p in range(pp):
        for t in range(tp):
            members = [p * tp * dp + d * tp + t for d in range(dp)]
            dp_groups.append(job.group(f"dp{p}_{t}", "DATA_PARALLEL_GROUP", members))
    stage = tp * dp
    for i in range(stage):
        pp_groups.append(job.group(f"pp{i}", "PIPELINE_MODEL_PARALLEL_GROUP",
                                   [i + s * stage for s in range(pp)]))
    bad = world // 2 + 3
    for _ in range(steps):
        for g in tp_groups:
            job.collective("all_reduce", group=g, sizes=((4096, 1024),), dtype="BFloat16")
        for g in pp_groups:
            members = job.groups[g][1]
            for a, b in pairwise(members):
                job.p2p(a, b, group=g, sizes=((16, 4096),), dtype="BFloat16")
        for g in dp_groups:
            job.collective("reduce_scatter", group=g, sizes=((1 << 20,),), dtype="BFloat16")
    bad_tp = next(g for g in tp_groups if bad in job.groups[g][1])
    if fault == "thread":  # the rank never issues its next tp all_reduce, nor anything after
        for g in tp_groups:
            ranks = [r for r in job.groups[g][1] if r != bad]
            job.collective("all_reduce", group=g, sizes=((4096, 1024),), dtype="BFloat16",
                           ranks=ranks, stuck=g == bad_tp)
        held = set(job.groups[bad_tp][1])  # their tp all_reduce waits: what follows too
        for g in dp_groups:
            ranks = [r for r in job.groups[g][1] if r != bad]
            job.collective("reduce_scatter", group=g, sizes=((1 << 20,),), dtype="BFloat16",
                           ranks=ranks, stuck=bool(held & set(job.groups[g][1])))
    else:  # its tp all_reduce finishes on its peers, never on it; nothing after finishes
        job.collective("all_reduce", group=bad_tp, sizes=((4096, 1024),), dtype="BFloat16")
        e = job.ranks[bad].entries[-1]
        e.update(state="scheduled", retired=False, time_discovered_started_ns=None,
                 time_discovered_completed_ns=None)
        e.pop("duration_ms", None)
        for g in tp_groups:
            if g != bad_tp:
                job.collective("all_reduce", group=g, sizes=((4096, 1024),), dtype="BFloat16")
        job.collective("all_reduce", group=bad_tp, sizes=((4096, 1024),), dtype="BFloat16",
                       stuck=True)
        for g in dp_groups:
            job.collective("reduce_scatter", group=g, sizes=((1 << 20,),), dtype="BFloat16",
                           stuck=bad in job.groups[g][1] or any(
                               r in job.groups[bad_tp][1] for r in job.groups[g][1]))
    return job, bad
