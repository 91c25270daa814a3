"""Shared test set-up: one OpenMP thread (2 cores, forked ranks), the rank harness, and
headless Chromium for the viewer and report tests."""

from __future__ import annotations

import os

# Before torch is imported anywhere: forked ranks must not inherit an OpenMP pool.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("COMMSCOPE_NO_RICH", "1")

import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from tests.harness import fake_world, run_ranks


def pytest_sessionstart(session: Any) -> None:
    """Run commscope's torch self-check once, before any rank is forked.

    The first ``flight.enable()`` / ``CommDebugMode`` of a torch install runs a
    throw-away job (a few seconds, then cached on disk); doing it here keeps that time
    out of the timeouts of multi-rank tests, and forked ranks inherit the verdict.
    """
    from commscope.probe import probe

    probe()


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


# ------------------------------------------------------------------ headless Chromium
# Debian's chromium driven by playwright; the tests skip, saying why, when either is
# missing. Never downloads a browser.

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _chromium_path() -> str | None:
    for candidate in (os.environ.get("COMMSCOPE_CHROMIUM"), "/usr/bin/chromium"):
        if candidate and os.path.exists(candidate):
            return candidate
    return shutil.which("chromium")


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """One headless Chromium for the whole session."""
    path = _chromium_path()
    if path is None:
        pytest.skip("Chromium not found: install Debian's `chromium` (make test does, as root)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install playwright)")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=path, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh page whose console errors and page errors are collected in ``page.errors``."""
    context = browser.new_context()
    pg = context.new_page()
    errors: list[str] = []
    pg.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.errors = errors  # type: ignore[attr-defined]
    try:
        yield pg
    finally:
        context.close()
