"""Stream marks: how the recorder learns when a synchronous device-side call completed.

A synchronous NCCL call (``async_op=False``) returns no work: NCCL runs it on the
caller's current stream. :func:`stream_mark` records a device event on that stream
right after the call, and the recorder polls the returned :class:`StreamMark` as it
polls NCCL's works. Marks are handed back with :func:`release_mark` once seen complete
and recorded again later, since creating an event costs more than recording one.
"""

from __future__ import annotations

from typing import Any

__all__ = ["StreamMark", "release_mark", "stream_mark"]


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
        """A mark on ``device``'s current stream (``None`` while it is being captured)."""
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
