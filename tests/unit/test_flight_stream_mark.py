"""Stream marks: the stand-in work of a synchronous device-side call (NCCL returns none).

The CUDA path runs in ``tests/gpu``; here torch's CPU device type, which has the same
``Event``/``current_stream`` interface, drives the generic path.
"""

from __future__ import annotations

import threading

import torch

from commscope.flight.record.marks import StreamMark, _free_marks, release_mark, stream_mark


def test_a_mark_completes_and_is_reused_once_released():
    _free_marks.clear()
    mark = stream_mark(torch.device("cpu"))
    assert isinstance(mark, StreamMark)
    assert mark.is_completed() and mark.exception() is None
    release_mark(mark)
    assert stream_mark(torch.device("cpu")) is mark
    assert stream_mark(torch.device("cpu")) is not mark  # the pool is empty again


def test_no_device_or_no_event_api_gives_no_mark():
    assert stream_mark(None) is None
    assert stream_mark(torch.device("meta")) is None


def test_threads_racing_for_the_pool_never_fail_and_never_share_a_mark():
    _free_marks.clear()
    device = torch.device("cpu")
    for _ in range(8):
        release_mark(StreamMark(torch.cpu.Event(), "cpu"))
    taken: list[StreamMark] = []
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def grab():
        start.wait()
        try:
            for _ in range(50):
                taken.append(stream_mark(device))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=grab) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert len(taken) == 200 and len({id(m) for m in taken}) == 200
