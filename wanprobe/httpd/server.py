"""A small HTTP/1.1 GET server for the daemon's listener, bounded against clients that misbehave.

Each response is one route's ``Response``; the server holds every client to:

- ``per_source`` connections at once per address (an IPv6 /64): one host cannot take the
  listener; one more takes the slot of that source's own oldest idle connection (below), or
  else is answered ``503`` with a one-shot non-blocking send and closed;
- ``max_connections`` at once (and at most a quarter of the fd limit, accept_backoff.py). At the
  cap a new connection takes the slot of the oldest one that has not yet completed its TLS
  handshake and request head, or else of the writer stalled longest (``_preempt``); only when
  every slot is doing work is it refused with ``503``. Hostile testing held all 16 slots of the
  old listener with 16 slow partial heads (9 of 10 scrapes got 503) or 40 non-reading
  ``/metrics`` clients (10 of 10): a scrape now always finds a slot (issue 37);
- a TLS handshake and request head of at most ``max_head_bytes``, complete within
  ``head_timeout_s``;
- TLS, client certificates and bcrypt basic auth as the web config says (web_config.py,
  auth.py), on every route but ``open_paths``;
- a body written in ``CHUNK_BYTES`` pieces, each of which must drain within
  ``stall_timeout_s`` and all of them within ``write_timeout_s``: a client that stops reading is
  reset (RST, its kernel buffer freed) instead of pinning a copy of the body in RAM. Five such
  clients on a 26 MB ``/metrics`` took the daemon from 349 to 577 MiB (issue 19); here each holds
  at most one chunk beyond a send buffer fixed at SNDBUF_BYTES (autotuned, the kernel queued a
  whole 1.5 MB body for a client that never read, charged to the unit's memory cgroup).

Accept failures (EMFILE) back off with one log line a minute. Routes are a table: an exact path,
or a prefix (``/peer/`` serves ``/peer/NAME``); a handler takes a ``Request`` and returns a
``Response`` or an awaitable of one. ``HEAD`` gets the head of the ``GET`` response.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import socket
import ssl
import struct
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from urllib.parse import unquote

from wanprobe.accept_backoff import (
    AcceptBackoff,
    accept,
    cancel_and_wait,
    connection_cap,
    listen_tcp,
)
from wanprobe.addresses import source_group
from wanprobe.httpd.auth import BasicAuth
from wanprobe.httpd.web_config import OPEN, WebConfig, peer_sans

CHUNK_BYTES = 256 * 1024
SNDBUF_BYTES = 256 * 1024  # socket(7) SO_SNDBUF: the kernel may queue this much for a client
PREEMPT_STALL_S = 1.0  # a writer that drained nothing for this long may give its slot up
REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden",
           404: "Not Found", 405: "Method Not Allowed",
           414: "URI Too Long", 500: "Internal Server Error", 503: "Service Unavailable"}


@dataclass(frozen=True)
class HttpLimits:
    max_connections: int = 64
    per_source: int = 8            # connections at once from one address (IPv6: one /64)
    head_timeout_s: float = 5.0
    max_head_bytes: int = 8192
    stall_timeout_s: float = 5.0   # one chunk must drain within this
    write_timeout_s: float = 30.0  # the whole body within this


@dataclass(frozen=True)
class Request:
    method: str
    path: str                  # percent-decoded, without the query
    query: str
    headers: dict[str, str]    # lower-case names
    client: str                # the peer's address
    rest: str = ""             # for a prefix route: the path after the prefix
    target: str = ""           # the request target as sent (a route may decode it strictly)


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()


Handler = Callable[[Request], "Response | Awaitable[Response]"]


@dataclass
class _Routes:
    exact: dict[str, Handler] = field(default_factory=dict)
    prefix: list[tuple[str, Handler]] = field(default_factory=list)

    def find(self, path: str) -> tuple[Handler | None, str]:
        if path in self.exact:
            return self.exact[path], ""
        for p, h in self.prefix:  # longest first
            if path.startswith(p):
                return h, path[len(p):]
        return None, ""


@dataclass(eq=False)
class _Conn:
    """One accepted connection: its source (rate-limited as a whole), what it is doing
    (``head``: TLS handshake or request head not yet complete; ``queued``: waiting for a password
    check; ``respond``; ``write``) and when it last moved."""

    source: str | bytes
    since: float
    phase: str = "head"
    moved: float = 0.0
    task: asyncio.Task | None = None


class BoundedHttpServer:
    """``route(path, handler, prefix=False)``, ``await start(host, port)`` → (host, port),
    ``await close()``, ``stats()`` → counts of connections served and refused by reason;
    ``web`` (web_config.py) says TLS and basic auth, swapped whole on reload."""

    def __init__(self, limits: HttpLimits | None = None, *, name: str = "http",
                 web: WebConfig = OPEN, open_paths: frozenset[str] = frozenset()) -> None:
        self.limits = limits or HttpLimits()
        self.name = name
        self.routes = _Routes()
        self.counts: Counter[str] = Counter()
        self.open_paths = open_paths      # served without authentication (``/healthz``)
        self._conns: dict[int, _Conn] = {}
        self._by_source: Counter[str | bytes] = Counter()
        self._lsock: socket.socket | None = None
        self._accept_task: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()
        self.set_web(web)

    @property
    def active(self) -> int:
        return len(self._conns)

    def set_web(self, web: WebConfig) -> None:
        """Serve new connections under ``web`` (those under way finish under the old one)."""
        self.web = web
        self._auth = BasicAuth(web) if web.users else None

    def route(self, path: str, handler: Handler, *, prefix: bool = False) -> None:
        if prefix:
            self.routes.prefix = sorted([*self.routes.prefix, (path, handler)],
                                        key=lambda ph: -len(ph[0]))
        else:
            self.routes.exact[path] = handler

    def stats(self) -> dict[str, int]:
        return {"active": self.active, **self.counts}

    async def start(self, host: str, port: int) -> tuple[str, int]:
        lsock = self._lsock = listen_tcp(host, port, 128)
        self._accept_task = asyncio.get_running_loop().create_task(self._accept_loop())
        return lsock.getsockname()[:2]

    async def close(self) -> None:
        await cancel_and_wait([self._accept_task])
        await cancel_and_wait(list(self._tasks))
        if self._lsock is not None:
            self._lsock.close()
            self._lsock = None

    async def _accept_loop(self) -> None:
        backoff = AcceptBackoff(f"{self.name} listener")
        loop = asyncio.get_running_loop()
        while True:
            sock, addr = await accept(self._lsock, backoff)
            source = source_group(addr[0])
            if self._by_source[source] >= self.limits.per_source and not self._preempt(source):
                self.counts["per_source_limit"] += 1
                _refuse(sock)
                continue
            if self.active >= connection_cap(self.limits.max_connections) and not self._preempt():
                self.counts["too_many_connections"] += 1
                _refuse(sock)
                continue
            with contextlib.suppress(OSError):  # a bounded kernel queue too, not a whole body
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SNDBUF_BYTES)
            now = time.monotonic()
            conn = _Conn(source, now, moved=now)
            self._conns[id(conn)] = conn
            self._by_source[source] += 1
            task = conn.task = loop.create_task(self._serve(sock, addr, conn))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _preempt(self, source: str | bytes | None = None) -> bool:
        """Make room for a new connection at the cap (``source``: at that source's share, among
        its own): the oldest one still in its handshake or request head (or queued for a
        password check), else the writer stalled longest (nothing drained for
        ``PREEMPT_STALL_S``). A scrape sends its request at once and reads what it asked for,
        so slow-header and non-reading clients, however many and from wherever (Prometheus's
        own address behind a NAT too), cannot hold every slot: the slot a scrape needs is
        always someone else's idle one (issue 37). Linear in the connections, at most
        ``max_connections``, and only when the listener is full."""
        now = time.monotonic()
        conns = [c for c in self._conns.values() if source is None or c.source == source]
        idle = [c for c in conns if c.phase in ("head", "queued")]
        if idle:
            victim = min(idle, key=lambda c: c.since)
        else:
            stalled = [c for c in conns if c.phase == "write" and now - c.moved >= PREEMPT_STALL_S]
            if not stalled:
                return False
            victim = min(stalled, key=lambda c: c.moved)
        self._drop(victim)
        self.counts["preempted"] += 1
        if victim.task is not None:
            victim.task.cancel()
        return True

    def _drop(self, conn: _Conn) -> None:
        if self._conns.pop(id(conn), None) is not None:
            self._by_source[conn.source] -= 1
            if self._by_source[conn.source] <= 0:
                del self._by_source[conn.source]

    async def _serve(self, sock: socket.socket, addr: tuple, conn: _Conn) -> None:
        writer, sent = None, False
        web, auth = self.web, self._auth   # the settings it was accepted under, to its end
        try:
            async with asyncio.timeout(self.limits.head_timeout_s):
                reader, writer = await _open(sock, web, self.limits.max_head_bytes)
                head = await reader.readuntil(b"\r\n\r\n")
            request = _parse(head, addr)
            response = await self._guarded(request, writer, web, auth, conn)
            conn.phase, conn.moved = "write", time.monotonic()
            await self._send(writer, request, response, web, conn)
            sent = True
            self.counts["served"] += 1
        except asyncio.CancelledError:
            if id(conn) in self._conns:
                raise  # shutdown, not a preemption
        except TimeoutError:
            self.counts["timeout"] += 1
        except ssl.SSLError:
            self.counts["tls_failed"] += 1   # plain HTTP, an untrusted client certificate, ...
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            self.counts["bad_request"] += 1
        except OSError:
            self.counts["connection_error"] += 1
        finally:
            self._drop(conn)
            if writer is None:
                sock.close()
            elif sent:
                writer.close()
            else:
                _reset(writer)

    async def _guarded(self, request: Request | None, writer: asyncio.StreamWriter,
                       web: WebConfig, auth: BasicAuth | None, conn: _Conn) -> Response:
        """The route's response, once the client has shown what ``web`` asks: a client
        certificate naming an allowed SAN, a password matching a bcrypt hash."""
        if request is None or request.method not in ("GET", "HEAD"):
            return await self._respond(request)
        if web.allowed_sans and not peer_sans(writer.get_extra_info("peercert")) & web.allowed_sans:
            self.counts["client_cert_refused"] += 1
            return Response(403, b"client certificate not allowed\n")
        if auth is not None and request.path not in self.open_paths:
            conn.phase = "queued"   # preemptible while bcrypt works for others
            user = await auth.check(request.headers.get("authorization"))
            if user is None:
                self.counts["unauthorized"] += 1
                return Response(401, b"unauthorized\n", headers=(
                    ("WWW-Authenticate", 'Basic realm="wanprobe", charset="UTF-8"'),))
        conn.phase = "respond"
        return await self._respond(request)

    async def _respond(self, request: Request | None) -> Response:
        if request is None:
            return Response(400, b"bad request\n")
        if request.method not in ("GET", "HEAD"):
            return Response(405, b"GET only\n", headers=(("Allow", "GET, HEAD"),))
        handler, rest = self.routes.find(request.path)
        if handler is None:
            known = " ".join(sorted(self.routes.exact))
            return Response(404, f"not found; try {known}\n".encode())
        try:
            out = handler(Request(**{**request.__dict__, "rest": rest}))
            return await out if inspect.isawaitable(out) else out
        except Exception:  # noqa: BLE001 - one route's bug is a 500, not a dead listener
            self.counts["handler_error"] += 1
            return Response(500, b"internal error\n")

    async def _send(self, writer: asyncio.StreamWriter, request: Request | None,
                    response: Response, web: WebConfig, conn: _Conn) -> None:
        extra = "".join(f"{k}: {v}\r\n" for k, v in (*web.headers, *response.headers))
        head = (f"HTTP/1.1 {response.status} {REASONS.get(response.status, 'Unknown')}\r\n"
                f"Content-Type: {response.content_type}\r\nContent-Length: "
                f"{len(response.body)}\r\n{extra}Connection: close\r\n\r\n").encode("latin-1")
        writer.write(head)
        body = b"" if request is not None and request.method == "HEAD" else response.body
        view = memoryview(body)
        deadline = time.monotonic() + self.limits.write_timeout_s
        for start in range(0, len(view), CHUNK_BYTES):
            writer.write(view[start:start + CHUNK_BYTES])
            left = deadline - time.monotonic()
            async with asyncio.timeout(max(0.0, min(self.limits.stall_timeout_s, left))):
                await writer.drain()
            conn.moved = time.monotonic()
        async with asyncio.timeout(self.limits.stall_timeout_s):
            await writer.drain()


async def _open(sock: socket.socket, web: WebConfig, limit: int
                ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Streams over an accepted socket, through a TLS handshake when ``web`` has a context (a
    failed handshake raises ssl.SSLError: plain HTTP to a TLS port gets no page)."""
    if web.ssl_context is None:
        return await asyncio.open_connection(sock=sock, limit=limit)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=limit, loop=loop)
    protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
    transport, _ = await loop.connect_accepted_socket(
        lambda: protocol, sock=sock, ssl=web.ssl_context, ssl_handshake_timeout=None)
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)


def _parse(head: bytes, addr: tuple) -> Request | None:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return None
    target = parts[1]
    path, _, query = target.partition("?")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return Request(parts[0], unquote(path), query, headers, str(addr[0]), target=target)


def _refuse(sock: socket.socket) -> None:
    """A one-shot 503 to a client over the connection cap: never waits on it."""
    with contextlib.suppress(OSError):
        sock.setblocking(False)
        sock.send(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
                  b"Connection: close\r\nRetry-After: 1\r\n\r\n")
    sock.close()


def _reset(writer: asyncio.StreamWriter) -> None:
    """A client that did not take its whole response (a timeout above) gets RST: SO_LINGER
    {1, 0} frees the socket's send queue now, not after the orphan retries (socket(7))."""
    sock = writer.transport.get_extra_info("socket")
    with contextlib.suppress(OSError, AttributeError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
