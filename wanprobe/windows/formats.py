"""Turn a transfer window into what runs the transfer: an rclone ``--bwlimit`` timetable or a
systemd timer. Both are plain text for the operator to review; nothing here installs anything.

rclone's timetable is ``"WEEKDAY-HH:MM,RATE ..."`` in the local time of the host running
rclone; a slot lasts until the next one and the last one wraps around the week, ``off`` means
unlimited and so does 0 (a bare number is KiB/s; rclone ``fs/bwtimetable.go`` ``LimitAt`` and
``fs/accounting/token_bucket.go``). systemd timers take ``OnCalendar=`` calendar events with a
time zone (systemd.time(7)); the timer is written in UTC so it stays on the measured hour.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, tzinfo

from wanprobe import units
from wanprobe.errors import UsageError, shown
from wanprobe.windows.plan import Answer, Window
from wanprobe.windows.profile import HOUR_S, HOURS_PER_WEEK

_UNIT = re.compile(r"[A-Za-z0-9:_.@\\-]{1,200}\.(service|target)")
_RCLONE_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")   # datetime.weekday() order
MIN_THROTTLE_BPS = 8 * 1024.0    # rclone's smallest limit, 1 KiB/s (0 would mean unlimited)


def local(ts: float, tz: tzinfo | None) -> datetime:
    """``ts`` in the zone ``tz`` (None: the host's zone, with its DST rules at that date)."""
    return datetime.fromtimestamp(ts, tz) if tz is not None else datetime.fromtimestamp(ts).astimezone()


def window_hours(w: Window) -> int:
    """Whole hours the pessimistic run of ``w`` needs (the expected one when p10 is unknown)."""
    seconds = w.p10_duration_s if w.p10_duration_s is not None else w.duration_s
    return max(1, math.ceil(seconds / HOUR_S))


def chosen(a: Answer) -> Window:
    """The window a schedule is built from: the best one."""
    return a.windows[0]


def rclone_rate(bits_per_second: float) -> str:
    """A rate in rclone's size syntax: whole KiB/s (rclone reads ``K`` as 1024 bytes)."""
    return f"{max(1, round(bits_per_second / 8 / 1024))}K"


def rclone_timetable(a: Answer, throttle_bps: float, tz: tzinfo | None) -> str:
    """Unlimited from the best window's start for as many hours as its p10 run needs, throttled
    to ``throttle_bps`` for the rest of the week, in local time of ``tz`` at the window's date."""
    if not (math.isfinite(throttle_bps) and throttle_bps >= MIN_THROTTLE_BPS):
        raise UsageError(f"--throttle must be at least 8 kbit/s (rclone's 1 KiB/s), not "
                         f"{throttle_bps:g} bit/s")
    w = chosen(a)
    hours = window_hours(w)
    if hours >= HOURS_PER_WEEK:
        return "off"
    slots = []
    for ts, rate in ((w.start_unix_s, "off"), (w.start_unix_s + hours * HOUR_S,
                                                rclone_rate(throttle_bps))):
        t = local(ts, tz)
        slots.append((t.weekday(), t.hour, t.minute, rate))
    # rclone wraps the LAST slot around the week: order them as its week runs (Sunday first)
    slots.sort(key=lambda s: ((s[0] + 1) % 7, s[1], s[2]))
    return " ".join(f"{_RCLONE_DAYS[d]}-{h:02d}:{m:02d},{r}" for d, h, m, r in slots)


def check_unit(unit: str) -> str:
    if not _UNIT.fullmatch(unit):
        raise UsageError(f"--unit: {shown(unit)} is not a systemd unit name ending in .service")
    return unit


def systemd_timer(a: Answer, unit: str, what: str, tz: tzinfo | None) -> str:
    """A timer starting ``unit`` at the best window every week, or once at the best in-time
    start when there is a deadline."""
    check_unit(unit)
    w = chosen(a)
    d = a.deadline
    if d is not None and d.best_start_unix_s is not None:
        start = datetime.fromtimestamp(d.best_start_unix_s, UTC)
        calendar = start.strftime("%Y-%m-%d %H:%M:%S UTC")
        expected, p10 = d.best_duration_s, d.best_p10_duration_s
        when = "once, at the best start that meets the deadline"
    else:
        start = datetime.fromtimestamp(w.start_unix_s, UTC)
        calendar = f"{_RCLONE_DAYS[start.weekday()]} *-*-* {start:%H:%M:%S} UTC"
        expected, p10 = w.duration_s, w.p10_duration_s
        when = "every week, at the best window"
    budget = max(1, math.ceil((p10 if p10 is not None else expected) / HOUR_S)) * HOUR_S
    lines = [
        f"# wanprobe windows: {what}, {units.format_bytes(a.size_bytes)}",
        f"# starts {when}: {_local_text(start.timestamp(), UTC)} "
        f"({_local_text(start.timestamp(), tz)}); expected {_hours(expected)}, p10 {_hours(p10)}",
        f"# suggested in {unit}: RuntimeMaxSec={int(budget)} (the p10 run, rounded up to hours)",
        "[Unit]",
        f"Description=Start {unit} in the transfer window measured by wanprobe",
        "",
        "[Timer]",
        f"OnCalendar={calendar}",
        "AccuracySec=1min",
        "Persistent=false",
        f"Unit={unit}",
        "",
        "[Install]",
        "WantedBy=timers.target",
    ]
    return "\n".join(lines) + "\n"


def _local_text(ts: float, tz: tzinfo | None) -> str:
    t = local(ts, tz)
    return f"{_RCLONE_DAYS[t.weekday()]} {t:%H:%M} {t.tzname() or ''}".rstrip()


def _hours(seconds: float | None) -> str:
    return "unknown" if seconds is None else f"{seconds / 3600:.1f} h"
