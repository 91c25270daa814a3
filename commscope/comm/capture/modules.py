"""Which module an op belongs to, and in which phase: the comm tracer's module tracker.

Forward: one global forward pre-hook pushes the module on a stack and one global forward
hook (``always_call=True``) pops it. A module with forward hooks of its own (TP's output
redistribution, FSDP's reshard) is popped instead by a hook of ours registered after
its own (the first time it runs in a ``with`` block), because global forward hooks run
before a module's hooks. So TP's input and output redistributions belong to the module,
and a module that raises still pops. A module may run any number of times.

Backward: no backward hook at all (no ``BackwardHook`` wrapping, no extra ``view`` ops).
Every autograd node has a sequence number taken from a per-thread counter when the
forward created it. On every push and pop the tracker writes down the counter and the
module now on top; in backward, the node being executed
(``torch._C._current_autograd_node()``) belongs to the module that was on top when its
sequence number was handed out (a binary search). Hooks that run inside a node (FSDP's
pre- and post-backward hooks, TP's redistribution backward) therefore count for the
module whose forward created them. ``AccumulateGrad`` nodes belong to the module that
owns the parameter. What runs in backward outside any node (engine callbacks queued at
the end of backward, where FSDP2 reduce-scatters the first layer's gradients) belongs
to the module whose node ran last.

Phases: ``forward``; ``backward`` while the autograd engine runs; ``checkpointing`` for a
forward recomputed inside backward (activation checkpointing); ``after_backward`` for
what runs outside every module after a backward pass (an optimizer step, a manual
gradient all-reduce) until the next module forward.

Names follow PyTorch's ``ModTracker``: the first module seen is named by its class
name, its children ``parent.child`` recursively; ``"Global"`` is outside every module.
A block over a model that an earlier block already named takes the names from
``_NAMINGS`` after checking that the tree has the same shape (see ``_NamingCache``).
Parameters are listed at a module's first sight but read (owners, meshes) only when
backward or a report needs them.
"""

from __future__ import annotations

import threading
import weakref
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Any

from torch.nn.modules import module as _nn_module
from torch.nn.modules.module import (
    register_module_forward_hook,
    register_module_forward_pre_hook,
)
from torch.utils.hooks import RemovableHandle

from commscope.comm.capture.counts import CommCounts
from commscope.comm.capture.needs import torch_internal

__all__ = [
    "FORWARD",
    "BACKWARD",
    "CHECKPOINTING",
    "AFTER_BACKWARD",
    "PHASE_NAMES",
    "COUNT_PHASES",
    "ModuleRecord",
    "ModuleTracker",
]

FORWARD = 0
BACKWARD = 1
CHECKPOINTING = 2
AFTER_BACKWARD = 3
PHASE_NAMES = ("forward", "backward", "checkpointing", "after_backward")
"""Phase codes -> names, as used in op lists."""
COUNT_PHASES = ("forward", "backward", "after_backward")
"""Collective counts are kept per these three phases (a recompute's collectives count as
backward, as PyTorch counts them)."""
_COUNT_BUCKET = (0, 1, 1, 2)

_graph_task_id = torch_internal("_C._current_graph_task_id")
_current_node = torch_internal("_C._current_autograd_node")
_next_sequence_nr = torch_internal("_C._autograd._get_sequence_nr")
_get_ident = threading.get_ident
_NO_SEQUENCE = 1 << 63  # AccumulateGrad nodes carry UINT64_MAX
_GLOBAL_HOOK_DICTS = (
    getattr(_nn_module, "_global_forward_pre_hooks", None),
    getattr(_nn_module, "_global_forward_hooks", None),
    getattr(_nn_module, "_global_forward_hooks_always_called", None),
)
"""torch.nn's global forward-hook registries (``None`` where a torch keeps them elsewhere)."""


