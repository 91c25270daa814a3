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
import secrets
import time
import uuid
from typing import Any

__all__ = ["job_identity", "agree_token", "request_secret", "JOB_KEY", "TOKEN_KEY",
           "TOKEN_HASH_KEY", "SECRET_KEY"]

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
:func:`agree_token`); deleted once every rank has read it."""
TOKEN_HASH_KEY = "commscope/watch_token_sha256"
"""Where they compare a token the user set on every host (its hash only)."""
SECRET_KEY = "commscope/request_secret"
"""Where the ranks of a job with no watch token agree on the secret that proves their
dump requests (:func:`request_secret`); deleted once every rank has read it."""
_READERS = "{key}/readers/{attempt}"
"""A counter of the ranks of one attempt (torchrun's restart count) that have read
``key``; the rank that completes it deletes ``key``."""
_warned_token: list[bool] = []


def agree_token(store: Any, token: str, drawn: bool, world_size: int = 0) -> str:
    """The watch token every rank of this job uses, whichever host it runs on.

    ``drawn``: each host's ``commscope run`` drew the token at random
    (``COMMSCOPE_WATCH_TOKEN_DRAWN=1``). Then the first rank to ask the job's store
    offers its own (``compare_set``) and every rank adopts that one, so all ranks publish
    under one key namespace and every host's watch file opens the whole job. The agreed
    token is readable in the store (:data:`TOKEN_KEY`) by whoever reaches it until every
    one of the ``world_size`` ranks has read it: the last one deletes it
    (:func:`_forget_when_all_read`). A token the user or the scheduler set on every host
    (``drawn`` false) never enters the store: the ranks compare its SHA-256 only, and a
    rank whose token differs from the first one's says so once (its host's watch file
    would open nothing). Where the store cannot agree (no ``compare_set``), the rank
    keeps its own. The token is never logged.
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
        if text:
            _forget_when_all_read(store, TOKEN_KEY, world_size)
        return text or token
    if text and text != offer and not _warned_token:
        _warned_token.append(True)
        logger.warning("commscope flight: COMMSCOPE_WATCH_TOKEN on this host differs from the "
                       "token of the rank that started the job: `commscope watch` with this "
                       "host's watch file will not see the job; set the same token on every "
                       "host, or unset it and let `commscope run` agree on one")
    return token


def request_secret(store: Any, token: str, world_size: int = 0) -> str:
    """The secret this rank proves its dump requests with, and checks the other ranks'
    against (:mod:`commscope.flight.out.watchdog`): the job's watch token when it has one
    (``commscope run`` always does); otherwise (``flight.enable()`` in a job started some
    other way, ``COMMSCOPE_WATCH_TOKEN`` unset) a random one the ranks agree on through
    the store as on a drawn token, and forget there the same way. ``""`` where the store
    cannot agree (then requests prove nothing). Never logged, never dumped."""
    if token or store is None:
        return token
    try:
        agreed = store.compare_set(SECRET_KEY, "", secrets.token_hex(16))
    except Exception as exc:  # a store without compare_set (fake, custom)
        logger.debug("commscope flight: no agreed request secret from the store: %r", exc)
        return ""
    text = agreed.decode("utf-8", "replace") if isinstance(agreed, bytes) else str(agreed)
    if text:
        _forget_when_all_read(store, SECRET_KEY, world_size)
    return text


def _forget_when_all_read(store: Any, key: str, world_size: int) -> None:
    """Count this rank as one that has read ``key``; the rank that makes the count a
    multiple of ``world_size`` deletes ``key`` (every rank of the attempt has it now; a
    later default group in the same store agrees anew). The count is kept per attempt
    (``TORCHELASTIC_RESTART_COUNT``): torchrun keeps one store across restarts, and a
    rank of an attempt that died before all had read must not count towards the next."""
    if world_size <= 0:
        return
    readers = _READERS.format(key=key, attempt=os.environ.get("TORCHELASTIC_RESTART_COUNT", ""))
    try:
        if int(store.add(readers, 1)) % world_size == 0:
            store.delete_key(key)
    except Exception as exc:  # a store without delete_key: the key stays
        logger.debug("commscope flight: could not forget %s in the store: %r", key, exc)
