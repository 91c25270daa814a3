"""Splice the recording process group into ``torch.distributed`` (torch 2.13).

Every group torch creates goes through ``distributed_c10d._new_process_group_helper``
(``init_process_group``, ``new_group`` with or without ``use_local_synchronization``,
``new_subgroups``, ``init_device_mesh``). That helper builds the group object with
``ProcessGroup(store, rank, size)`` and then registers the real backends on it. While
recording is enabled we wrap the helper so that, for the length of the call, the name
``ProcessGroup`` inside ``distributed_c10d`` answers construction with a
:class:`~commscope.flight.splice.backend.RecordingProcessGroup` and every ``isinstance`` /
``issubclass`` question exactly as the real class does. Torch then finishes the job
itself: backends, name, description, registry, default group. No backend object is
replaced and the group's identity never changes afterwards.

More patches keep behaviour identical for recording groups:

* ``batch_isend_irecv`` coalesces only when ``type(group) is ProcessGroup``; for a
  recording group on a backend that coalesces (NCCL) we run the same coalescing path,
  and for every group we mark the batch so its p2p ops share one ``p2p_seq_id``;
* ``ProcessGroup.split_group`` (NCCL splitting) returns a plain group built in C++;
  :func:`commscope.flight.splice.backend.adopt` re-registers its backends on a recording
  group.
* on torch before 2.8, whose process-group binding destroys a group while holding the
  GIL, ``destroy_process_group`` (and the end of the interpreter) first lets gloo's
  worker threads finish without the GIL: see :func:`let_workers_finish`.
"""

from __future__ import annotations

import atexit
import functools
import inspect
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from commscope.compat import backend_name, has
from commscope.flight.record.clock import start_clock_service
from commscope.flight.record.creations import Creation
from commscope.flight.record.job import agree_token, job_identity, request_secret
from commscope.flight.record.placement import HostTableGatherer, this_place
from commscope.flight.record.recorder import SLOT, Recorder
from commscope.flight.record.stack import capture_to_user
from commscope.flight.splice.backend import RecordingProcessGroup, adopt_python, timeout_ms
from commscope.flight.splice.selfcheck import splice_missed

__all__ = ["install", "uninstall", "installed", "attach_inner", "existing_groups",
           "let_workers_finish", "WORKER_GRACE_S", "on_abort"]

logger = logging.getLogger(__name__)

_REAL_PG = c10d.ProcessGroup
_BACKEND_SAYS = has("supports_coalescing")
_lock = threading.RLock()
_originals: dict[str, Any] = {}


class _FactoryMeta(type):
    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        return RecordingProcessGroup(*args, **kwargs)

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, _REAL_PG)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, _REAL_PG)

    def __getattr__(cls, name: str) -> Any:
        return getattr(_REAL_PG, name)


class _ProcessGroupFactory(metaclass=_FactoryMeta):
    """Stands in for ``ProcessGroup`` inside ``distributed_c10d`` during group creation."""


def _backend_map(backend: Any) -> dict[str, str]:
    try:
        mapping = c10d.BackendConfig(backend).get_device_backend_map()
        return {str(dev): str(name) for dev, name in mapping.items()}
    except Exception:
        return {"cpu": str(backend).lower()}


def attach_inner(pg: Any, store: Any) -> None:
    """Give a recording group its plain twin (see ``RecordingProcessGroup._commscope_inner``).

    The twin is a plain ``ProcessGroup`` on the same store, rank and size with the very
    same backend objects registered, the same default backend, bound device, name and
    description; the c10d dispatcher cannot tell the two apart.
    """
    options = pg._commscope_options
    if store is None:
        inner = _REAL_PG(pg.rank(), pg.size())
    elif options is not None:  # torch 2.5 and older
        inner = _REAL_PG(store, pg.rank(), pg.size(), options)
    else:
        inner = _REAL_PG(store, pg.rank(), pg.size())
    if pg.bound_device_id is not None:
        inner.bound_device_id = pg.bound_device_id
    type_map = dist.Backend.backend_type_map
    custom = _REAL_PG.BackendType.CUSTOM
    default = str(pg._get_backend_name()).lower()
    if hasattr(inner, "_set_default_backend"):  # before 2.6: set by the options
        inner._set_default_backend(type_map.get(default, custom))
    for device in pg._device_types:
        backend = pg._get_backend(device)
        name = backend_name(backend, default)
        inner._register_backend(device, type_map.get(name, custom), backend)
    inner._set_group_name(pg.group_name)
    inner._set_group_desc(pg.group_desc)
    pg._commscope_inner = inner


