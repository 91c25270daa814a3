"""``commscope exec``: record one rank that another launcher started, script unchanged.

``srun commscope exec train.py ARGS``, ``mpirun -np 8 commscope exec train.py`` or, in a
Kubernetes ``PyTorchJob`` container, ``commscope exec train.py``: one process per rank,
no torchrun agent. In this process, before the script runs:

1. torch's ``env://`` variables are filled from the launcher's where they are not set
   (:func:`commscope.flight.launcher_env.torch_env`: Slurm, Open MPI, MPICH / Intel MPI);
2. the job's environment is what ``commscope run`` gives its workers
   (:func:`commscope.flight.launch.watch_env`: a watch token drawn here and marked drawn,
   so the ranks agree on one through the job's store; the watch file beside the dumps;
   strict recording; the banner, printed by rank 0);
3. the worker bootstrap runs the script (:func:`commscope.flight.bootstrap.run_target`).

``cli.py`` parses the command line and calls :func:`prepare_env`, then
:func:`exec_target`.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping, Sequence

from commscope.flight.bootstrap import run_target
from commscope.flight.launch import watch_env
from commscope.flight.launcher_env import torch_env

__all__ = ["prepare_env", "exec_target"]


def prepare_env(env: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Fill ``env`` (default ``os.environ``) for one recorded rank, in place: torch's
    variables from the launcher's, then ``commscope run``'s own. Returns what was added
    or changed. Raises :class:`~commscope.flight.launcher_env.LauncherEnvError` (nothing
    changed) when the rank, the world size or rank 0's host cannot be told."""
    env = os.environ if env is None else env
    filled = torch_env(env)
    after = watch_env({**env, **filled})
    added = {k: v for k, v in after.items() if env.get(k) != v}
    env.update(added)
    return added


def exec_target(target: str, args: Sequence[str], *, module: bool = False) -> None:
    """Run ``target`` as ``__main__`` with the recorder on, as ``python TARGET ARGS``
    (``python -m TARGET ARGS`` with ``module``) would; call :func:`prepare_env` first."""
    run_target(target, args, module=module, prog="commscope exec")
