"""Rolling per-peer windows (pure; no I/O): what the daemon's regression baseline
(``daemon/baseline.py``) and the path watch (``path_watch.py``) share (issue 38).

Each peer's sessions fill two windows: the last ``recent`` are judged against the ``window``
before them, the reference. A session enters the reference only as it leaves the recent window,
and not while the reference is frozen (a degraded or queueing peer), so an anomaly is not learnt
as the new normal. After a change that is the new normal (a reroute) the recent sessions become
the reference and the recent window starts again.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

Row = TypeVar("Row")
State = TypeVar("State")


class Windows(Generic[Row]):
    """The reference window (``history``, up to ``window`` rows) and the ``recent`` rows after
    it (module docstring)."""

    def __init__(self, window: int, recent: int) -> None:
        self.history: deque[Row] = deque(maxlen=window)
        self.recent: deque[Row] = deque(maxlen=recent)

    def push(self, row: Row, *, learn: bool = True) -> tuple[Row | None, Row | None]:
        """Add ``row`` to the recent window; when that was full and ``learn``, its oldest row
        moves into the reference. Returns (entered, left): the row that entered the reference
        and the one that fell out of it (None when none did), for callers that keep aggregates
        of the reference up to date."""
        entered: Row | None = None
        left: Row | None = None
        if len(self.recent) == self.recent.maxlen and learn:
            entered = self.recent[0]
            if len(self.history) == self.history.maxlen:
                left = self.history[0]
            self.history.append(entered)
        self.recent.append(row)
        return entered, left

    def ready(self, min_history: int, min_recent: int) -> bool:
        """Enough to judge: at least ``min_history`` reference rows and ``min_recent`` recent
        ones (the settings' ``recent``: a full window, unless a reload changed it since)."""
        return len(self.history) >= min_history and len(self.recent) >= min_recent

    def restart(self) -> None:
        """The recent rows become the reference (a new normal); the recent window is empty."""
        self.history = deque(self.recent, maxlen=self.history.maxlen)
        self.recent = deque(maxlen=self.recent.maxlen)


class PerPeer(Generic[State]):
    """One ``State`` per peer name, made by ``make`` on first use and dropped by ``forget``."""

    def __init__(self, make: Callable[[], State]) -> None:
        self._make = make
        self._peers: dict[str, State] = {}

    def __getitem__(self, peer: str) -> State:
        st = self._peers.get(peer)
        if st is None:
            st = self._peers[peer] = self._make()
        return st

    def get(self, peer: str) -> State | None:
        """The peer's state, None when it has none yet (nothing is made)."""
        return self._peers.get(peer)

    def forget(self, peer: str) -> None:
        self._peers.pop(peer, None)

    def __len__(self) -> int:
        return len(self._peers)

    def __iter__(self) -> Iterator[str]:
        return iter(self._peers)


def median_known(values: Iterable[float | None]) -> float | None:
    """The median of the values that are known (not None); None when none is."""
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None