def _creation_started(rec: Recorder, bound: dict[str, Any]) -> Creation | None:
    """Note the creation of a group this rank is a member of (``None`` for a rank that
    only passes through: torch calls the helper on non-members too)."""
    if bound.get("group_rank") is None:
        return None
    ranks = list(bound.get("global_ranks_in_group") or [])
    is_default = not ranks
    if is_default:
        ranks = list(range(int(bound["group_size"])))
        # known before the rendezvous: a rank blocked in it can dump and ask others to
        rec.global_rank = int(bound["group_rank"])
        rec.world_size = len(ranks)
        rec.store = bound.get("store")
        _place_rank(rec)
    try:
        caller: Any = sys._getframe(2)
    except ValueError:
        caller = None
    return rec.creations.started(
        str(bound.get("group_name") or ""), str(bound.get("group_desc") or ""), ranks,
        capture_to_user(caller, rec.config.max_frames),
        timeout_ms(bound.get("timeout")) * 1_000_000)


def _patched_helper(*args: Any, **kwargs: Any) -> Any:
    original = _originals["_new_process_group_helper"]
    rec = SLOT.rec
    if rec is None:
        return original(*args, **kwargs)
    creation = None
    try:
        bound = inspect.signature(original).bind(*args, **kwargs).arguments
        creation = _creation_started(rec, bound)
    except Exception as exc:
        rec.fail(exc)
        bound = {}
    with _lock:
        c10d.ProcessGroup = _ProcessGroupFactory  # type: ignore[misc]
        try:
            result = original(*args, **kwargs)
        except BaseException:
            if creation is not None:
                rec.creations.ended(creation, failed=True)
            raise
        finally:
            c10d.ProcessGroup = _REAL_PG  # type: ignore[misc]
    if creation is not None:
        rec.creations.ended(creation)
    pg = result[0] if isinstance(result, tuple) and result else None
    if isinstance(pg, _REAL_PG) and not isinstance(pg, RecordingProcessGroup):
        if not _adopt_python(rec, pg, bound):
            splice_missed(pg)  # loud: logs an error, raises under commscope run
        return result
    try:
        if isinstance(pg, RecordingProcessGroup) and getattr(pg, "_commscope_info", None) is None:
            attach_inner(pg, result[1])
            ranks = list(bound.get("global_ranks_in_group") or [])
            group_rank = int(bound["group_rank"])
            is_default = not ranks
            if is_default:
                ranks = list(range(int(bound["group_size"])))
            rec.attach_group(
                pg,
                ranks,
                group_rank,
                _backend_map(bound.get("backend")),
                timeout_ms(bound.get("timeout")),
            )
            if is_default:
                rec.global_rank = group_rank
                rec.world_size = len(ranks)
                rec.store = bound.get("store")
                rec.job = job_identity(rec.store, rec.world_size)
    except Exception as exc:
        rec.fail(exc)
    return result


