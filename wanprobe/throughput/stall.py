"""A test whose client stopped reading ends instead of holding the server's sockets.

A reverse test sends from the server; a client that keeps its sockets open but never reads fills
every send buffer and would hold them (and its slot of ``max_connections``) until the test's
duration and drain ran out — 16 data sockets of 471 KB each and the control socket still open
193 s later in the issue 19 report. The server's wait for the end of a test compares the bytes
its streams sent every ``TICK_S`` and ends the test once they moved no byte for ``STALL_S``: at
most STALL_S + TICK_S after the last byte the client took (comparing only every STALL_S, as
before issue 37, saw the first stall at the second wake: a test ended 20.6 s after its client
stopped reading, not the 10 s the README promises).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import Any

STALL_S = 10.0  # longer than any RTO backoff a live path shows before it moves a byte again
TICK_S = 0.5    # how often the byte counts are compared (shared-memory reads: nothing to cost)


async def wait_unless_stalled(aws: set[asyncio.Future], streams: Iterable[Any], timeout_s: float,
                              stall_s: float | None = None) -> set[asyncio.Future]:
    """``asyncio.wait(aws, FIRST_COMPLETED)`` for up to ``timeout_s``; returns early with an
    empty set when the sending ``streams`` (datapath.Stream) moved nothing for ``stall_s``
    (seen within ``stall_s`` + TICK_S of their last byte)."""
    stall_s = STALL_S if stall_s is None else stall_s
    tick = min(TICK_S, stall_s / 4)
    deadline = time.monotonic() + timeout_s
    sending = [s for s in streams if s.sending]
    last, moved_at = sum(s.bytes for s in sending), time.monotonic()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return set()
        done, _ = await asyncio.wait(aws, timeout=min(left, tick),
                                     return_when=asyncio.FIRST_COMPLETED)
        if done:
            return done
        moved, now = sum(s.bytes for s in sending), time.monotonic()
        if moved != last:
            last, moved_at = moved, now
        elif sending and now - moved_at >= stall_s:
            return set()


async def flush(writer: asyncio.StreamWriter) -> None:
    """Drain, but never wait on a client that does not read for longer than a few seconds."""
    async with asyncio.timeout(5.0):
        await writer.drain()
