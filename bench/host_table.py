"""What the job's host table costs: bytes in every dump, and its gathering at start-up.

The host table (``commscope_hosts``, docs/formats.md) says on which host, with which pid
and into which folder every rank of the job ran, so one host's folder knows where the
other ranks' dumps are. Two costs (issue 31, item 12):

Part 1, bytes. For 8, 512 and 4 096 ranks, 8 ranks a host (1, 64 and 512 hosts; host
names ``gpu-node-0001.cluster.internal``, one absolute dump folder, pids of 6-7 digits),
the table as ``commscope.hosttable.encode_table`` makes it, measured as what it adds to a
dump file: pickle protocol 4 (the default dump format) and JSON (``--dump-format
json``), each also gzipped (``COMMSCOPE_FR_COMPRESS``); its value in the store
(``commscope/hosts``, compact JSON), which every rank reads once; and ``commscope_place``
(the rank's own place, in every dump). For scale: the size of commscope's own dump of a
full 2 000-entry ring (torch's fake backend, 2 000 all_reduces 20 frames deep).

Part 2, start-up. ``HostTableGatherer`` (``commscope/flight/record/placement.py``) with
``--ranks`` simulated ranks (default 4 096, 8 a host), against an in-memory store (our
own CPU: JSON and the encoding) and a real TCPStore (torch's, the kind torchrun runs; the
server in this process, one client):

  post:      every rank's one ``set`` of its place (all ranks one after another, from one
             client; in a job each rank posts its own, in parallel)
  gather:    rank 0's tick once every place is there: ``check`` in chunks of 1 024 keys,
             ``multi_get``, encode, one ``set`` of the table
  read:      one other rank's tick: ``check`` + ``get`` of the table + decode
  serve:     the table's bytes read by every other rank (``get`` after ``get`` from one
             client): what rank 0's host's store serves in all

each as wall and CPU time (the store's server is a thread of this process).

All of it runs on the recorder's watchdog thread, never on the training thread: no
collective waits for it. PyTorch has no counterpart to compare with: its flight
recorder's dumps carry no host, pid or host table (``fr_trace`` names each rank's host
``host_rank<r>`` after the file), and its answer for dumps spread over hosts is "copy
all files into a single directory".

    .venv/bin/python bench/host_table.py
    .venv/bin/python bench/host_table.py --ranks 4096 --rounds 7
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import pickle
import platform
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from commscope.flight.out.dump import PICKLE_PROTOCOL
from commscope.flight.record.placement import PLACE_KEY, TABLE_KEY, HostTableGatherer
from commscope.hosttable import decode_table, encode_table

RANKS_PER_HOST = 8
DUMP_DIR = "/scratch/job42/commscope_traces"
NO_PYTORCH = ("PyTorch: no counterpart (its dumps carry no host, pid or host table; "
              "fr_trace calls each rank's host host_rank<r>)")


def places(world: int) -> list[dict[str, Any]]:
    """Every rank's place as ``this_place`` makes it, for ``world`` ranks, 8 a host."""
    out = []
    for rank in range(world):
        node = rank // RANKS_PER_HOST
        out.append({"rank": rank, "host": f"gpu-node-{node:04d}.cluster.internal",
                    "pid": 1_000_000 + 7919 * rank % 3_000_000, "node_rank": node,
                    "local_rank": rank % RANKS_PER_HOST, "dump_dir": DUMP_DIR,
                    "launcher": "torchrun", "path": f"{DUMP_DIR}/rank_{rank}"})
    return out


def _added(field: str, value: Any, base: dict[str, Any]) -> dict[str, int]:
    """Bytes ``{field: value}`` adds to the dump ``base``, per format."""
    with_it = {**base, field: value}
    out = {}
    for name, encode in (("pickle", lambda d: pickle.dumps(d, protocol=PICKLE_PROTOCOL)),
                         ("json", lambda d: json.dumps(d).encode())):
        out[name] = len(encode(with_it)) - len(encode(base))
        out[f"{name}.gz"] = (len(gzip.compress(encode(with_it), 6))
                             - len(gzip.compress(encode(base), 6)))
    return out


def _nested(depth: int, fn) -> Any:
    return fn() if depth <= 0 else _nested(depth - 1, fn)


def _ring_child(conn) -> None:
    os.environ["TORCH_FR_BUFFER_SIZE"] = "0"
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    import commscope.flight as flight

    flight.enable(buffer_size=2000, watchdog=False, handle_signals=False)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    t = torch.ones(16)
    _nested(20, lambda: [dist.all_reduce(t) for _ in range(2000)])
    conn.send_bytes(pickle.dumps(flight.snapshot(reason="timeout"), protocol=PICKLE_PROTOCOL))
    conn.close()


