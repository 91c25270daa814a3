"""The simulated-host tests skip, saying why, where Linux namespaces are not permitted."""

from __future__ import annotations

import pytest

from tests.hosts.cluster import namespaces_unavailable


@pytest.fixture(scope="session", autouse=True)
def _namespaces() -> None:
    """Probe once: UTS, mount and PID namespaces (root, or CAP_SYS_ADMIN, on Linux)."""
    why = namespaces_unavailable()
    if why:
        pytest.skip(why)