def _adopt_python(rec: Recorder, pg: Any, bound: dict[str, Any]) -> bool:
    """A group a custom backend wrote in Python (torch made it the group itself):
    recorded through its own methods (:func:`adopt_python`). ``False`` when it is not
    such a group (or its arguments were not read)."""
    if not bound or getattr(pg, "_commscope_info", None) is not None:
        return getattr(pg, "_commscope_info", None) is not None
    try:
        ranks = list(bound.get("global_ranks_in_group") or [])
        group_rank = int(bound["group_rank"])
        is_default = not ranks
        if is_default:
            ranks = list(range(int(bound["group_size"])))
        if not adopt_python(pg, rec, ranks, group_rank, _backend_map(bound.get("backend")),
                            timeout_ms(bound.get("timeout"))):
            return False
        if is_default:
            rec.global_rank = group_rank
            rec.world_size = len(ranks)
            rec.store = bound.get("store")
            rec.job = job_identity(rec.store, rec.world_size)
        return True
    except Exception as exc:
        rec.fail(exc)
        return True


def _place_rank(rec: Recorder) -> None:
    """Once the default group exists: the job's one watch token (every host's ranks
    publish under it) and the secret its dump requests are proven with, this rank's
    place and the gathering of the job's host table."""
    token = os.environ.get("COMMSCOPE_WATCH_TOKEN", "")
    drawn = os.environ.get("COMMSCOPE_WATCH_TOKEN_DRAWN") == "1"
    rec.watch_token = agree_token(rec.store, token, drawn, rec.world_size)
    rec.request_secret = request_secret(rec.store, rec.watch_token, rec.world_size)
    rec.place = this_place(rec.global_rank, rec.config.dump_prefix)
    rec.hosts = HostTableGatherer(rec.place, rec.global_rank, rec.world_size)
    if rec.global_rank == 0 and rec.clock_service is None and rec.store is not None:
        start_clock_service(rec)


def _peer_kwarg(op: Any) -> dict[str, int]:
    key = "group_dst" if op.op is dist.isend else "group_src"
    return {key: op.group_peer}


def _patched_batch_isend_irecv(p2p_op_list: list[Any]) -> list[Any]:
    original = _originals["batch_isend_irecv"]
    rec = SLOT.rec
    group = p2p_op_list[0].group if p2p_op_list else None
    if group is None and p2p_op_list and c10d.is_initialized():
        group = c10d._get_default_group()
    info = getattr(group, "_commscope_info", None)
    if rec is None or info is None or not rec.active:
        return original(p2p_op_list)
    with rec.ring.lock:
        info.p2p_seq_id += 1
        info.batch_p2p_seq = info.p2p_seq_id
    try:
        device = p2p_op_list[0].tensor.device
        # torch 2.6 decides by the device type alone (a recording group is coalesced
        # there as a plain one is); later releases by the backend's say, but only for a
        # group of exactly the class ProcessGroup, which ours is not.
        if _BACKEND_SAYS and _coalesces(group, device):
            # What torch does for a plain ProcessGroup on a coalescing backend (NCCL):
            # issue every op inside one coalescing block.
            c10d._check_p2p_op_list(p2p_op_list)
            with c10d._coalescing_manager(group, device, async_ops=True) as cm:
                for op in p2p_op_list:
                    op.op(op.tensor, group=op.group, tag=op.tag, **_peer_kwarg(op))
            return cm.works
        return original(p2p_op_list)
    finally:
        info.batch_p2p_seq = None


def _coalesces(group: Any, device: Any) -> bool:
    """Whether ``group``'s backend for ``device`` coalesces ops (NCCL); ``False`` for a
    group written in Python, which has no C++ backend (it coalesces as it likes)."""
    try:
        return bool(group._get_backend(device).supports_coalescing)
    except (RuntimeError, AttributeError):
        return False


WORKER_GRACE_S = 0.05
"""How long :func:`let_workers_finish` waits without the GIL (torch before 2.8)."""

_exit_hook: list[bool] = []


def let_workers_finish() -> None:
    """Wait :data:`WORKER_GRACE_S` without the GIL when groups exist, on torch before 2.8.

    There, a group is destroyed with the GIL held, and gloo's destructor joins its worker
    threads; a worker still releasing a finished work whose tensor's Python object died
    first needs the GIL to free it, so both wait for good (PyTorch fixed the binding in
    2.8). torch alone meets this about once in a dozen 2-rank jobs that end with
    ``destroy_process_group``; our Python around each collective made it more than half
    of them on 2.7.1. Sleeping hands the GIL to those workers first.
    """
    if not has("pg_destructor_releases_gil") and c10d.is_initialized():
        time.sleep(WORKER_GRACE_S)


