"""Per-peer rolling baselines and regression detection with hysteresis (pure; no I/O).

For each peer the last ``recent`` probe sessions are compared with the ``window`` sessions before
them: median of the per-session p50 and p99 RTT, and pooled loss (lost / sent). Throughput tests
are compared one by one with the median of earlier tests. A metric *enters* the degraded state
when its excess passes the threshold and *clears* only when the excess falls below
``clear_fraction`` of it, so a value hovering at the threshold does not flap. While a peer is
degraded its baseline is frozen, so the regression is not learnt as the new normal.

Loss uses the lower bound of the Wilson score interval (Wilson 1927; Brown, Cai & DasGupta 2001)
of the recent loss, so one lost packet out of 50 is not called a 2 % regression.
"""

from __future__ import annotations

import bisect
import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from wanprobe.daemon.config import BaselineSettings
from wanprobe.daemon.store import ProbeRow
from wanprobe.probe.stats import wilson_interval  # the one copy (exact z, exact 0/1 ends)


@dataclass(frozen=True)
class Transition:
    """A metric of a peer entering (``degraded``) or leaving (``recovered``) regression."""

    peer: str
    metric: str            # rtt_p50, rtt_p99, loss, throughput
    state: str             # degraded | recovered
    baseline: float
    current: float
    threshold: float
    unit: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"peer": self.peer, "metric": self.metric, "state": self.state,
                "baseline": self.baseline, "current": self.current, "threshold": self.threshold,
                "unit": self.unit, "evidence": self.evidence}


@dataclass
class _PeerState:
    history: deque            # baseline ProbeRows
    recent: deque             # last `recent` ProbeRows
    tput: deque               # baseline bits_per_second
    degraded: dict[str, bool] = field(default_factory=dict)
    # the history's aggregates, kept up to date as rows enter and leave it, so a session costs
    # O(log window) instead of re-sorting the window (bench/daemon_footprint.py at 1,000 peers)
    sorted_ms: dict[str, list[float]] = field(
        default_factory=lambda: {"rtt_p50_ms": [], "rtt_p99_ms": []})
    lost: int = 0
    sent: int = 0

    def add_history(self, row: ProbeRow) -> None:
        """Append ``row`` to the baseline window (evicting the oldest when full)."""
        if len(self.history) == self.history.maxlen:
            self._account(self.history[0], -1)
        self.history.append(row)
        self._account(row, +1)

    def _account(self, row: ProbeRow, sign: int) -> None:
        for attr, values in self.sorted_ms.items():
            v = getattr(row, attr)
            if v is None:
                continue
            if sign > 0:
                bisect.insort(values, v)
            else:
                del values[bisect.bisect_left(values, v)]
        if row.received is not None:
            self.sent += sign * (row.sent or 0)
            self.lost += sign * ((row.sent or 0) - row.received)


