"""End to end on real gloo ranks: a job fails, every rank dumps with PyTorch's native
recorder, and the analyzer names the failure (the committed fixtures, regenerated live)."""

from __future__ import annotations

import pytest

from commscope.analyze import analyze
from tests.data.make_native_fixtures import generate

pytestmark = pytest.mark.dist


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
