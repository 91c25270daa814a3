"""Every difference between torch releases that commscope depends on, in one table.

commscope runs on torch 2.6 to 2.15 (docs/compat.md has what was measured). Where a
release lacks something a feature needs, that feature asks here, by name, instead of a
``hasattr`` of its own:

>>> from commscope import compat                      # doctest: +SKIP
>>> compat.has("py_work_holder")                       # doctest: +SKIP
True
>>> compat.require("device_mesh_unflatten", "DeviceMesh._unflatten")   # doctest: +SKIP

Each :class:`Difference` says from which release on torch has the thing (``since``),
what it is, and what commscope does without it. :func:`has` answers on the installed
torch by looking (an attribute, a signature), so a backport or a nightly is judged by
what it has, not by its number; ``tests/unit/test_compat.py`` checks on every release
of the matrix that what it finds agrees with ``since``. :func:`require` raises
:class:`TorchTooOld`, naming the installed version, the release that has the thing and
the feature that needs it.

Importing this module imports no torch (the analyzer runs without it); the first
:func:`has` does.
"""

from __future__ import annotations

import inspect
import logging
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

__all__ = [
    "ALLOW_OLD_ENV",
    "DIFFERENCES",
    "FLOOR",
    "NEWEST_MEASURED",
    "Difference",
    "TorchMissing",
    "TorchTooOld",
    "backend_name",
    "clear_mesh_groups",
    "drop_mesh_dim_names",
    "has",
    "markdown_table",
    "mesh_group_names",
    "need_torch",
    "missing",
    "require",
    "release",
    "torch_version",
    "work_failed",
    "torch_release",
    "warn_if_newer",
]

logger = logging.getLogger(__name__)

FLOOR = "2.6"
"""The oldest torch release commscope is measured on (``pyproject.toml``'s floor)."""


class TorchTooOld(RuntimeError):
    """The installed torch lacks what a commscope feature needs (the message says what,
    which release has it, and what else still works)."""


class TorchMissing(ImportError):
    """PyTorch is not installed here, and the feature asked for runs on it."""


_WITHOUT_TORCH = "commscope analyze, view, diff and mesh work without it"


NEWEST_MEASURED = "2.15"
"""The newest torch release the matrix of docs/compat.md ran on."""

ALLOW_OLD_ENV = "COMMSCOPE_ALLOW_OLD_TORCH"
"""``=1`` lets the torch-using parts run on a torch older than :data:`FLOOR` (unmeasured:
how far back each part goes is in docs/compat.md), with a warning instead of the refusal."""


def need_torch(feature: str) -> None:
    """Raise :class:`TorchMissing` unless torch imports, :class:`TorchTooOld` when it is
    older than :data:`FLOOR` (unless :data:`ALLOW_OLD_ENV` is ``1``).

    ``pip install commscope`` does not install torch (the analyzer needs none): the
    recorder, the tracer and the live mesh run on the torch the job already has.
    """
    try:
        import torch
    except ImportError:
        raise TorchMissing(
            f"{feature} needs PyTorch ({FLOOR} or newer), which is not installed in this "
            f"environment ({sys.executable}). Install the torch your job runs (pip "
            f"install torch, or pip install 'commscope[torch]'); {_WITHOUT_TORCH}."
        ) from None
    _check_floor(str(torch.__version__), feature)


def _check_floor(version: str, feature: str) -> None:
    if release(version) >= release(FLOOR):
        return
    if os.environ.get(ALLOW_OLD_ENV, "") == "1":
        _warn_old(version)
        return
    raise TorchTooOld(
        f"{feature} runs on torch {FLOOR} or newer; this environment has torch {version}. "
        f"Releases before {FLOOR} are not supported (docs/compat.md says how far back each "
        f"part was measured; {ALLOW_OLD_ENV}=1 runs it anyway, unsupported); "
        f"{_WITHOUT_TORCH}, on any torch or none.")


@cache
def _warn_old(version: str) -> None:
    logger.warning(
        "commscope: torch %s is older than %s, the oldest release commscope supports "
        "(%s=1): recording and tracing may miss collectives (docs/compat.md)",
        version, FLOOR, ALLOW_OLD_ENV)


