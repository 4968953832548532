"""What the echo-style senders (STAMP: sender.py, ICMP: icmp.py) share per session: the raw
records a summary is computed from, 16-bit session identifiers, what a failed send means, and
where kernel TX stamps go."""

from __future__ import annotations

import asyncio
import errno
import random
import socket
from collections.abc import Container
from dataclasses import dataclass, field

from wanprobe.errors import ProbeError
from wanprobe.probe import timestamps as ts
from wanprobe.probe.probe_summary import Reply

# the kernel reported the peer unreachable: the probe is lost, the session goes on
_LOST_ERRNOS = frozenset({errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH})


@dataclass(kw_only=True)
class SessionRecords:
    """Per-probe records of one session (probe_summary.summarize reads them): send times from
    the clock and from the kernel, replies as received, which sequence numbers were answered;
    ``done`` is set once every probe sent is answered and ``sending`` is over."""

    tx_user_ns: dict[int, int] = field(default_factory=dict)
    tx_kernel_ns: dict[int, int] = field(default_factory=dict)
    replies: list[Reply] = field(default_factory=list)
    answered: set[int] = field(default_factory=set)
    done: asyncio.Event | None = None   # made by whoever waits for it
    sending: bool = True


class SessionIds:
    """16-bit session identifiers (STAMP SSID, RFC 8972 §3; ICMP echo identifier, RFC 792),
    handed out round robin from a random start, never 0 and never one in use."""

    __slots__ = ("_next",)

    def __init__(self) -> None:
        self._next = random.randint(1, 0xFFFF)

    def take(self, in_use: Container[int], what: str) -> int:
        for _ in range(0x10000):
            ident = self._next
            self._next = self._next % 0xFFFF + 1
            if ident not in in_use:
                return ident
        raise ProbeError(f"too many concurrent {what} (65535)")


def send_failed(exc: OSError, what: str) -> None:
    """After ``sendto``/``sendmsg`` raised ``exc``: return when the probe only is lost (the
    socket buffer is full, or the kernel reported the peer unreachable; it counts as sent and
    lost), raise ProbeError when the socket cannot send at all."""
    if isinstance(exc, (BlockingIOError, InterruptedError)) or exc.errno in _LOST_ERRNOS:
        return
    raise ProbeError(f"cannot send {what}: {exc.strerror}") from None


def drain_tx_stamps(tracker: ts.TxStampTracker, sock: socket.socket) -> None:
    """File the kernel TX stamps waiting on ``sock`` into their sessions' ``tx_kernel_ns``
    (the tracker's entries are ``(session, seq)``)."""
    for (sess, seq), tx_ns in tracker.drain(sock):
        sess.tx_kernel_ns[seq] = tx_ns
