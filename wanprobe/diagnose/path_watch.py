"""Reroute vs queueing, per peer, from each probe session's min and p99 RTT (pure; no I/O).

The RTT *floor* is the minimum RTT over a window of sessions: propagation plus fixed per-hop
costs, which only a route change moves. The *spread* is a session's p99 − min, the median over
the window: the queueing a probe meets on the way. The two answer different questions (issue
16; perfsonar/project#1148 asks to tie latency changes to route changes):

- ``rerouted``: every one of the last ``recent`` sessions has its minimum beyond the reference
  floor by more than the step threshold, in the same direction, and within the step threshold
  of each other (the step *holds*), while the spread stays within its threshold of the
  reference spread. One event per step: the reference
  is then re-learnt from the new sessions.
- ``queueing``: the floor is steady (within the step threshold) and the spread has risen by more
  than its threshold (judged once the reference holds ``queueing_history`` sessions). While queueing, the reference is frozen so the queue is not learnt as
  normal; ``queueing_cleared`` when the spread is back under half the threshold.

The reference is the ``window`` sessions before the last ``recent`` (``rolling.Windows``, as
the daemon's baseline.py keeps them).

Which direction queues: STAMP sessions also give each direction's one-way delay spread (p99 −
min of T2 − T1 and of T4 − T3, probe/owd.py). A clock offset between the ends shifts every
one-way delay of a direction by the same amount, so the spread needs no clock synchronisation
(RFC 5481 §4.2, PDV). A ``queueing`` event names the direction(s) whose median spread rose by
more than half the RTT spread threshold: ``forward`` (toward the peer), ``reverse`` (back from
it), ``both``, or None when the sessions carry no one-way delays (ICMP, TCP).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypedDict

from wanprobe.diagnose.rolling import PerPeer, Windows, median_known


@dataclass(frozen=True)
class Threshold:
    """A change that counts: larger than ``min_ms`` and than ``ratio`` of the reference."""

    min_ms: float
    ratio: float

    def of(self, reference_ms: float) -> float:
        return max(self.min_ms, self.ratio * reference_ms)


@dataclass(frozen=True)
class PathWatchSettings:
    """Window sizes in sessions and the two thresholds (module docstring)."""

    window: int = 20
    recent: int = 5
    min_history: int = 5
    floor_step: Threshold = Threshold(min_ms=2.0, ratio=0.1)    # of the reference floor
    # of the reference spread (tripled), and at least 5 ms: a busy host's own scheduling moves
    # the median p99 - min by a few ms (a CI run saw 0.25 -> 2.7 ms with no queue on the path),
    # while a queue that matters to a training step over a WAN is tens of ms
    spread_rise: Threshold = Threshold(min_ms=5.0, ratio=2.0)
    queueing_history: int = 10          # reference sessions needed to call queueing


@dataclass(frozen=True)
class PathEvent:
    """A change of a peer's path: ``rerouted``, ``queueing`` or ``queueing_cleared``."""

    peer: str
    event: str
    old_floor_ms: float
    new_floor_ms: float
    old_spread_ms: float
    new_spread_ms: float
    floor_threshold_ms: float
    spread_threshold_ms: float
    sessions: int
    direction: str | None = None          # queueing: forward, reverse, both (None: unknown)
    old_forward_spread_ms: float | None = None
    new_forward_spread_ms: float | None = None
    old_reverse_spread_ms: float | None = None
    new_reverse_spread_ms: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


# One session, in ms: (RTT min, RTT spread p99 − min, forward and reverse one-way spread).
_Session = tuple[float, float, float | None, float | None]


class _Direction(TypedDict):
    """The queueing direction and the one-way spreads it was judged on (:func:`_direction`)."""

    direction: str | None
    old_forward_spread_ms: float
    new_forward_spread_ms: float
    old_reverse_spread_ms: float
    new_reverse_spread_ms: float


@dataclass
class _Peer:
    sessions: Windows[_Session]
    queueing: bool = False   # the reference is frozen while the path queues
    floor_ms: float | None = None
    spread_ms: float | None = None


