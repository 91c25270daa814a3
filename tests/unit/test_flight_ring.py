"""The ring keeps the newest entries, oldest first, from any number of threads."""

from __future__ import annotations

import threading

from hypothesis import given
from hypothesis import strategies as st

from commscope.flight.record.ring import Ring


@given(capacity=st.integers(0, 50), count=st.integers(0, 200))
def test_keeps_the_last_capacity_items_in_order(capacity, count):
    ring: Ring[int] = Ring(capacity)
    for i in range(count):
        ring.append(i)
    expected = list(range(count))[-capacity:] if capacity else []
    assert ring.snapshot() == expected
    assert len(ring) == len(expected)
    assert ring.written == count


def test_concurrent_appends_lose_nothing():
    ring: Ring[tuple[int, int]] = Ring(100_000)
    per_thread = 20_000

    def work(tid: int) -> None:
        for i in range(per_thread):
            ring.append((tid, i))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    items = ring.snapshot()
    assert len(items) == 4 * per_thread
    for tid in range(4):
        assert [i for t, i in items if t == tid] == list(range(per_thread))


def test_clear_forgets_everything():
    ring: Ring[int] = Ring(3)
    for i in range(5):
        ring.append(i)
    ring.clear()
    assert ring.snapshot() == [] and ring.written == 0
