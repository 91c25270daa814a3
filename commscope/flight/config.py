"""Settings of the flight recorder, from ``enable(...)`` arguments or the environment.

An argument given to :func:`commscope.flight.enable` wins; otherwise the variables PyTorch
users already set are honoured, so a job configured for PyTorch's own recorder records
the same way under commscope:

========================================  ==============================================
setting                                   environment (first one set wins)
========================================  ==============================================
``buffer_size`` (default 2000)            ``TORCH_FR_BUFFER_SIZE``,
                                          ``TORCH_NCCL_TRACE_BUFFER_SIZE``
``dump_prefix``                           ``COMMSCOPE_FR_DUMP_PREFIX``,
(default ``./commscope_traces/rank_``)    ``TORCH_FR_DUMP_TEMP_FILE``,
                                          ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``
``timeout_s`` (default: the group's;      ``COMMSCOPE_FR_TIMEOUT_S``
80 % of it on a device backend)
``timing`` (default off)                  ``TORCH_NCCL_ENABLE_TIMING``
``dump_on_timeout`` (default on)          ``TORCH_NCCL_DUMP_ON_TIMEOUT``
``dump_format`` (default ``pickle``)      ``COMMSCOPE_FR_DUMP_FORMAT`` (``pickle``/``json``)
``max_frames`` (default 16)               ``COMMSCOPE_FR_MAX_FRAMES``
``watch_interval_s`` (default 2, 0 = off)  ``COMMSCOPE_WATCH_INTERVAL_S``
``fingerprint`` (default on)              ``COMMSCOPE_FR_FINGERPRINT``
========================================  ==============================================

``COMMSCOPE_FR_DUMP_PREFIX`` exists for NCCL jobs that keep PyTorch's own flight
recorder on beside ours: both write ``<prefix><rank>``, so with only
``TORCH_FR_DUMP_TEMP_FILE`` set the two would write the same files; ours then goes
where ``COMMSCOPE_FR_DUMP_PREFIX`` says and PyTorch's where its variable says.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["FlightConfig", "DEFAULT_BUFFER_SIZE", "DEFAULT_DUMP_PREFIX", "resolve_config",
           "prefix_from_env", "PREFIX_VARIABLES"]

DEFAULT_BUFFER_SIZE = 2000
DEFAULT_DUMP_PREFIX = "./commscope_traces/rank_"
DEFAULT_MAX_FRAMES = 16
DEFAULT_WATCH_INTERVAL_S = 2.0
DUMP_FORMATS = ("pickle", "json")

_TRUE = {"1", "true", "yes", "on", "y", "t"}
_FALSE = {"0", "false", "no", "off", "n", "f", ""}


@dataclass(frozen=True, slots=True)
class FlightConfig:
    """What the recorder keeps, when it dumps and where the files go."""

    buffer_size: int = DEFAULT_BUFFER_SIZE
    """Entries kept per rank; the oldest is overwritten when the ring is full."""
    dump_prefix: str = DEFAULT_DUMP_PREFIX
    """Dump files are ``<dump_prefix><global rank>`` (plus ``.json`` / ``.gz``)."""
    timeout_s: float | None = None
    """A collective pending this long triggers a dump; ``None``: the group's timeout
    (on a device backend 80 % of it: PyTorch's NCCL watchdog may abort at the timeout)."""
    timing: bool = False
    """Fill ``duration_ms`` of completed entries."""
    dump_on_timeout: bool = True
    """Whether the watchdog dumps (and asks every rank to dump) on a timeout."""
    dump_format: str = "pickle"
    """``"pickle"`` (PyTorch's format, read by ``fr_trace``) or ``"json"``."""
    compress: bool = False
    """Gzip the dump files (``.gz`` suffix)."""
    max_frames: int = DEFAULT_MAX_FRAMES
    """Python frames kept per entry (innermost first); 0 keeps none."""
    watchdog: bool = True
    """Run the per-rank watchdog thread (timeouts, store-wide dump requests, signals)."""
    handle_signals: bool = True
    """Dump on SIGTERM and SIGUSR1, then hand over to the previous handler."""
    dump_on_exception: bool = True
    """Dump when an exception is not caught (main thread or any thread)."""
    poll_interval_s: float = 0.5
    """How often the watchdog looks at pending collectives and the store."""
    watch_interval_s: float = DEFAULT_WATCH_INTERVAL_S
    """How often the rank publishes its progress record for ``commscope watch`` (0: off)."""
    fingerprint: bool = True
    """Keep a running fingerprint of each group's collectives
    (:mod:`commscope.flight.record.agree.fingerprint`): silent desyncs show while the job runs."""


def _env_int(env: Mapping[str, str], *names: str) -> tuple[int | None, str | None]:
    for name in names:
        text = env.get(name)
        if text is not None and text.strip() != "":
            try:
                return int(text.strip()), name
            except ValueError:
                raise ValueError(
                    f"{name}={text!r} is not an integer; set it to a number of entries "
                    f"such as 2000, or 0 to turn recording off"
                ) from None
    return None, None


def _env_bool(env: Mapping[str, str], name: str) -> bool | None:
    text = env.get(name)
    if text is None:
        return None
    low = text.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError(f"{name}={text!r} is not a boolean; use 1/0 or true/false")


PREFIX_VARIABLES = ("COMMSCOPE_FR_DUMP_PREFIX", "TORCH_FR_DUMP_TEMP_FILE",
                    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
"""Where the dumps go, by the first of these that is set (else the default)."""


def prefix_from_env(env: Mapping[str, str]) -> str:
    """The dump prefix the environment gives (:data:`PREFIX_VARIABLES`, first set wins;
    else :data:`DEFAULT_DUMP_PREFIX`)."""
    return next((env[k] for k in PREFIX_VARIABLES if env.get(k)), DEFAULT_DUMP_PREFIX)


def resolve_config(
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
    env: Mapping[str, str] | None = None,
) -> FlightConfig:
    """Merge explicit arguments with the environment into a :class:`FlightConfig`.

    Raises ``ValueError`` naming the offending argument or variable.
    """
    env = os.environ if env is None else env
    if buffer_size is None:
        buffer_size, _ = _env_int(env, "TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
        if buffer_size is None:
            buffer_size = DEFAULT_BUFFER_SIZE
    if buffer_size < 0:
        raise ValueError(f"buffer_size must be >= 0 entries, got {buffer_size}")
    if dump_prefix is None:
        dump_prefix = prefix_from_env(env)
    if timeout_s is None:
        text = env.get("COMMSCOPE_FR_TIMEOUT_S")
        if text:
            try:
                timeout_s = float(text)
            except ValueError:
                raise ValueError(
                    f"COMMSCOPE_FR_TIMEOUT_S={text!r} is not a number of seconds"
                ) from None
    if timeout_s is not None and timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s}")
    if timing is None:
        timing = bool(_env_bool(env, "TORCH_NCCL_ENABLE_TIMING"))
    if dump_on_timeout is None:
        flag = _env_bool(env, "TORCH_NCCL_DUMP_ON_TIMEOUT")
        dump_on_timeout = True if flag is None else flag
    if dump_format is None:
        dump_format = (env.get("COMMSCOPE_FR_DUMP_FORMAT") or "pickle").strip().lower()
    if dump_format not in DUMP_FORMATS:
        raise ValueError(f"dump_format must be one of {DUMP_FORMATS}, got {dump_format!r}")
    if max_frames is None:
        max_frames, _ = _env_int(env, "COMMSCOPE_FR_MAX_FRAMES")
        if max_frames is None:
            max_frames = DEFAULT_MAX_FRAMES
    if max_frames < 0:
        raise ValueError(f"max_frames must be >= 0, got {max_frames}")
    if poll_interval_s <= 0:
        raise ValueError(f"poll_interval_s must be > 0 seconds, got {poll_interval_s}")
    if watch_interval_s is None:
        text = env.get("COMMSCOPE_WATCH_INTERVAL_S")
        try:
            watch_interval_s = float(text) if text else DEFAULT_WATCH_INTERVAL_S
        except ValueError:
            raise ValueError(
                f"COMMSCOPE_WATCH_INTERVAL_S={text!r} is not a number of seconds (0 = off)"
            ) from None
    if watch_interval_s < 0:
        raise ValueError(f"watch_interval_s must be >= 0 seconds (0 = off), got "
                         f"{watch_interval_s}")
    if fingerprint is None:
        flag = _env_bool(env, "COMMSCOPE_FR_FINGERPRINT")
        fingerprint = True if flag is None else flag
    return FlightConfig(
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
