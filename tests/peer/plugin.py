"""pytest plugin loaded into a peer run (``-p tests.peer.plugin``), never into the suite.

* ``COMMSCOPE_PEER_START=fork`` starts the ranks of PyTorch's multi-process tests
  (``MultiProcessTestCase``) by forking the test process instead of spawning fresh
  interpreters: the same test code on the same ranks, about 0.3 s per test instead of
  15-40 s on 2 cores. ``spawn`` (the default) is torch's own harness, unchanged.
* ``COMMSCOPE_PEER_EXPECT=module:Name,Name`` makes sure the swapped names really come
  from that package in every collected file: a swap that did not happen fails the run
  instead of testing torch's class.
"""

from __future__ import annotations

import os
from typing import Any

import pytest


def _fork_processes(self: Any) -> None:
    import torch.multiprocessing

    self._start_processes(torch.multiprocessing.get_context("fork").Process)


def pytest_configure(config: Any) -> None:
    """Install the fork start when asked for."""
    if os.environ.get("COMMSCOPE_PEER_START", "spawn") == "fork":
        from torch.testing._internal.common_distributed import MultiProcessTestCase

        MultiProcessTestCase._spawn_processes = _fork_processes  # type: ignore[method-assign]


def pytest_report_header(config: Any) -> str:
    """Say how the ranks start and what the swap must give."""
    start = os.environ.get("COMMSCOPE_PEER_START", "spawn")
    expect = os.environ.get("COMMSCOPE_PEER_EXPECT", "-")
    return f"commscope peer run: ranks started with {start}; swapped names: {expect}"


def pytest_collection_finish(session: Any) -> None:
    """Refuse to run when a swapped name is not the expected package's."""
    expect = os.environ.get("COMMSCOPE_PEER_EXPECT")
    if not expect:
        return
    package, _, names = expect.partition(":")
    seen = {id(item.module): item.module for item in session.items if hasattr(item, "module")}
    for module in seen.values():
        for name in filter(None, names.split(",")):
            owner = getattr(getattr(module, name, None), "__module__", "") or ""
            if not owner.startswith(package):
                raise pytest.UsageError(
                    f"{module.__name__}.{name} comes from {owner!r}, not {package}: the "
                    "import swap did not take effect"
                )
