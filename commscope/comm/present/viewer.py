"""The offline viewer: one self-contained HTML page for a comm-trace JSON dump.

The page is ``commscope/viewer/comm_viewer.html`` with our own CSS and JS inlined and the
dump embedded in a ``<script type="application/json">`` block (Chromium refuses to
``fetch()`` a neighbouring ``file://``). Nothing is loaded from the network. Without a
dump the page is blank and loads whatever JSON dump, ours or PyTorch's, the user drops
on it or picks.
"""

from __future__ import annotations

import html
import json
import os
from importlib import resources
from typing import Any

from commscope.comm.trace.model import CommTrace
from commscope.comm.trace.schema import is_comm_dump, trace_to_json

__all__ = ["render_viewer", "write_viewer", "embed_json"]

_PACKAGE = "commscope"
_MARK_CSS = "/*__COMM_VIEWER_CSS__*/"
_MARK_JS = "/*__COMM_VIEWER_JS__*/"
_MARK_DATA = "__COMM_VIEWER_DATA__"
_MARK_TITLE = "__COMM_VIEWER_TITLE__"


def _asset(name: str) -> str:
    return resources.files(_PACKAGE).joinpath("viewer", name).read_text(encoding="utf-8")


def embed_json(data: Any) -> str:
    r"""``data`` as JSON that is safe inside a ``<script>`` element.

    ``<``, ``>`` and ``&`` only occur inside JSON strings, where ``\u003c`` and friends
    mean the same characters, so ``</script>`` in a module name cannot end the block.
    """
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return (
        text.replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


def render_viewer(
    data: CommTrace | dict[str, Any] | None = None,
    *,
    noise_level: int = 3,
    title: str | None = None,
) -> str:
    """The HTML page for ``data`` (a trace, a parsed dump, or ``None`` for a blank page).

    Raises ``ValueError`` when a dict is given that is not a comm dump.
    """
    if isinstance(data, CommTrace):
        payload: Any = trace_to_json(data, noise_level)
    elif data is None:
        payload = None
    elif is_comm_dump(data):
        payload = data
    else:
        raise ValueError(
            "render_viewer wants a CommTrace, a CommDebugMode JSON dump (an object with "
            f"'fqn' and 'children') or None for a blank page; got {type(data).__name__}"
        )
    page = _asset("comm_viewer.html")
    page = page.replace(_MARK_TITLE, html.escape(title or "commscope comm trace"), 1)
    page = page.replace(_MARK_CSS, _asset("common.css") + _asset("comm_viewer.css"), 1)
    head, sep, tail = page.partition(_MARK_JS)
    # The data goes in last, into the part before the JS, so nothing in it is replaced.
    head = head.replace(_MARK_DATA, embed_json(payload), 1)
    return head + _asset("common.js") + _asset("comm_viewer.js") + tail if sep else head


def write_viewer(
    path: str | os.PathLike[str],
    data: CommTrace | dict[str, Any] | None = None,
    *,
    noise_level: int = 3,
    title: str | None = None,
) -> str:
    """Write :func:`render_viewer` to ``path`` (overwritten) and return the path."""
    text = render_viewer(data, noise_level=noise_level, title=title)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return os.fspath(path)