def _patched_destroy_process_group(*args: Any, **kwargs: Any) -> Any:
    let_workers_finish()
    return _originals["destroy_process_group"](*args, **kwargs)


_abort_hook: list[Callable[[], None]] = []


def on_abort(hook: Callable[[], None] | None) -> None:
    """Run ``hook`` (the recorder's dump) before a process group is aborted: what a
    fault-tolerance wrapper (NVRx's in-process restart) does to the groups of a failed
    job, after which their records are gone."""
    _abort_hook[:] = [hook] if hook is not None else []


def _patched_abort(*args: Any, **kwargs: Any) -> Any:
    for hook in list(_abort_hook):
        try:
            hook()
        except Exception as exc:  # never in the way of the abort itself
            logger.warning("commscope flight: dump before the abort failed: %r", exc)
    return _originals["_abort_process_group"](*args, **kwargs)


def install() -> None:
    """Patch ``torch.distributed`` so groups created from now on are recorded."""
    with _lock:
        if _originals:
            return
        if hasattr(c10d, "_abort_process_group"):
            _originals["_abort_process_group"] = c10d._abort_process_group
            functools.update_wrapper(_patched_abort, _originals["_abort_process_group"])
            c10d._abort_process_group = _patched_abort
        _originals["_new_process_group_helper"] = c10d._new_process_group_helper
        _originals["batch_isend_irecv"] = c10d.batch_isend_irecv
        _patched_helper.__wrapped__ = _originals["_new_process_group_helper"]  # type: ignore[attr-defined]
        c10d._new_process_group_helper = _patched_helper
        c10d.batch_isend_irecv = _patched_batch_isend_irecv
        dist.batch_isend_irecv = _patched_batch_isend_irecv  # type: ignore[attr-defined]
        if not has("pg_destructor_releases_gil"):
            _originals["destroy_process_group"] = c10d.destroy_process_group
            functools.update_wrapper(_patched_destroy_process_group,
                                     _originals["destroy_process_group"])
            c10d.destroy_process_group = _patched_destroy_process_group
            dist.destroy_process_group = _patched_destroy_process_group  # type: ignore[attr-defined]
            if not _exit_hook:  # groups left to the end of the interpreter: the same wait
                atexit.register(let_workers_finish)
                _exit_hook.append(True)


def uninstall() -> None:
    """Undo :func:`install`; groups already recording keep their class but stop recording."""
    with _lock:
        if not _originals:
            return
        _restore(c10d, "_new_process_group_helper", _patched_helper)
        if "_abort_process_group" in _originals:
            _restore(c10d, "_abort_process_group", _patched_abort)
        _restore(c10d, "batch_isend_irecv", _patched_batch_isend_irecv)
        if dist.batch_isend_irecv is _patched_batch_isend_irecv:  # type: ignore[attr-defined]
            dist.batch_isend_irecv = _originals["batch_isend_irecv"]  # type: ignore[attr-defined]
        if "destroy_process_group" in _originals:
            _restore(c10d, "destroy_process_group", _patched_destroy_process_group)
            if dist.destroy_process_group is _patched_destroy_process_group:  # type: ignore[attr-defined]
                dist.destroy_process_group = _originals["destroy_process_group"]  # type: ignore[attr-defined]
        _originals.clear()


def _restore(module: Any, name: str, ours: Callable[..., Any]) -> None:
    if getattr(module, name) is ours:
        setattr(module, name, _originals[name])


def installed() -> bool:
    """Whether the patches are in place."""
    return bool(_originals)


def existing_groups() -> int:
    """How many process groups torch already has (created before recording started)."""
    if not c10d.is_initialized():
        return 0
    return len(c10d._world.pg_map)
