"""The rank harness itself: results come back, failures surface, hangs are killed."""

from __future__ import annotations

import os
import time

import pytest

from tests.harness import RankFailure, run_ranks


def _sum_ranks(rank, world_size):
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    return (rank, int(t.item()), os.environ["OMP_NUM_THREADS"])


def test_four_ranks_all_reduce_is_fast(tmp_path):
    start = time.monotonic()
    out = run_ranks(_sum_ranks, 4, tmp_path)
    elapsed = time.monotonic() - start
    assert out == [(r, 6, "1") for r in range(4)]
    assert elapsed < 5.0, f"4-rank job took {elapsed:.2f}s"


def _fail_on_two(rank, world_size):
    if rank == 2:
        raise ValueError("rank two is unhappy")
    return rank


def test_child_traceback_reaches_parent_with_rank(tmp_path):
    with pytest.raises(RankFailure) as info:
        run_ranks(_fail_on_two, 3, tmp_path)
    text = str(info.value)
    assert "rank 2 raised" in text
    assert "ValueError: rank two is unhappy" in text


def _hang_on_one(rank, world_size):
    if rank == 1:
        time.sleep(600)
    return rank


def test_hanging_rank_is_killed_and_named(tmp_path):
    start = time.monotonic()
    results = run_ranks(_hang_on_one, 2, tmp_path, timeout=2.0, check=False)
    assert time.monotonic() - start < 10
    assert results[0].value == 0 and not results[0].timed_out
    assert results[1].timed_out and results[1].exitcode is not None


def _crash(rank, world_size):
    if rank == 1:
        os._exit(7)
    return rank


def test_crashed_rank_reports_exit_code(tmp_path):
    results = run_ranks(_crash, 2, tmp_path, timeout=10, check=False)
    assert results[1].exitcode == 7 and results[1].value is None
    with pytest.raises(RankFailure, match="exited with code 7"):
        run_ranks(_crash, 2, tmp_path, timeout=10)


def test_fake_world_pretends_to_be_one_rank_of_many(fake_pg):
    import torch.distributed as dist

    with fake_pg(5, 16384):
        assert dist.get_rank() == 5
        assert dist.get_world_size() == 16384
    assert not dist.is_initialized()
