"""Count collectives where they enter ``torch.distributed``, with no dispatch mode.

``CommDebugMode(ops=False)`` wants collectives and modules only. A ``TorchDispatchMode``
sees every op of the model and costs about 1.5x on a small forward even when it does
nothing; this module instead hooks the few Python entry points every collective passes
through, so ops that are not collectives run at full speed:

1. **Process-group methods** (``ProcessGroup.allreduce``, ``_allgather_base``,
   ``send``...): what ``torch.distributed.all_reduce`` and every other eager c10d call
   end in. Each is counted under the ``c10d`` op packet the method dispatches to
   (``allreduce`` -> ``c10d.allreduce_``), the key the dispatch-mode capture uses.
2. **Op packets** of the collective namespaces (``torch.ops._c10d_functional.all_reduce``,
   ``torch.ops._dtensor.shard_dim_alltoall``, ...): what functional collectives, DTensor
   and FSDP call. The packet attribute on its ``torch.ops`` namespace is swapped for a
   proxy that counts and calls through; everything else (``.default``, schemas) is the
   packet's own.
3. **torch.compile**: while dynamo traces, the hooks step aside, so a graph holds
   torch's own op and no bookkeeping (no graph break). The compiled code calls the op
   directly afterwards, so collectives inside compiled regions are **not** counted in
   this mode; the full mode (``ops=True``) counts them.
4. **Nesting**: a collective issued inside a counted one (``shard_dim_alltoall``'s
   all-gather on CPU, a recording group's plain twin) is not counted again; a
   thread-local depth says so.

The hooks are installed while at least one such mode is active and removed when the
last one exits (also on an exception). They see collectives from every thread (a
dispatch mode sees only its own thread's and the autograd engine's). Collectives issued
from C++ without passing through Python (DDP's reducer) reach neither hook point unless
the group is a flight-recording group (``commscope.flight``), whose Python methods
hand every call to the hooked methods of its plain twin.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Protocol

import torch
from torch._C._distributed_c10d import ProcessGroup

from commscope.comm.capture import registry

__all__ = ["HookedMode", "attach", "detach", "attached", "PG_METHOD_OPS"]

logger = logging.getLogger(__name__)

PG_METHOD_OPS: dict[str, str] = {
    "allreduce": "allreduce_",
    "allreduce_coalesced": "allreduce_coalesced_",
    "broadcast": "broadcast_",
    "allgather": "allgather_",
    "_allgather_base": "_allgather_base_",
    "allgather_coalesced": "allgather_coalesced_",
    "allgather_into_tensor_coalesced": "allgather_into_tensor_coalesced_",
    "reduce_scatter": "reduce_scatter_",
    "_reduce_scatter_base": "_reduce_scatter_base_",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor_coalesced_",
    # torch 2.13's names for the tensor forms (all_gather_into_tensor and friends)
    "all_gather_single": "_allgather_base_",
    "all_gather_single_coalesced": "allgather_into_tensor_coalesced_",
    "reduce_scatter_single": "_reduce_scatter_base_",
    "reduce_scatter_single_coalesced": "reduce_scatter_tensor_coalesced_",
    "all_to_all_single": "alltoall_base_",
    "reduce": "reduce_",
    "gather": "gather_",
    "scatter": "scatter_",
    "alltoall": "alltoall_",
    "alltoall_base": "alltoall_base_",
    "barrier": "barrier",
    "monitored_barrier": "monitored_barrier_",
    "send": "send",
    "recv": "recv_",
    "recv_anysource": "recv_any_source_",
}
"""``ProcessGroup`` method -> the ``c10d`` op it dispatches to (and is counted under)."""
_PACKET_NAMESPACES = ("_c10d_functional", "_c10d_functional_autograd", "_dtensor")
"""Namespaces whose packets Python code calls (funcol, DTensor, FSDP, compiled graphs
replayed eagerly). ``torch.ops.c10d.*`` is what the process-group methods dispatch to from
C++, and the legacy ``c10d_functional`` namespace has no Python callers in torch 2.13:
swapping their packets too would double the cost of entering the block for nothing."""


class HookedMode(Protocol):
    """What a mode attached here must offer (``CommDebugMode`` does)."""

    def _count_hooked(self, cls: registry.OpClass, args: tuple[Any, ...],
                      kwargs: dict[str, Any] | None, out: Any, group: Any) -> None:
        """Count one collective; ``group`` is the ``ProcessGroup`` or ``None`` (read it
        from the arguments)."""

    def _count_hooked_batch(self, batch: registry.BatchP2P, args: tuple[Any, ...],
                            kwargs: dict[str, Any] | None) -> None:
        """Count the sends and recvs of one ``batch_p2p_ops`` call."""


class _State(threading.local):
    depth = 0


_tls = _State()
_compiling = torch.compiler.is_compiling
"""Dynamo traces through the hooks: it must see torch's own call and no bookkeeping."""
_lock = threading.Lock()
_modes: list[HookedMode] = []


def _notify(cls: registry.OpClass, args: tuple[Any, ...], kwargs: dict[str, Any] | None,
            out: Any, group: Any) -> None:
    for mode in tuple(_modes):
        try:
            mode._count_hooked(cls, args, kwargs, out, group)
        except Exception as exc:  # bookkeeping must never break the user's job
            logger.debug("cannot count %s: %s", cls.key, exc)


