"""The browser fixture itself works: a local file renders and scripts run offline."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.browser


def test_local_page_runs_script(page, tmp_path):
    html = tmp_path / "p.html"
    html.write_text(
        "<!doctype html><title>t</title><div id=o></div>"
        "<script>document.getElementById('o').textContent = String(6 * 7);</script>"
    )
    page.goto(html.as_uri())
    assert page.text_content("#o") == "42"
    assert page.errors == []
