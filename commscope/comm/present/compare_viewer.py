"""The offline diff page: two comm traces side by side, with the changes highlighted.

The page is ``commscope/viewer/diff_viewer.html`` with our own CSS and JS inlined and the
comparison (:func:`~commscope.comm.present.compare_report.diff_to_json`, every row, unchanged
ones included) embedded in a ``<script type="application/json">`` block. Nothing is
loaded from the network.
"""

from __future__ import annotations

import html
import os
from importlib import resources

from commscope.comm.present.compare_report import diff_to_json
from commscope.comm.present.compare_types import TraceDiff
from commscope.comm.present.viewer import embed_json

__all__ = ["render_diff_viewer", "write_diff_viewer"]

_MARK_CSS = "/*__DIFF_VIEWER_CSS__*/"
_MARK_JS = "/*__DIFF_VIEWER_JS__*/"
_MARK_DATA = "__DIFF_VIEWER_DATA__"
_MARK_TITLE = "__DIFF_VIEWER_TITLE__"


def _asset(name: str) -> str:
    return resources.files("commscope").joinpath("viewer", name).read_text(encoding="utf-8")


def render_diff_viewer(d: TraceDiff, *, title: str | None = None) -> str:
    """The HTML page for the comparison ``d``."""
    page = _asset("diff_viewer.html")
    default = f"commscope diff: {os.path.basename(d.a.label)} vs {os.path.basename(d.b.label)}"
    page = page.replace(_MARK_TITLE, html.escape(title or default), 1)
    page = page.replace(_MARK_CSS, _asset("common.css") + _asset("diff_viewer.css"), 1)
    head, sep, tail = page.partition(_MARK_JS)
    # The data goes in last, into the part before the JS, so nothing in it is replaced.
    head = head.replace(_MARK_DATA, embed_json(diff_to_json(d, unchanged=True)), 1)
    return head + _asset("common.js") + _asset("diff_viewer.js") + tail if sep else head


def write_diff_viewer(
    path: str | os.PathLike[str], d: TraceDiff, *, title: str | None = None
) -> str:
    """Write :func:`render_diff_viewer` to ``path`` (overwritten) and return the path."""
    text = render_diff_viewer(d, title=title)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return os.fspath(path)
