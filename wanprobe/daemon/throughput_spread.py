"""Where a peer's scheduled throughput tests go: spread over the 168 hours of the week.

The transfer-window profile (wanprobe/windows) needs samples in every hour of the week within its
look-back. A fixed interval does not give them: tests every 6 h from the daemon's start fall on
the same 28 hours every week, and the other 140 are never measured. So a peer's test may start
only in an hour of the week that has the fewest of its tests within the look-back (among the
hours its allowed windows reach); with one test per ``interval`` the 168 hours fill in
``168 x interval`` (14 days at 2 h) and stay filled as old tests age out. perfSONAR's default
of a test every 6 h would leave most hours empty.

The ledger also bounds what a peer costs: bytes of its tests in the last 24 h, held under
``budget_per_peer_per_day`` by the scheduler.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

from wanprobe.windows.profile import HOUR_S, HOURS_PER_WEEK, hour_of_week

DAY_S = 86400.0


class SpreadLedger:
    """Per peer: the tests of the look-back (time, bytes, whether they gave a rate)."""

    def __init__(self, lookback_s: float, testable: Callable[[int], bool] | None = None) -> None:
        self.lookback_s = lookback_s
        self.testable = testable or (lambda hour: True)
        self._tests: dict[str, deque[tuple[float, int, bool]]] = {}
        self._cache: dict[str, tuple[int, list[int]]] = {}   # peer -> (hour index, counts)

    def seed(self, peer: str, rows: Iterable[tuple[float, int, bool]]) -> None:
        """Tests the store already holds for ``peer`` (oldest first)."""
        self._tests[peer] = deque(sorted(rows))
        self._cache.pop(peer, None)

    def record(self, peer: str, ts: float, moved_bytes: int, ok: bool) -> None:
        self._tests.setdefault(peer, deque()).append((ts, moved_bytes, ok))
        self._cache.pop(peer, None)

    def last(self, peer: str) -> float | None:
        tests = self._tests.get(peer)
        return tests[-1][0] if tests else None

    def _expire(self, peer: str, now: float) -> deque[tuple[float, int, bool]]:
        tests = self._tests.setdefault(peer, deque())
        keep = max(self.lookback_s, DAY_S)
        while tests and tests[0][0] < now - keep:
            tests.popleft()
        return tests

    def bytes_last_day(self, peer: str, now: float) -> int:
        return sum(b for ts, b, _ in self._expire(peer, now) if ts >= now - DAY_S)

    def coverage(self, peer: str, now: float) -> list[int]:
        """Tests that gave a rate, per hour of the week, within the look-back (cached per hour)."""
        index = int(now // HOUR_S)
        cached = self._cache.get(peer)
        if cached is not None and cached[0] == index:
            return cached[1]
        counts = [0] * HOURS_PER_WEEK
        for ts, _, ok in self._expire(peer, now):
            if ok and ts >= now - self.lookback_s:
                counts[hour_of_week(ts)] += 1
        self._cache[peer] = (index, counts)
        return counts

    def least_sampled(self, peer: str, now: float) -> bool:
        """True when the hour of ``now`` has no more of the peer's tests than any other hour
        the allowed windows reach."""
        counts = self.coverage(peer, now)
        reachable = [c for h, c in enumerate(counts) if self.testable(h)] or counts
        return counts[hour_of_week(now)] <= min(reachable)


def reachable_hours(in_window: Callable[[float], bool], now: float) -> set[int]:
    """Hours of the week the allowed windows reach: any quarter of the hour's next occurrence
    inside a window (the windows are in local time, the hours in UTC)."""
    base = (now // HOUR_S) * HOUR_S
    return {hour_of_week(base + k * HOUR_S) for k in range(HOURS_PER_WEEK)
            if any(in_window(base + k * HOUR_S + q * 900) for q in range(4))}


def cost_per_peer_per_day(interval_s: float, max_bytes_per_test: int, budget: int) -> int:
    """The most one peer's tests move in a day: the tests the interval allows, each at its cap,
    held under the per-peer budget."""
    tests = int(DAY_S // interval_s) + (1 if DAY_S % interval_s else 0)
    return min(budget, tests * max_bytes_per_test)


def describe_cost(interval_s: float, lookback_s: float, max_bytes_per_test: int,
                  budget_per_peer: int, budget_per_host: int, peers: int) -> str:
    """One line for ``daemon --check``: what the scheduled tests cost and what they cover."""
    from wanprobe.units import format_bytes, format_duration

    per_day = DAY_S / interval_s
    per_peer = cost_per_peer_per_day(interval_s, max_bytes_per_test, budget_per_peer)
    weeks = lookback_s / (HOURS_PER_WEEK * interval_s)
    cover = (f"every hour of the week tested {weeks:.2g}x per {format_duration(lookback_s)}"
             if weeks >= 1 else f"only {weeks:.0%} of the 168 hours per "
             f"{format_duration(lookback_s)} (interval above lookback / 168)")
    host = min(budget_per_host, peers * per_peer)
    return (f"throughput tests: each peer every {format_duration(interval_s)} "
            f"({per_day:.3g}/day), spread over the hours of the week: {cover}; at most "
            f"{format_bytes(per_peer)}/day per peer (tests capped at "
            f"{format_bytes(max_bytes_per_test)}), {format_bytes(host)}/day for {peers} peers")
