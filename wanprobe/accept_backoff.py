"""Accept loops that survive running out of file descriptors.

When a process is at its RLIMIT_NOFILE (a connection flood, a leak elsewhere), accept(2) fails
with EMFILE at once, again and again: asyncio's own server logs a traceback for every failure
(a 1,100-connection flood at the 1,024 fd limit wrote 2,800 tracebacks in 20 s, issue 19). Here a
resource failure (EMFILE, ENFILE, ENOBUFS, ENOMEM) waits — 50 ms, doubling to 2 s — and logs one
line per minute with the count, as nginx's ``accept_mutex_delay``/``worker_connections`` logic
and Go's net/http (exponential backoff from 5 ms to 1 s on a temporary accept error) do.

``connection_cap(configured)`` bounds a listener's concurrent connections by the fd limit too,
so one listener's flood cannot take the descriptors the others (``/metrics``) need.
``listen_tcp`` opens a listener's socket and ``cancel_and_wait`` shuts down the tasks serving
it, the same for the throughput server and the daemon's HTTP listener.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import resource
import socket
import time
from collections.abc import Callable, Iterable

RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
FIRST_WAIT_S, MAX_WAIT_S = 0.05, 2.0
LOG_EVERY_S = 60.0
LOGGER = "wanprobe.daemon"  # the daemon's logger (daemon/logging.py); a CLI server's stderr


def connection_cap(configured: int, share: float = 0.25) -> int:
    """``configured``, but at most ``share`` of this process's soft RLIMIT_NOFILE (that share at least 8)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return configured
    return min(configured, max(8, int(soft * share)))


class AcceptBackoff:
    """The wait after a failed accept and the one log line per minute (``what``: the listener)."""

    def __init__(self, what: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.what, self.clock = what, clock
        self.wait_s = FIRST_WAIT_S
        self.failures = 0        # since the last log line
        self.total = 0
        self._logged_at: float | None = None

    def ok(self) -> None:
        self.wait_s = FIRST_WAIT_S

    def failed(self, exc: OSError) -> float:
        """Count a failed accept; return how long to wait before the next one."""
        self.failures += 1
        self.total += 1
        now = self.clock()
        if self._logged_at is None or now - self._logged_at >= LOG_EVERY_S:
            level = logging.ERROR if exc.errno in RESOURCE_ERRNOS else logging.WARNING
            logging.getLogger(LOGGER).log(
                level, f"{self.what}: accept failed {self.failures} times "
                f"({exc.strerror or exc}); backing off", extra={"fields": {}})
            self._logged_at, self.failures = now, 0
        wait = self.wait_s
        self.wait_s = min(self.wait_s * 2, MAX_WAIT_S)
        return wait


async def accept(lsock: socket.socket, backoff: AcceptBackoff) -> tuple[socket.socket, tuple]:
    """The next connection on non-blocking ``lsock``; failures wait per ``backoff``."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            conn = await loop.sock_accept(lsock)
        except (asyncio.CancelledError, GeneratorExit):
            raise
        except OSError as exc:
            if exc.errno in (errno.ECONNABORTED, errno.EAGAIN, errno.EINTR):
                continue  # the client gave up before we accepted: nothing to say
            await asyncio.sleep(backoff.failed(exc))
            continue
        backoff.ok()
        return conn


def listen_tcp(host: str, port: int, backlog: int) -> socket.socket:
    """A non-blocking socket listening on TCP ``host:port`` (port 0: a free one), on the first
    address ``getaddrinfo`` gives, with SO_REUSEADDR (socket(7): a restarted server binds while
    its old connections sit in TIME_WAIT). Raises OSError (``socket.gaierror`` for a name that
    does not resolve), the socket closed."""
    family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                               flags=socket.AI_PASSIVE)[0]
    lsock = socket.socket(family, socket.SOCK_STREAM)
    try:
        lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        lsock.bind(addr)
        lsock.listen(backlog)
        lsock.setblocking(False)
    except OSError:
        lsock.close()
        raise
    return lsock


async def cancel_and_wait(tasks: Iterable[asyncio.Task | None]) -> None:
    """Cancel each task (None: none there), then wait for each to end; what one raised on its
    way out is dropped: it is being shut down."""
    tasks = [t for t in tasks if t is not None]
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
