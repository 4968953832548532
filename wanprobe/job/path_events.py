"""Path events from a peer's probe sessions, as a slow step's evidence (pure; no I/O).

Each session is judged against the median of the ``REFERENCE`` clean sessions before it (a
session with an event does not enter the reference, so a long event is not learnt as normal):

* ``loss burst``: at least ``MIN_LOST`` probes lost and a loss ratio of at least
  ``LOSS_RATIO`` and ``LOSS_FACTOR`` × the reference's; the direction from STAMP's per-direction
  counts (RFC 8762), the ratio with its Wilson 95 % interval and sample size;
* ``reroute``: the RTT floor (the session's minimum) moved by more than the step threshold
  (``STEP_MS`` or ``STEP_RATIO`` of the reference floor): propagation changed, which only a
  route change does;
* ``queue``: the floor steady and the queueing a probe meets (p50 − min) grown by more than the
  step threshold.

An event covers its session: from its start (``ts``) to the next session's start, at most
``span_s`` (the probe interval). Fewer than ``MIN_REFERENCE`` clean sessions before: no judgement.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from wanprobe.probe.stats import wilson_interval

REFERENCE, MIN_REFERENCE = 20, 5
MIN_LOST, LOSS_RATIO, LOSS_FACTOR = 2, 0.01, 5.0
STEP_MS, STEP_RATIO = 2.0, 0.10


@dataclass(frozen=True)
class Session:
    """One probe session toward ``peer`` (the daemon's history row): start, probes sent, lost
    per direction (None: not known), RTT min and p50 in ms."""

    ts: float
    peer: str
    sent: int | None
    lost_forward: int | None
    lost_reverse: int | None
    rtt_min_ms: float | None
    rtt_p50_ms: float | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def sessions_of(rows: Iterable[Any], until: float = math.inf) -> list[Session]:
    """The sessions of the daemon's history rows (``history.store.ProbeRow``, read by their
    fields) that started by ``until``; a row with an error (no answer) is not a session."""
    return [Session(r.ts, r.peer, r.sent, r.loss_forward_lost, r.loss_reverse_lost,
                    r.rtt_min_ms, r.rtt_p50_ms) for r in rows if r.error is None and r.ts <= until]


def probe_interval_s(sessions: Iterable[Session], default_s: float = 10.0) -> float:
    """How long a session stands for: the median gap between one peer's sessions
    (``default_s``, the daemon's default probe interval, without two)."""
    by_peer: dict[str, list[float]] = {}
    for s in sessions:
        by_peer.setdefault(s.peer, []).append(s.ts)
    gaps = [b - a for ts in by_peer.values() for a, b in itertools.pairwise(sorted(ts)) if b > a]
    return statistics.median(gaps) if gaps else default_s


@dataclass(frozen=True)
class PathEvent:
    """What happened on the path to ``peer`` between ``start`` and ``end``."""

    kind: str            # "loss burst" | "reroute" | "queue"
    peer: str
    start: float
    end: float
    cause: str           # one line with the figures
    evidence: dict[str, Any] = field(default_factory=dict)


def _loss(s: Session) -> tuple[int, int] | None:
    if s.sent is None or s.sent <= 0 or s.lost_forward is None:
        return None
    return s.lost_forward + (s.lost_reverse or 0), s.sent


def _ratio(counts: tuple[int, int] | None) -> float | None:
    return None if counts is None else counts[0] / counts[1]


def _judge(s: Session, ref: Sequence[Session]) -> tuple[str, str, dict[str, Any]] | None:
    """The event of ``s`` against the reference sessions, or None."""
    counts = _loss(s)
    ref_loss = [r for r in (_ratio(_loss(x)) for x in ref) if r is not None]
    base_loss = statistics.median(ref_loss) if ref_loss else 0.0
    if counts and counts[0] >= MIN_LOST and counts[0] / counts[1] >= max(LOSS_RATIO,
                                                                         LOSS_FACTOR * base_loss):
        lo, hi = wilson_interval(counts[0], counts[1])
        way = ("forward" if not s.lost_reverse else "both" if s.lost_forward else "reverse")
        return "loss burst", (f"{counts[0]} of {counts[1]} probes lost ({counts[0] / counts[1]:.1%}, "
                              f"95 % CI {lo:.1%}-{hi:.1%}; {way}) against {base_loss:.2%} before"), {
            "lost": counts[0], "sent": counts[1], "ratio": counts[0] / counts[1],
            "ci95": [lo, hi], "direction": way, "reference_ratio": base_loss}
    floors = [x.rtt_min_ms for x in ref if x.rtt_min_ms is not None]
    spreads = [x.rtt_p50_ms - x.rtt_min_ms for x in ref
               if x.rtt_p50_ms is not None and x.rtt_min_ms is not None]
    if s.rtt_min_ms is None or not floors:
        return None
    floor = statistics.median(floors)
    step = max(STEP_MS, STEP_RATIO * floor)
    if abs(s.rtt_min_ms - floor) > step:
        return "reroute", (f"RTT floor {s.rtt_min_ms:.1f} ms against {floor:.1f} ms before "
                           f"({s.rtt_min_ms - floor:+.1f} ms: propagation changed)"), {
            "rtt_min_ms": s.rtt_min_ms, "reference_rtt_min_ms": floor}
    if s.rtt_p50_ms is not None and spreads:
        spread, base = s.rtt_p50_ms - s.rtt_min_ms, statistics.median(spreads)
        if spread - base > step:
            return "queue", (f"queueing {spread:.1f} ms (p50 − min) against {base:.1f} ms "
                             f"before, floor steady at {s.rtt_min_ms:.1f} ms"), {
                "queueing_ms": spread, "reference_queueing_ms": base, "rtt_min_ms": s.rtt_min_ms}
    return None


def path_events(sessions: Iterable[Session], span_s: float) -> list[PathEvent]:
    """Every event in ``sessions`` (any peers, any order), by start."""
    by_peer: dict[str, list[Session]] = {}
    for s in sessions:
        by_peer.setdefault(s.peer, []).append(s)
    out = []
    for peer, rows in by_peer.items():
        rows.sort(key=lambda s: s.ts)
        clean: list[Session] = []
        for i, s in enumerate(rows):
            nxt = rows[i + 1].ts if i + 1 < len(rows) else s.ts + span_s
            got = _judge(s, clean[-REFERENCE:]) if len(clean) >= MIN_REFERENCE else None
            if got is None:
                clean.append(s)
                continue
            kind, cause, evidence = got
            out.append(PathEvent(kind, peer, s.ts, min(nxt, s.ts + span_s), cause,
                                 {"session_start": s.ts, **evidence}))
    return sorted(out, key=lambda e: (e.start, e.peer))