@dataclass(eq=False, slots=True)
class ModuleRecord:
    """One module FQN seen inside the block, with what happened in it."""

    fqn: str
    """``"Global"`` or the module's fully-qualified name (``MLPModule.net1``)."""
    depth: int
    """0 for Global, 1 for the root module, +1 per level."""
    module_type: str = ""
    """``str(type(module))`` without ``<>``, PyTorch's spelling; "" for Global."""
    parent: ModuleRecord | None = None
    """The module it first ran under (``None`` for Global)."""
    ancestors: tuple[ModuleRecord, ...] = ()
    """Parent, grand-parent, ..., Global: where its collectives roll up to."""
    children: list[str] = field(default_factory=list)
    """FQNs of the modules first run under this one, in call order, each once (names,
    not records: links go upward only, so a finished trace is freed without the GC)."""
    params: list[tuple[str, Any]] = field(default_factory=list)
    """Direct parameters ``(name, parameter)`` (``recurse=False``)."""
    ops: list[tuple[Any, int, Any]] = field(default_factory=list)
    """Ops run here: ``(op overload, phase code, specs)``; ``specs`` lists the
    ``DTensorSpec`` of each positional DTensor argument of a DTensor-level op (shape,
    placements, mesh, read when a report is made), ``None`` for a plain op."""
    counts: tuple[CommCounts, CommCounts, CommCounts] | None = None
    """Collective counts per :data:`COUNT_PHASES`, this module and its descendants
    (``None`` until the first one; see :meth:`phase_counts`)."""
    calls: int = 0
    """Forward calls (recomputes excluded)."""

    def phase_counts(self) -> tuple[CommCounts, CommCounts, CommCounts]:
        """The three per-phase count dicts, created on first use."""
        if self.counts is None:
            self.counts = (CommCounts(), CommCounts(), CommCounts())
        return self.counts


