"""Transfer windows from a profile: when to start moving SIZE bytes, and whether a deadline holds.

A transfer is modelled as a fluid: in each hour it moves what the profile says a test achieved in
that hour of the week (p50 for the expected case, p10 for the pessimistic one), hour after hour
until SIZE is moved. A run that reaches an hour without data stops there: its duration is
unknown, never guessed (conventions §3). Starting earlier never finishes later in this model, so
the earliest finish for a deadline is a start now.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from wanprobe.errors import UsageError, WanprobeError
from wanprobe.units import MAX_DURATION_S, MAX_SIZE_BYTES, format_bytes
from wanprobe.windows.profile import (
    HOUR_S,
    HOURS_PER_WEEK,
    WEEK_S,
    HourBucket,
    Profile,
    ProfileError,
    hour_label,
    hour_of_week,
    next_start_ts,
)

MAX_TRANSFER_S = MAX_DURATION_S   # a transfer longer than a year is reported as such
RATES = {"p50": "p50_bits_per_second", "p10": "p10_bits_per_second"}


class DeadlineMissed(WanprobeError):
    """The transfer cannot finish by the deadline on the measured profile."""

    exit_code = 1


@dataclass(frozen=True)
class Run:
    """One simulated transfer: how long it takes (None: it reaches an hour without data, or
    would take more than a year) and the hours it spans."""

    duration_s: float | None
    hours: tuple[int, ...]
    blocked_hour: int | None = None


def _week_bits(profile: Profile, key: str) -> float | None:
    """Bits one whole week moves at ``key``; None when an hour has no data."""
    rates = [getattr(b, key) for b in profile.hours]
    return None if any(r is None for r in rates) else math.fsum(rates) * HOUR_S


def simulate(profile: Profile, start_ts: float, size_bytes: float, rate: str = "p50") -> Run:
    """Move ``size_bytes`` from ``start_ts`` at the profile's ``rate`` (p50 or p10) per hour.
    Whole weeks in the middle of a long run are skipped at the week's total."""
    key, left_bits, t, hours = RATES[rate], size_bytes * 8.0, start_ts, []
    week_bits = _week_bits(profile, key)
    while t - start_ts < MAX_TRANSFER_S:
        if week_bits and t - start_ts >= WEEK_S and left_bits > 2 * week_bits:
            weeks = math.floor(left_bits / week_bits) - 1
            t, left_bits = t + weeks * WEEK_S, left_bits - weeks * week_bits
            continue
        bucket = profile.hours[hour_of_week(t)]
        if len(hours) < HOURS_PER_WEEK:
            hours.append(bucket.hour_of_week)
        bps = getattr(bucket, key)
        if bps is None:
            return Run(None, tuple(hours), bucket.hour_of_week)
        span = (math.floor(t / HOUR_S) + 1) * HOUR_S - t
        if bps * span >= left_bits:
            return Run(t + left_bits / bps - start_ts, tuple(hours))
        left_bits -= bps * span
        t += span
    return Run(None, tuple(hours))


@dataclass(frozen=True)
class Window:
    """A start hour and what moving SIZE from then is expected to cost; JSON keys are fields."""

    start_hour_of_week: int
    start_unix_s: float                 # next occurrence after the end of the profile
    duration_s: float
    p10_duration_s: float | None        # None: the pessimistic run reaches an hour without data
    expected_bits_per_second: float     # SIZE / duration
    p10_bits_per_second: float | None
    loss_forward_max_ratio: float | None
    loss_reverse_max_ratio: float | None
    rtt_p50_min_seconds: float | None
    rtt_p50_max_seconds: float | None
    hours_spanned: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def label(self) -> str:
        return hour_label(self.start_hour_of_week)


def _extreme(fn, values) -> float | None:
    known = [v for v in values if v is not None]
    return fn(known) if known else None


