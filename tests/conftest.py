"""Shared test set-up: one OpenMP thread (2 cores, forked ranks) and the rank harness."""

from __future__ import annotations

import os

# Before torch is imported anywhere: forked ranks must not inherit an OpenMP pool.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("COMMSCOPE_NO_RICH", "1")

import pytest

from tests.harness import fake_world, run_ranks


@pytest.fixture
def ranks(tmp_path):
    """``ranks(fn, world_size, *args, **kw)``: run ``fn`` on real gloo ranks in ``tmp_path``."""

    def _run(fn, world_size, *args, **kwargs):
        return run_ranks(fn, world_size, tmp_path, *args, **kwargs)

    return _run


@pytest.fixture
def fake_pg():
    """``with fake_pg(rank, world_size):`` make this process one rank of a fake job."""
    return fake_world
