"""The public calls of the flight recorder: enable, disable, dump, snapshot, dump_trace."""

from __future__ import annotations

import atexit
import json
import logging
import os
import pickle
import threading
from typing import Any

from commscope.flight.config import FlightConfig, resolve_config
from commscope.flight.out import fatal
from commscope.flight.out.dump import Dumper, build_dump
from commscope.flight.out.watchdog import Watchdog
from commscope.flight.record.agree.fingerprint import Fingerprint
from commscope.flight.record.recorder import SLOT, Recorder
from commscope.flight.splice import install as _install
from commscope.flight.splice.selfcheck import check_torch, require_flight

__all__ = [
    "enable",
    "disable",
    "is_enabled",
    "config",
    "dump",
    "snapshot",
    "dump_trace",
    "dump_trace_json",
]

logger = logging.getLogger(__name__)

_lock = threading.RLock()


class _State:
    recorder: Recorder | None = None
    dumper: Dumper | None = None
    watchdog: Watchdog | None = None


_state = _State()
_fork_hook_installed = False
_exit_hook_installed = False


def _stop_watchdog_at_exit() -> None:
    # A watchdog thread still inside a store call while the interpreter tears down the
    # C++ objects it uses ends in "terminate called without an active exception"
    # (SIGABRT, seen after a user's SIGTERM handler calls sys.exit). Stop it first.
    dog = _state.watchdog
    if dog is not None:
        try:
            dog.stop()
        except Exception:
            pass


def _after_fork_in_child() -> None:
    # A forked child (DataLoader worker, multiprocessing with fork) records nothing
    # and dumps nothing: the ring, the file name and the signals belong to the parent.
    rec = _state.recorder
    if rec is None:
        return
    SLOT.rec = None
    rec.active = False
    _install.uninstall()
    fatal.disarm(in_child=True)
    dog = _state.watchdog
    _state.watchdog = None
    if dog is not None:
        dog.forget_in_child()


def enable(
    *,
    buffer_size: int | None = None,
    dump_prefix: str | None = None,
    timeout_s: float | None = None,
    timing: bool | None = None,
    dump_on_timeout: bool | None = None,
    dump_format: str | None = None,
    compress: bool = False,
    max_frames: int | None = None,
    watchdog: bool = True,
    handle_signals: bool = True,
    dump_on_exception: bool = True,
    poll_interval_s: float = 0.5,
    watch_interval_s: float | None = None,
    fingerprint: bool | None = None,
) -> FlightConfig:
    """Start recording every collective of every process group created from now on.

    Call it before ``torch.distributed.init_process_group`` (``commscope run`` does it
    for you). Arguments left ``None`` come from the environment variables PyTorch's
    recorder uses (see :mod:`commscope.flight.config`). Calling it again replaces the
    settings and starts a fresh ring; groups created earlier keep recording.
    ``buffer_size=0`` turns recording off, as ``TORCH_FR_BUFFER_SIZE=0`` does.

    Returns the settings in force. Raises ``ValueError`` for an invalid setting and
    :class:`~commscope.flight.splice.selfcheck.RecorderUnsupported` when the installed torch
    cannot be recorded (the message names its version and what is missing): the code
    is checked, and the first call on a torch install runs a throw-away one-rank job
    that must be recorded (:mod:`commscope.probe`; a few seconds, then cached).
    """
    cfg = resolve_config(
        buffer_size=buffer_size,
        dump_prefix=dump_prefix,
        timeout_s=timeout_s,
        timing=timing,
        dump_on_timeout=dump_on_timeout,
        dump_format=dump_format,
        compress=compress,
        max_frames=max_frames,
        watchdog=watchdog,
        handle_signals=handle_signals,
        dump_on_exception=dump_on_exception,
        poll_interval_s=poll_interval_s,
        watch_interval_s=watch_interval_s,
        fingerprint=fingerprint,
    )
    if cfg.buffer_size:
        check_torch()  # raises RecorderUnsupported, naming what this torch lacks
        require_flight()  # a throw-away job must record (cached per torch install)
    if cfg.timing:
        # NCCL times its own works only with this set when a group is created; then
        # duration_ms is the device time. An explicit "0" from the user is kept.
        os.environ.setdefault("TORCH_NCCL_ENABLE_TIMING", "1")
    with _lock:
        old = _state.recorder
        disable()
        if cfg.buffer_size == 0:
            logger.info("commscope flight: buffer_size is 0, recording stays off")
            return cfg
        rec = Recorder(cfg)
        if old is not None:
            # Keep the live groups (and their counters) created under the previous
            # settings; group ids keep counting up, as torch's do.
            rec.groups = [g for g in old.groups if g.alive()]
            rec.next_pg_id = max((g.pg_id + 1 for g in rec.groups), default=0)
            for g in rec.groups:  # a group keeps its fingerprint while fingerprints stay on
                if not cfg.fingerprint:
                    g.fp = None
                elif g.fp is None:
                    g.fp = Fingerprint()
            if rec.groups:
                rec.global_rank, rec.world_size, rec.store = (
                    old.global_rank,
                    old.world_size,
                    old.store,
                )
                rec.job, rec.watch_token, rec.hosts = old.job, old.watch_token, old.hosts
                rec.request_secret = old.request_secret
                if old.place is not None:
                    rec.place = {**old.place, "dump_dir": os.path.dirname(
                        os.path.abspath(cfg.dump_prefix))}
        elif _install.existing_groups():
            logger.warning(
                "commscope flight: %d process group(s) existed before enable(); they are "
                "not recorded. Call commscope.flight.enable() before init_process_group.",
                _install.existing_groups(),
            )
        dumper = Dumper(rec)
        dog = Watchdog(rec, dumper)
        _state.recorder, _state.dumper, _state.watchdog = rec, dumper, dog
        _install.install()
        _install.on_abort(lambda: dog.dump_before_abort())
        SLOT.rec = rec
        global _fork_hook_installed, _exit_hook_installed
        if not _fork_hook_installed:
            os.register_at_fork(after_in_child=_after_fork_in_child)
            _fork_hook_installed = True
        if not _exit_hook_installed:
            atexit.register(_stop_watchdog_at_exit)
            _exit_hook_installed = True
        dog.start()
        rank = os.environ.get("RANK", "")
        if cfg.dump_on_exception and rank.isdigit():
            fatal.arm(cfg.dump_prefix, int(rank))
    return cfg


