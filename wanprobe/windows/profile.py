"""The hour-of-week profile of one path (a site pair or one host's peer): pure functions.

Inputs are what the sources measured, already in base units: goodput samples (one per scheduled
throughput test) and path observations (probe sessions, or one hour of them from Prometheus).
Per hour of the week the profile keeps p10 and p50 of the goodput samples (Hyndman & Fan type 7,
as numpy's default), loss per direction as lost / sent summed over the hour's observations (a
ratio of sums, as Prometheus computes ``increase(lost) / increase(sent)``), and the RTT median
as the session-weighted median of the observations' medians. An hour nobody measured keeps
``None`` for every figure and 0 samples (conventions §3): a profile never fills a gap.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from wanprobe.errors import WanprobeError
from wanprobe.probe.stats import percentiles_sorted

HOURS_PER_WEEK = 168
HOUR_S = 3600.0
WEEK_S = HOURS_PER_WEEK * HOUR_S
# 1970-01-01 00:00 UTC was a Thursday: hour 72 of a week that starts on Monday 00:00
_EPOCH_HOUR_OF_WEEK = 72
DAY_NAMES = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


class ProfileError(WanprobeError):
    """No profile can be built: the path does not exist, or it has no samples where needed."""

    exit_code = 1


def hour_of_week(ts: float) -> int:
    """Hour of the week of Unix time ``ts`` in UTC, 0 = Monday 00:00-00:59."""
    return int((math.floor(ts / HOUR_S) + _EPOCH_HOUR_OF_WEEK) % HOURS_PER_WEEK)


def hour_label(hour: int) -> str:
    """``26`` → ``"Tue 02:00"`` (UTC)."""
    return f"{DAY_NAMES[hour // 24]} {hour % 24:02d}:00"


def next_start_ts(hour: int, now_ts: float) -> float:
    """The first instant at or after ``now_ts`` that starts hour ``hour`` of the week."""
    base = math.ceil(now_ts / HOUR_S) * HOUR_S
    return base + ((hour - hour_of_week(base)) % HOURS_PER_WEEK) * HOUR_S


def lookback_span(now_ts: float, lookback_s: float) -> tuple[float, float]:
    """(start, end) of a look-back in whole hours: end = the end of the current hour."""
    end = math.ceil(now_ts / HOUR_S) * HOUR_S
    return end - math.ceil(lookback_s / HOUR_S) * HOUR_S, end


@dataclass(frozen=True)
class GoodputSample:
    """One throughput test: when it ran and the receiver goodput it achieved."""

    ts: float
    bits_per_second: float


@dataclass(frozen=True)
class PathObservation:
    """Probe results over a span starting at ``ts``: packets sent and lost per direction (RFC
    8762 counters; reverse = replies lost of the probes that reached the reflector), the median
    RTT, and how many sessions stand behind them (the weight of the median)."""

    ts: float
    sessions: float
    rtt_p50_seconds: float | None = None
    sent: float | None = None
    lost_forward: float | None = None
    lost_reverse: float | None = None


@dataclass(frozen=True)
class HourBucket:
    """One hour of the week; JSON keys are the field names."""

    hour_of_week: int
    p10_bits_per_second: float | None = None
    p50_bits_per_second: float | None = None
    loss_forward_ratio: float | None = None
    loss_reverse_ratio: float | None = None
    rtt_p50_seconds: float | None = None
    samples: int = 0              # throughput tests behind p10 / p50
    probe_sessions: int = 0       # probe sessions behind loss and RTT

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Profile:
    """168 hour buckets measured between ``start_ts`` and ``end_ts``, and where they came from."""

    hours: tuple[HourBucket, ...]
    start_ts: float
    end_ts: float
    source: dict[str, Any] = field(default_factory=dict)

    @property
    def hours_without_goodput(self) -> list[int]:
        return [b.hour_of_week for b in self.hours if b.p50_bits_per_second is None]

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "start_unix_s": self.start_ts, "end_unix_s": self.end_ts,
                "lookback_s": self.end_ts - self.start_ts,
                "profile": [b.to_json() for b in self.hours],
                "hours_without_data": self.hours_without_goodput}


def weighted_median(pairs: list[tuple[float, float]]) -> float | None:
    """The lower weighted median of (value, weight) pairs with positive weights; None if none."""
    pairs = sorted((v, w) for v, w in pairs if w > 0 and math.isfinite(v))
    total = math.fsum(w for _, w in pairs)
    if not pairs:
        return None
    acc = 0.0
    for value, weight in pairs:
        acc += weight
        if acc >= total / 2:
            return value
    return pairs[-1][0]


def _ratio(lost: list[float], sent: list[float]) -> float | None:
    """lost / sent in [0, 1]: Prometheus's extrapolated increase() can put a sum a hair past."""
    total = math.fsum(sent)
    return None if not lost or total <= 0 else min(1.0, max(0.0, math.fsum(lost) / total))


def _bucket(hour: int, rates: list[float], obs: list[PathObservation]) -> HourBucket:
    p10 = p50 = None
    if rates:
        p10, p50 = percentiles_sorted(sorted(rates), (10, 50))
    fwd = [o for o in obs if o.sent is not None and o.lost_forward is not None]
    rev = [o for o in fwd if o.lost_reverse is not None]
    return HourBucket(
        hour_of_week=hour, p10_bits_per_second=p10, p50_bits_per_second=p50,
        loss_forward_ratio=_ratio([o.lost_forward for o in fwd], [o.sent for o in fwd]),
        # reverse: replies lost out of the probes that reached the reflector (rules.py)
        loss_reverse_ratio=_ratio([o.lost_reverse for o in rev],
                                  [o.sent - o.lost_forward for o in rev]),
        rtt_p50_seconds=weighted_median([(o.rtt_p50_seconds, o.sessions) for o in obs
                                         if o.rtt_p50_seconds is not None]),
        samples=len(rates), probe_sessions=round(math.fsum(o.sessions for o in obs)))


def build_profile(goodput: Iterable[GoodputSample], paths: Iterable[PathObservation], *,
                  start_ts: float, end_ts: float,
                  source: dict[str, Any] | None = None) -> Profile:
    """Sort every sample with ``start_ts <= ts < end_ts`` into its hour of the week."""
    rates: list[list[float]] = [[] for _ in range(HOURS_PER_WEEK)]
    obs: list[list[PathObservation]] = [[] for _ in range(HOURS_PER_WEEK)]
    for g in goodput:
        if start_ts <= g.ts < end_ts and math.isfinite(g.bits_per_second) and g.bits_per_second >= 0:
            rates[hour_of_week(g.ts)].append(g.bits_per_second)
    for o in paths:
        if start_ts <= o.ts < end_ts and o.sessions > 0:
            obs[hour_of_week(o.ts)].append(o)
    return Profile(tuple(_bucket(h, rates[h], obs[h]) for h in range(HOURS_PER_WEEK)),
                   start_ts, end_ts, dict(source or {}))


def require_goodput(profile: Profile, what: str) -> None:
    """Refuse a profile without one goodput sample: no window can be judged from it."""
    if all(b.samples == 0 for b in profile.hours):
        sessions = sum(b.probe_sessions for b in profile.hours)
        days = (profile.end_ts - profile.start_ts) / 86400
        raise ProfileError(
            f"{what}: no throughput tests in the last {days:g} days"
            + (f" (but {sessions} probe sessions)" if sessions else "")
            + ": enable the daemons' scheduled tests ([throughput] enabled = true, docs/fleet.md §8)")
