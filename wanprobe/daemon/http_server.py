"""A small HTTP/1.1 GET server for the daemon's listener, bounded against clients that misbehave.

Each response is one route's ``Response``; the server holds every client to:

- ``max_connections`` at once (and at most a quarter of the fd limit, accept_backoff.py); one
  more is answered ``503`` with a one-shot non-blocking send and closed;
- a request head of at most ``max_head_bytes``, complete within ``head_timeout_s``;
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

CHUNK_BYTES = 256 * 1024
SNDBUF_BYTES = 256 * 1024  # socket(7) SO_SNDBUF: the kernel may queue this much for a client
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
           414: "URI Too Long", 500: "Internal Server Error", 503: "Service Unavailable"}


@dataclass(frozen=True)
class HttpLimits:
    max_connections: int = 16
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


class BoundedHttpServer:
    """``route(path, handler, prefix=False)``, ``await start(host, port)`` → (host, port),
    ``await close()``, ``stats()`` → counts of connections served and refused by reason."""

    def __init__(self, limits: HttpLimits | None = None, *, name: str = "http") -> None:
        self.limits = limits or HttpLimits()
        self.name = name
        self.routes = _Routes()
        self.active = 0
        self.counts: Counter[str] = Counter()
        self._lsock: socket.socket | None = None
        self._accept_task: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()

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
            if self.active >= connection_cap(self.limits.max_connections):
                self.counts["too_many_connections"] += 1
                _refuse(sock)
                continue
            self.active += 1
            with contextlib.suppress(OSError):  # a bounded kernel queue too, not a whole body
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SNDBUF_BYTES)
            task = loop.create_task(self._serve(sock, addr))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _serve(self, sock: socket.socket, addr: tuple) -> None:
        writer, sent = None, False
        try:
            reader, writer = await asyncio.open_connection(sock=sock,
                                                           limit=self.limits.max_head_bytes)
            async with asyncio.timeout(self.limits.head_timeout_s):
                head = await reader.readuntil(b"\r\n\r\n")
            request = _parse(head, addr)
            response = await self._respond(request)
            await self._send(writer, request, response)
            sent = True
            self.counts["served"] += 1
        except TimeoutError:
            self.counts["timeout"] += 1
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            self.counts["bad_request"] += 1
        except OSError:
            self.counts["connection_error"] += 1
        finally:
            self.active -= 1
            if writer is None:
                sock.close()
            elif sent:
                writer.close()
            else:
                _reset(writer)

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
                    response: Response) -> None:
        extra = "".join(f"{k}: {v}\r\n" for k, v in response.headers)
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
        async with asyncio.timeout(self.limits.stall_timeout_s):
            await writer.drain()


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