class BaselineTracker:
    """Feed probe rows and throughput results; get :class:`Transition` events back."""

    def __init__(self, settings: BaselineSettings) -> None:
        self.s = settings
        self._peers: dict[str, _PeerState] = {}

    def _state(self, peer: str) -> _PeerState:
        st = self._peers.get(peer)
        if st is None:
            st = self._peers[peer] = _PeerState(deque(maxlen=self.s.window),
                                                deque(maxlen=self.s.recent),
                                                deque(maxlen=self.s.window))
        return st

    def degraded(self, peer: str) -> dict[str, bool]:
        return dict(self._state(peer).degraded)

    def baseline(self, peer: str) -> dict[str, float | None]:
        st = self._state(peer)
        return {"rtt_p50_ms": _sorted_median(st.sorted_ms["rtt_p50_ms"]),
                "rtt_p99_ms": _sorted_median(st.sorted_ms["rtt_p99_ms"]),
                "loss_ratio": st.lost / st.sent if st.sent else None,
                "bits_per_second": _median(st.tput), "sessions": len(st.history)}

    def observe_probe(self, row: ProbeRow) -> list[Transition]:
        """Add one session summary (error rows are skipped: errors are counted elsewhere)."""
        if row.error or not row.sent:
            return []
        st = self._state(row.peer)
        if len(st.recent) == st.recent.maxlen and not any(st.degraded.values()):
            st.add_history(st.recent[0])
        st.recent.append(row)
        if len(st.history) < self.s.min_samples or len(st.recent) < self.s.recent:
            return []
        events = [self._rtt(row.peer, st, "rtt_p50", "rtt_p50_ms"),
                  self._rtt(row.peer, st, "rtt_p99", "rtt_p99_ms"),
                  self._loss(row.peer, st)]
        return [e for e in events if e is not None]

    def observe_throughput(self, peer: str, bits_per_second: float) -> list[Transition]:
        st = self._state(peer)
        events: list[Transition] = []
        base = _median(st.tput)
        if base and len(st.tput) >= max(2, self.s.min_samples // 5):
            drop = (base - bits_per_second) / base
            thr = self.s.throughput_drop_ratio
            ev = self._hysteresis(peer, st, "throughput", drop, thr, base, bits_per_second,
                                  "bit/s", lambda: {"tests_in_baseline": len(st.tput)})
            if ev:
                events.append(ev)
        if not st.degraded.get("throughput"):
            st.tput.append(bits_per_second)
        return events

    def _rtt(self, peer: str, st: _PeerState, metric: str, attr: str) -> Transition | None:
        base = _sorted_median(st.sorted_ms[attr])
        cur = _median(getattr(r, attr) for r in st.recent)
        if base is None or cur is None:
            return None
        thr_ms = max(base * self.s.rtt_increase_ratio, self.s.rtt_increase_min_ms)
        # excess normalised so that 1.0 == threshold, for both enter and clear
        excess = (cur - base) / thr_ms
        return self._hysteresis(peer, st, metric, excess, 1.0, base, cur, "ms",
                                lambda: {"threshold_ms": round(thr_ms, 3),
                                         "recent_sessions": len(st.recent),
                                         "baseline_sessions": len(st.history)})

    def _loss(self, peer: str, st: _PeerState) -> Transition | None:
        b_lost, b_sent = st.lost, st.sent
        base = b_lost / b_sent if b_sent else None
        r_lost, r_sent, cur = _pooled_loss(st.recent)
        if base is None or cur is None:
            return None
        lo, hi = wilson_interval(r_lost, r_sent)
        thr = self.s.loss_increase
        # enter on the CI's lower bound (significant), clear on the point estimate
        excess = (lo if not st.degraded.get("loss") else cur) - base

        def evidence() -> dict:  # only built when the state changes
            directions = {
                "forward_ratio": _mean(r.loss_forward_ratio for r in st.recent),
                "reverse_ratio": _mean(r.loss_reverse_ratio for r in st.recent),
                "baseline_forward_ratio": _mean(r.loss_forward_ratio for r in st.history),
                "baseline_reverse_ratio": _mean(r.loss_reverse_ratio for r in st.history),
            }
            return {"recent_sent": r_sent, "recent_lost": r_lost,
                    "recent_ci95": [round(lo, 6), round(hi, 6)],
                    "baseline_sent": b_sent, "baseline_lost": b_lost,
                    **{k: round(v, 6) for k, v in directions.items() if v is not None}}

        return self._hysteresis(peer, st, "loss", excess, thr, base, cur, "ratio", evidence)

    def _hysteresis(self, peer: str, st: _PeerState, metric: str, excess: float, thr: float,
                    base: float, cur: float, unit: str,
                    evidence: Callable[[], dict]) -> Transition | None:
        was = st.degraded.get(metric, False)
        if not was and excess > thr:
            st.degraded[metric] = True
            return Transition(peer, metric, "degraded", base, cur, thr, unit, evidence())
        if was and excess < thr * self.s.clear_fraction:
            st.degraded[metric] = False
            return Transition(peer, metric, "recovered", base, cur, thr, unit, evidence())
        return None


def _sorted_median(values: list[float]) -> float | None:
    """statistics.median of an already sorted list, without copying or sorting it."""
    n = len(values)
    if not n:
        return None
    mid = n // 2
    return values[mid] if n % 2 else (values[mid - 1] + values[mid]) / 2


def _median(values) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _mean(values) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def _pooled_loss(rows) -> tuple[int, int, float | None]:
    sent = sum(r.sent or 0 for r in rows if r.received is not None)
    lost = sum((r.sent or 0) - r.received for r in rows if r.received is not None)
    return lost, sent, (lost / sent if sent else None)