@cache
def warn_if_newer(version: str) -> bool:
    """Warn once when ``version`` is newer than :data:`NEWEST_MEASURED` (called when the
    self-check passed on it: it works, but no matrix measured it). Returns whether it
    warned."""
    if release(version) <= release(NEWEST_MEASURED):
        return False
    logger.warning(
        "commscope: torch %s is newer than the releases commscope is measured on (%s to "
        "%s, docs/compat.md); its self-check passed, so recording is on",
        version, FLOOR, NEWEST_MEASURED)
    return True


@dataclass(frozen=True)
class Difference:
    """One thing some supported torch releases have and older ones lack."""

    key: str
    since: str
    """The first release that has it (``"2.7"``)."""
    what: str
    """What it is, in torch's terms."""
    without: str
    """What commscope does on a release without it."""
    probe: Callable[[], bool]
    """Looks at the installed torch; ``True`` when it has the thing."""
    broken: tuple[str, str] | None = None
    """Releases (first, last) that lost it again: a regression in torch, fixed later."""

    def expected_on(self, version: tuple[int, int]) -> bool:
        """Whether a release is documented to have it (what :func:`has` must find)."""
        if version < release(self.since):
            return False
        if self.broken is not None:
            first, last = (release(v) for v in self.broken)
            return not first <= version <= last
        return True

    @property
    def releases(self) -> str:
        """``2.7+`` or ``2.6+, except 2.8-2.11``, for tables and messages."""
        text = f"{self.since}+"
        if self.broken is not None:
            first, last = self.broken
            text += f", except {first}" + (f"-{last}" if last != first else "")
        return text


def torch_version() -> str:
    """``torch.__version__`` of the installed torch (imports it)."""
    import torch

    return str(torch.__version__)


def release(version: str) -> tuple[int, int]:
    """``(2, 13)`` for ``"2.13.0+cpu"`` or ``"2.13"``."""
    m = re.match(r"(\d+)\.(\d+)", version)
    if m is None:
        raise ValueError(f"not a torch version: {version!r}")
    return int(m.group(1)), int(m.group(2))


def torch_release() -> tuple[int, int]:
    """The installed torch's ``(major, minor)``."""
    return release(torch_version())


# ------------------------------------------------------------------ the probes


def _params(fn: Any) -> set[str]:
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return set()


def _since(major: int, minor: int) -> Callable[[], bool]:
    """A probe by release number, for what Python cannot see (a C++ binding's behaviour,
    a bug in torch's own code); the matrix checks the number on every release."""
    return lambda: torch_release() >= (major, minor)


def _attr(module: str, *path: str) -> Callable[[], bool]:
    """A probe: ``module`` imports and has the attribute ``path`` (dotted steps)."""

    def probe() -> bool:
        import importlib

        obj: Any = importlib.import_module(module)
        for step in path:
            if not hasattr(obj, step):
                return False
            obj = getattr(obj, step)
        return True

    return probe


def _module(name: str) -> Callable[[], bool]:
    def probe() -> bool:
        import importlib.util

        try:
            return importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:
            return False

    return probe


def _mentions(module: str, name: str) -> Callable[[], bool]:
    """A probe: the source of ``module`` mentions ``name`` (an instance attribute)."""

    def probe() -> bool:
        import importlib

        try:
            return name in inspect.getsource(importlib.import_module(module))
        except (OSError, TypeError):
            return False

    return probe


def _calls(module: str, function: str, name: str) -> Callable[[], bool]:
    """A probe: the source of ``module.function`` calls ``name`` (what a torch function
    issues, which its signature does not show)."""

    def probe() -> bool:
        import importlib

        try:
            fn = getattr(importlib.import_module(module), function)
            return f"{name}(" in inspect.getsource(fn)
        except (AttributeError, OSError, TypeError):
            return False

    return probe


def _op(namespace: str, name: str) -> Callable[[], bool]:
    """A probe: ``torch.ops.<namespace>.<name>`` exists once functional collectives are
    loaded (they register their ops on import)."""

    def probe() -> bool:
        import torch
        import torch.distributed._functional_collectives  # registers the ops

        return hasattr(getattr(torch.ops, namespace), name)

    return probe