class ModuleTracker:
    """Tracks the current module and phase for the comm tracer (see the module doc).

    Also answers the attribute names of PyTorch's ``_CommModeModuleTracker`` that user
    code reads (``module_helper_dict``, ``parent_dict``, ``sharding_dict`` ...).
    """

    def __init__(self) -> None:
        # id(module) -> [weak reference, fqn, children named?]; a plain dict because a
        # WeakKeyDictionary lookup builds a weak reference every time.
        self._names: dict[int, list[Any]] = {}
        self._handles: list[Any] = []
        self._direct: list[tuple[dict[int, Any], dict[int, bool], int]] = []
        self.active = False
        self._used = False
        self.reset()

    # ------------------------------------------------------------------ state

    def reset(self) -> None:
        """Forget everything recorded (names of modules are kept, as PyTorch keeps them)."""
        self.global_record = ModuleRecord(fqn="Global", depth=0)
        self.records: dict[str, ModuleRecord] = {"Global": self.global_record}
        self._by_module: dict[Any, ModuleRecord] = {}
        self._local: set[Any] = set()
        self.stack: list[tuple[ModuleRecord, bool]] = []
        self.top: ModuleRecord = self.global_record
        self.top_phase = FORWARD
        self._global_phase = FORWARD
        self._bp_seq: list[int] = []
        self._bp_owner: list[ModuleRecord] = []
        self._param_owner: dict[int, ModuleRecord] = {}
        self._unscanned: list[ModuleRecord] = []
        self.last_node: Any = None
        self.last_owner: ModuleRecord = self.global_record
        self._meshes: dict[int, Any] = {}
        self.last_mesh: Any = None

    def enter(self) -> None:
        """Start tracking: install the global forward hooks."""
        if self._used:
            self.reset()
        self._used = True
        self._thread = threading.get_ident()
        self._local = set()
        self._handles = []
        pre, post, always = _GLOBAL_HOOK_DICTS
        if isinstance(pre, dict) and isinstance(post, dict) and isinstance(always, dict):
            # What register_module_forward_(pre_)hook do, without building a
            # RemovableHandle each (a few microseconds per block); undone in exit().
            hook_id = RemovableHandle.next_id
            RemovableHandle.next_id += 2
            pre[hook_id] = self._pre_hook
            post[hook_id + 1] = self._global_post_hook
            always[hook_id + 1] = True
            self._direct += [(pre, {}, hook_id), (post, always, hook_id + 1)]
        else:
            self._handles = [
                register_module_forward_pre_hook(self._pre_hook),
                register_module_forward_hook(self._global_post_hook, always_call=True),
            ]
        self._mark(self.global_record)  # enter() runs on the forward thread
        self.active = True

    def _add_local_hook(self, mod: Any) -> None:
        """``mod.register_forward_hook(self._local_post_hook, always_call=True)``, without
        building a ``RemovableHandle`` (a few microseconds per module and per block):
        the hook goes straight into the module's hook dicts under a fresh handle id and
        comes out again in :meth:`exit`. Falls back to the public call if the module does
        not keep its hooks the way ``torch.nn.Module`` 2.x does."""
        hooks = mod.__dict__.get("_forward_hooks")
        always = mod.__dict__.get("_forward_hooks_always_called")
        if not isinstance(hooks, dict) or not isinstance(always, dict):
            self._handles.append(mod.register_forward_hook(self._local_post_hook, always_call=True))
            return
        hook_id = RemovableHandle.next_id
        RemovableHandle.next_id += 1
        hooks[hook_id] = self._local_post_hook
        always[hook_id] = True
        self._direct.append((hooks, always, hook_id))

    def exit(self) -> None:
        """Stop tracking: remove every hook, drop module references, keep the records."""
        self.active = False
        for handle in self._handles:
            handle.remove()
        self._handles = []
        for hooks, always, hook_id in self._direct:
            hooks.pop(hook_id, None)
            always.pop(hook_id, None)
        self._direct = []
        self._by_module = {}
        self._local = set()
        self.stack = []
        self.top = self.global_record
        self.last_node = None

    # ------------------------------------------------------------------ naming

    def _entry(self, mod: Any) -> list[Any] | None:
        entry = self._names.get(id(mod))
        if entry is not None and entry[0]() is mod:
            return entry
        return None

    def _set_name(self, mod: Any, name: str) -> list[Any]:
        # A new entry every time, never an edit: entries may be shared with _NAMINGS.
        # A rename keeps "children named" (PyTorch's ModTracker walks a module once).
        entry = self._entry(mod)
        if entry is None:
            entry = self._names[id(mod)] = [weakref.ref(mod), name, False]
        else:
            entry = self._names[id(mod)] = [entry[0], name, entry[2]]
        return entry

    def _name(self, mod: Any) -> str:
        entry = self._entry(mod)
        if entry is None:
            if not self._names:
                # This tracker's first module: what a walk from it would name is
                # probably known already, from an earlier block over the same model.
                cached = _NAMINGS.lookup(mod)
                if cached is not None:
                    self._names.update(cached)
                    return cached[id(mod)][1]
                name = self._walk(mod, self._set_name(mod, type(mod).__name__))
                _NAMINGS.store(mod, self._names)
                return name
            entry = self._set_name(mod, type(mod).__name__)
        if entry[2]:
            return entry[1]
        return self._walk(mod, entry)

    def _walk(self, mod: Any, entry: list[Any]) -> str:
        """Name ``mod``'s descendants ``parent.child``, recursively (PyTorch's order)."""
        name = entry[1]
        seen: set[int] = set()
        for child_name, child in mod._modules.items():  # named_children(), faster
            if child is None or id(child) in seen:
                continue
            seen.add(id(child))
            self._set_name(child, f"{name}.{child_name}")
            self._name(child)
        entry[2] = True
        return name

    def get_known_fqn(self, mod: Any) -> str | None:
        """The FQN given to ``mod``, or ``None`` if it was never seen."""
        entry = self._entry(mod)
        return None if entry is None else entry[1]

    # ------------------------------------------------------------------ hooks

    def _first_sight(self, mod: Any) -> ModuleRecord:
        entry = self._names.get(id(mod))
        if entry is not None and entry[2] and entry[0]() is mod:
            fqn = entry[1]
        else:
            fqn = self._name(mod)
        rec = self.records.get(fqn)
        if rec is None:
            stack = self.stack
            parent = stack[-1][0] if stack else self.global_record
            cls = type(mod)
            params = []
            for item in mod._parameters.items():  # a loop: a comprehension is a call
                if item[1] is not None:
                    params.append(item)
            rec = ModuleRecord(
                fqn, len(stack) + 1, _TYPE_NAMES.get(cls) or _type_name(cls), parent,
                (parent, *parent.ancestors), [], params,
            )
            parent.children.append(fqn)
            self.records[fqn] = rec
            if params:
                self._unscanned.append(rec)
        self._by_module[mod] = rec
        return rec

    def _pre_hook(self, mod: Any, args: Any) -> None:
        rec = self._by_module.get(mod)
        if rec is None:
            rec = self._first_sight(mod)
        if mod._forward_hooks and mod not in self._local:
            # The module has forward hooks of its own (TP's output redistribution, FSDP's
            # reshard): pop only after them, from a hook registered after theirs.
            self._local.add(mod)
            self._add_local_hook(mod)
        if _graph_task_id() == -1:
            self.stack.append((rec, False))
            rec.calls += 1
            self.top_phase = self._global_phase = FORWARD
        else:
            self.stack.append((rec, True))
            self.top_phase = CHECKPOINTING
        self.top = rec
        if _get_ident() == self._thread:
            self._mark(rec)

    def _global_post_hook(self, mod: Any, args: Any, output: Any) -> None:
        if mod not in self._local:
            self._pop(mod)

    def _local_post_hook(self, mod: Any, args: Any, output: Any) -> None:
        self._pop(mod)

    def _pop(self, mod: Any) -> None:
        rec = self._by_module.get(mod)
        stack = self.stack
        if stack and stack[-1][0] is rec:
            stack.pop()
        else:
            for i in range(len(stack) - 1, -1, -1):
                if stack[i][0] is rec:
                    del stack[i:]
                    break
            else:
                return
        if stack:
            self.top, recompute = stack[-1]
            self.top_phase = CHECKPOINTING if recompute else FORWARD
        else:
            self.top = self.global_record
            self.top_phase = self._global_phase
        if _get_ident() == self._thread:
            self._mark(self.top)

    def _mark(self, rec: ModuleRecord) -> None:
        """Nodes created from now on belong to ``rec`` (call on the forward thread only).

        A mark with no node created since the one before replaces it: the lists grow
        with the autograd nodes, not with the module calls.
        """
        seq = _next_sequence_nr()
        marks = self._bp_seq
        if marks:
            last = marks[-1]
            if seq == last:
                self._bp_owner[-1] = rec
                return
            if seq < last:
                return
        marks.append(seq)
        self._bp_owner.append(rec)

    # ------------------------------------------------------------------ lookups

    def backward_owner(self, node: Any) -> tuple[ModuleRecord, int]:
        """The module and phase of an op running while the autograd engine runs.

        ``node`` is ``torch._C._current_autograd_node()``; the dispatch hook answers the
        common case (same node as the previous op, no recompute) without calling this.
        """
        stack = self.stack
        if stack:
            rec, recompute = stack[-1]
            if recompute:
                return rec, CHECKPOINTING
        else:
            self._global_phase = self.top_phase = AFTER_BACKWARD
        if node is None:
            # An engine callback at the end of backward (FSDP2 reduce-scatters the first
            # layer's gradients there): charge the module whose node ran last.
            return self.last_owner, BACKWARD
        if node is self.last_node:
            return self.last_owner, BACKWARD
        owner = self._owner_of(node)
        self.last_node = node
        self.last_owner = owner
        return owner, BACKWARD

    def callback_owner(self) -> ModuleRecord:
        """Who a collective issued in backward outside every node belongs to, for a
        capture that sees no ops (``ops=False``) and so cannot tell which node ran last.

        Such a collective runs in an engine callback at the end of backward (FSDP2
        reduce-scatters the first layer's gradients there). Backward runs the graph from
        the newest node to the oldest, so the node that ran last is the oldest one: the
        gradient of a parameter of the first module with parameters the forward ran.
        """
        for owner in self._owners().values():
            return owner
        return self.last_owner

    def _owners(self) -> dict[int, ModuleRecord]:
        """``id(parameter) -> record`` of every module seen so far (built when asked)."""
        if self._unscanned:
            self._scan()
        return self._param_owner

    @property
    def meshes(self) -> dict[int, Any]:
        """``id(mesh) -> DeviceMesh`` of the meshes seen so far: those of the modules'
        DTensor parameters (read when asked), plus those the capture adds."""
        if self._unscanned:
            self._scan()
        return self._meshes

    def _scan(self) -> None:
        """Read the parameters of the modules first seen since the last scan (owners,
        meshes): off the forward's path, since only backward and reports need them."""
        pending = self._unscanned
        self._unscanned = []
        for rec in pending:
            for _, param in rec.params:
                self._param_owner[id(param)] = rec
                mesh = getattr(param, "device_mesh", None)
                if mesh is not None:
                    self._meshes[id(mesh)] = mesh

    def _owner_of(self, node: Any) -> ModuleRecord:
        seq = node._sequence_nr()
        if seq >= _NO_SEQUENCE:
            # AccumulateGrad: the parameter's module; a parameter we never saw (FSDP2's
            # unsharded ones) follows the node that produced its gradient, run just before.
            variable = getattr(node, "variable", None)
            return self._owners().get(id(variable), self.last_owner)
        i = bisect_right(self._bp_seq, seq) - 1
        return self._bp_owner[i] if i >= 0 else self.global_record

    @property
    def is_bw(self) -> bool:
        """True while the autograd engine runs (PyTorch's ``ModTracker.is_bw``)."""
        return _graph_task_id() != -1

    @property
    def name(self) -> str:
        """FQN of the module ops are charged to right now."""
        if _graph_task_id() != -1 and self.active:
            return self.backward_owner(_current_node())[0].fqn
        return self.top.fqn

    @property
    def parents(self) -> set[str]:
        """FQNs of the modules whose forward is running, plus ``"Global"``."""
        return {"Global", *(rec.fqn for rec, _ in self.stack)}

    @property
    def activation_checkpointing(self) -> bool:
        """True while a forward is recomputed inside backward."""
        return bool(self.stack) and self.stack[-1][1]

    # ------------------------------------------------------- PyTorch's attributes

    def modules(self) -> list[ModuleRecord]:
        """Every record, Global first, in the order modules first ran (a pre-order walk)."""
        out: list[ModuleRecord] = []

        def walk(rec: ModuleRecord) -> None:
            out.append(rec)
            for child in rec.children:
                walk(self.records[child])

        walk(self.global_record)
        return out

    @property
    def module_helper_dict(self) -> dict[str, dict[str, Any]]:
        """``{fqn: {"module_type", "depth", "parameters"}}`` as PyTorch's tracker keeps it."""
        out: dict[str, dict[str, Any]] = {}
        for rec in self.modules():
            entry: dict[str, Any] = {"depth": rec.depth}
            if rec.module_type:
                entry = {"module_type": rec.module_type, "depth": rec.depth}
            placements = {n: str(p.placements) for n, p in rec.params if _is_dtensor(p)}
            if placements:
                entry["parameters"] = placements
            out[rec.fqn] = entry
        return out

    @property
    def module_parameters_dict(self) -> dict[str, dict[str, Any]]:
        """``{fqn: {param_name: param.data}}`` for modules with direct parameters."""
        return {
            rec.fqn: {n: p.data for n, p in rec.params} for rec in self.modules() if rec.params
        }

    @property
    def sharding_dict(self) -> dict[str, Any]:
        """``{"fqn.param": placements}`` for DTensor parameters."""
        return {
            f"{rec.fqn}.{n}": p.placements
            for rec in self.modules()
            for n, p in rec.params
            if _is_dtensor(p)
        }

    @property
    def parent_dict(self) -> dict[str, list[str]]:
        """``{fqn: [child fqns]}`` for modules with children (no duplicates)."""
        return {r.fqn: list(r.children) for r in self.modules() if r.children}

    @property
    def module_parents_dict(self) -> dict[str, set[str]]:
        """``{fqn: {itself and its ancestors}}``; Global maps to an empty set."""
        out: dict[str, set[str]] = {}
        for rec in self.modules():
            chain = {rec.fqn, *(a.fqn for a in rec.ancestors)}
            out[rec.fqn] = set() if rec.parent is None else chain
        return out

    def print_paramater_info(self) -> None:
        """Print :attr:`module_parameters_dict` (PyTorch's name, typo included)."""
        print(self.module_parameters_dict)

    def print_sharding_info(self) -> None:
        """Print one ``fqn.param: placements`` line per DTensor parameter."""
        for key, value in self.sharding_dict.items():
            print(f"{key}: {value}")


