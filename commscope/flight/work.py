"""A work handle that tells the recorder when it completes.

Some backends return works without a future (gloo's ``send``/``recv``), so no callback
can announce their completion. The recording process group hands such a work back to
the caller wrapped in :class:`TrackedWork`: every call is forwarded to the real work,
and the first ``wait()`` that returns (or ``is_completed()`` that says yes) marks the
entry completed. The wrapper holds the real work (which the caller holds anyway); the
recorder holds only the entry.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch.distributed as dist

__all__ = ["TrackedWork"]


class TrackedWork(dist.Work):
    """Forward everything to ``work``; report completion of ``entry`` to ``recorder``."""

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

    def get_future(self) -> Any:
        """Forwarded to the real work (raises where the backend has no future)."""
        return self._work.get_future()

    def block_current_stream(self) -> None:
        """Forwarded to the real work."""
        self._work.block_current_stream()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_work") or name in ("_entry", "_recorder"):
            raise AttributeError(name)
        return getattr(self._work, name)
