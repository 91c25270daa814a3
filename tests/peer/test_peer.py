"""PyTorch's own tests pass against commscope: the CI selection of every peer suite.

Each suite is one of PyTorch's test files with the import of the class under test
swapped for commscope's (``suites.py``), run in a child pytest whose every process is
killed at the end (``runner.py``): the whole file with forked ranks, plus a sample with
torch's own spawning harness. ``make test-peer PEER=all`` runs whole files the way
PyTorch does; docs/mesh.md has the numbers and what is out of scope.
"""

from __future__ import annotations

import pytest

from tests.needs import torch_has
from tests.peer.runner import run_suite
from tests.peer.suites import SUITES

pytestmark = [pytest.mark.peer, pytest.mark.dist]


@torch_has("peer_tests_of_2_13")
@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", sorted(SUITES))
def test_pytorchs_own_tests_pass_against_commscope(name, tmp_path):
    outcomes = run_suite(SUITES[name], mode="ci", timeout=420, dest=tmp_path)
    if outcomes[0].not_run is not None:
        pytest.skip(outcomes[0].not_run)
    for outcome in outcomes:
        assert outcome.ok, (
            f"{outcome.line()}\nfailed: {outcome.failed}\n{outcome.output[-6000:]}"
        )
    assert outcomes[0].passed, "the whole file ran no test"
