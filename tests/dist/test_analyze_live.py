"""End to end on real gloo ranks: a job fails, every rank dumps with PyTorch's native
recorder, and the analyzer names the failure (the committed fixtures, regenerated live)."""

from __future__ import annotations

import pytest

from commscope.analyze import analyze
from tests.data import make_recorded_fixtures
from tests.data.make_native_fixtures import generate
from tests.needs import torch_has

pytestmark = pytest.mark.dist


@torch_has("gloo_flight_recorder")
@pytest.mark.parametrize("name,kind,culprits,seq", [
    ("missing_rank", "missing_rank", [2], 4),
    ("cross_group_deadlock", "cross_group_deadlock", [0, 1, 2], 2),
])
def test_live_gloo_job_is_diagnosed(tmp_path, name, kind, culprits, seq):
    out = generate(name, tmp_path / "scratch", tmp_path / name)
    result = analyze(out)
    root = result.findings[0]
    assert result.verdict == "hang"
    assert (root.kind, root.culprit_ranks, root.collective_seq_id) == (kind, culprits, seq)
    assert result.unreadable == []


def test_live_skip_then_block_is_the_skipping_rank(tmp_path):
    # commscope demo's story on a (2, 2) mesh, recorded by commscope.flight
    out = make_recorded_fixtures.generate("skipped_then_blocked", tmp_path / "scratch",
                                          tmp_path / "skipped")
    result = analyze(out)
    root = result.findings[0]
    assert (root.kind, root.culprit_ranks, root.waiting_ranks) == ("missing_rank", [3], [0, 1, 2])
    assert (root.group.desc, root.group.ranks, root.collective_seq_id) == ("mesh_dp", (1, 3), 3)
