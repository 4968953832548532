"""Why a step was slow: the job's own step times joined with path and host events (pure).

A step is slow when it took more than ``SLOW_FACTOR`` × the running baseline: the median of the
``WINDOW`` steps before it that were not slow themselves (a stretch of slow steps is not learnt
as normal; the first ``MIN_BASELINE`` steps only build it). Each slow step gets one attribution,
with the evidence behind it:

1. ``host`` — a straggler: one rank's compute (its step less its timed communication) grew by
   at least ``SHARE`` of the step's excess over its own running median, while the others waited
   in their collective: that rank's host was busy (CPU contention, steal, a slow device).
   Host events (e.g. CPU steal intervals) overlapping the step are named with it.
2. ``path`` — the step's excess was in communication (when timed; any step when not) and a
   path event (``path_events``: loss burst, reroute, queue) overlapped the step: the event with
   the largest overlap, its edge and figures.
3. ``unexplained`` — neither: a slow step with no event is never blamed on the path.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from wanprobe.job.path_events import PathEvent
from wanprobe.job.steps import Step, StepLog

WINDOW, MIN_BASELINE = 20, 5
SLOW_FACTOR = 1.3
SHARE = 0.5


@dataclass(frozen=True)
class HostEvent:
    """Something that happened on a host between ``start`` and ``end`` (e.g. CPU steal)."""

    host: str
    start: float
    end: float
    cause: str
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SlowStep:
    step: int
    start: float
    end: float
    duration_s: float
    baseline_s: float
    attribution: str          # "path" | "host" | "unexplained"
    cause: str
    evidence: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Explanation:
    steps: int
    slow_steps: tuple[SlowStep, ...]
    events: int
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        counts = {k: sum(1 for s in self.slow_steps if s.attribution == k)
                  for k in ("path", "host", "unexplained")}
        return {"steps": self.steps, "slow": len(self.slow_steps), "by_attribution": counts,
                "path_events": self.events, "notes": list(self.notes),
                "method": {"window_steps": WINDOW, "slow_factor": SLOW_FACTOR,
                           "straggler_share": SHARE},
                "slow_steps": [s.to_json() for s in self.slow_steps]}


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if len(values) >= MIN_BASELINE else None


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


class _Baselines:
    """Running medians over the last WINDOW normal steps: the step, and each rank's compute."""

    def __init__(self) -> None:
        self.steps: list[float] = []
        self.compute: dict[int, list[float]] = {}

    def step(self) -> float | None:
        return _median(self.steps[-WINDOW:])

    def rank(self, r: int) -> float | None:
        return _median(self.compute.get(r, [])[-WINDOW:])

    def learn(self, s: Step) -> None:
        self.steps.append(s.duration_s)
        for ln in s.ranks:
            c = s.compute_s(ln)
            if c is not None:
                self.compute.setdefault(ln.rank, []).append(c)


def _straggler(s: Step, base: _Baselines, excess: float) -> tuple[str, dict[str, Any]] | None:
    worst: tuple[float, int, float, float] | None = None
    for ln in s.ranks:
        c, b = s.compute_s(ln), base.rank(ln.rank)
        if c is None or b is None:
            continue
        if worst is None or c - b > worst[0]:
            worst = (c - b, ln.rank, c, b)
    if worst is None or worst[0] < SHARE * excess:
        return None
    grew, rank, c, b = worst
    waits = {ln.rank: ln.comm_s for ln in s.ranks if ln.rank != rank}
    return (f"rank {rank} computed {c:.3f} s against {b:.3f} s usually (+{grew:.3f} s of the "
            f"step's +{excess:.3f} s) while the others waited in the collective: a straggler, "
            "its host busy or slow"), {"rank": rank, "compute_s": c, "baseline_compute_s": b,
                                       "others_comm_s": waits}


def _in_comm(s: Step, base: _Baselines, excess: float) -> bool:
    """Whether the step's excess was spent communicating (True when comm is not timed)."""
    timed = [ln for ln in s.ranks if ln.comm_s is not None]
    if not timed:
        return True
    grew = max((s.compute_s(ln) or 0.0) - (base.rank(ln.rank) or 0.0) for ln in timed)
    return grew < SHARE * excess


def _path(s: Step, events: Sequence[PathEvent]) -> PathEvent | None:
    best = max(events, key=lambda e: _overlap(s.start, s.end, e.start, e.end), default=None)
    if best is None or _overlap(s.start, s.end, best.start, best.end) <= 0:
        return None
    return best


def _slow(s: Step, baseline: float, base: _Baselines, events: Sequence[PathEvent],
          host_events: Sequence[HostEvent]) -> SlowStep:
    excess = s.duration_s - baseline

    def out(attribution: str, cause: str, evidence: dict[str, Any]) -> SlowStep:
        return SlowStep(s.step, s.start, s.end, s.duration_s, baseline, attribution, cause,
                        evidence)

    hosts = [h for h in host_events if _overlap(s.start, s.end, h.start, h.end) > 0]
    straggler = _straggler(s, base, excess)
    if straggler is not None:
        cause, ev = straggler
        return out("host", cause, {**ev, "host_events": [asdict(h) for h in hosts]})
    event = _path(s, events) if _in_comm(s, base, excess) else None
    if event is not None:
        return out("path", f"{event.kind} toward {event.peer}: {event.cause}", {
            "peer": event.peer, "kind": event.kind, "event_start": event.start,
            "event_end": event.end, **event.evidence})
    if hosts:
        return out("host", f"{hosts[0].host}: {hosts[0].cause}",
                   {"host_events": [asdict(h) for h in hosts]})
    return out("unexplained", "no path or host event in the step, and no rank computed "
               "longer than usual", {"comm_s": {ln.rank: ln.comm_s for ln in s.ranks}})


def explain(log: StepLog, events: Sequence[PathEvent],
            host_events: Sequence[HostEvent] = ()) -> Explanation:
    """The slow steps of ``log`` with their attribution (module docstring)."""
    base = _Baselines()
    slow = []
    for s in log.steps:
        baseline = base.step()
        if baseline is not None and s.duration_s > SLOW_FACTOR * baseline:
            slow.append(_slow(s, baseline, base, events, host_events))
        else:
            base.learn(s)
    return Explanation(len(log.steps), tuple(slow), len(events), log.notes)
