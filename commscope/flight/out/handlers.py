"""The Python signal handlers of this process, to tell a signal handler's work from the
program it interrupted.

A trainer's SIGTERM handler (Lightning's) may issue a collective; a stack that passes
through a handler's code shows a signal interrupted the program there. Dumps and progress
records name the handlers installed now (``commscope_signal_handlers``) and the records
issued from one (``commscope_signal_records``), and the analyzer sets those aside from
where the rank stopped.
"""

from __future__ import annotations

import signal
from typing import Any

__all__ = ["signal_handler_codes", "chain_handler", "handler_list", "issued_in_handlers"]


def signal_handler_codes() -> dict[Any, str]:
    """Code object -> signal name of every Python signal handler installed now (and of
    the handlers commscope's own handlers chain to)."""
    out: dict[Any, str] = {}
    for sig in _HANDLER_SIGNALS:
        try:
            handlers = [signal.getsignal(sig)]
        except (ValueError, OSError):
            continue
        handlers += list(_CHAINED.get(sig, ()))
        for handler in handlers:
            code = getattr(getattr(handler, "__func__", handler), "__code__", None)
            if code is not None:
                out.setdefault(code, signal.Signals(sig).name)
    return out


_HANDLER_SIGNALS = [s for s in (getattr(signal, n, None) for n in (
    "SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGHUP", "SIGQUIT")) if s is not None]
_CHAINED: dict[int, list[Any]] = {}
"""Handlers commscope's own signal handlers call in turn (:func:`chain_handler`)."""


def chain_handler(sig: int, handler: Any) -> None:
    """The watchdog's handler of ``sig`` calls ``handler`` (the user's) after dumping:
    collectives issued from it are marked as issued from a signal handler too."""
    if callable(handler):
        _CHAINED[sig] = [handler]
    else:
        _CHAINED.pop(sig, None)


def _in_handler(frames: Any, handlers: dict[Any, str]) -> str | None:
    for i in range(0, len(frames) - 1, 2):
        hit = handlers.get(frames[i])
        if hit is not None:
            return hit
    return None




def handler_list(handlers: dict[Any, str]) -> list[dict[str, Any]]:
    """``commscope_signal_handlers``: each handler's signal, function, file and line."""
    return [{"signal": sig, "name": code.co_name, "filename": code.co_filename,
             "line": code.co_firstlineno} for code, sig in handlers.items()]


def issued_in_handlers(entries: Any, handlers: dict[Any, str]) -> dict[str, str]:
    """``commscope_signal_records``: record id -> signal of the entries whose stack
    passes through a signal handler's code."""
    return {str(e.record_id): sig for e in entries
            if (sig := _in_handler(e.frames, handlers)) is not None}
