"""Actions due at event-loop times, kept in a heap, with one loop timer armed for the earliest.

However many sessions are in flight, the loop holds one timer for all of them (the STAMP sender's
probes, the daemon's per-peer schedule in daemon/prober.py) instead of one per session: a
session costs a heap entry, not a TimerHandle in the loop's own heap. ``fire`` runs when the
earliest entry is due and pops whatever it wants to handle; entries it pushes meanwhile only
queue, and the timer is re-armed once, for the new earliest, when it returns.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from collections.abc import Callable


class TimerHeap:
    """Entries ``(due, tiebreak, *item)`` in ``heap``; ``fire()`` is called when one is due."""

    __slots__ = ("heap", "_fire", "_loop", "_timer", "_due", "_tiebreak")

    def __init__(self, fire: Callable[[], None]) -> None:
        self.heap: list[tuple] = []
        self._fire = fire
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._due: float | None = None
        self._tiebreak = itertools.count()

    def push(self, loop: asyncio.AbstractEventLoop, due: float, *item: object) -> None:
        """Queue ``item`` for loop time ``due``; arm the timer if it is now the earliest."""
        heapq.heappush(self.heap, (due, next(self._tiebreak), *item))
        if self._due is None or due < self._due:
            if self._timer is not None:
                self._timer.cancel()
            self._loop = loop
            self._timer = loop.call_at(due, self._run)
            self._due = due

    def clear(self) -> None:
        """Drop every entry and the timer."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._due = None
        self.heap.clear()

    def _run(self) -> None:
        self._timer = None
        self._due = -math.inf   # pushes from inside fire() only queue: re-armed below, once
        try:
            self._fire()
        finally:
            heap = self.heap
            self._due = heap[0][0] if heap else None
            if heap:
                self._timer = self._loop.call_at(self._due, self._run)
