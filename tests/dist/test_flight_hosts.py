"""One job across hosts, on real gloo ranks that genuinely run under different hostnames
(each forked rank enters a UTS namespace of its own): the ranks agree on one watch token
whatever each host drew, a token the user set never enters the store, and every dump
carries its place and the job's host table, which the analyzer reads back."""

from __future__ import annotations

import hashlib
import os
import pickle
import time
from datetime import timedelta

import pytest

from tests.harness import run_ranks
from tests.hostname import LO, become, why_no_hostnames

pytestmark = pytest.mark.dist

_WHY_NOT = why_no_hostnames()
needs_hosts = pytest.mark.skipif(bool(_WHY_NOT), reason=_WHY_NOT or "ok")


def _job(rank: int, world_size: int, hosts: list[str], folder: str, tokens: list[str],
         drawn: bool) -> dict:
    import torch
    import torch.distributed as dist

    import commscope.flight as flight
    from commscope.flight.api import _state

    become(hosts[rank])
    os.environ["COMMSCOPE_WATCH_TOKEN"] = tokens[rank]
    if drawn:
        os.environ["COMMSCOPE_WATCH_TOKEN_DRAWN"] = "1"
    else:
        os.environ.pop("COMMSCOPE_WATCH_TOKEN_DRAWN", None)
    os.environ["LOCAL_RANK"] = str(hosts[:rank].count(hosts[rank]))
    flight.enable(dump_prefix=os.path.join(folder, hosts[rank], "rank_"), poll_interval_s=0.05,
                  handle_signals=False, dump_on_exception=False)
    store = dist.FileStore(os.environ["COMMSCOPE_TEST_STORE"], world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=30))
    t = torch.ones(4)
    dist.all_reduce(t)
    rec = _state.recorder
    deadline = time.monotonic() + 20
    while (not rec.hosts.done or rec.clock is None) and time.monotonic() < deadline:
        time.sleep(0.05)
    dist.barrier()  # every rank has its table before any dumps
    path = flight.dump()
    keys = {k: store.check([k]) for k in ("commscope/watch_token",
                                          "commscope/watch_token_sha256")}
    return {"token": rec.watch_token, "path": path, "keys": keys,
            "hash": store.get("commscope/watch_token_sha256").decode()
            if keys["commscope/watch_token_sha256"] else None}


@needs_hosts
def test_ranks_of_all_hosts_agree_on_one_drawn_token_and_dumps_carry_the_host_table(tmp_path):
    hosts = ["hostA", "hostA", "hostB", "hostB"]
    tokens = [f"drawn-on-{h}" for h in hosts]
    out = run_ranks(_job, 4, tmp_path, hosts, str(tmp_path), tokens, True, init=False,
                    timeout=90)
    agreed = {o["token"] for o in out}
    assert len(agreed) == 1 and agreed <= set(tokens)  # one of the drawn ones, shared by all
    # and forgotten in the store once every rank had read it (docs/watch.md, "Security")
    assert not any(o["keys"]["commscope/watch_token"] for o in out)
    for rank, o in enumerate(out):
        with open(o["path"], "rb") as f:
            data = pickle.load(f)  # our own test dump, written just now
        place = data["commscope_place"]
        assert place["host"] == hosts[rank] == data["hostname"]
        assert place["pid"] == data["pid"] and place["local_rank"] == rank % 2
        assert place["path"] == o["path"]
        assert place["dump_dir"] == os.path.join(str(tmp_path), hosts[rank])
        assert data["commscope_hosts"]["hosts"] == [
            ["hostA", os.path.join(str(tmp_path), "hostA"), None],
            ["hostB", os.path.join(str(tmp_path), "hostB"), None]]
        assert data["commscope_hosts"]["runs"] == [[0, 1, 0], [2, 3, 1]]
        assert "drawn-on" not in repr(data)  # no token in a dump
        clock = data["commscope_clock"]  # measured through the store against rank 0
        assert clock["reference"] == "rank 0"
        assert abs(clock["offset_ns"]) <= max(clock["uncertainty_ns"], 10**6) + 5 * 10**6
        assert (clock["offset_ns"], clock["uncertainty_ns"]) == (0, 0) or rank != 0

    from commscope.analyze.model import HostMap
    from commscope.analyze.read.load import load_dumps

    # one host's folder still knows where every rank ran, and where their files are
    only_a = load_dumps(str(tmp_path / "hostA"))
    where = HostMap(only_a.dumps)
    assert where.hosts() == {"hostA": [0, 1], "hostB": [2, 3]}
    assert where.elsewhere([2, 3]) == {"hostB": [2, 3]}
    assert where.dump_dir([2, 3]) == os.path.join(str(tmp_path), "hostB")
    assert where.label(2).startswith("hostB, pid ")

    from commscope.analyze import analyze

    result = analyze(str(tmp_path / "hostA"))
    assert result.verdict == "incomplete"  # not a crash: hostB's files are on hostB
    assert [f.kind for f in result.findings] == ["dumps_elsewhere"]
    assert "Ranks 2, 3 ran on hostB" in result.findings[0].message
    assert f"hostB:{tmp_path / 'hostB'}/" in result.findings[0].message
    merged = tmp_path / "merged"
    merged.mkdir()
    for host in ("hostA", "hostB"):
        for f in (tmp_path / host).glob("rank_*"):
            (merged / f.name).write_bytes(f.read_bytes())
    assert analyze(str(merged)).verdict == "healthy"


@needs_hosts
def test_a_token_the_user_set_never_enters_the_store(tmp_path):
    hosts = ["hostA", "hostB"]
    secret = "set-by-the-scheduler-on-every-host"
    out = run_ranks(_job, 2, tmp_path, hosts, str(tmp_path), [secret, secret], False,
                    init=False, timeout=60, env=LO)
    assert [o["token"] for o in out] == [secret, secret]
    assert not out[0]["keys"]["commscope/watch_token"]
    assert out[0]["hash"] == hashlib.sha256(secret.encode()).hexdigest()
