"""A test whose client stopped reading ends instead of holding the server's sockets.

A reverse test sends from the server; a client that keeps its sockets open but never reads fills
every send buffer and would hold them (and its slot of ``max_connections``) until the test's
duration and drain ran out — 16 data sockets of 471 KB each and the control socket still open
193 s later in the issue 19 report. The server's wait for the end of a test wakes every
``STALL_S`` and ends the test when the streams it sends on moved no byte in that time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import Any

STALL_S = 10.0  # longer than any RTO backoff a live path shows before it moves a byte again


async def wait_unless_stalled(aws: set[asyncio.Future], streams: Iterable[Any], timeout_s: float,
                              stall_s: float | None = None) -> set[asyncio.Future]:
    """``asyncio.wait(aws, FIRST_COMPLETED)`` for up to ``timeout_s``; returns early with an
    empty set when the sending ``streams`` (datapath.Stream) moved nothing for ``stall_s``."""
    stall_s = STALL_S if stall_s is None else stall_s
    deadline = time.monotonic() + timeout_s
    sending = [s for s in streams if s.sending]
    last = None
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return set()
        done, _ = await asyncio.wait(aws, timeout=min(left, stall_s),
                                     return_when=asyncio.FIRST_COMPLETED)
        if done:
            return done
        moved = sum(s.bytes for s in sending)
        if sending and moved == last:
            return set()
        last = moved


async def flush(writer: asyncio.StreamWriter) -> None:
    """Drain, but never wait on a client that does not read for longer than a few seconds."""
    async with asyncio.timeout(5.0):
        await writer.drain()
