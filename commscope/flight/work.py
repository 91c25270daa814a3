"""A work handle that tells the recorder when its collective completed.

The recording process group hands the backend's work back to the caller wrapped in
:class:`TrackedWork`. Every call is forwarded to the real work; on the way the wrapper
notes completion, in the caller's own thread:

* ``wait()`` returning (eager calls, FSDP, functional collectives' ``wait_tensor``);
* ``is_completed()`` saying yes;
* ``get_future()`` (DDP's reducer, comm hooks): a callback on that future marks it;
* the wrapper being dropped while the real work is already done.

Hanging a callback on *every* future would make the backend's worker thread take the
GIL after each op; the wrapper avoids that for everything but future users. It holds
the real work, which the caller holds anyway; the recorder holds only the entry.
C++ callers get the wrapper through torch's ``PyWorkHolder``, which keeps it alive.
"""

from __future__ import annotations

from datetime import timedelta
from functools import partial
from typing import Any

import torch.distributed as dist

__all__ = ["TrackedWork", "StreamMark", "stream_mark", "release_mark"]


class TrackedWork(dist.Work):
    """Forward everything to ``work``; report completion of ``entry`` to ``recorder``."""

    __slots__ = ("_entry", "_recorder", "_work")

    def __init__(self, work: Any, entry: Any, recorder: Any) -> None:
        super().__init__()
        self._work = work
        self._entry = entry
        self._recorder = recorder

    def _done(self, failed: bool = False) -> None:
        entry = self._entry
        if entry is not None:
            self._entry = None
            self._recorder.complete(entry, failed=failed)

    def wait(self, timeout: timedelta | None = None) -> bool:
        """Wait for the real work; mark the entry completed when it returns."""
        try:
            ok = self._work.wait() if timeout is None else self._work.wait(timeout)
        except BaseException:
            self._done(failed=True)
            raise
        if ok:
            self._done()
        return ok

    def is_completed(self) -> bool:
        """Whether the real work completed (marks the entry when it did)."""
        done = self._work.is_completed()
        if done:
            self._done()
        return done

    def get_future(self) -> Any:
        """The real work's future, with a completion callback for the recorder."""
        fut = self._work.get_future()
        entry = self._entry
        if entry is not None:
            self._entry = None
            fut.add_done_callback(partial(self._recorder._on_future_cb, entry))
        return fut

    def is_success(self) -> bool:
        """Forwarded to the real work."""
        return self._work.is_success()

    def exception(self) -> Any:
        """Forwarded to the real work."""
        return self._work.exception()

    def source_rank(self) -> int:
        """Forwarded to the real work (``recv`` from any source)."""
        return self._work.source_rank()

    def _source_rank(self) -> int:
        return self._work._source_rank()

    def result(self) -> list[Any]:
        """Forwarded to the real work."""
        return self._work.result()

    def synchronize(self) -> None:
        """Forwarded to the real work."""
        self._work.synchronize()

    def block_current_stream(self) -> None:
        """Forwarded to the real work."""
        self._work.block_current_stream()

    def get_future_result(self) -> Any:
        """Forwarded to the real work."""
        return self._work.get_future_result()

    def _get_duration(self) -> float:
        return self._work._get_duration()

    def _get_op_type(self) -> Any:
        return self._work._get_op_type()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_work") or name in ("_entry", "_recorder"):
            raise AttributeError(name)
        return getattr(self._work, name)

    def __del__(self) -> None:
        entry = getattr(self, "_entry", None)
        if entry is None:
            return
        try:
            done = self._work.is_completed()
            if not done:
                # Some backends (fake) only complete the future.
                done = self._work.get_future().done()
            if done:
                self._done()
        except Exception:
            pass


class StreamMark:
    """Stands in for the work of a synchronous device-side call, which has none.

    Holds a device event recorded on the caller's stream right after the call; the
    recorder polls it like a work, then hands it back with :func:`release_mark` for
    reuse (creating an event costs more than recording one). It keeps no tensor.
    """

    __slots__ = ("_event", "_kind")

    def __init__(self, event: Any, kind: str) -> None:
        self._event = event
        self._kind = kind

    def is_completed(self) -> bool:
        """Whether the device has passed the event."""
        return bool(self._event.query())

    def exception(self) -> None:
        """Always ``None``: a device event carries no error."""
        return None


