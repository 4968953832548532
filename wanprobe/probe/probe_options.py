"""What every probe method (STAMP, ICMP, TCP connect) shares around its sender: checking the
options, the number of probes they mean, one socket per (event loop, key) shared by the
concurrent sessions of that loop, and how such a socket is set up and torn down (the STAMP
reflector's socket too)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import weakref
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from wanprobe.errors import UsageError
from wanprobe.probe import limits
from wanprobe.probe import timestamps as ts
from wanprobe.probe.access import check_sent_dscp
from wanprobe.probe.result import ProbeResult

DEFAULT_COUNT = 10
RCVBUF_BYTES = 4 << 20   # replies of many sessions between two reads of the loop


def probe_count(count: int | None, duration_s: float | None, interval_s: float) -> int:
    """Probes to send: ``count``, or ``duration_s / interval_s``, or DEFAULT_COUNT; absurd runs
    are refused up front (``probe.limits``)."""
    if count is not None and duration_s is not None:
        raise UsageError("give either --count or --duration, not both")
    limits.check_run(count, duration_s, interval_s)
    if count is not None:
        if count < 1:
            raise UsageError(f"--count must be >= 1 (got {count})")
        total = int(count)
    elif duration_s is not None:
        if not duration_s > 0:
            raise UsageError("--duration must be > 0")
        total = max(1, int(round(duration_s / interval_s)))
    else:
        total = DEFAULT_COUNT
    limits.check_total(total, interval_s)
    return total


def check_common(port: int | None, dscp: int, timeout_s: float) -> None:
    """One-line UsageError for a port, DSCP or timeout out of range; a network-control DSCP
    (48-63) is refused too (``access.check_sent_dscp``)."""
    if port is not None and not 1 <= int(port) <= 65535:
        raise UsageError(f"port {port} out of range 1-65535")
    if not 0 <= int(dscp) <= 63:
        raise UsageError(f"DSCP {dscp} out of range 0-63")
    check_sent_dscp(int(dscp))
    limits.check_timeout(timeout_s)


def renamed(result: ProbeResult, peer: str) -> ProbeResult:
    """The result under the name the caller gave the peer (not its resolved address)."""
    return result if result.peer == peer else replace(result, peer=peer)


@contextlib.contextmanager
def shared_sender(registry: weakref.WeakKeyDictionary, key: Any,
                  factory: Callable[[], Any]) -> Iterator[Any]:
    """The sender for ``key`` in the running loop, created on first use and closed when its
    last session ends (``registry`` is the probe method's own WeakKeyDictionary)."""
    per_loop = registry.setdefault(asyncio.get_running_loop(), {})
    entry = per_loop.get(key)
    if entry is None:
        entry = per_loop[key] = [factory(), 0]
    entry[1] += 1
    try:
        yield entry[0]
    finally:
        entry[1] -= 1
        if entry[1] == 0:
            entry[0].close()
            per_loop.pop(key, None)


def ready_socket(sock: socket.socket, *, tx_timestamps: bool, ttl_and_dst: bool = False) -> None:
    """Kernel RX (and, with ``tx_timestamps``, TX) timestamps and the received TOS on ``sock``
    (``timestamps.enable_rx_metadata``), a RCVBUF_BYTES receive buffer where the kernel allows
    it, and non-blocking mode for the event loop. OSError when the kernel refuses an option."""
    ts.enable_rx_metadata(sock, timestamping=True, tx_timestamps=tx_timestamps,
                          ttl_and_dst=ttl_and_dst)
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF_BYTES)
    sock.setblocking(False)


def close_socket(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    """Stop ``loop`` reading ``sock`` (whether or not it was) and close it."""
    with contextlib.suppress(Exception):
        loop.remove_reader(sock.fileno())
    sock.close()