def _between_fixes(d_key: str) -> Callable[[], bool]:
    """A probe by release number for a regression (``broken``), checked by the matrix."""
    return lambda: DIFFERENCES[d_key].expected_on(torch_release())


def _mesh_backend_override() -> bool:
    from torch.distributed.device_mesh import init_device_mesh

    return "backend_override" in _params(init_device_mesh)


_C10D = "torch.distributed.distributed_c10d"
_MESH = "torch.distributed.device_mesh"

DIFFERENCES: dict[str, Difference] = {d.key: d for d in (
    # ---- what the flight recorder splices into
    Difference(
        "py_work_holder", "2.7",
        "a Work made in Python and handed to C++ (a functional collective, DDP) is kept "
        "alive by C++ (PyWorkHolder)",
        "the recorder hands back the backend's own work and learns completion from its "
        "future (a callback in gloo's thread: a few tens of microseconds more per "
        "collective) or, for a work without a future, by polling it",
        _since(2, 7)),
    Difference(
        "supports_coalescing", "2.7",
        "a backend says whether it coalesces ops (``Backend.supports_coalescing``), and "
        "``batch_isend_irecv`` asks it (before: it coalesces every CUDA batch)",
        "a recording group's batch_isend_irecv goes through torch's own, which coalesces "
        "it by device type, as it does for a plain group",
        _attr(_C10D, "ProcessGroupGloo", "supports_coalescing")),
    Difference(
        "pg_split_group", "2.9",
        "``ProcessGroup.split_group`` (NCCL's communicator split, called by "
        "``dist.split_group``)",
        "a recording group has no ``split_group`` either, as a plain one has not",
        _attr(_C10D, "ProcessGroup", "split_group")),
    Difference(
        "pg_single_tensor_names", "2.13",
        "``ProcessGroup.all_gather_single``, ``reduce_scatter_single``, "
        "``all_to_all_single`` and their coalesced forms (before: ``_allgather_base``, "
        "``_reduce_scatter_base``, ``alltoall_base``, "
        "``allgather_into_tensor_coalesced``, ``reduce_scatter_tensor_coalesced``)",
        "the recording group overrides the older names, which are the real methods there",
        _attr(_C10D, "ProcessGroup", "all_gather_single")),
    Difference(
        "work_exception", "2.13",
        "``Work.exception()`` hands a failed work's error to Python (before, the binding "
        "raises TypeError: it cannot convert the C++ exception pointer)",
        "a polled work's failure is read from ``Work.is_success()`` (:func:`work_failed`)",
        _since(2, 13)),
    Difference(
        "fake_backend_name", "2.9",
        "the ``fake`` backend (torch's fake process group) answers ``name()``",
        "its name is taken from the group's backend setting (:func:`backend_name`)",
        _since(2, 9)),
    # ---- what the tracer and the mesh read
    Difference(
        "mesh_dim_group_names", "2.8",
        "a DeviceMesh keeps each axis's process-group name in ``_dim_group_names`` "
        "(before: ``(tag, ranks, name)`` tuples in ``_dim_group_infos``)",
        "read through :func:`mesh_group_names`, the same on every release",
        _mentions(_MESH, "_dim_group_names")),
    Difference(
        "device_mesh_unflatten", "2.10",
        "``DeviceMesh._unflatten`` (split one mesh axis into several)",
        "commscope's ``DeviceMesh.unflatten`` and ``_unflatten`` work on every release; "
        "only the comparison with torch's own needs it",
        _attr(_MESH, "DeviceMesh", "_unflatten")),
    Difference(
        "init_device_mesh_backend_override", "2.9",
        "``init_device_mesh(..., backend_override=...)`` and ``_flatten(name, "
        "backend_override)``",
        "commscope's ``init_device_mesh`` and ``unflatten``/``_unflatten`` take "
        "``backend_override`` on every release; ``_flatten(name, backend_override)`` is "
        "torch's own and raises TorchTooOld there",
        _mesh_backend_override),
    Difference(
        "functional_batch_p2p", "2.12",
        "the functional p2p ops ``_c10d_functional.batch_p2p_ops``/``isend``/``irecv``",
        "nothing: there is nothing to count where the ops do not exist",
        _op("_c10d_functional", "batch_p2p_ops")),
    Difference(
        "compiled_collectives_bypass_python", "2.13",
        "code compiled by ``torch.compile`` calls a functional collective's kernel "
        "directly, past the Python op that the collectives-only capture hooks",
        "better, not worse: ``CommDebugMode(ops=False)`` also counts the collectives of "
        "compiled regions there, as the full mode does everywhere",
        _since(2, 13)),
    # ---- torch's own tools and their limits, which our tests compare with or run on
    Difference(
        "all_gather_object_single", "2.15",
        "``dist.all_gather_object`` gathers the objects' sizes and bytes with "
        "``all_gather_single``, the dispatcher's ``c10d._allgather_base_`` (before: with "
        "``all_gather``, ``c10d.allgather_``)",
        "nothing: either op is an ``all_gather`` to commscope (both spellings are in "
        "``commscope.collectives``) and is counted under the op torch issued, as torch's "
        "own CommDebugMode counts it",
        _calls(_C10D, "all_gather_object", "all_gather_single")),
    Difference(
        "comm_debug_mode_repr", "2.10",
        "torch's ``CommDebugMode`` prints as ``CommDebugMode(get_total_counts()=N)``",
        "ours prints so on every release (torch's is ``<... object at 0x...>`` there)",
        _mentions("torch.distributed.tensor.debug._comm_mode", "def __repr__")),
    Difference(
        "dtensor_tp_transformer_on_cpu", "2.6",
        "PyTorch's test ``Transformer`` (the CommDebugMode tutorial's model) runs "
        "tensor- and sequence-parallel on CPU",
        "nothing of commscope's: torch's DTensor raises inside the model's attention "
        "('Attempted to flatten sharded dimension 1') on those releases, traced or not, "
        "so the tests and the tutorial on that model skip",
        _between_fixes("dtensor_tp_transformer_on_cpu"), broken=("2.8", "2.11")),
    Difference(
        "dtensor_counts_of_2_12", "2.12",
        "torch's DTensor issues the collectives and aten ops the golden files were "
        "recorded with (the TP transformer all-gathers once in forward, not 7 times, and "
        "not again in backward; the TP MLP's noise-3 table has ``aten.view``)",
        "nothing of commscope's: counts are still compared with torch's own "
        "CommDebugMode on the same release; only the fixed numbers and golden tables "
        "of 2.12+ are not",
        _since(2, 12)),
    Difference(
        "functional_wrap_tensor_autograd", "2.11",
        "functional collectives wrap their result for autograd with an op of their own, "
        "``_c10d_functional._wrap_tensor_autograd``, which the dispatcher shows",
        "nothing: the op lists of noise levels 2-3 have one line fewer, as torch's own do",
        _op("_c10d_functional", "_wrap_tensor_autograd")),
    Difference(
        "mesh_repr_of_2_10", "2.10",
        "a torch DeviceMesh prints as ``DeviceMesh((4,), 'cpu', stride=(1,))`` (its "
        "layout form)",
        "tables print torch's own repr of the mesh, whatever the release (the golden "
        "tables are compared with that repr put in)",
        _mentions(_MESH, "stride=")),
    Difference(
        "mesh_world_axis_reuses_default_group", "2.10",
        "torch's ``init_device_mesh`` reuses the default group for any axis that spans "
        "the whole world (before: only for a 1-D mesh)",
        "commscope's mesh reuses it on every release (one communicator fewer per such "
        "axis); its description is then ``default_pg`` where torch's says ``mesh_<axis>``",
        _since(2, 10)),
    Difference(
        "mesh_slices_any_axes", "2.10",
        "torch's DeviceMesh gives groups for a slice of non-adjacent axes "
        "(``mesh['dp', 'tp']`` of a 3-D mesh) and for a flattened one",
        "commscope's mesh does on every release; the comparisons with torch's skip",
        _since(2, 10)),
    Difference(
        "mesh_unflatten_by_name", "2.12",
        "torch's ``DeviceMesh._unflatten`` takes the axis by name (2.10 and 2.11 refuse "
        "every name: an inverted check)",
        "commscope's takes names and indices on every release; the comparison with "
        "torch's passes the index",
        _since(2, 12)),
    Difference(
        "gloo_flight_recorder", "2.8",
        "PyTorch's own flight recorder records gloo (``_dump_fr_trace``)",
        "nothing of commscope's: only PyTorch-native gloo dumps cannot be made (the tests "
        "that compare with them skip)",
        _attr("torch._C._distributed_c10d", "_dump_fr_trace")),
    Difference(
        "torch_fr_trace", "2.10",
        "PyTorch's dump analyzer as a module, ``torch.distributed.flight_recorder.fr_trace``",
        "nothing of commscope's: only the check that torch's analyzer reads our dumps "
        "skips",
        _module("torch.distributed.flight_recorder")),
    Difference(
        "torch_fr_trace_reads_gloo", "2.12",
        "torch's ``fr_trace`` analyzes gloo dumps (2.10 and 2.11 stop at 'name "
        "formatting error? gloo != nccl')",
        "nothing of commscope's: the check that torch's analyzer names the same culprit "
        "in our gloo dumps skips",
        _since(2, 12)),
    Difference(
        "fsdp2_hsdp_trains_exactly", "2.9",
        "FSDP2 with HSDP trains on gloo to one process's losses (2.8's does not, on its "
        "own mesh too: its CPU path reduces the gradients otherwise)",
        "nothing of commscope's: the HSDP tests compare our mesh's losses with torch's own "
        "mesh's there",
        _since(2, 9)),
    Difference(
        "fsdp2_on_cpu", "2.8",
        "FSDP2 (``fully_shard``) trains on CPU with gloo (2.6: ``torch.cpu.Stream`` has no "
        "``record_event``; 2.7: it reduce-scatters with ``ReduceOp.AVG``, which gloo "
        "refuses)",
        "nothing of commscope's: torch's FSDP2 itself cannot train on CPU there (it does "
        "on GPUs), so the gloo tests that train with it skip",
        _since(2, 8)),
    Difference(
        "fsdp_data_parallel_mesh_dims", "2.12",
        "FSDP2's ``DataParallelMeshDims`` (the data-parallel axes of a full SPMD mesh)",
        "nothing: the test that hands our mesh to it skips",
        _attr("torch.distributed.fsdp", "DataParallelMeshDims")),
    Difference(
        "peer_tests_of_2_13", "2.13",
        "PyTorch's own ``test_device_mesh.py`` and ``test_comm_mode.py`` of the 2.13 era, "
        "which ``tests/peer`` runs against commscope, import and pass on torch's own "
        "classes (they test that release's behaviour)",
        "nothing of commscope's: the peer run skips; ``tests/unit/test_mesh_torch_api.py`` "
        "checks torch's API on our mesh on every release",
        _since(2, 13)),
    Difference(
        "pipelining_on_gloo", "2.6",
        "torch's pipelining schedules run on gloo (2.9's stage set-up sends 8 bytes where "
        "the peer posted 4, and gloo aborts both ranks, commscope or not)",
        "pipeline attribution is not tested on those releases",
        _between_fixes("pipelining_on_gloo"), broken=("2.9", "2.9")),
    Difference(
        "pipeline_schedule_preconnects", "2.15",
        "torch's pipelining schedule, not its stages, sets up the rank's point-to-point "
        "links on the first step: one ``all_reduce`` over the pipeline group agrees on the "
        "metadata mode (2.13 and 2.14: a 4-byte vote sent stage to stage, "
        "``_warmup_forward_vote``/``_warmup_backward_result``), then each pair of "
        "neighbouring ranks exchanges one 4-byte message and an ``all_reduce`` ends each "
        "round (``_preconnect_shared_p2p_edges``); commscope leaves these under "
        "``Global``: they belong to the rank, which may hold several stages",
        "the set-up messages are the stages' own (2.13-2.14: the vote), and commscope "
        "charges them to ``pipeline stage N``, like their shape exchange",
        _attr("torch.distributed.pipelining._p2p", "_preconnect_shared_p2p_edges")),
    Difference(
        "pipeline_1f1b_on_gloo", "2.8",
        "torch's ``Schedule1F1B`` and ``ScheduleInterleaved1F1B`` run on gloo (before, "
        "they deadlock there on gloo's blocking sends, commscope or not)",
        "pipeline attribution is tested with GPipe only on those releases",
        _since(2, 8)),
    Difference(
        "pg_destructor_releases_gil", "2.8",
        "a process group is destroyed with the GIL released (before, the binding holds "
        "the GIL while gloo's destructor joins its worker threads, and a worker that must "
        "free a tensor's Python object waits for that GIL: ``destroy_process_group`` can "
        "hang for good, with or without commscope)",
        "while recording, ``destroy_process_group`` and the end of the interpreter first "
        "wait 50 ms without the GIL, so gloo's workers finish: measured on 2.7.1, 2-rank "
        "jobs ending in ``destroy_process_group`` hung 7 times in 12 with the recorder "
        "before this wait, 0 in 12 with it (torch alone: 1 in 12)",
        _since(2, 8)),
)}