_MAX_FREE_MARKS = 4096
_free_marks: dict[str, list[StreamMark]] = {}
_device_api: dict[str, tuple[Any, Any, Any] | None] = {}


def _api(kind: str) -> tuple[Any, Any, Any] | None:
    """``(Event, current_stream, is_current_stream_capturing)`` of ``torch.<kind>``."""
    import torch

    module = getattr(torch, kind, None)
    event = getattr(module, "Event", None)
    current = getattr(module, "current_stream", None)
    if event is None or current is None:
        api = None
    else:
        api = (event, current, getattr(module, "is_current_stream_capturing", None))
    _device_api[kind] = api
    return api


class _CudaStreams:
    """The current CUDA stream without ``torch.cuda.current_stream``'s per-call cost.

    That call builds a new ``Stream`` object each time (several microseconds on a
    synchronous NCCL call of a few tens); this asks torch's C binding for the stream's
    identity and keeps one ``Stream`` object per identity. Used only when the binding
    exists (CUDA builds); otherwise :func:`stream_mark` takes the public calls.
    """

    __slots__ = ("capturing", "current", "known", "make", "record")

    def __init__(self, torch: Any) -> None:
        self.current = torch._C._cuda_getCurrentStream
        self.capturing = torch._C._cuda_isCurrentStreamCapturing
        self.record = torch._C._CudaEventBase.record
        self.make = torch.cuda.Stream
        self.known: dict[Any, Any] = {}

    def mark(self, device: Any) -> StreamMark | None:
        if self.capturing():
            return None
        key = self.current(device.index if device.index is not None else -1)
        stream = self.known.get(key)
        if stream is None:
            if len(self.known) >= 256:
                self.known.clear()
            stream = self.known[key] = self.make(
                stream_id=key[0], device_index=key[1], device_type=key[2]
            )
        mark = _take_mark("cuda") or StreamMark(self.make_event(), "cuda")
        self.record(mark._event, stream)
        return mark

    @staticmethod
    def make_event() -> Any:
        import torch

        return torch.cuda.Event()


_cuda_streams: list[_CudaStreams | None] = []


def _cuda_fast_path() -> _CudaStreams | None:
    if not _cuda_streams:
        import torch

        try:
            _cuda_streams.append(_CudaStreams(torch))
        except AttributeError:  # a build or release without those bindings
            _cuda_streams.append(None)
    return _cuda_streams[0]


def stream_mark(device: Any) -> StreamMark | None:
    """A :class:`StreamMark` on ``device``'s current stream, or ``None`` when none can be
    made (no device, a device type without events, a stream being captured into a
    CUDA graph, where an event cannot be queried)."""
    if device is None:
        return None
    kind = device.type
    if kind == "cuda":
        fast = _cuda_streams[0] if _cuda_streams else _cuda_fast_path()
        if fast is not None:
            return fast.mark(device)
    api = _device_api[kind] if kind in _device_api else _api(kind)
    if api is None:
        return None
    event_type, current_stream, capturing = api
    if capturing is not None and capturing():
        return None
    mark = _take_mark(kind) or StreamMark(event_type(), kind)
    mark._event.record(current_stream(device))
    return mark


def _take_mark(kind: str) -> StreamMark | None:
    """A released mark of ``kind`` to record again, or ``None`` (thread-safe: two
    threads may race for the last one)."""
    free = _free_marks.get(kind)
    if not free:
        return None
    try:
        return free.pop()
    except IndexError:
        return None


def release_mark(mark: StreamMark) -> None:
    """Give back a completed mark so that its event is recorded again next time."""
    free = _free_marks.setdefault(mark._kind, [])
    if len(free) < _MAX_FREE_MARKS:
        free.append(mark)