class _NamingCache:
    """What a walk from a root module named, kept across trackers (one per block).

    Naming a model walks all of its modules and makes a weak reference to each: most of
    what tracking one small forward costs. A walk's result depends only on the root's
    class name and the tree's shape (each module's children, by name and identity), so
    a later tracker whose first module is the same root, with the same shape, takes the
    names as they were. Checking the shape costs a fraction of the walk; any change
    (a child replaced, added or removed, the root's class swapped by ``fully_shard``)
    makes a fresh walk. Holds only weak references: a model that is freed is dropped.
    """

    _LIMIT = 32

    def __init__(self) -> None:
        # id(root) -> (weak reference to the root, its class name, names of the walk,
        # shape: per module in the tree, (weak reference, child names, child ids))
        self._by_root: dict[int, tuple[Any, str, dict[int, list[Any]], list[tuple[Any, ...]]]] = {}

    def lookup(self, root: Any) -> dict[int, list[Any]] | None:
        """The names a walk from ``root`` would give, or ``None`` when not known."""
        found = self._by_root.get(id(root))
        if found is None:
            return None
        root_ref, root_name, names, shape = found
        if root_ref() is not root or type(root).__name__ != root_name:
            return None
        for ref, child_names, child_ids in shape:
            mod = ref()
            if mod is None:
                return None
            children = mod._modules
            if tuple(children) != child_names or tuple(map(id, children.values())) != child_ids:
                return None
        return names

    def store(self, root: Any, names: dict[int, list[Any]]) -> None:
        """Keep what a walk from ``root`` named (``names``: the walk's entries only)."""
        if len(self._by_root) >= self._LIMIT:  # drop freed roots; if none, start over
            self._by_root = {k: v for k, v in self._by_root.items() if v[0]() is not None}
            if len(self._by_root) >= self._LIMIT:
                self._by_root.clear()
        shape = []
        for ref, _name, _walked in names.values():
            mod = ref()
            if mod is None:
                return
            children = mod._modules
            shape.append((ref, tuple(children), tuple(map(id, children.values()))))
        root_ref = names[id(root)][0]
        self._by_root[id(root)] = (root_ref, type(root).__name__, dict(names), shape)


_NAMINGS = _NamingCache()


_TYPE_NAMES: dict[type, str] = {}


def _type_name(cls: type) -> str:
    """PyTorch's spelling of a module type: ``str(type(m))`` without ``<`` and ``>``."""
    name = _TYPE_NAMES.get(cls)
    if name is None:
        name = _TYPE_NAMES[cls] = str(cls).replace("<", "").replace(">", "")
    return name


def _is_dtensor(value: Any) -> bool:
    return hasattr(value, "placements") and hasattr(value, "device_mesh")
