"""The seeds' tests use the headless-Chromium fixtures of the browser tests too."""

from tests.browser.conftest import browser, page  # noqa: F401 - fixtures for this folder
