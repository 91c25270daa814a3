"""``CommDebugMode``: count and attribute every collective a block of code issues.

A drop-in for ``torch.distributed.tensor.debug.CommDebugMode`` (same methods, same
attributes, same keys, same tables), built for speed and for correctness where PyTorch
2.13's is wrong:

* a module may run any number of times inside one ``with`` (PyTorch raises
  ``IndexError`` and leaks hooks); an exception leaves no hook, mode or state behind;
* ``barrier``, ``send``/``recv`` and in-place functional collectives are counted;
* backward collectives are charged to the module whose forward created the autograd
  node that issued them, not to whichever module's backward started last;
* a collective issued outside every module after ``backward()`` returned is filed
  under ``after_backward``, never as a forward collective of the last module;
* the tracer's own machinery issues no ops (no ``param.data`` reads, no backward hooks),
  so no ``detach``/``view`` entries that the model did not run;
* per collective it also records payload bytes, dtype, process group, group size and
  mesh axis; :meth:`CommDebugMode.summary` turns them into a table by op and axis with an
  estimated time at a bus bandwidth you give.

Per op, the dispatch hook does one dict lookup, one autograd-state call and one list
append; everything else (strings, roll-ups, tables) waits until a report is asked for.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import commscope.needs_torch  # noqa: F401 (first: a clear error where torch is absent)

# isort: split
import torch
import torch.distributed.tensor
from torch.utils._python_dispatch import TorchDispatchMode

from commscope import collectives
from commscope.comm.capture import hooks, pipeline, registry, snapshot
from commscope.comm.capture.counts import CommCounts
from commscope.comm.capture.modules import BACKWARD, CHECKPOINTING, ModuleRecord, ModuleTracker
from commscope.comm.capture.needs import require_comm, torch_internal
from commscope.comm.trace.model import CollectiveRecord, CommTrace

__all__ = ["CommDebugMode"]

logger = logging.getLogger(__name__)

DTensor = torch_internal("distributed.tensor.DTensor")  # public from torch 2.5
_graph_task_id = torch_internal("_C._current_graph_task_id")
_current_node = torch_internal("_C._current_autograd_node")
_fake_mode = torch_internal("_C._get_dispatch_mode")
_FAKE = torch_internal("_C._TorchDispatchModeKey.FAKE")
_HOP = object()
# id(op overload) -> (None (plain op) | _HOP | registry.OpClass, callable); shared.
_CLASSES: dict[int, tuple[Any, Any]] = {}
_KEEP: list[Any] = []
_COUNT_BUCKET = (0, 1, 1, 2)
_P2P = frozenset({collectives.SEND, collectives.RECV})


def _skip_dynamo(code: Any) -> bool:
    """Tell dynamo never to trace ``code`` nor what it calls, without a wrapper per call.

    ``TorchDispatchMode`` wraps each subclass's ``__torch_dispatch__`` in
    ``torch._disable_dynamo``, which costs a few microseconds on every op; marking the
    code object once does the same job for free. Returns False (and the wrapper stays)
    where this torch has no such hook.
    """
    try:
        from torch._dynamo.eval_frame import set_code_exec_strategy
        from torch._dynamo.types import FrameAction, FrameExecStrategy

        set_code_exec_strategy(code, FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP))
    except Exception as exc:  # older or newer torch: keep torch's own wrapper
        logger.debug("cannot mark __torch_dispatch__ for dynamo: %s", exc)
        return False
    return True


def _classify(func: Any) -> tuple[Any, Any]:
    """``(None | _HOP | OpClass | BatchP2P, callable)`` for an op, cached under ``id(func)``.

    Keyed by id because ``OpOverload.__hash__`` is Python code; op overloads live for
    the whole process (``_KEEP`` makes sure), so an id is never reused. The callable is
    the overload's C++ entry point, one Python frame shorter than ``OpOverload.__call__``.
    """
    if isinstance(func, torch._ops.HigherOrderOperator):
        entry: tuple[Any, Any] = (_HOP, func)
    else:
        cls: Any = registry.classify(func) or registry.batch_p2p_class(func)
        entry = (cls, getattr(func, "_op", func))
    _KEEP.append(func)
    _CLASSES[id(func)] = entry
    return entry


class CommDebugMode(TorchDispatchMode):
    """Context manager that traces collectives per module and phase.

    ``with CommDebugMode() as cm: model(x)`` then ``cm.get_comm_counts()``,
    ``cm.generate_comm_debug_tracing_table(noise_level=0)``, ``cm.summary()``,
    ``cm.generate_json_dump("comm.json")``.

    Args:
        ops: record every op per module (needed for noise levels 1-3). ``False`` keeps
            only collectives and module structure, with no dispatch mode at all (hooks
            where collectives enter torch.distributed, :mod:`commscope.comm.capture.hooks`):
            the same counts, much cheaper, but collectives inside ``torch.compile``d
            regions are not seen.
        bandwidth_gbps: bus bandwidth (decimal GB/s) for estimated times in
            :meth:`summary`, the detailed table and the JSON dump.
    """

    def __init__(self, *, ops: bool = True, bandwidth_gbps: float | None = None) -> None:
        super().__init__()
        if bandwidth_gbps is not None and bandwidth_gbps <= 0:
            raise ValueError(
                f"bandwidth_gbps must be > 0 (decimal GB/s), got {bandwidth_gbps}; "
                "pass None to skip time estimates"
            )
        self.supports_higher_order_operators = True
        self.record_ops = ops
        self.bandwidth_gbps = bandwidth_gbps
        self._comm_counts: CommCounts = CommCounts()
        # (key, module record, phase bucket) per collective not yet rolled up into the
        # counts: the capture only appends, :meth:`_settle` adds up when counts are read.
        self._unsettled: list[tuple[Any, ModuleRecord, int]] = []
        self.advanced_module_tracker = ModuleTracker()
        self._tracker = self.advanced_module_tracker
        self._raw: list[tuple[Any, ...]] = []
        self._searched: set[str] = set()
        self._groups: dict[str, registry.GroupInfo] = {}
        self._records: list[CollectiveRecord] | None = None
        self._active = False
        self._rank: int | None = None
        self._world_size: int | None = None

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> CommDebugMode:
        if self._active:
            raise RuntimeError(
                "this CommDebugMode is already active; nest a second CommDebugMode() "
                "instead of entering the same one twice"
            )
        require_comm()  # a throw-away job must be counted (once per torch install)
        self._comm_counts = CommCounts()
        self._unsettled = []
        self._raw = []
        self._searched: set[str] = set()
        self._records = None
        self._rank = self._world_size = None
        self._tracker.enter()
        try:
            if self.record_ops:
                super().__enter__()
            else:  # collectives only: hooks where they enter torch.distributed
                hooks.attach(self)
        except BaseException:
            self._tracker.exit()
            raise
        pipeline.attach()
        self._active = True
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self._tracker.exit()
        finally:
            self._active = False
            pipeline.detach()
            if self.record_ops:
                super().__exit__(*exc)
            else:
                hooks.detach(self)

    # ------------------------------------------------------------------ capture

    def __torch_dispatch__(
        self, func: Any, types: Any, args: Any = (), kwargs: Any = None
    ) -> Any:
        entry = _CLASSES.get(id(func))
        if entry is None:
            entry = _classify(func)
        cls, call = entry
        if cls is _HOP:
            return func(*args, **(kwargs or {}))
        tracker = self._tracker
        if _graph_task_id() == -1:
            rec = tracker.top
            phase = tracker.top_phase
        else:
            node = _current_node()
            if node is tracker.last_node and node is not None and not tracker.stack:
                rec = tracker.last_owner
                phase = BACKWARD
            else:
                rec, phase = tracker.backward_owner(node)
        if DTensor in types:
            if self.record_ops:
                specs = []
                for a in args:  # a loop: a comprehension costs a frame per op
                    if type(a) is DTensor or isinstance(a, DTensor):
                        specs.append(a._spec)
                if specs:
                    mesh = specs[-1].mesh
                    if mesh is not tracker.last_mesh:
                        tracker.last_mesh = tracker.meshes[id(mesh)] = mesh
                rec.ops.append((func, phase, specs))
            return NotImplemented
        out = call(*args, **kwargs) if kwargs else call(*args)
        if cls is not None:
            if type(cls) is registry.BatchP2P:
                self._count_batch(cls, rec, phase, args, kwargs)
            else:
                self._count(cls, rec, phase, args, kwargs, out)
        if self.record_ops and _fake_mode(_FAKE) is None:
            # Ops under a fake mode are DTensor's sharding propagation, not the model's.
            rec.ops.append((func, phase, None))
        return out

    def _count(
        self, cls: registry.OpClass, rec: ModuleRecord, phase: int, args: Any, kwargs: Any,
        out: Any, group: Any = None,
    ) -> None:
        try:
            nbytes, dtype = registry.payload(cls, args, kwargs, out)
        except Exception as exc:  # never let bookkeeping break the user's job
            logger.debug("cannot size %s: %s", cls.key, exc)
            nbytes, dtype = 0, ""
        group_value = group
        if group is not None:
            pass
        elif 0 <= cls.group_arg < len(args):
            group_value = args[cls.group_arg]
        elif kwargs and cls.group_arg >= 0:
            group_value = kwargs.get(cls.arg_names[cls.group_arg])
        stage = None
        if cls.collective in _P2P and args:  # a pipeline stage's send/recv: see pipeline.py
            found = pipeline.attribute(self._tracker, args[0])
            if found is not None:
                rec, phase, stage = found
        self._add(cls, rec, phase, nbytes, dtype, group_value, stage)

    def _count_batch(
        self, batch: registry.BatchP2P, rec: ModuleRecord, phase: int, args: Any, kwargs: Any
    ) -> None:
        try:
            items, group_value = registry.batch_p2p_items(batch, args, kwargs)
        except Exception as exc:  # never let bookkeeping break the user's job
            logger.debug("cannot read batch_p2p_ops arguments: %s", exc)
            return
        tensors = pipeline.batch_tensors(args, kwargs) if pipeline.installed() else ()
        for i, (cls, nbytes, dtype) in enumerate(items):
            found = pipeline.attribute(self._tracker, tensors[i]) if i < len(tensors) else None
            if found is None:
                self._add(cls, rec, phase, nbytes, dtype, group_value)
            else:
                self._add(cls, found[0], found[1], nbytes, dtype, group_value, found[2])

    def _locate(self) -> tuple[ModuleRecord, int]:
        """The module and phase a collective issued right now belongs to (hooked path)."""
        tracker = self._tracker
        if _graph_task_id() == -1:
            return tracker.top, tracker.top_phase
        node = _current_node()
        rec, phase = tracker.backward_owner(node)
        if node is None and phase == BACKWARD:  # an engine callback: see callback_owner
            rec = tracker.callback_owner()
        return rec, phase

    def _count_hooked(self, cls: registry.OpClass, args: tuple[Any, ...],
                      kwargs: dict[str, Any] | None, out: Any, group: Any) -> None:
        """One collective seen by :mod:`commscope.comm.capture.hooks` (``ops=False``)."""
        rec, phase = self._locate()
        self._count(cls, rec, phase, args, kwargs, out, group)

    def _count_hooked_batch(self, batch: registry.BatchP2P, args: tuple[Any, ...],
                            kwargs: dict[str, Any] | None) -> None:
        """The sends and recvs of one hooked ``batch_p2p_ops`` call."""
        rec, phase = self._locate()
        self._count_batch(batch, rec, phase, args, kwargs)

    def _add(
        self, cls: registry.OpClass, rec: ModuleRecord, phase: int, nbytes: int, dtype: str,
        group_value: Any, stage: int | None = None,
    ) -> None:
        bucket = _COUNT_BUCKET[phase]
        self._unsettled.append((cls.key, rec, bucket))
        group = registry.group_info(group_value, self._groups)
        if (
            group.name not in self._searched
            and not group.desc.startswith("mesh_")
            and not snapshot.known_group(group.name, self._tracker.meshes)
        ):
            self._searched.add(group.name)
            snapshot.find_meshes(self._tracker.meshes)
        self._raw.append(
            (cls, rec.fqn, bucket, phase == CHECKPOINTING, nbytes, dtype, group, stage)
        )
        self._records = None

    def _settle(self) -> None:
        """Roll the collectives captured since the last call up into the counts (the
        block's, and each module's and its ancestors' per phase)."""
        pending = self._unsettled
        if not pending:
            return
        self._unsettled = []
        counts = self._comm_counts
        for key, rec, bucket in pending:
            counts[key] = dict.get(counts, key, 0) + 1
            for target in (rec, *rec.ancestors):
                c = target.phase_counts()[bucket]
                c[key] = dict.get(c, key, 0) + 1

    # ------------------------------------------------------------------ PyTorch's API

    @property
    def comm_counts(self) -> CommCounts:
        """``{op packet: count}`` of the block so far (PyTorch's attribute)."""
        self._settle()
        return self._comm_counts

    @comm_counts.setter
    def comm_counts(self, value: CommCounts) -> None:
        self._settle()
        self._comm_counts = value

    def get_total_counts(self) -> int:
        """Number of collectives counted (all keys, all phases)."""
        return sum(self.comm_counts.values())

    def get_comm_counts(self) -> CommCounts:
        """``{op packet: count}``; lookups also accept printed and canonical names."""
        return self.comm_counts

    def get_parameter_info(self) -> dict[str, dict[str, Any]]:
        """``{module fqn: {param name: param.data}}`` for modules that ran with parameters."""
        return self._tracker.module_parameters_dict

    def get_sharding_info(self) -> dict[str, Any]:
        """``{"fqn.param": placements}`` for every DTensor parameter of a module that ran."""
        return self._tracker.sharding_dict

    @property
    def comm_module_counts(self) -> dict[str, dict[str, CommCounts]]:
        """``{fqn: {"forward": counts, "backward": counts}}`` for Global and every module
        with collectives; counts include descendants. Global also has ``"after_backward"``
        when something was issued there."""
        self._settle()
        out: dict[str, dict[str, CommCounts]] = {}
        for rec in self._tracker.modules():
            if rec.parent is not None and not (rec.counts and any(rec.counts)):
                continue
            counts = rec.phase_counts()
            entry = {"forward": counts[0], "backward": counts[1]}
            if counts[2]:
                entry["after_backward"] = counts[2]
            out[rec.fqn] = entry
        return out

    @property
    def comm_module_operation_counts(self) -> dict[str, dict[str, list[dict[str, Any]]]]:
        """``{fqn: {"operations_list": [op dicts]}}`` in PyTorch's shape."""
        return snapshot.operation_dicts(self._tracker)

    @property
    def comm_registry(self) -> set[Any]:
        """Packets PyTorch's mode counts; ours also counts every other collective op."""
        return registry.pytorch_registry()

    def generate_comm_debug_tracing_table(
        self, noise_level: int = 3, *, color: bool | None = None, details: bool = False
    ) -> str:
        """The per-module table at ``noise_level`` 0-3 (PyTorch's layout).

        ``color=None`` uses ANSI colours like PyTorch unless ``NO_COLOR`` is set;
        ``details=True`` appends bytes and mesh axis to every collective line.
        """
        from commscope.comm.present.report import format_table

        return format_table(self.trace(), noise_level, color=color, details=details)

    def log_comm_debug_tracing_table_to_file(
        self, file_name: str = "comm_mode_log.txt", noise_level: int = 3
    ) -> None:
        """Write the table without colours to ``file_name`` (``{rank}`` is replaced)."""
        from commscope.comm.present.report import format_table

        path = _output_path(file_name, self._where()[0])
        with open(path, "w") as f:
            f.write(format_table(self.trace(), noise_level, color=False))

    def generate_json_dump(
        self, file_name: str = "comm_mode_log.json", noise_level: int = 3
    ) -> None:
        """Write the JSON dump (PyTorch's keys plus ours, see docs/comm.md) to ``file_name``."""
        from commscope.comm.trace.schema import write_json

        write_json(self.trace(), _output_path(file_name, self._where()[0]), noise_level)

    # ------------------------------------------------------------------ ours

    @property
    def records(self) -> list[CollectiveRecord]:
        """Every collective of the block in issue order, with bytes, group and axis."""
        if self._records is None:
            axes = snapshot.mesh_axes(self._tracker.meshes)
            self._records = snapshot.build_records(self._raw, axes)
        return self._records

    def summary(self, bandwidth_gbps: float | None = None) -> str:
        """A table by collective and mesh axis: calls, bytes and (given a bandwidth) time."""
        from commscope.comm.present.report import format_summary

        bw = bandwidth_gbps if bandwidth_gbps is not None else self.bandwidth_gbps
        return format_summary(self.records, bw)

    def trace(self) -> CommTrace:
        """Everything captured, as plain data (what the reports and the JSON are made of)."""
        self._settle()
        rank, world = self._where()
        return snapshot.build_trace(
            self._tracker,
            self.records,
            ops_recorded=self.record_ops,
            rank=rank,
            world_size=world,
            bandwidth_gbps=self.bandwidth_gbps,
        )

    def _where(self) -> tuple[int | None, int | None]:
        """Rank and world size, asked once (when first reported, not on exit)."""
        if self._rank is None:
            self._rank, self._world_size = _rank_and_world()
        return self._rank, self._world_size

    def __repr__(self) -> str:
        return f"CommDebugMode(get_total_counts()={self.get_total_counts()})"


def _unwrap_dispatch(cls: type) -> None:
    """Replace torch's per-call dynamo wrapper of ``cls.__torch_dispatch__`` by a one-time
    mark on its code (see :func:`_skip_dynamo`)."""
    wrapped = cls.__dict__["__torch_dispatch__"]
    raw = getattr(wrapped, "__wrapped__", None)
    if raw is not None and raw is not wrapped and _skip_dynamo(raw.__code__):
        cls.__torch_dispatch__ = raw  # type: ignore[method-assign]


_unwrap_dispatch(CommDebugMode)


def _rank_and_world() -> tuple[int | None, int | None]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None, None


def _output_path(file_name: str | os.PathLike[str], rank: int | None) -> str:
    """``file_name`` with ``{rank}`` replaced by this rank (0 when not distributed)."""
    text = os.fspath(file_name)
    if "{rank}" in text:
        if rank is None:
            rank = _rank_and_world()[0]
        text = text.replace("{rank}", str(rank or 0))
    return text
