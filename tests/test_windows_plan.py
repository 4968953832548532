"""Transfer windows without a server: the hour of the week, the profile's figures, the fluid
transfer model and the deadline verdict against hand-computed values, and the rclone timetable
and systemd timer (its OnCalendar= checked by systemd-analyze itself)."""

from __future__ import annotations

import math
import subprocess
import zoneinfo

import pytest
from conftest import require_tool

from wanprobe.errors import UsageError
from wanprobe.windows import formats
from wanprobe.windows.from_prometheus import new_tests
from wanprobe.windows.plan import answer, find_windows, judge_deadline, simulate
from wanprobe.windows.profile import (
    HOUR_S,
    WEEK_S,
    GoodputSample,
    HourBucket,
    PathObservation,
    Profile,
    ProfileError,
    build_profile,
    hour_of_week,
    next_start_ts,
)

MONDAY = 1704067200.0   # 2024-01-01 00:00 UTC, a Monday


def flat(rate_of_hour) -> Profile:
    """A profile whose p10 and p50 are ``rate_of_hour(h)`` (None: no data)."""
    hours = tuple(HourBucket(h, rate_of_hour(h), rate_of_hour(h), samples=int(rate_of_hour(h) is not None))
                  for h in range(168))
    return Profile(hours, MONDAY - 2 * WEEK_S, MONDAY)


def nights(fast=1e9, slow=1e8):
    """1 Gbit/s from 00:00 to 07:59 UTC every day, 100 Mbit/s otherwise."""
    return flat(lambda h: fast if h % 24 < 8 else slow)


def test_hour_of_week_starts_monday_utc():
    assert hour_of_week(MONDAY) == 0
    assert hour_of_week(MONDAY + 26 * HOUR_S + 59) == 26      # Tue 02:00:59
    assert hour_of_week(MONDAY - 1) == 167                     # Sun 23:59:59
    assert next_start_ts(26, MONDAY + 1) == MONDAY + 26 * HOUR_S
    assert next_start_ts(0, MONDAY + 1) == MONDAY + WEEK_S


def test_profile_figures_by_hand():
    start, end = MONDAY - WEEK_S, MONDAY + WEEK_S
    at5 = MONDAY + 5 * HOUR_S + 60
    goodput = [GoodputSample(at5 + i, r) for i, r in enumerate((300, 100, 500, 200, 400))]
    goodput += [GoodputSample(MONDAY + 6 * HOUR_S, 50.0), GoodputSample(end + 10, 1e12),
                GoodputSample(start - 10, 1e12)]   # outside the lookback: ignored
    paths = [PathObservation(at5, 1, 0.1, sent=100, lost_forward=1, lost_reverse=0),
             PathObservation(at5 + 600, 3, 0.2, sent=300, lost_forward=5, lost_reverse=2)]
    p = build_profile(goodput, paths, start_ts=start, end_ts=end)
    h5, h6, h7 = p.hours[5], p.hours[6], p.hours[7]
    assert (h5.p10_bits_per_second, h5.p50_bits_per_second, h5.samples) == (140.0, 300.0, 5)
    assert (h6.p10_bits_per_second, h6.p50_bits_per_second, h6.samples) == (50.0, 50.0, 1)
    assert math.isclose(h5.loss_forward_ratio, 6 / 400)
    assert math.isclose(h5.loss_reverse_ratio, 2 / 394)        # of the probes that arrived
    assert h5.rtt_p50_seconds == 0.2 and h5.probe_sessions == 4  # weighted by sessions
    assert h7 == HourBucket(7)                                  # no data: no figure, 0 samples
    assert h6.loss_forward_ratio is None and h6.rtt_p50_seconds is None
    assert p.hours_without_goodput == [h for h in range(168) if h not in (5, 6)]
    assert p.to_json()["profile"][5]["p50_bits_per_second"] == 300.0


def test_simulate_by_hand():
    p = flat(lambda h: 0.5e9 if h in (2, 3) else 1e9)
    # from 01:30: 1800 s at 1 Gbit/s, 3600 s at 0.5, then 1800 s at 0.5 = 4.5e12 bits
    run = simulate(p, MONDAY + 1.5 * HOUR_S, 4.5e12 / 8)
    assert math.isclose(run.duration_s, 2 * HOUR_S) and run.hours == (1, 2, 3)
    gap = simulate(flat(lambda h: None if h == 3 else 1e9), MONDAY + HOUR_S, 1e13)
    assert gap.duration_s is None and gap.blocked_hour == 3
    # eight weeks and 100 s at a flat 1 Gbit/s (whole weeks are skipped, not walked)
    long = simulate(flat(lambda h: 1e9), MONDAY, (8 * WEEK_S + 100) * 1e9 / 8)
    assert math.isclose(long.duration_s, 8 * WEEK_S + 100)


def test_best_window_fits_in_the_fast_hours():
    size = 4 * HOUR_S * 1e9 / 8                     # four hours at the fast rate
    ranked = find_windows(nights(), size, MONDAY + 30)
    best = ranked[0]
    assert best.start_hour_of_week % 24 <= 4 and math.isclose(best.duration_s, 4 * HOUR_S)
    assert best.hours_spanned == 4 and best.expected_bits_per_second == pytest.approx(1e9)
    assert best.start_unix_s == MONDAY + HOUR_S  # the soonest of the equal ones (01:00)
    worst = ranked[-1]                               # starts at 08:00: 16 slow hours first
    assert worst.start_hour_of_week % 24 == 8
    assert worst.duration_s == pytest.approx(16 * HOUR_S + (size * 8 - 16 * 3600 * 1e8) / 1e9)


