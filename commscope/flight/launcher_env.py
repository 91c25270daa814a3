"""torch's ``env://`` variables from what Slurm, MPI or a Kubernetes operator set.

``torch.distributed.init_process_group()`` reads ``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR`` and ``MASTER_PORT`` (and scripts read ``LOCAL_RANK``); torchrun sets them,
other launchers set their own. :func:`torch_env` says which of them to add, from where
(first one set wins; a variable already set, non-empty, is never replaced):

==================  ===========================================================
variable            from
==================  ===========================================================
``RANK``            ``OMPI_COMM_WORLD_RANK``, ``PMI_RANK``, ``SLURM_PROCID``
``WORLD_SIZE``      ``OMPI_COMM_WORLD_SIZE``, ``PMI_SIZE``,
                    ``SLURM_STEP_NUM_TASKS``, ``SLURM_NTASKS``
``LOCAL_RANK``      ``OMPI_COMM_WORLD_LOCAL_RANK``, ``MPI_LOCALRANKID``,
                    ``SLURM_LOCALID``
``LOCAL_WORLD_SIZE``  ``OMPI_COMM_WORLD_LOCAL_SIZE``, ``MPI_LOCALNRANKS``, this node's
                    count in ``SLURM_STEP_TASKS_PER_NODE`` / ``SLURM_TASKS_PER_NODE``
                    (``8(x2),4``: index ``SLURM_NODEID``), ``SLURM_NTASKS_PER_NODE``
``MASTER_ADDR``     the first host of ``SLURM_STEP_NODELIST``, ``SLURM_JOB_NODELIST``,
                    ``SLURM_NODELIST`` (a hostlist such as ``gpu[001-004,010]``);
                    ``127.0.0.1`` when every rank runs on this host
``MASTER_PORT``     ``15000 + SLURM_JOB_ID % 10000``; else 29500 (torchrun's default)
==================  ===========================================================

MPI comes before Slurm: ``mpirun`` inside a Slurm allocation starts its ranks through
daemons whose ``SLURM_*`` variables describe the daemons (one task per node), not the
ranks. Slurm's variables count only when no MPI launcher is seen, or when they agree
with it (``srun --mpi=pmi2`` sets both). A Kubernetes ``PyTorchJob`` sets torch's own
variables: nothing is added. A Slurm job's batch script (``SLURM_PROCID`` but no
``SLURM_STEP_ID``: not a task of ``srun``) is refused when it would wait for ranks that
never come. Pure: no torch, no process, no DNS.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator, Mapping

__all__ = ["LauncherEnvError", "torch_env", "expand_hostlist", "first_host",
           "tasks_per_node", "slurm_port", "DEFAULT_PORT", "SLURM_PORT_BASE"]

DEFAULT_PORT = 29500
"""``MASTER_PORT`` where no launcher says one (torchrun's default)."""
SLURM_PORT_BASE = 15000
"""``MASTER_PORT`` under Slurm: this plus the job id's last four digits (15000-24999:
unprivileged, below Linux's ephemeral range; the rule PyTorch Lightning uses)."""

_RANK = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")
_NODELISTS = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
_TASKS_PER_NODE = ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
_MPI = {  # name -> (rank, size, local rank, local size)
    "Open MPI": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                 "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    "MPICH / Intel MPI": ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
}


class LauncherEnvError(ValueError):
    """What ``commscope exec`` cannot tell from the environment, in one line."""


def _get(env: Mapping[str, str], name: str) -> str | None:
    text = env.get(name)
    return text.strip() if text is not None and text.strip() else None


def _int(env: Mapping[str, str], name: str) -> int | None:
    text = _get(env, name)
    if text is None:
        return None
    if not text.isdigit():
        raise LauncherEnvError(f"{name}={text!r} is not a non-negative integer")
    return int(text)


# --------------------------------------------------------------------------- Slurm syntax


def _split_top(text: str) -> list[str]:
    """``a[1-2,4],b`` -> ``["a[1-2,4]", "b"]``: commas outside brackets split."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise LauncherEnvError(f"hostlist {text!r}: nested '['")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise LauncherEnvError(f"hostlist {text!r}: ']' without '['")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise LauncherEnvError(f"hostlist {text!r}: '[' without ']'")
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _range_values(group: str, text: str) -> Iterator[str]:
    """``001-003,7`` -> ``001 002 003 7`` (the width of the low bound is kept)."""
    for item in group.split(","):
        low, sep, high = item.strip().partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            raise LauncherEnvError(f"hostlist {text!r}: {item!r} is not a number or a range")
        if not sep:
            yield low
            continue
        if int(high) < int(low):
            raise LauncherEnvError(f"hostlist {text!r}: range {item!r} goes down")
        width = len(low)
        yield from (str(n).zfill(width) for n in range(int(low), int(high) + 1))


def _expand_one(name: str, text: str) -> Iterator[str]:
    pieces = re.split(r"\[([^\]]*)\]", name)  # literal, group, literal, group, ..., literal
    choices = [[piece] if i % 2 == 0 else list(_range_values(piece, text))
               for i, piece in enumerate(pieces)]
    for combo in itertools.product(*choices):
        yield "".join(combo)


def _iter_hostlist(text: str) -> Iterator[str]:
    for name in _split_top(text):
        yield from _expand_one(name, text)


def expand_hostlist(text: str) -> list[str]:
    """Every host of a Slurm hostlist expression, in order:
    ``"gpu[001-002,010],login1"`` -> ``["gpu001", "gpu002", "gpu010", "login1"]``;
    several bracket groups in one name multiply (``r[1-2]n[1-2]``: r1n1 r1n2 r2n1 r2n2).
    Raises :class:`LauncherEnvError` on a malformed one."""
    return list(_iter_hostlist(text))


def first_host(text: str) -> str:
    """The first host of a Slurm hostlist expression (without expanding the rest)."""
    host = next(_iter_hostlist(text), None)
    if host is None:
        raise LauncherEnvError(f"hostlist {text!r} names no host")
    return host


def tasks_per_node(text: str) -> list[int]:
    """Slurm's tasks-per-node form, one count per node: ``"8(x2),4"`` -> ``[8, 8, 4]``."""
    counts: list[int] = []
    for item in text.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", item)
        if match is None:
            raise LauncherEnvError(f"tasks per node {text!r}: {item!r} is not N or N(xM)")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def slurm_port(job_id: str) -> int:
    """``MASTER_PORT`` for Slurm job ``job_id``: ``15000 + job id % 10000``."""
    digits = job_id.strip().split("_")[0].split("+")[0]  # array and het job forms
    if not digits.isdigit():
        raise LauncherEnvError(f"SLURM_JOB_ID={job_id!r} is not a job number; set MASTER_PORT")
    return SLURM_PORT_BASE + int(digits) % 10000


# --------------------------------------------------------------------------- the mapping


def _mpi(env: Mapping[str, str]) -> tuple[str, tuple[str, str, str, str]] | None:
    for name, names in _MPI.items():
        if _get(env, names[0]) is not None:
            return name, names
    return None


def _slurm_is_ours(env: Mapping[str, str], mpi: tuple[str, str, str, str] | None) -> bool:
    """Whether Slurm's task variables describe this process (see module doc)."""
    procid = _get(env, "SLURM_PROCID")
    if procid is None:
        return False
    if mpi is None:
        return True
    ntasks = _get(env, "SLURM_STEP_NUM_TASKS") or _get(env, "SLURM_NTASKS")
    return procid == _get(env, mpi[0]) and ntasks == _get(env, mpi[1])


def _slurm_local_size(env: Mapping[str, str]) -> int | None:
    for name in _TASKS_PER_NODE:
        text = _get(env, name)
        if text is None:
            continue
        counts = tasks_per_node(text)
        node = _int(env, "SLURM_NODEID")
        if len(counts) == 1:
            return counts[0]
        if node is not None and node < len(counts):
            return counts[node]
    return _int(env, "SLURM_NTASKS_PER_NODE")


def torch_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables to add to ``env`` so that ``init_process_group()`` (``env://``) and
    scripts that read ``LOCAL_RANK`` work under this launcher; never one already set.

    Raises :class:`LauncherEnvError` (one line: what is missing, where it was looked
    for, what to do) when the rank, the world size or rank 0's host cannot be told.
    """
    mpi = _mpi(env)
    mpi_names = mpi[1] if mpi else None
    slurm = _slurm_is_ours(env, mpi_names)
    sources: dict[str, list[str]] = {
        "RANK": [],
        "WORLD_SIZE": [],
        "LOCAL_RANK": [],
        "LOCAL_WORLD_SIZE": [],
    }
    if mpi_names:
        for key, name in zip(sources, mpi_names):
            sources[key].append(name)
    if slurm:
        sources["RANK"].append("SLURM_PROCID")
        sources["WORLD_SIZE"] += ["SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"]
        sources["LOCAL_RANK"].append("SLURM_LOCALID")
    out: dict[str, str] = {}
    for key, names in sources.items():
        if _get(env, key) is not None:
            continue
        value = next((v for v in (_int(env, n) for n in names) if v is not None), None)
        if value is None and key == "LOCAL_WORLD_SIZE" and slurm:
            value = _slurm_local_size(env)
        if value is not None:
            out[key] = str(value)
    merged = {**env, **out}
    rank, world = _int(merged, "RANK"), _int(merged, "WORLD_SIZE")
    if rank is None or world is None:
        missing = "rank" if rank is None else "world size"
        looked = ", ".join(["RANK", *_RANK] if rank is None else
                           ["WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE",
                            "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"])
        raise LauncherEnvError(
            f"cannot tell this process's {missing}: none of {looked} is set; start it "
            f"with srun, mpirun or torchrun, or set RANK and WORLD_SIZE (and MASTER_ADDR, "
            f"MASTER_PORT)")
    if rank >= world:
        raise LauncherEnvError(f"RANK {rank} is outside WORLD_SIZE {world} "
                               f"(ranks are 0..{world - 1})")
    if slurm and world > 1 and out.get("WORLD_SIZE") and not (
            _get(env, "SLURM_STEP_ID") or _get(env, "SLURM_STEPID")):
        raise LauncherEnvError(
            f"this is a Slurm job's batch script, not a task of srun (SLURM_STEP_ID is not "
            f"set): the other {world - 1} of SLURM_NTASKS={world} ranks would never come; "
            f"start the ranks with `srun commscope exec ...`")
    if _get(env, "MASTER_ADDR") is None:
        out["MASTER_ADDR"] = _master_addr(env, merged, slurm, mpi[0] if mpi else None)
    if _get(env, "MASTER_PORT") is None:
        job = _get(env, "SLURM_JOB_ID")
        out["MASTER_PORT"] = str(slurm_port(job) if job else DEFAULT_PORT)
    return out


def _master_addr(env: Mapping[str, str], merged: Mapping[str, str], slurm: bool,
                 mpi: str | None) -> str:
    if slurm:
        for name in _NODELISTS:
            text = _get(env, name)
            if text is not None:
                try:
                    return first_host(text)
                except LauncherEnvError as exc:
                    raise LauncherEnvError(f"{name}: {exc}") from None
    world = _int(merged, "WORLD_SIZE")
    if world == 1 or _int(merged, "LOCAL_WORLD_SIZE") == world:
        return "127.0.0.1"  # every rank runs on this host
    if mpi:
        raise LauncherEnvError(
            f"cannot tell which host rank 0 runs on: {mpi}'s launcher does not say; set "
            f"MASTER_ADDR to rank 0's host (Open MPI: mpirun -x MASTER_ADDR=HOST; MPICH, "
            f"Intel MPI: mpirun -genv MASTER_ADDR HOST)")
    where = f"none of {', '.join(_NODELISTS)} is set" if slurm else "no launcher says"
    raise LauncherEnvError(f"cannot tell which host rank 0 runs on: MASTER_ADDR is not set "
                           f"and {where}; set MASTER_ADDR to rank 0's host")