def _window(profile: Profile, hour: int, start_ts: float, size_bytes: float) -> Window | None:
    expected = simulate(profile, start_ts, size_bytes, "p50")
    if expected.duration_s is None:
        return None
    low = simulate(profile, start_ts, size_bytes, "p10")
    spanned = low.hours if low.duration_s is not None else expected.hours
    buckets: list[HourBucket] = [profile.hours[h] for h in dict.fromkeys(spanned)]
    bits = size_bytes * 8.0
    return Window(
        start_hour_of_week=hour, start_unix_s=start_ts, duration_s=expected.duration_s,
        p10_duration_s=low.duration_s,
        expected_bits_per_second=bits / expected.duration_s,
        p10_bits_per_second=None if low.duration_s is None else bits / low.duration_s,
        loss_forward_max_ratio=_extreme(max, (b.loss_forward_ratio for b in buckets)),
        loss_reverse_max_ratio=_extreme(max, (b.loss_reverse_ratio for b in buckets)),
        rtt_p50_min_seconds=_extreme(min, (b.rtt_p50_seconds for b in buckets)),
        rtt_p50_max_seconds=_extreme(max, (b.rtt_p50_seconds for b in buckets)),
        hours_spanned=len(spanned))


def rank_key(w: Window) -> tuple:
    """Best first: shortest pessimistic (p10) run, then shortest expected one, then soonest —
    as the deadline's best start. Two starts whose expected runs differ only by the noise of
    the samples are told apart by how bad they get: a start whose p10 run spills into slow
    hours is not the best one (tests/test_windows_sources.py saw one that depended on the hour
    the history was taken in)."""
    p10 = w.p10_duration_s if w.p10_duration_s is not None else math.inf
    return (round(p10, 3), round(w.duration_s, 3), w.start_unix_s)


def find_windows(profile: Profile, size_bytes: float, now_ts: float) -> list[Window]:
    """Every start hour of the week whose expected run avoids hours without data, best first.
    Raises ProfileError when there is none (naming the hours without data)."""
    check_size(size_bytes)
    out = [w for h in range(HOURS_PER_WEEK)
           if (w := _window(profile, h, next_start_ts(h, now_ts), size_bytes)) is not None]
    if not out:
        missing = profile.hours_without_goodput
        raise ProfileError(
            f"no start hour of the week can move {format_bytes(size_bytes)} without crossing hours "
            f"that have no throughput samples ({len(missing)} of {HOURS_PER_WEEK}: "
            f"{describe_hours(missing)}); a longer --lookback or more tests fill them")
    return sorted(out, key=rank_key)


def describe_hours(hours: list[int], limit: int = 4) -> str:
    """Runs of consecutive hours, in UTC: ``Mon 00:00-05:59, Tue 12:00-12:59 …``."""
    runs: list[list[int]] = []
    for h in sorted(hours):
        if runs and runs[-1][-1] == h - 1:
            runs[-1].append(h)
        else:
            runs.append([h])
    text = [f"{hour_label(r[0])}-{(r[-1] % 24):02d}:59 UTC" if len(r) > 1 else
            f"{hour_label(r[0])} UTC" for r in runs[:limit]]
    return ", ".join(text) + (f" and {len(runs) - limit} more spans" if len(runs) > limit else "")


