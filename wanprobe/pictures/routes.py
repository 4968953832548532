"""The daemon page's routes on the metrics listener (daemon/metrics.py ``MetricsServer``, a
``wanprobe.httpd.server.BoundedHttpServer``).

``/`` (every peer), ``/peer/NAME`` (one peer) and ``/static/wanprobe-pictures.<hash>.js`` (BokehJS
and charts.js, cached by the browser for a year: its name changes with its content). Read-only:
GET and HEAD only (the listener refuses the rest), and the only inputs are the peer name and
``?window=`` (5 min to 90 days), both validated: a bad window or any other parameter is a 400,
an unknown peer a 404, each with one line of text.

Rendering never blocks the event loop that drives the probes: the daemon's state is copied on the
loop (state.snapshot, microseconds per peer), then the history is queried and the HTML built in a
worker thread over a read-only SQLite connection. One page is rendered at a time, and a page
rendered less than one probe interval ago (CACHE_MIN_S to CACHE_MAX_S) is served again: nothing
on it can have changed sooner, and any number of viewers reloading costs at most one render per
probe interval per distinct page.
"""

from __future__ import annotations

import asyncio
import logging
import time
import urllib.parse
from collections import OrderedDict
from typing import Any

from wanprobe.blocking import run_blocking
from wanprobe.errors import UsageError, WanprobeError, shown
from wanprobe.httpd.server import BoundedHttpServer, Request, Response
from wanprobe.pictures import assets as assets_mod
from wanprobe.pictures.history_data import DEFAULT_WINDOW_S, parse_window
from wanprobe.pictures.html import CSP_SERVED

LOGGER = "wanprobe.daemon"  # the daemon's logger, by name (daemon/logging.py formats its lines)
CACHE_MIN_S, CACHE_MAX_S = 2.0, 30.0
CACHE_PAGES = 16
MAX_TARGET_CHARS = 1024
HTML = "text/html; charset=utf-8"
TEXT = "text/plain; charset=utf-8"
# no caching of a page, no sniffing, no framing; the CSP header also covers frame-ancestors
PAGE_HEADERS = (("Cache-Control", "no-store"), ("X-Content-Type-Options", "nosniff"),
                ("X-Frame-Options", "DENY"), ("Referrer-Policy", "no-referrer"),
                ("Content-Security-Policy", f"{CSP_SERVED}; frame-ancestors 'none'"))
STATIC_HEADERS = (("Cache-Control", "public, max-age=31536000, immutable"),
                  ("X-Content-Type-Options", "nosniff"))


def _line(status: int, message: str) -> Response:
    return Response(status, (" ".join(message.split()) + "\n").encode(), TEXT,
                    (("X-Content-Type-Options", "nosniff"),))


def parse_query(query: str) -> tuple[float, str | None]:
    """``window=`` (once) and nothing else; returns (seconds, the text to keep in links)."""
    try:
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query),
                                       max_num_fields=4, errors="strict")
    except (ValueError, UnicodeDecodeError):
        raise UsageError("bad query string (only ?window=DURATION, e.g. ?window=6h)") from None
    names = [k for k, _ in pairs]
    if any(k != "window" for k in names) or len(names) > 1:
        bad = next((k for k in names if k != "window"), "window")
        raise UsageError(f"unknown or repeated parameter {shown(bad)} (only window=DURATION)")
    if not pairs:
        return DEFAULT_WINDOW_S, None
    return parse_window(pairs[0][1]), pairs[0][1]


class DaemonPages:
    """The page's routes on the daemon's listener (``install``); ``respond(target)`` answers a
    raw request target with a Response, or None for a path it does not serve."""

    def __init__(self, daemon: Any) -> None:
        self.daemon = daemon
        self._lock = asyncio.Lock()
        self._cache: OrderedDict[tuple, tuple[float, Response]] = OrderedDict()
        self._assets: assets_mod.Assets | None = None

    def install(self, http: BoundedHttpServer) -> None:
        """Route ``/``, ``/peer/NAME`` and ``/static/...`` of the bounded listener here."""
        http.route("/", self._handle)
        http.route("/peer/", self._handle, prefix=True)
        http.route("/static/", self._handle, prefix=True)

    async def _handle(self, request: Request) -> Response:
        # the raw target: the peer name is decoded here, strictly (a non-UTF-8 name is a 400)
        answer = await self.respond(request.target or request.path)
        return answer if answer is not None else _line(404, "try /, /metrics or /healthz")

    async def respond(self, target: str) -> Response | None:
        path, _, query = target.partition("?")
        if path != "/" and not path.startswith(("/peer/", "/static/")):
            return None
        if len(target) > MAX_TARGET_CHARS:
            return _line(414, "request target too long")
        try:  # the first load imports bokeh and reads 1.4 MB: not on the loop
            assets = self._assets = self._assets or await run_blocking(assets_mod.load)
        except WanprobeError as exc:
            return _line(503, str(exc))
        if path.startswith("/static/"):
            if path != f"/static/{assets.script_name}":
                return _line(404, "no such asset")
            return Response(200, assets.script_bytes, "text/javascript; charset=utf-8",
                            STATIC_HEADERS)
        try:
            window_s, window = parse_query(query)
        except UsageError as exc:
            return _line(400, str(exc))
        peer = None
        if path != "/":
            try:
                name = urllib.parse.unquote(path[len("/peer/"):], errors="strict")
            except UnicodeDecodeError:
                return _line(400, "peer name is not UTF-8")
            peer = next((p for p in self.daemon.peers if p.name == name), None)
            if peer is None:
                return _line(404, f"no peer named {shown(name)} (see / for the list)")
        return await self._render(path, window_s, window, peer.name if peer else None)

    async def _render(self, path: str, window_s: float, window: str | None,
                      peer: str | None) -> Response:
        from wanprobe.pictures.state import snapshot

        key = (path, window_s)
        async with self._lock:
            hit = self._cache.get(key)
            fresh_s = min(max(self.daemon.cfg.probe.interval_s, CACHE_MIN_S), CACHE_MAX_S)
            if hit is not None and time.monotonic() - hit[0] < fresh_s:
                return hit[1]
            state = snapshot(self.daemon)
            if peer is not None and state.peer(peer) is None:   # removed by a reload meanwhile
                return _line(404, f"no peer named {shown(peer)} (see / for the list)")
            try:
                body = await run_blocking(_draw, state, window_s, window, peer)
            except WanprobeError as exc:   # the history cannot be read
                return _line(503, str(exc))
            except Exception as exc:  # noqa: BLE001 - a page bug must not take the listener down
                logging.getLogger(LOGGER).log(logging.ERROR, "page failed", extra={
                    "fields": {"path": path, "error": repr(exc)}})
                return _line(500, f"page failed: {type(exc).__name__}")
            response = Response(200, body, HTML, PAGE_HEADERS)
            self._cache[key] = (time.monotonic(), response)
            self._cache.move_to_end(key)
            while len(self._cache) > CACHE_PAGES:
                self._cache.popitem(last=False)
            return response


def _draw(state: Any, window_s: float, window: str | None, peer: str | None) -> bytes:
    """In the worker thread: query the history and build the page."""
    from wanprobe.pictures.overview import overview_page, peer_page

    assets = assets_mod.load()
    src = f"/static/{assets.script_name}"
    if peer is None:
        page = overview_page(state, window_s=window_s, window=window)
    else:
        page = peer_page(state, state.peer(peer), window_s=window_s)
    return page.render(assets, script_src=src).encode()
