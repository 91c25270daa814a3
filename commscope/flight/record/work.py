"""Work handles that tell the recorder when their collective completed.

:class:`WaitedWork` is for the calls torch's eager functions wait on at once
(``async_op=False``); :class:`TrackedWork`, a real ``dist.Work``, for everything else.

The recording process group hands the backend's work back to the caller wrapped in
:class:`TrackedWork`. Every call is forwarded to the real work; on the way the wrapper
notes completion, in the caller's own thread:

* ``wait()`` returning (eager calls, FSDP, functional collectives' ``wait_tensor``);
* ``is_completed()`` saying yes;
* ``get_future()`` (DDP's reducer, comm hooks): a callback on that future marks it;
* the wrapper being dropped: at once when the real work is already done, else the
  recorder polls the real work until it completes (an async op nobody waits on),
  holding it no longer than the backend's own queue does;
* the recorder asking, weakly, before a dump and before it calls an entry overdue (an
  async op whose work the caller keeps and never waits on).

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

__all__ = ["TrackedWork", "WaitedWork"]


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
            else:  # dropped unfinished: the recorder polls the work until it completes
                self._entry = None
                self._recorder.adopt(entry, self._work)
        except Exception:
            pass


class WaitedWork:
    """A lighter wrapper for the works that ``torch.distributed``'s eager functions wait
    for at once (``async_op=False``, which they pass on as ``opts.asyncOp = False``).

    Those functions only call ``wait()`` on the work and drop it; it never reaches C++
    or the user. So it need not be a ``dist.Work`` (whose construction and finalizer
    cost about a microsecond per collective): ``wait()`` marks the entry, anything else
    is forwarded to the real work.
    """

    __slots__ = ("_entry", "_recorder", "_work")

    def __init__(self, work: Any, entry: Any, recorder: Any) -> None:
        self._work = work
        self._entry = entry
        self._recorder = recorder

    # The same completion bookkeeping and forwarding as TrackedWork (plain functions,
    # so they serve both classes).
    _done = TrackedWork._done
    wait = TrackedWork.wait
    is_completed = TrackedWork.is_completed
    __getattr__ = TrackedWork.__getattr__