@dataclass(frozen=True)
class Deadline:
    """Whether SIZE can be moved by ``deadline_unix_s``, and from when. JSON keys are fields."""

    deadline_s: float
    deadline_unix_s: float
    can_meet: bool                          # at p50
    can_meet_p10: bool                      # even at p10
    latest_start_unix_s: float | None       # last start that still finishes in time at p50
    latest_start_p10_unix_s: float | None
    best_start_unix_s: float | None         # in-time start with the shortest run (p10 first)
    best_duration_s: float | None
    best_p10_duration_s: float | None
    earliest_finish_unix_s: float | None    # start now, at p50 (None: runs into missing hours)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def judge_deadline(profile: Profile, size_bytes: float, now_ts: float,
                   deadline_s: float) -> Deadline:
    """Starts now and at every hour boundary before the deadline, each simulated at p50 and p10
    (a run from an hour boundary depends only on its hour of the week: 168 of each at most)."""
    check_size(size_bytes)
    check_deadline(deadline_s)
    end = now_ts + deadline_s
    cache: dict[tuple[int, str], float | None] = {}

    def run(t: float, rate: str) -> float | None:
        if t == now_ts:
            return simulate(profile, t, size_bytes, rate).duration_s
        key = (hour_of_week(t), rate)
        if key not in cache:
            cache[key] = simulate(profile, t, size_bytes, rate).duration_s
        return cache[key]

    first = math.floor(now_ts / HOUR_S) * HOUR_S + HOUR_S
    starts = [now_ts] + [first + k * HOUR_S for k in range(int(deadline_s // HOUR_S) + 1)
                         if first + k * HOUR_S < end]
    runs = [(t, run(t, "p50"), run(t, "p10")) for t in starts]
    if all(p50 is None for _, p50, _ in runs):
        raise ProfileError(
            "cannot judge the deadline: every start before it runs into hours without throughput "
            f"samples ({describe_hours(profile.hours_without_goodput)})")
    fits = [(t, d, d10) for t, d, d10 in runs if d is not None and t + d <= end]
    fits10 = [(t, d, d10) for t, d, d10 in fits if d10 is not None and t + d10 <= end]
    best = min(fits10 or fits, key=lambda r: (round(r[1], 3), r[0]), default=None)
    first_run = runs[0][1]
    return Deadline(
        deadline_s=deadline_s, deadline_unix_s=end, can_meet=bool(fits), can_meet_p10=bool(fits10),
        latest_start_unix_s=max((r[0] for r in fits), default=None),
        latest_start_p10_unix_s=max((r[0] for r in fits10), default=None),
        best_start_unix_s=None if best is None else best[0],
        best_duration_s=None if best is None else best[1],
        best_p10_duration_s=None if best is None else best[2],
        earliest_finish_unix_s=None if first_run is None else now_ts + first_run)


def check_size(size_bytes: float) -> None:
    if not (isinstance(size_bytes, int | float) and math.isfinite(size_bytes)
            and 0 < size_bytes <= MAX_SIZE_BYTES):
        raise UsageError(f"--bytes must be a size above 0 and at most 1 EiB, not {size_bytes!r}")


def check_deadline(deadline_s: float) -> None:
    if not (math.isfinite(deadline_s) and 0 < deadline_s <= MAX_DURATION_S):
        raise UsageError(f"--deadline must lie between 0 and a year, not {deadline_s!r} s")


@dataclass(frozen=True)
class Answer:
    """A profile, its windows best first (the top ``len(windows)``) and the deadline verdict."""

    profile: Profile
    size_bytes: float
    now_ts: float
    windows: tuple[Window, ...]
    windows_evaluated: int
    deadline: Deadline | None = None

    def to_json(self) -> dict[str, Any]:
        return {**self.profile.to_json(), "bytes": self.size_bytes, "now_unix_s": self.now_ts,
                "windows": [w.to_json() for w in self.windows],
                "windows_evaluated": self.windows_evaluated,
                "deadline": None if self.deadline is None else self.deadline.to_json()}


def answer(profile: Profile, size_bytes: float, now_ts: float, *, top: int = 5,
           deadline_s: float | None = None) -> Answer:
    """The whole answer to "when should I move SIZE over this path"."""
    if not 1 <= top <= HOURS_PER_WEEK:
        raise UsageError(f"--top must lie between 1 and {HOURS_PER_WEEK}, not {top}")
    ranked = find_windows(profile, size_bytes, now_ts)
    verdict = None if deadline_s is None else judge_deadline(profile, size_bytes, now_ts, deadline_s)
    return Answer(profile, size_bytes, now_ts, tuple(ranked[:top]), len(ranked), verdict)