@cache
def has(key: str) -> bool:
    """Whether the installed torch has difference ``key`` (looked at once, then kept)."""
    try:
        probe = DIFFERENCES[key].probe
    except KeyError:
        raise KeyError(
            f"no torch difference called {key!r}; known: {sorted(DIFFERENCES)}") from None
    try:
        return bool(probe())
    except ImportError:
        return False


def require(key: str, feature: str) -> None:
    """Raise :class:`TorchTooOld` unless the installed torch has ``key``.

    ``feature`` names what the user asked for (``"DeviceMesh._unflatten"``).
    """
    if has(key):
        return
    d = DIFFERENCES[key]
    raise TorchTooOld(
        f"{feature} needs torch {d.since} or newer ({d.what}); this is torch "
        f"{torch_version()}. Everything else of commscope works on this release; see "
        "docs/compat.md.")


# ------------------------------------------------------------------ adapters


def mesh_group_names(mesh: Any) -> list[str | None]:
    """The process-group name of each axis of a torch ``DeviceMesh`` (any release)."""
    names = getattr(mesh, "_dim_group_names", None)
    if names is not None:
        return list(names)
    infos = getattr(mesh, "_dim_group_infos", None) or ()
    return [info[2] if len(info) > 2 else None for info in infos]


def clear_mesh_groups(mesh: Any) -> None:
    """Give a torch ``DeviceMesh`` made with ``_init_backend=False`` an empty list of
    groups, as torch's own mesh has on a rank outside it (any release)."""
    if has("mesh_dim_group_names"):
        mesh._dim_group_names = []
    else:
        mesh._dim_group_infos = []


