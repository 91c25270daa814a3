"""Which job (and which attempt of it) a rank belongs to, agreed through the job's store.

A restarted job (torchrun ``--max-restarts``, a scheduler's requeue) or a reused dump
folder leaves the files of an earlier attempt beside the new ones; the analyzer must
never merge the two. So, once the default group exists, every rank asks the job's own
store for one id: the first rank to ask draws it at random (``compare_set``), every
other rank reads the same one, and a new attempt (a new rendezvous store) draws anew.
The dump carries it as ``commscope_job`` with what torchrun says of the attempt.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
import uuid
from typing import Any

__all__ = ["job_identity", "agree_token", "JOB_KEY", "TOKEN_KEY", "TOKEN_HASH_KEY"]

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


TOKEN_KEY = "commscope/watch_token"
"""Where the ranks of one attempt agree on a token ``commscope run`` drew (see
:func:`agree_token`)."""
TOKEN_HASH_KEY = "commscope/watch_token_sha256"
"""Where they compare a token the user set on every host (its hash only)."""
_warned_token: list[bool] = []


def agree_token(store: Any, token: str, drawn: bool) -> str:
    """The watch token every rank of this job uses, whichever host it runs on.

    ``drawn``: each host's ``commscope run`` drew the token at random
    (``COMMSCOPE_WATCH_TOKEN_DRAWN=1``). Then the first rank to ask the job's store
    offers its own (``compare_set``) and every rank adopts that one, so all ranks publish
    under one key namespace and every host's watch file opens the whole job; the agreed
    token is then readable by whoever reaches the store (docs/hosts.md). A token the user
    or the scheduler set on every host (``drawn`` false) never enters the store: the
    ranks compare its SHA-256 only, and a rank whose token differs from the first one's
    says so once (its host's watch file would open nothing). Where the store cannot
    agree (no ``compare_set``), the rank keeps its own. The token is never logged.
    """
    if store is None or not token:
        return token
    offer = token if drawn else hashlib.sha256(token.encode("utf-8")).hexdigest()
    try:
        agreed = store.compare_set(TOKEN_KEY if drawn else TOKEN_HASH_KEY, "", offer)
    except Exception as exc:  # a store without compare_set (fake, custom)
        logger.debug("commscope flight: no agreed watch token from the store: %r", exc)
        return token
    text = agreed.decode("utf-8", "replace") if isinstance(agreed, bytes) else str(agreed)
    if drawn:
        return text or token
    if text and text != offer and not _warned_token:
        _warned_token.append(True)
        logger.warning("commscope flight: COMMSCOPE_WATCH_TOKEN on this host differs from the "
                       "token of the rank that started the job: `commscope watch` with this "
                       "host's watch file will not see the job; set the same token on every "
                       "host, or unset it and let `commscope run` agree on one")
    return token
