"""Dump requests through the job's store: only proven ones count, and they are rate-limited.

The store is torch's own ``HashStore`` (what a TCPStore holds, in one process); the
watchdog and the publisher are driven by hand (``tick``), so time is the test's. The
same story on a real ``commscope run`` job, played by an outsider with torch's own store
client, is in tests/dist/test_watch_jobs.py.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

dist = pytest.importorskip("torch.distributed")

from commscope.flight.config import resolve_config  # noqa: E402
from commscope.flight.out import progress, requests, watchdog  # noqa: E402
from commscope.flight.out.dump import Dumper  # noqa: E402
from commscope.flight.out.publish import Publisher  # noqa: E402
from commscope.flight.out.requests import ProvenRequests, RateLimit  # noqa: E402
from commscope.flight.out.watchdog import REQUEST_COUNT_KEY, Watchdog, request_key  # noqa: E402
from commscope.flight.record import job  # noqa: E402
from commscope.flight.record.recorder import Recorder  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_warnings():
    requests._warned.clear()
    yield
    requests._warned.clear()


def test_the_newest_proven_request_is_taken_and_the_others_refused_once(caplog):
    look = ProvenRequests("test request")
    values = {1: b"good", 2: b"forged", 3: b"good"}
    accept = lambda n, raw: n if raw == b"good" else None  # noqa: E731
    with caplog.at_level(logging.WARNING, logger=requests.__name__):
        assert look.look(3, values.get, accept, lambda n: f"key/{n}", now=0.0) == 3
        assert look.seen == 3 and look.refused == 1
        values.update({4: b"forged", 5: b"forged"})
        assert look.look(5, values.get, accept, lambda n: f"key/{n}", now=1.0) is None
    assert look.refused == 3
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "key/2" in warned[0] and "test request" in warned[0]


def test_a_number_without_its_value_is_waited_for_then_refused():
    look = ProvenRequests("test request")
    values: dict[int, bytes] = {}
    accept = lambda n, raw: n  # noqa: E731
    assert look.look(1, values.get, accept, str, now=10.0) is None
    assert look.seen == 0  # its writer may be between its two store calls
    values[1] = b"late"
    assert look.look(1, values.get, accept, str, now=10.5) == 1  # filled in: taken
    assert look.look(2, values.get, accept, str, now=11.0) is None
    assert look.look(2, values.get, accept, str, now=11.0 + requests.PROOF_GRACE_S) is None
    assert look.seen == 2 and look.refused == 1  # never filled in: refused
    # a counter bumped a million times is read in its newest numbers only
    calls: list[int] = []
    look.look(10**6, lambda n: calls.append(n), accept, str, now=20.0)
    assert len(calls) == requests.WINDOW


def test_rate_limit_is_a_sliding_window():
    limit = RateLimit(3, 60.0)
    assert [limit.allow(t) for t in (0, 1, 2, 3, 59.9)] == [True, True, True, False, False]
    assert limit.allow(60.0) and not limit.allow(60.5)


def _watchdog(tmp_path, rank: int = 1, world: int = 4):
    rec = Recorder(resolve_config(dump_prefix=str(tmp_path / "rank_"), watch_interval_s=0,
                                  handle_signals=False, dump_on_exception=False))
    rec.global_rank, rec.world_size = rank, world
    store = dist.HashStore()
    rec.store = store
    rec.request_secret = job.request_secret(store, "", world)
    dog = Watchdog(rec, Dumper(rec))
    return rec, store, dog


def test_only_proven_requests_of_other_ranks_make_a_rank_dump(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(watchdog, "_REQUEST_GRACE_S", 0.0)
    rec, store, dog = _watchdog(tmp_path)
    secret = rec.request_secret
    assert secret and len(secret) == 32
    forged = ["0|timeout", "0|timeout|" + "0" * 64, "9|timeout|x",
              watchdog.request_value("not the secret", 4, 0, "timeout")]
    with caplog.at_level(logging.WARNING, logger=requests.__name__):
        for value in forged:  # what someone who reaches the store writes
            n = store.add(REQUEST_COUNT_KEY, 1)
            store.set(request_key(n), value)
            dog.tick()
        assert dog.dumper.count == 0 and not list(tmp_path.glob("rank_*"))
        # a proof made for one number does not hold for another
        n = store.add(REQUEST_COUNT_KEY, 1)
        store.set(request_key(n), watchdog.request_value(secret, n - 1, 0, "timeout"))
        dog.tick()
        assert dog.dumper.count == 0
    refusals = [r.getMessage() for r in caplog.records if "ignored" in r.getMessage()]
    assert len(refusals) == 1 and request_key(1) in refusals[0]
    assert secret not in refusals[0]
    n = store.add(REQUEST_COUNT_KEY, 1)
    store.set(request_key(n), watchdog.request_value(secret, n, 2, "timeout"))
    dog.tick()
    assert dog.dumper.count == 1
    assert (tmp_path / "rank_1").exists()


def test_dumps_on_other_ranks_requests_are_limited_per_minute(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(watchdog, "_REQUEST_GRACE_S", 0.0)
    rec, store, dog = _watchdog(tmp_path)
    with caplog.at_level(logging.WARNING, logger=requests.__name__):
        for _ in range(10):
            n = store.add(REQUEST_COUNT_KEY, 1)
            store.set(request_key(n), watchdog.request_value(rec.request_secret, n, 0,
                                                             "timeout"))
            dog.tick()
    assert dog.dumper.count == watchdog.INCIDENT_DUMPS
    limited = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(limited) == 1
    # bounded files: the first of the incident, then one file per reason beside it
    files = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")
                   if p.is_file() and not p.name.startswith("."))
    assert files == ["commscope_later/1.request-from-rank-0.pkl", "rank_1"], files


def test_a_rank_does_not_answer_its_own_request_and_others_see_it(tmp_path, monkeypatch):
    monkeypatch.setattr(watchdog, "_REQUEST_GRACE_S", 0.0)
    rec, store, dog = _watchdog(tmp_path, rank=0, world=2)
    other = Recorder(resolve_config(dump_prefix=str(tmp_path / "rank_"), watch_interval_s=0,
                                    handle_signals=False, dump_on_exception=False))
    other.global_rank, other.world_size, other.store = 1, 2, store
    other.request_secret = job.request_secret(store, "", 2)
    assert other.request_secret == rec.request_secret  # agreed through the store
    assert not store.check([job.SECRET_KEY])  # and forgotten there: both ranks have it
    peer = Watchdog(other, Dumper(other))
    dog._post_request("timeout")
    dog.tick()
    peer.tick()
    assert (dog.dumper.count, peer.dumper.count) == (0, 1)


def _publisher(token: str = "tok"):
    rec = Recorder(resolve_config(watch_interval_s=0.5))
    rec.global_rank, rec.world_size = 0, 1
    store = dist.HashStore()
    rec.store = SimpleNamespace(underlying_store=store)
    rec.watch_token = token
    return Publisher(rec, 0.5), store


def test_commscope_dump_needs_the_token_and_is_answered_at_most_every_few_seconds():
    pub, store = _publisher()
    tid = progress.token_id("tok")
    assert pub.tick(now=0.0)
    key = progress.dump_key(tid)
    n = store.add(key, 1)  # an outsider bumps the counter, with no proof or a wrong one
    store.set(progress.dump_proof_key(tid, n), progress.dump_proof("guess", tid, n))
    assert pub.tick(now=1.0) and not pub.take_dump_request(now=1.0)
    n = store.add(key, 1)  # the watcher's request: the proof keyed with the token
    store.set(progress.dump_proof_key(tid, n), progress.dump_proof("tok", tid, n))
    assert pub.tick(now=2.0) and pub.take_dump_request(now=2.0)
    assert not pub.take_dump_request(now=2.1)  # answered
    for _ in range(20):  # a burst: answered together, once the time has passed
        n = store.add(key, 1)
        store.set(progress.dump_proof_key(tid, n), progress.dump_proof("tok", tid, n))
    assert pub.tick(now=3.0)
    assert not pub.take_dump_request(now=3.0)
    assert not pub.take_dump_request(now=2.0 + progress.DUMP_REQUEST_EVERY_S - 0.1)
    assert pub.take_dump_request(now=2.0 + progress.DUMP_REQUEST_EVERY_S)
    assert not pub.take_dump_request(now=20.0)


def test_a_drawn_token_is_forgotten_in_the_store_once_every_rank_has_it(monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    store = dist.PrefixStore("default_pg", dist.HashStore())
    got = [job.agree_token(store, f"drawn-{r}", True, 3) for r in range(2)]
    assert got == ["drawn-0", "drawn-0"] and store.check([job.TOKEN_KEY])
    assert job.agree_token(store, "drawn-2", True, 3) == "drawn-0"
    assert not store.check([job.TOKEN_KEY])  # the last rank deleted it
    # the next attempt (torchrun keeps the store) agrees anew, on a count of its own
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    got = [job.agree_token(store, f"again-{r}", True, 3) for r in range(3)]
    assert got == ["again-0"] * 3 and not store.check([job.TOKEN_KEY])
    # a token the user set stays out of the store; it is the requests' secret as well
    assert job.agree_token(store, "mine", False, 3) == "mine"
    assert job.request_secret(store, "mine", 3) == "mine"
    assert not store.check([job.TOKEN_KEY, job.SECRET_KEY])
