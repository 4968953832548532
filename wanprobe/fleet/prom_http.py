"""Prometheus's HTTP API, read with the standard library: instant and range queries.

https://prometheus.io/docs/prometheus/latest/querying/api/ (``/api/v1/query``,
``/api/v1/query_range``). The server is untrusted input (issue 37): each query is bounded as a
whole — ``timeout_s`` from connecting to the last byte (a timer shuts the socket down; a
per-read timeout let a server dripping a byte every 2 s outlive ``--timeout 5s``) and
:data:`MAX_REPLY_BYTES` read (a larger ``Content-Length`` is refused before the body) — and
the answer is parsed under a series cap (``prom_reply``). Every failure is one error line.
``stats=all`` (Prometheus ≥ 2.35) adds the samples a query touched, which the windows bench
reads.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

from wanprobe.fleet.prom_reply import (
    MAX_SERIES,
    Points,
    PrometheusError,
    parse_matrix,
    parse_vector,
)

__all__ = ["MAX_REPLY_BYTES", "MAX_SERIES", "Points", "PrometheusError", "Samples", "Series",
           "get", "label_value", "parse_matrix", "parse_vector", "query", "query_range"]

MAX_REPLY_BYTES = 32 * 2**20
MAX_ERROR_BYTES = 64 * 2**10   # of an HTTP error's body: only its "error" line is shown
Samples = list[tuple[dict[str, str], float]]
Series = list[tuple[dict[str, str], Points]]


class _Deadline:
    """One query's whole-time bound: when it passes, every socket the query opened is shut
    down (a blocked read returns at once), and ``fired`` says why the read failed."""

    def __init__(self, seconds: float) -> None:
        self.fired = self._done = False
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True

    def connection(self, cls: type[http.client.HTTPConnection]) -> Callable[..., Any]:
        """A factory of ``cls`` (urllib's ``http_class``) whose sockets this deadline holds."""
        def make(*args: Any, **kwargs: Any) -> http.client.HTTPConnection:
            conn = cls(*args, **kwargs)
            conn._create_connection = self._connect  # type: ignore[attr-defined]
            return conn
        return make

    def _connect(self, address: tuple[str, int], timeout: float | None,
                 source_address: Any = None) -> socket.socket:
        sock = socket.create_connection(address, timeout, source_address)
        with self._lock:
            if self.fired:  # name resolution has no timer to cut it: checked once it is done
                sock.close()
                raise TimeoutError("deadline passed while connecting")
            # a descriptor of our own: TLS wraps (and detaches) ``sock``, urllib closes it
            self._socks.append(sock.dup())
        return sock

    def _fire(self) -> None:
        with self._lock:
            if self._done:  # the query ended as the timer went off: it was in time
                return
            self.fired = True
            for s in self._socks:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> _Deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()
        with self._lock:
            self._done = True
            for s in self._socks:
                s.close()
            self._socks.clear()


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, deadline: _Deadline) -> None:
        super().__init__()
        self.deadline = deadline

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(self.deadline.connection(http.client.HTTPConnection), req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, deadline: _Deadline) -> None:
        super().__init__()
        self.deadline = deadline

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(self.deadline.connection(http.client.HTTPSConnection), req,
                            context=self._context)  # type: ignore[attr-defined]


def _too_large(url: str, size: str, limit: int) -> PrometheusError:
    return PrometheusError(f"Prometheus at {url}: an answer of {size} bytes, over the "
                           f"{limit // 2**20} MiB limit of fleet queries; refused")


def read_capped(resp: Any, url: str, limit: int = MAX_REPLY_BYTES) -> bytes:
    """The body of ``resp``, refused once it passes ``limit`` bytes (or says it will)."""
    length = (resp.headers.get("Content-Length") or "").strip()
    if length.isdigit() and int(length) > limit:
        raise _too_large(url, length, limit)
    body = bytearray()
    while len(body) <= limit:
        chunk = resp.read(min(2**20, limit + 1 - len(body)))
        if not chunk:
            break
        body += chunk
    if len(body) > limit:
        raise _too_large(url, f"more than {limit}", limit)
    return body  # type: ignore[return-value]  # bytes-like; json.loads takes it


def _http_error(url: str, exc: urllib.error.HTTPError) -> PrometheusError:
    with exc:
        body = exc.read(MAX_ERROR_BYTES)
    try:
        detail = json.loads(body).get("error", "")
    except (ValueError, AttributeError, RecursionError):
        detail = ""
    return PrometheusError(f"Prometheus at {url}: HTTP {exc.code} {detail}".strip())


def get(url: str, path: str, params: dict[str, Any], *, timeout_s: float = 10.0,
        max_bytes: int = MAX_REPLY_BYTES) -> bytes:
    """The body of ``GET url/path?params`` within ``timeout_s`` in all; an HTTP error carries
    Prometheus's own message."""
    full = url.rstrip("/") + path + "?" + urllib.parse.urlencode(params)
    deadline = _Deadline(timeout_s)
    try:
        with deadline:
            opener = urllib.request.build_opener(_HTTPHandler(deadline), _HTTPSHandler(deadline))
            try:
                with opener.open(full, timeout=timeout_s) as resp:
                    body = read_capped(resp, url, max_bytes)
            except urllib.error.HTTPError as exc:
                raise _http_error(url, exc) from None
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
        if deadline.fired:
            raise _too_slow(url, timeout_s) from None
        reason = getattr(exc, "reason", None) or exc
        raise PrometheusError(f"cannot reach Prometheus at {url}: {reason}") from None
    if deadline.fired:  # the body may have been cut short
        raise _too_slow(url, timeout_s)
    return body


def _too_slow(url: str, timeout_s: float) -> PrometheusError:
    return PrometheusError(f"Prometheus at {url}: no complete answer within {timeout_s:g} s "
                           "(--timeout bounds each whole query)")


def query(url: str, promql: str, *, timeout_s: float = 10.0, at_s: float | None = None) -> Samples:
    """(labels, value) of every sample of an instant vector query (at ``at_s``, default now)."""
    params: dict[str, Any] = {"query": promql}
    if at_s is not None:
        params["time"] = f"{at_s:.3f}"
    return parse_vector(get(url, "/api/v1/query", params, timeout_s=timeout_s), url)


def query_range(url: str, promql: str, *, start_s: float, end_s: float, step_s: float,
                timeout_s: float = 30.0, stats: bool = False) -> tuple[Series, dict[str, Any]]:
    """Every series of a range query and, with ``stats``, what Prometheus says it cost."""
    params: dict[str, Any] = {"query": promql, "start": f"{start_s:.3f}", "end": f"{end_s:.3f}",
                              "step": f"{step_s:g}", "timeout": f"{timeout_s:g}s"}
    if stats:
        params["stats"] = "all"
    return parse_matrix(get(url, "/api/v1/query_range", params, timeout_s=timeout_s), url)


def label_value(text: str) -> str:
    """``text`` as a PromQL string literal (double-quoted, backslash and quote escaped)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