class PathWatch:
    """Feed (min, p99) per session; get :class:`PathEvent` back. See the module docstring."""

    def __init__(self, settings: PathWatchSettings | None = None) -> None:
        self.s = settings or PathWatchSettings()
        self._peers: PerPeer[_Peer] = PerPeer(
            lambda: _Peer(Windows(self.s.window, self.s.recent)))

    def current(self, peer: str) -> tuple[float | None, float | None]:
        """(floor, spread) in ms over the last ``recent`` sessions, for the gauges."""
        st = self._peers.get(peer)
        return (st.floor_ms, st.spread_ms) if st else (None, None)

    def forget(self, peer: str) -> None:
        self._peers.forget(peer)

    def observe(self, peer: str, min_ms: float | None, p99_ms: float | None, *,
                forward_spread_ms: float | None = None,
                reverse_spread_ms: float | None = None) -> list[PathEvent]:
        """Add one session's RTT min and p99 (ms), and when known each direction's one-way
        delay spread (p99 − min, ms); sessions without replies are skipped."""
        if min_ms is None or p99_ms is None:
            return []
        st = self._peers[peer]
        w = st.sessions
        w.push((float(min_ms), max(0.0, float(p99_ms) - float(min_ms)), forward_spread_ms,
                reverse_spread_ms), learn=not st.queueing)
        st.floor_ms = min(r[0] for r in w.recent)
        st.spread_ms = statistics.median(r[1] for r in w.recent)
        if not w.ready(self.s.min_history, self.s.recent):
            return []
        return self._judge(peer, st)

    def _judge(self, peer: str, st: _Peer) -> list[PathEvent]:
        s, w = self.s, st.sessions
        ref_floor = min(r[0] for r in w.history)
        ref_spread = statistics.median(r[1] for r in w.history)
        step = s.floor_step.of(ref_floor)
        rise = s.spread_rise.of(ref_spread)
        cur_floor, cur_spread = st.floor_ms, st.spread_ms
        if cur_floor is None or cur_spread is None:  # never: observe() sets both first
            return []

        def event(name: str) -> PathEvent:
            return PathEvent(peer, name, ref_floor, cur_floor, ref_spread, cur_spread, step, rise,
                             len(w.recent))

        mins = [r[0] for r in w.recent]
        # held: every recent session is off the old floor on the same side and they agree on
        # the new one (a session that straddles the change, with packets that went out on the
        # old route and came back on the new, sits in between and must leave the window first)
        held = (all(m > ref_floor + step for m in mins) or all(m < ref_floor - step for m in mins)) \
            and max(mins) - min(mins) <= step
        if held and cur_spread <= ref_spread + rise:
            ev = event("rerouted")
            w.restart()   # the new path is the new reference
            st.queueing = False
            return [ev]
        steady = abs(cur_floor - ref_floor) <= step
        # a spread is noisier than a floor: judge it against a full reference only (not the 5
        # sessions a reroute left), so a busy moment on the new path is not called a queue
        if not st.queueing and steady and cur_spread > ref_spread + rise \
                and len(w.history) >= s.queueing_history:
            st.queueing = True
            direction = _direction(st, rise / 2)
            queueing = event("queueing")
            return [replace(queueing, **direction) if direction is not None else queueing]
        if st.queueing and cur_spread < ref_spread + rise / 2:
            st.queueing = False
            return [event("queueing_cleared")]
        return []


def _median_of(rows: Sequence[_Session], i: int) -> float | None:
    """The median of column ``i`` where most rows know it, else None."""
    vals = [v for v in (r[i] for r in rows) if v is not None]
    return median_known(vals) if len(vals) * 2 > len(rows) else None


def _direction(st: _Peer, threshold_ms: float) -> _Direction | None:
    """Which direction's one-way spread rose by more than ``threshold_ms`` (module docstring),
    with the spreads it compared; None when the sessions carry no one-way delays."""
    old, new = st.sessions.history, st.sessions.recent
    f_old, f_new = _median_of(old, 2), _median_of(new, 2)
    r_old, r_new = _median_of(old, 3), _median_of(new, 3)
    if f_old is None or f_new is None or r_old is None or r_new is None:
        return None
    grew = (f_new - f_old > threshold_ms, r_new - r_old > threshold_ms)
    direction = {(True, False): "forward", (False, True): "reverse", (True, True): "both"}.get(grew)
    return {"direction": direction, "old_forward_spread_ms": f_old,
            "new_forward_spread_ms": f_new, "old_reverse_spread_ms": r_old,
            "new_reverse_spread_ms": r_new}


def one_way_spreads(doc: Mapping[str, Any]) -> tuple[float | None, float | None]:
    """(forward, reverse) one-way delay spread (p99 − min, ms) of a probe document
    (``owd_ms.variation``, offset-free), or Nones."""
    var = ((doc.get("owd_ms") or {}).get("variation") or {})
    return ((var.get("forward") or {}).get("p99"), (var.get("reverse") or {}).get("p99"))