def _hook_method(original: Any, cls: registry.OpClass) -> Any:
    def hooked(self: Any, *args: Any, **kwargs: Any) -> Any:
        tls = _tls
        if tls.depth or not _modes or _compiling():
            return original(self, *args, **kwargs)
        tls.depth += 1
        try:
            out = original(self, *args, **kwargs)
        finally:
            tls.depth -= 1
        _notify(cls, args, kwargs, out, self)
        return out

    hooked.__name__ = getattr(original, "__name__", "hooked")
    hooked.__doc__ = getattr(original, "__doc__", None)
    hooked.__wrapped__ = original  # type: ignore[attr-defined]
    return hooked


class _CountingPacket:
    """Stands in for one ``OpOverloadPacket``: counts calls, delegates everything else."""

    # No __slots__: dynamo guards on the ``__dict__`` of what it traces through.

    def __init__(self, packet: Any, cls: registry.OpClass | None,
                 batch: registry.BatchP2P | None) -> None:
        self._packet = packet
        self._cls = cls
        self._batch = batch

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        tls = _tls
        if tls.depth or not _modes or _compiling():
            return self._packet(*args, **kwargs)
        tls.depth += 1
        try:
            out = self._packet(*args, **kwargs)
        finally:
            tls.depth -= 1
        if self._batch is not None:
            for mode in tuple(_modes):
                try:
                    mode._count_hooked_batch(self._batch, args, kwargs)
                except Exception as exc:  # bookkeeping must never break the user's job
                    logger.debug("cannot count batch_p2p_ops: %s", exc)
        elif self._cls is not None:
            _notify(self._cls, args, kwargs, out, None)
        return out

    @property
    def __wrapped__(self) -> Any:
        """The packet torch made (what this proxy stands in for)."""
        return self._packet

    def __getattr__(self, name: str) -> Any:
        return getattr(self._packet, name)

    def __repr__(self) -> str:
        return repr(self._packet)


class _Plan:
    """What to swap, worked out once per process (see :func:`_make_plan`)."""

    def __init__(self, methods: list[tuple[str, Any, Any]],
                 packets: list[tuple[Any, str, Any, Any]]) -> None:
        self.methods = methods
        """``(method name, torch's method, ours)`` per ``ProcessGroup`` method."""
        self.packets = packets
        """``(namespace, name, torch's packet, proxy)`` per op packet."""
        self.ours: list[tuple[dict[str, Any], dict[str, Any]]] = []
        """Per namespace: its ``__dict__`` and ``{name: proxy}`` to put into it."""
        self.theirs: list[tuple[dict[str, Any], dict[str, Any]]] = []
        """Per namespace: its ``__dict__`` and ``{name: torch's packet}`` to put back."""
        by_space: dict[int, tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = {}
        for space, name, packet, proxy in packets:
            entry = by_space.setdefault(id(space), (vars(space), {}, {}))
            entry[1][name] = proxy
            entry[2][name] = packet
        for space_dict, ours, theirs in by_space.values():
            self.ours.append((space_dict, ours))
            self.theirs.append((space_dict, theirs))


_plan: _Plan | None = None


def _make_plan() -> _Plan:
    """What to swap, worked out once per process: the process-group methods and the op
    packets of the collective namespaces.

    Every packet is classified before any is swapped: classifying reads the legacy
    packets (the keys), which must be torch's own, never a proxy of ours.
    """
    methods = []
    for method, op_name in PG_METHOD_OPS.items():
        original = ProcessGroup.__dict__.get(method)
        packet = getattr(torch.ops.c10d, op_name, None) if original is not None else None
        func = getattr(packet, "default", None)
        cls = registry.classify(func) if func is not None else None
        if cls is not None:
            methods.append((method, original, _hook_method(original, cls)))
    packets = []
    for qualified in torch._C._dispatch_get_all_op_names():
        namespace, _, name = qualified.partition("::")
        if namespace not in _PACKET_NAMESPACES or "." in name:
            continue
        space = getattr(torch.ops, namespace)
        try:
            packet = getattr(space, name)
            func = packet.default
        except (AttributeError, RuntimeError):
            continue
        packet = getattr(packet, "__wrapped__", packet)
        cls = registry.classify(func)
        batch = None if cls is not None else registry.batch_p2p_class(func)
        if cls is not None or batch is not None:
            packets.append((space, name, packet, _CountingPacket(packet, cls, batch)))
    return _Plan(methods, packets)


_installed = False


def _install() -> None:
    """Swap ours in. A namespace keeps its packets in its instance ``__dict__`` (where
    ``torch.ops`` caches them on first use), so one ``dict.update`` per namespace does
    what a ``setattr`` per packet would."""
    global _plan, _installed
    if _plan is None:
        _plan = _make_plan()
    _installed = True
    for method, _original, hooked in _plan.methods:
        setattr(ProcessGroup, method, hooked)
    for space_dict, ours in _plan.ours:
        space_dict.update(ours)


def _uninstall() -> None:
    """Put torch's own back (also after a partial install)."""
    global _installed
    _installed = False
    if _plan is None:
        return
    for method, original, _hooked in _plan.methods:
        setattr(ProcessGroup, method, original)
    for space_dict, theirs in _plan.theirs:
        space_dict.update(theirs)


def attach(mode: HookedMode) -> None:
    """Start counting into ``mode`` (installs the hooks for the first mode)."""
    with _lock:
        if not _modes:
            try:
                _install()
            except BaseException:
                _uninstall()
                raise
        _modes.append(mode)


def detach(mode: HookedMode) -> None:
    """Stop counting into ``mode`` (removes the hooks after the last mode)."""
    with _lock:
        if mode in _modes:
            _modes.remove(mode)
        if not _modes:
            _uninstall()


def attached() -> bool:
    """Whether the hooks are installed right now."""
    return _installed