def test_no_window_through_hours_without_data():
    p = flat(lambda h: 1e9 if h % 24 < 8 else None)
    assert find_windows(p, 1e9, MONDAY)[0].duration_s == pytest.approx(8.0)
    with pytest.raises(ProfileError, match="no start hour.*08:00-23:59 UTC"):
        find_windows(p, 9 * HOUR_S * 1e9 / 8, MONDAY)


def test_deadline_met_and_missed_by_hand():
    size = 4 * HOUR_S * 1e9 / 8
    d = judge_deadline(nights(), size, MONDAY, 5 * HOUR_S)
    assert d.can_meet and d.can_meet_p10
    assert d.latest_start_unix_s == MONDAY + HOUR_S            # 01:00 → 05:00 exactly
    assert d.best_start_unix_s == MONDAY and d.best_duration_s == pytest.approx(4 * HOUR_S)
    missed = judge_deadline(nights(), size, MONDAY, 3 * HOUR_S)
    assert not missed.can_meet and missed.latest_start_unix_s is None
    assert missed.earliest_finish_unix_s == pytest.approx(MONDAY + 4 * HOUR_S)
    with pytest.raises(ProfileError, match="cannot judge"):
        judge_deadline(flat(lambda h: None if h < 10 else 1e9), size, MONDAY, 5 * HOUR_S)


@pytest.mark.parametrize("size,deadline", [(0, None), (-1.0, None), (float("nan"), None),
                                           (2.0**61, None), (1e9, 0.0), (1e9, -5.0),
                                           (1e9, float("inf")), (1e9, 400 * 86400.0)])
def test_nonsense_size_or_deadline(size, deadline):
    with pytest.raises(UsageError):
        answer(nights(), size, MONDAY, deadline_s=deadline)


def test_gauge_changes_are_tests():
    pts = [(MONDAY, 5.0), (MONDAY + HOUR_S, 5.0), (MONDAY + 2 * HOUR_S, 7.0),
           (MONDAY + 5 * HOUR_S, 7.0), (MONDAY + 6 * HOUR_S, 6.0)]
    assert [(s.ts, s.bits_per_second) for s in new_tests(pts, MONDAY)] == [
        (MONDAY + HOUR_S, 7.0), (MONDAY + 5 * HOUR_S, 6.0)]   # the value at the start is older
    late = new_tests([(MONDAY + 3 * HOUR_S, 9.0)], MONDAY)    # a series born in the lookback
    assert [(s.ts, s.bits_per_second) for s in late] == [(MONDAY + 2 * HOUR_S, 9.0)]


def _answer(start_hour: int, hours: float):
    def rate(h):
        return 1e9 if (h - start_hour) % 168 < hours else 1e7
    return answer(flat(rate), hours * HOUR_S * 1e9 / 8, MONDAY - 60, top=1)


def test_rclone_timetable_in_local_time_wraps_from_the_last_slot():
    a = _answer(5 * 24 + 22, 6)                      # Sat 22:00 UTC, six fast hours
    assert formats.rclone_timetable(a, 100e6, zoneinfo.ZoneInfo("UTC")) == \
        "Sun-04:00,12207K Sat-22:00,off"            # Sunday first: rclone's week
    taipei = formats.rclone_timetable(a, 8 * 1024, zoneinfo.ZoneInfo("Asia/Taipei"))
    assert taipei == "Sun-06:00,off Sun-12:00,1K"    # UTC+8; 1 KiB/s is rclone's least
    with pytest.raises(UsageError, match="throttle"):
        formats.rclone_timetable(a, 0, None)         # 0 means unlimited to rclone


def test_systemd_timer_calendar_is_valid():
    tool = require_tool("systemd-analyze")
    a = _answer(26, 3)                               # Tue 02:00 UTC
    text = formats.systemd_timer(a, "ckpt-sync.service", "tpe -> usw", None)
    calendar = next(ln.split("=", 1)[1] for ln in text.splitlines() if ln.startswith("OnCalendar="))
    assert calendar == "Tue *-*-* 02:00:00 UTC" and "Unit=ckpt-sync.service" in text
    r = subprocess.run([tool, "calendar", calendar], capture_output=True, text=True)
    assert r.returncode == 0 and "Next elapse: Tue" in r.stdout, r.stdout + r.stderr
    with pytest.raises(UsageError, match="unit"):
        formats.systemd_timer(a, "x; rm -rf /", "w", None)


@pytest.mark.parametrize("body", [b"not json", b'{"status": "success"}', b"[1, 2]",
                                  b'{"status": "success", "data": {"resultType": "vector", "result": []}}',
                                  b'{"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {}, "values": [[1, "x"]]}]}}',
                                  b'{"status": "error", "error": "bad_data: parse error"}'])
def test_a_range_reply_that_is_not_a_matrix_is_one_error(body):
    from wanprobe.fleet.prom_http import PrometheusError, parse_matrix

    with pytest.raises(PrometheusError):
        parse_matrix(body, "http://p:9090")
