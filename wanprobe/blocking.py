"""Blocking work from the event loop: ``run_blocking`` runs a call in a daemon thread, so a
loop that stops never waits for it (throughput tests, counter reads and SQLite in the daemon,
the page's rendering)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def run_blocking(fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn(*args)`` in a daemon thread and await its result; cancelling the await abandons
    the thread instead of waiting for it (the default executor would hold up shutdown)."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future = loop.create_future()

    def target() -> None:
        def settle(ok: bool, value: Any) -> None:
            if not fut.done():
                fut.set_result(value) if ok else fut.set_exception(value)

        try:
            result = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
            ok, value = False, exc
        else:
            ok, value = True, result
        try:
            loop.call_soon_threadsafe(settle, ok, value)
        except RuntimeError:  # the loop is gone (daemon stopped): nobody waits any more
            pass

    threading.Thread(target=target, name=f"wanprobe-{getattr(fn, '__name__', 'work')}",
                     daemon=True).start()
    return await fut
