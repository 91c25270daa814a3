"""``commscope watch --web``: the live view as a local, read-only web page.

One background thread refreshes the snapshot every interval (one fetch however many
pages are open); the HTTP server only hands out the latest one. Routes (GET only; every
one needs ``?token=``, the job's watch token, or a random one when the job has none;
anything else is 403):

* ``/`` the page (HTML, CSS and JS from the package, no CDN);
* ``/snapshot.json`` the latest snapshot (``commscope.watch/1``), or ``{"error": ...}``
  once the store went away; with ``rank_table``, the ranks table as the terminal draws
  it (:func:`commscope.watch.view.rank_table`: hosts and pids when the job spans hosts,
  folded by host at scale), so the page and the terminal show the same rows; with
  ``slowest_table``, the "slowest ranks" panel's rows as the terminal draws them
  (:func:`commscope.watch.view.slowest_cells`); ``wait_graph_svg``, the snapshot's
  ``wait_graph`` drawn as the HTML report draws it
  (:mod:`commscope.analyze.present.waitsvg`);
* ``/report`` the HTML report of the job's last dump (``commscope analyze`` of the dump
  folder), when there is one.

Bound to 127.0.0.1 by default. The page never writes to the job: there is no route that
could.
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlparse

from commscope.analyze.present.waitgraph import WaitForGraph
from commscope.analyze.present.waitsvg import render_svg
from commscope.watch.source import WatchError
from commscope.watch.view import rank_table, slowest_cells

__all__ = ["WatchServer", "serve", "page_html"]

_PAGE_ROWS = 32
"""Rows of the page's ranks table (the terminal shows 16)."""


def _asset(name: str) -> str:
    return resources.files("commscope").joinpath("viewer", name).read_text(encoding="utf-8")


def page_html() -> str:
    """The live page, self-contained."""
    return (
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        "<link rel=\"icon\" href=\"data:,\"><title>commscope watch</title>\n"
        f"<style>\n{_asset('watch.css')}\n</style></head>\n<body><main id=\"app\">"
        "<p id=\"status\">connecting…</p></main>\n"
        f"<script>\n{_asset('watch.js')}\n</script>\n</body></html>\n"
    )


class WatchServer:
    """The refresher thread and the HTTP server of one ``--web`` session."""

    def __init__(self, make: Callable[[], dict[str, Any]], *, token: str,
                 host: str = "127.0.0.1", port: int = 0, refresh_s: float = 2.0) -> None:
        self.make = make
        self.token = token or secrets.token_urlsafe(18)
        self.refresh_s = refresh_s
        self.latest: dict[str, Any] = {"state": "waiting", "headline": "connecting"}
        self.refreshes = 0
        self._stop = threading.Event()
        self._page = page_html()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                return

            def _send(self, code: int, body: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.send_header("X-Content-Type-Options", "nosniff")
                self.send_header("Content-Security-Policy",
                                 "default-src 'self'; script-src 'unsafe-inline'; "
                                 "style-src 'unsafe-inline'; connect-src 'self'; "
                                 "img-src data:")
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                url = urlparse(self.path)
                given = parse_qs(url.query).get("token", [""])[0]
                if not hmac.compare_digest(given.encode(), server.token.encode()):
                    self._send(403, b"forbidden: wrong or missing token\n", "text/plain")
                    return
                if url.path == "/":
                    self._send(200, server._page.encode(), "text/html; charset=utf-8")
                elif url.path == "/snapshot.json":
                    body = json.dumps(server.latest).encode()
                    self._send(200, body, "application/json")
                elif url.path == "/report":
                    code, html = server.report()
                    self._send(code, html.encode(), "text/html; charset=utf-8")
                else:
                    self._send(404, b"not found\n", "text/plain")

            def _refuse(self) -> None:
                self._send(405, b"read-only\n", "text/plain")

            do_POST = do_PUT = do_DELETE = do_PATCH = _refuse

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True

    @property
    def url(self) -> str:
        """The page's address, token included."""
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/?token={self.token}"

    def refresh(self) -> None:
        """Take one snapshot now (errors become the page's message)."""
        try:
            snap = self.make()
            if isinstance(snap.get("ranks"), list):
                snap = {**snap, "rank_table": rank_table(snap, _PAGE_ROWS),
                        "slowest_table": slowest_cells(snap.get("slowest") or [])}
            if isinstance(snap.get("wait_graph"), dict):  # who waits for whom, drawn
                graph = WaitForGraph.from_json(snap["wait_graph"])
                snap = {**snap, "wait_graph_svg": render_svg(graph)}
        except WatchError as exc:
            snap = {**self.latest, "error": str(exc), "state": "gone",
                    "headline": f"the job's store went away: {exc}"}
        self.latest = snap
        self.refreshes += 1

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.refresh()
            self._stop.wait(self.refresh_s)

    def start(self) -> None:
        """Start refreshing and serving in background threads."""
        threading.Thread(target=self._loop, name="commscope-watch-refresh",
                         daemon=True).start()
        threading.Thread(target=self.httpd.serve_forever, name="commscope-watch-http",
                         daemon=True).start()

    def stop(self) -> None:
        """Stop both threads and close the socket."""
        self._stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def report(self) -> tuple[int, str]:
        """The HTML report of the last dump in the job's dump folder."""
        prefix = self.latest.get("dump_prefix")
        folder = os.path.dirname(prefix) if isinstance(prefix, str) else None
        name = os.path.basename(prefix) if isinstance(prefix, str) else ""
        if not folder or not os.path.isdir(folder) or not any(
                f.startswith(name) and f[len(name):].isdigit() for f in os.listdir(folder)):
            return 404, ("<!doctype html><p>No dump yet: run <code>commscope dump</code> "
                         "(the job keeps running), or wait for a timeout.</p>")
        from commscope.analyze import analyze
        from commscope.analyze.present.export import html_report

        try:
            return 200, html_report(analyze(folder, prefix=name))
        except Exception as exc:  # a report must never take the page down
            return 500, f"<!doctype html><p>could not analyze {folder}: {exc}</p>"


def serve(make: Callable[[], dict[str, Any]], *, host: str, port: int, token: str,
          write: Callable[[str], None], refresh_s: float = 2.0) -> int:
    """Run the page until Ctrl-C; return the exit status."""
    server = WatchServer(make, token=token, host=host, port=port, refresh_s=refresh_s)
    server.start()
    write(f"commscope watch: live page at {server.url} (read-only; Ctrl-C to stop)")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop()
