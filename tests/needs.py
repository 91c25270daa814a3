"""Skip a test on a torch release that lacks what it needs, saying which release has it.

    from tests.needs import torch_has

    @torch_has("device_mesh_unflatten")
    def test_unflatten_matches_torch(): ...

The reason names the installed torch, the release that has the thing and what it is
(``commscope.compat.DIFFERENCES``), so a skipped test in the matrix reads as a feature
of that release, never as a silent gap. ``needs_torch(key)`` is the same check for use
inside a test (after a parametrized branch has chosen what it needs).
"""

from __future__ import annotations

import pytest

from commscope import compat

__all__ = ["torch_has", "needs_torch", "why_not"]


def why_not(key: str) -> str | None:
    """``None`` when the installed torch has ``key``, else the skip reason."""
    if compat.has(key):
        return None
    d = compat.DIFFERENCES[key]
    return f"torch {compat.torch_version()} lacks what torch {d.since}+ has: {d.what}"


def torch_has(*keys: str) -> pytest.MarkDecorator:
    """Skip unless the installed torch has every one of ``keys``."""
    reasons = [r for r in (why_not(k) for k in keys) if r is not None]
    return pytest.mark.skipif(bool(reasons), reason="; ".join(reasons) or "-")


def needs_torch(*keys: str) -> None:
    """Inside a test: skip it unless the installed torch has every one of ``keys``."""
    reasons = [r for r in (why_not(k) for k in keys) if r is not None]
    if reasons:
        pytest.skip("; ".join(reasons))
