"""Loss over a sliding window of probe sessions, per direction, with its sample and interval
(issue 36).

One daemon session of ten probes can say nothing below 10 %: a steady 3 % loss shows as 0 % in
three sessions of four. Summing the sessions' own counts (lost and sent, per direction, as each
STAMP session split them, probe/loss_split.py) over a window of time gives the loss an interval
that narrows with the probes behind it: 30 sessions of 10 probes at 3 % give about 9 of 300, 95 %
interval 1.6-5.6 % (Wilson, probe/stats.py). The daemon keeps a short window (the peer table, the
regression detector) and a long one (the page's matrix and the history bands).

Pure, O(1) per session and per question, and bounded in memory: each window keeps BUCKETS time
buckets of summed counts and their running sums.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from wanprobe.probe.stats import wilson_interval

DIRECTIONS = ("forward", "reverse", "round_trip")


@dataclass(frozen=True)
class WindowLoss:
    """``lost`` of ``of`` probes in one direction over ``sessions`` sessions of the window."""

    direction: str
    lost: int
    of: int
    sessions: int
    window_s: float

    @property
    def ratio(self) -> float | None:
        return self.lost / self.of if self.of else None

    @property
    def ci95(self) -> tuple[float, float]:
        return wilson_interval(self.lost, self.of)

    def to_json(self) -> dict[str, Any]:
        lo, hi = self.ci95
        return {"direction": self.direction, "lost": self.lost, "sent": self.of,
                "ratio": self.ratio, "ci95": [round(lo, 6), round(hi, 6)],
                "sessions": self.sessions, "window_s": self.window_s}


def session_counts(doc: Mapping[str, Any] | None) -> dict[str, tuple[int, int]]:
    """(lost, of) per direction from a ProbeResult ``to_json()``: forward and reverse as the
    reflector split them, the round trip as the path's (the reflector's own drops left out)."""
    loss = (doc or {}).get("loss") if isinstance(doc, Mapping) else None
    if not isinstance(loss, Mapping):
        return {}
    out = {}
    for direction, lost_key, of_key in (("forward", "forward_lost", "forward_of"),
                                        ("reverse", "reverse_lost", "reverse_of")):
        lost, of = loss.get(lost_key), loss.get(of_key)
        if _count(lost) and _count(of) and lost <= of:
            out[direction] = (lost, of)
    of, received = loss.get("path_sent", loss.get("sent")), loss.get("received")
    if _count(of) and _count(received) and received <= of:
        out["round_trip"] = (of - received, of)
    return out


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


BUCKETS = 30      # each window is kept as this many time buckets of counts (bounded memory)


class LossWindow:
    """One peer's loss over each of ``windows`` (seconds), kept as BUCKETS time buckets of
    summed counts per window with running sums: a session is added, old buckets expired and a
    window's loss read in O(1), in memory bounded per peer whatever the probe rate (a window
    ends on a bucket's boundary: up to 1/BUCKETS of it older than asked)."""

    def __init__(self, windows: tuple[float, ...]) -> None:
        self.windows = tuple(windows)
        self._buckets: dict[float, deque] = {w: deque() for w in self.windows}
        self._sums = {w: {d: [0, 0, 0] for d in DIRECTIONS} for w in self.windows}

    def add(self, ts: float, doc: Mapping[str, Any] | None) -> None:
        counts = session_counts(doc)
        for w in self.windows:
            if counts:
                size = w / BUCKETS
                start = ts - ts % size
                q = self._buckets[w]
                if not q or q[-1][0] != start:
                    q.append((start, {d: [0, 0, 0] for d in DIRECTIONS}))
                for d, (lost, of) in counts.items():
                    for acc in (q[-1][1][d], self._sums[w][d]):
                        acc[0], acc[1], acc[2] = acc[0] + lost, acc[1] + of, acc[2] + 1
            self._expire(w, ts)

    def _expire(self, w: float, now: float) -> None:
        q, sums, size = self._buckets[w], self._sums[w], w / BUCKETS
        while q and q[0][0] + size <= now - w:
            _start, counts = q.popleft()
            for d, (lost, of, n) in counts.items():
                acc = sums[d]
                acc[0], acc[1], acc[2] = acc[0] - lost, acc[1] - of, acc[2] - n

    def loss(self, direction: str, window_s: float, now: float) -> WindowLoss:
        """The sum over the last ``window_s`` (one of ``windows``) seconds before ``now``."""
        self._expire(window_s, now)
        lost, of, n = self._sums[window_s][direction]
        return WindowLoss(direction, lost, of, n, window_s)

    def all(self, window_s: float, now: float) -> dict[str, WindowLoss]:
        return {d: self.loss(d, window_s, now) for d in DIRECTIONS}


class PeerLossWindows:
    """Every peer's :class:`LossWindow` over the same two windows (short, long)."""

    def __init__(self, short_s: float, long_s: float) -> None:
        self.spans = (short_s, long_s)
        self._peers: dict[str, LossWindow] = {}

    def add(self, peer: str, ts: float, doc: Mapping[str, Any] | None) -> None:
        window = self._peers.get(peer)
        if window is None:
            window = self._peers[peer] = LossWindow(self.spans)
        window.add(ts, doc)

    def loss(self, peer: str, which: str, now: float) -> dict[str, WindowLoss] | None:
        """``which`` ("short" or "long") window of ``peer`` per direction; None before any."""
        window = self._peers.get(peer)
        return None if window is None else window.all(self.spans[which == "long"], now)

    def forget(self, peer: str) -> None:
        self._peers.pop(peer, None)

    def retune(self, short_s: float, long_s: float) -> None:
        """New window lengths (a reload): every window starts afresh."""
        if (short_s, long_s) != self.spans:
            self.spans = (short_s, long_s)
            self._peers.clear()
