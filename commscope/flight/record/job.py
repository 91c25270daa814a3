"""Which job (and which attempt of it) a rank belongs to, agreed through the job's store.

A restarted job (torchrun ``--max-restarts``, a scheduler's requeue) or a reused dump
folder leaves the files of an earlier attempt beside the new ones; the analyzer must
never merge the two. So, once the default group exists, every rank asks the job's own
store for one id: the first rank to ask draws it at random (``compare_set``), every
other rank reads the same one, and a new attempt (a new rendezvous store) draws anew.
The dump carries it as ``commscope_job`` with what torchrun says of the attempt.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from typing import Any

__all__ = ["job_identity", "JOB_KEY"]

logger = logging.getLogger(__name__)

JOB_KEY = "commscope/job_id"


def job_identity(store: Any, world_size: int) -> dict[str, Any]:
    """``{"id", "run_id", "restart", "master", "world_size", "started_ns"}`` for this
    rank's job; ``id`` is shared by every rank of the attempt ("" when the store cannot
    agree on one: then the other fields tell jobs apart)."""
    env = os.environ
    info: dict[str, Any] = {
        "id": "",
        "run_id": env.get("TORCHELASTIC_RUN_ID", ""),
        "restart": _int(env.get("TORCHELASTIC_RESTART_COUNT")),
        "master": f"{env.get('MASTER_ADDR', '')}:{env.get('MASTER_PORT', '')}".strip(":"),
        "world_size": world_size,
        "started_ns": time.time_ns(),
    }
    if store is not None:
        try:
            agreed = store.compare_set(JOB_KEY, "", uuid.uuid4().hex)
            info["id"] = agreed.decode() if isinstance(agreed, bytes) else str(agreed)
        except Exception as exc:  # a store without compare_set (fake, custom)
            logger.debug("commscope flight: no job id from the store: %r", exc)
    return info


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None