def _ring_dump() -> dict[str, Any]:
    """A real commscope dump of a full 2 000-entry ring (torch's fake backend, 2 000
    all_reduces 20 frames deep, stacks on: the file a hang leaves), without a table."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_ring_child, args=(child,))
    proc.start()
    data = pickle.loads(parent.recv_bytes())
    proc.join(60)
    data.pop("commscope_hosts", None)
    return data


def part_bytes(worlds: list[int]) -> None:
    ring = _ring_dump()
    ring_pickle = len(pickle.dumps(ring, protocol=PICKLE_PROTOCOL))
    ring_gz = len(gzip.compress(pickle.dumps(ring, protocol=PICKLE_PROTOCOL), 6))
    small = {k: v for k, v in ring.items() if k not in ("entries", "commscope_place")}
    print(f"\npart 1: bytes the host table adds to every dump (8 ranks a host; for scale, "
          f"commscope's dump of a full 2000-entry ring is {ring_pickle / 1e6:.2f} MB "
          f"pickled, {ring_gz / 1e3:.0f} KB gzipped)")
    print(f"{'ranks':>6} {'hosts':>6} {'pickle B':>9} {'pickle.gz B':>12} {'json B':>8} "
          f"{'json.gz B':>10} {'store B':>8} {'B/rank':>7} {'of a ring dump':>15}")
    for world in worlds:
        table = encode_table(places(world))
        assert decode_table(table) is not None
        added = _added("commscope_hosts", table, ring)
        store = len(json.dumps(table, separators=(",", ":")).encode())
        hosts = len(table["hosts"])
        print(f"{world:6d} {hosts:6d} {added['pickle']:9d} {added['pickle.gz']:12d} "
              f"{added['json']:8d} {added['json.gz']:10d} {store:8d} "
              f"{added['pickle'] / world:7.1f} {added['pickle'] / ring_pickle:14.2%}")
    place = places(1)[0]
    one = _added("commscope_place", place, small)
    print(f"commscope_place (one rank's own place, every dump): {one['pickle']} B pickled, "
          f"{one['json']} B JSON")
    print(NO_PYTORCH)


class MemoryStore:
    """The store methods the gatherer uses, on a dict (values as bytes, as torch's)."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def set(self, key: str, value: str | bytes) -> None:
        self.data[key] = value.encode() if isinstance(value, str) else bytes(value)

    def get(self, key: str) -> bytes:
        return self.data[key]

    def check(self, keys: list[str]) -> bool:
        return all(k in self.data for k in keys)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return [self.data[k] for k in keys]


def _time(fn) -> tuple[float, float]:
    """(wall, CPU of this process) seconds of ``fn()``: the store's server is a thread of
    this process, so its CPU counts; on a shared box the CPU figure is the steadier."""
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w0, time.process_time() - c0


def gather_round(store: Any, world: int,
                 all_places: list[dict[str, Any]]) -> dict[str, tuple[float, float]]:
    """One job start: post every place, rank 0 gathers, one other rank reads (see doc)."""
    gatherers = [HostTableGatherer(p, p["rank"], world) for p in all_places[:2]]
    out = {"post": _time(lambda: [store.set(PLACE_KEY.format(rank=r),
                                            json.dumps(all_places[r], separators=(",", ":")))
                                  for r in range(1, world)])}
    gatherers[1]._posted = True  # posted just above
    out["gather"] = _time(lambda: gatherers[0].tick(store, now=1e9))
    assert gatherers[0].done, "rank 0 did not gather"
    out["read"] = _time(lambda: gatherers[1].tick(store, now=1e9))
    assert gatherers[1].done and gatherers[1].table == gatherers[0].table
    return out


def part_startup(world: int, rounds: int) -> None:
    from torch.distributed import TCPStore

    all_places = places(world)
    print(f"\npart 2: gathering the host table of {world} ranks ({world // RANKS_PER_HOST} "
          f"hosts), median of {rounds} rounds, ms wall / ms CPU")
    print(f"{'store':<22} {'post (every rank)':>18} {'gather (rank 0)':>16} "
          f"{'read (one rank)':>16}")
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                      timeout=timedelta(seconds=60))
    client = TCPStore("127.0.0.1", server.port, is_master=False,
                      timeout=timedelta(seconds=60))
    for name, make in (("in-memory (our CPU)", lambda: MemoryStore()),
                       ("TCPStore, 1 client", lambda: client)):
        results = []
        for _ in range(rounds):
            store = make()
            if not isinstance(store, MemoryStore):  # a fresh job's keys each round
                store.delete_key(TABLE_KEY)
                for r in range(world):
                    store.delete_key(PLACE_KEY.format(rank=r))
            results.append(gather_round(store, world, all_places))
        cells = []
        for key in ("post", "gather", "read"):
            wall = statistics.median(r[key][0] for r in results) * 1e3
            cpu = statistics.median(r[key][1] for r in results) * 1e3
            cells.append(f"{wall:.1f} / {cpu:.1f}")
        print(f"{name:<22} {cells[0]:>18} {cells[1]:>16} {cells[2]:>16}")
    size = len(bytes(client.get(TABLE_KEY)))
    wall, cpu = _time(lambda: [client.get(TABLE_KEY) for _ in range(world - 1)])
    print(f"the table in the store: {size} B; the store serving it to the {world - 1} other "
          f"ranks (one client, one get after another): {wall:.2f} s wall, {cpu:.2f} s CPU, "
          f"{size * (world - 1) / 1e6:.0f} MB ({size * (world - 1) / 1e6 / wall:.0f} MB/s)")
    print(NO_PYTORCH)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worlds", default="8,512,4096", help="part 1's job sizes")
    ap.add_argument("--ranks", type=int, default=4096, help="part 2's job size")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    print(f"commscope host table cost, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs, python {sys.version.split()[0]}, "
          f"load average {os.getloadavg()[0]:.2f}")
    part_bytes([int(x) for x in args.worlds.split(",")])
    part_startup(args.ranks, args.rounds)


if __name__ == "__main__":
    main()