def disable() -> None:
    """Stop recording, the watchdog and the signal/exception hooks.

    Process groups created while recording keep working unchanged (they only stop
    recording); groups created afterwards are plain torch groups. The last ring stays
    readable through :func:`snapshot` and :func:`dump` until the next :func:`enable`.
    """
    with _lock:
        SLOT.rec = None
        _install.uninstall()
        if _state.watchdog is not None:
            _state.watchdog.stop()
            _state.watchdog = None
        if _state.recorder is not None:
            _state.recorder.active = False
        fatal.disarm()


def is_enabled() -> bool:
    """Whether collectives are being recorded right now."""
    rec = SLOT.rec
    return rec is not None and rec.active


def config() -> FlightConfig | None:
    """The settings of the current (or last) recorder, ``None`` before :func:`enable`."""
    rec = _state.recorder
    return rec.config if rec is not None else None


def _recorder() -> Recorder:
    rec = _state.recorder
    if rec is None:
        raise RuntimeError(
            "commscope.flight has nothing to dump: call commscope.flight.enable() before "
            "init_process_group (or launch with `commscope run`)"
        )
    return rec


def dump(path: str | None = None, *, reason: str = "api", dump_format: str | None = None,
         exception: BaseException | None = None) -> str:
    """Write this rank's dump file now and return its absolute path.

    ``path`` defaults to ``<dump_prefix><rank>`` (``.json`` for JSON). A ``path``
    ending in ``.json`` (or ``.json.gz``) is written as JSON unless ``dump_format`` says
    otherwise. From an ``except`` block, pass ``exception=e`` (and e.g.
    ``reason="exception"``): the file keeps its type, message and traceback, and the
    analyzer reports the rank as crashed by it.
    """
    _recorder()
    assert _state.dumper is not None
    if dump_format is None and path is not None and path.removesuffix(".gz").endswith(".json"):
        dump_format = "json"
    return _state.dumper.dump(reason, path=path, dump_format=dump_format,
                              exception=exception)


def snapshot(
    *,
    include_collectives: bool = True,
    include_stack_traces: bool = True,
    only_active: bool = False,
    reason: str = "api",
) -> dict[str, Any]:
    """The rank's dump as a dict (what :func:`dump` would write), without writing."""
    return build_dump(
        _recorder(),
        reason,
        include_collectives=include_collectives,
        include_stack_traces=include_stack_traces,
        only_active=only_active,
    )


def dump_trace(
    include_collectives: bool = True,
    include_stack_traces: bool = True,
    only_active: bool = False,
) -> bytes:
    """Pickled dump bytes, the commscope form of PyTorch's on-demand call.

    Same three options and same result type as
    ``torch._C._distributed_c10d._dump_nccl_trace(includeCollectives=True,
    includeStackTraces=True, onlyActive=False)``: ``pickle.loads`` gives the dict
    with ``version``, ``pg_config``, ``pg_status`` and ``entries``.
    """
    data = snapshot(
        include_collectives=include_collectives,
        include_stack_traces=include_stack_traces,
        only_active=only_active,
    )
    return pickle.dumps(data, protocol=4)


def dump_trace_json(include_collectives: bool = True, only_active: bool = False) -> bytes:
    """JSON dump bytes without stack frames, like PyTorch's ``_dump_nccl_trace_json``."""
    data = snapshot(
        include_collectives=include_collectives,
        include_stack_traces=False,
        only_active=only_active,
    )
    return json.dumps(data, separators=(",", ":")).encode("utf-8")