def drop_mesh_dim_names(mesh: Any) -> None:
    """Make a torch ``DeviceMesh`` unnamed (``mesh_dim_names`` is ``None``), which
    ``from_group`` cannot make of several groups (an attribute in older releases, a
    property over ``_mesh_dim_names`` in newer ones)."""
    if "_mesh_dim_names" in vars(mesh):
        mesh._mesh_dim_names = None
    else:
        mesh.mesh_dim_names = None
    if getattr(mesh, "_hash", None) is not None:
        mesh._hash = None


def backend_name(backend: Any, default: str) -> str:
    """A backend's name in lower case; ``default`` where it cannot say (the ``fake``
    backend before 2.9 raises from ``name()``)."""
    try:
        return str(backend.name()).lower()
    except (RuntimeError, AttributeError):
        return default


def work_failed(work: Any) -> bool:
    """Whether a completed work ended with an error (any release, see ``work_exception``)."""
    try:
        return work.exception() is not None
    except TypeError:
        return not work.is_success()


def missing() -> list[Difference]:
    """The differences the installed torch lacks (what degrades here, and how)."""
    return [d for d in DIFFERENCES.values() if not has(d.key)]


def markdown_table() -> str:
    """The table of differences as docs/compat.md shows it (``python -m commscope.compat``)."""
    rows = ["| difference | releases that have it | what it is | without it |",
            "|---|---|---|---|"]
    for d in DIFFERENCES.values():
        rows.append(f"| `{d.key}` | {d.releases} | {_md(d.what)} | {_md(d.without)} |")
    return "\n".join(rows)


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace(":func:", "").replace(":mod:", "")


if __name__ == "__main__":
    print(markdown_table())
    gone = missing()
    print(f"\ntorch {torch_version()}: "
          + ("has every difference" if not gone else
             "lacks " + ", ".join(d.key for d in gone)))
