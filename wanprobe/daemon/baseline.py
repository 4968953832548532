"""Per-peer rolling baselines and regression detection with hysteresis (pure; no I/O).

For each peer the last ``recent`` probe sessions are compared with the ``window`` sessions before
them: median of the per-session p50 and p99 RTT, and pooled loss (lost / sent). Throughput tests
are compared one by one with the median of earlier tests. A metric *enters* the degraded state
when its excess passes the threshold and *clears* only when the excess falls below
``clear_fraction`` of it, so a value hovering at the threshold does not flap. While a peer is
degraded its baseline is frozen, so the regression is not learnt as the new normal. The two
windows per peer are ``diagnose/rolling.py``'s, shared with the path watch.

Loss is pooled over the last ``loss_window`` sessions (hundreds of probes, not the five sessions
of the RTT metrics) against a baseline of up to twice as many sessions that have left that window
(issue 36). It enters when the window is above the baseline by the threshold *and* the difference
is significant (a pooled two-proportion z-test at LOSS_Z), and clears when the window is back
within ``clear_fraction`` of the threshold and no longer distinguishable (z <= 1). A steady 3 %
that a 5-session point estimate read as 0 % every few minutes no longer fires and clears.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from wanprobe.daemon.config import BaselineSettings
from wanprobe.diagnose.rolling import PerPeer, Windows, median_known
from wanprobe.history.store import ProbeRow
from wanprobe.probe.stats import wilson_interval  # the one copy (exact z, exact 0/1 ends)

# the loss regression's significance: a z-test after every session is many tests; at 3.5 a path
# that always loses 3 % (30 sessions of 10 against 60) fires in none of 50 simulated 400-session
# runs (tests/test_daemon_store.py)
LOSS_Z = 4.0
# ... and the baseline does not learn a session while the window is this far above it, so a step
# that is not yet significant is not half-learnt before it is (Page's CUSUM-free version of
# "don't train on the anomaly")
LOSS_Z_LEARN = 2.0


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
    rows: Windows[ProbeRow]   # the baseline ProbeRows (history) and the last `recent` ones
    tput: deque               # baseline bits_per_second
    degraded: dict[str, bool] = field(default_factory=dict)
    # the history's aggregates, kept up to date as rows enter and leave it, so a session costs
    # O(log window) instead of re-sorting the window (bench/daemon_footprint.py at 1,000 peers)
    sorted_ms: dict[str, list[float]] = field(
        default_factory=lambda: {"rtt_p50_ms": [], "rtt_p99_ms": []})
    # the last loss_window sessions' (lost, sent) and their sums, for the loss regression, and
    # the loss baseline: up to ``window`` sessions that have left that window. The baseline
    # learns a session only once it is out of the window being judged, so a new loss is not
    # half-learnt (and so never significant) by the time the window has the samples to see it
    loss_recent: deque = field(default_factory=deque)
    recent_lost: int = 0
    recent_sent: int = 0
    loss_base: deque = field(default_factory=deque)
    base_lost: int = 0
    base_sent: int = 0
    loss_z: float = 0.0   # the last session's z of the window over the baseline

    def add_loss(self, row: ProbeRow, keep: int, base_keep: int, learn: bool) -> None:
        if row.received is None or not row.sent:
            return
        self.loss_recent.append((row.sent - row.received, row.sent))
        self.recent_lost += row.sent - row.received
        self.recent_sent += row.sent
        while len(self.loss_recent) > keep:
            lost, sent = self.loss_recent.popleft()
            self.recent_lost -= lost
            self.recent_sent -= sent
            if not learn:  # degraded: the baseline is frozen
                continue
            self.loss_base.append((lost, sent))
            self.base_lost += lost
            self.base_sent += sent
            if len(self.loss_base) > base_keep:
                lost, sent = self.loss_base.popleft()
                self.base_lost -= lost
                self.base_sent -= sent

    def add_row(self, row: ProbeRow, learn: bool) -> None:
        """Add ``row`` to the recent window; the row it pushes into the baseline (when
        ``learn``) and the one that leaves the baseline update its sorted aggregates."""
        entered, left = self.rows.push(row, learn=learn)
        if left is not None:
            self._account(left, -1)
        if entered is not None:
            self._account(entered, +1)

    def _account(self, row: ProbeRow, sign: int) -> None:
        for attr, values in self.sorted_ms.items():
            v = getattr(row, attr)
            if v is None:
                continue
            if sign > 0:
                bisect.insort(values, v)
            else:
                del values[bisect.bisect_left(values, v)]


class BaselineTracker:
    """Feed probe rows and throughput results; get :class:`Transition` events back."""

    def __init__(self, settings: BaselineSettings) -> None:
        self.s = settings
        # made with the settings of the day (a reload changes them for new peers only)
        self._peers: PerPeer[_PeerState] = PerPeer(lambda: _PeerState(
            Windows(self.s.window, self.s.recent), deque(maxlen=self.s.window)))

    def _state(self, peer: str) -> _PeerState:
        return self._peers[peer]

    def degraded(self, peer: str) -> dict[str, bool]:
        return dict(self._state(peer).degraded)

    def baseline(self, peer: str) -> dict[str, float | None]:
        st = self._state(peer)
        return {"rtt_p50_ms": _sorted_median(st.sorted_ms["rtt_p50_ms"]),
                "rtt_p99_ms": _sorted_median(st.sorted_ms["rtt_p99_ms"]),
                "loss_ratio": st.base_lost / st.base_sent if st.base_sent else None,
                "bits_per_second": median_known(st.tput), "sessions": len(st.rows.history)}

    def observe_probe(self, row: ProbeRow) -> list[Transition]:
        """Add one session summary (error rows are skipped: errors are counted elsewhere)."""
        if row.error or not row.sent:
            return []
        st = self._state(row.peer)
        st.add_row(row, learn=not any(st.degraded.values()))
        st.add_loss(row, max(self.s.loss_window, self.s.recent), 2 * self.s.loss_window,
                    learn=not any(st.degraded.values()) and st.loss_z < LOSS_Z_LEARN)
        if not st.rows.ready(self.s.min_samples, self.s.recent):
            return []
        events = [self._rtt(row.peer, st, "rtt_p50", "rtt_p50_ms"),
                  self._rtt(row.peer, st, "rtt_p99", "rtt_p99_ms"),
                  self._loss(row.peer, st)]
        return [e for e in events if e is not None]

    def observe_throughput(self, peer: str, bits_per_second: float) -> list[Transition]:
        st = self._state(peer)
        events: list[Transition] = []
        base = median_known(st.tput)
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
        cur = median_known(getattr(r, attr) for r in st.rows.recent)
        if base is None or cur is None:
            return None
        thr_ms = max(base * self.s.rtt_increase_ratio, self.s.rtt_increase_min_ms)
        # excess normalised so that 1.0 == threshold, for both enter and clear
        excess = (cur - base) / thr_ms
        return self._hysteresis(peer, st, metric, excess, 1.0, base, cur, "ms",
                                lambda: {"threshold_ms": round(thr_ms, 3),
                                         "recent_sessions": len(st.rows.recent),
                                         "baseline_sessions": len(st.rows.history)})

    def _loss(self, peer: str, st: _PeerState) -> Transition | None:
        b_lost, b_sent = st.base_lost, st.base_sent
        base = b_lost / b_sent if b_sent else None
        r_lost, r_sent = st.recent_lost, st.recent_sent
        cur = r_lost / r_sent if r_sent else None
        # a baseline of fewer sessions than the window it judges is itself noise (a first
        # session of ten clean probes is "0 %" against a path that always lost 3 %)
        if base is None or cur is None or len(st.loss_base) < self.s.loss_window:
            return None
        lo, hi = wilson_interval(r_lost, r_sent)
        thr = self.s.loss_increase
        # enter when the window is above the baseline by the threshold *and* the two samples
        # differ significantly (a two-proportion z-test, pooled, at LOSS_Z: the test runs after
        # every session, so it asks for more than 95 %); clear when the window is back within
        # clear_fraction of the threshold. The baseline is a sample too: a path that always
        # lost 3 % reads 1 % in one window and 5 % in another
        excess = cur - base
        st.loss_z = _z_two_proportions(r_lost, r_sent, b_lost, b_sent)
        if not st.degraded.get("loss") and st.loss_z < LOSS_Z:
            excess = 0.0   # not significant: not a regression, however large it reads
        elif st.degraded.get("loss") and st.loss_z > 1.0:
            excess = max(excess, thr)   # still distinguishable from the baseline: not back
        def evidence() -> dict:  # only built when the state changes
            recent, history = st.rows.recent, st.rows.history
            directions = {
                "forward_ratio": _mean(r.loss_forward_ratio for r in recent),
                "reverse_ratio": _mean(r.loss_reverse_ratio for r in recent),
                "baseline_forward_ratio": _mean(r.loss_forward_ratio for r in history),
                "baseline_reverse_ratio": _mean(r.loss_reverse_ratio for r in history),
            }
            return {"recent_sent": r_sent, "recent_lost": r_lost,
                    "recent_sessions": len(st.loss_recent),
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


def _z_two_proportions(lost_a: int, of_a: int, lost_b: int, of_b: int) -> float:
    """The pooled two-proportion z statistic of a's loss over b's (0 when it cannot be told)."""
    pooled = (lost_a + lost_b) / (of_a + of_b)
    se = math.sqrt(pooled * (1 - pooled) * (1 / of_a + 1 / of_b))
    return (lost_a / of_a - lost_b / of_b) / se if se > 0 else 0.0


def _mean(values) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None
