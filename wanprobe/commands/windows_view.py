"""The options and the output that ``fleet windows`` and ``history PEER --windows`` share."""

from __future__ import annotations

import json
import sys
import zoneinfo
from dataclasses import dataclass
from datetime import tzinfo
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from wanprobe import units
from wanprobe.errors import UsageError, shown
from wanprobe.safe_text import SafeConsole as Console
from wanprobe.windows import formats
from wanprobe.windows.plan import Answer, DeadlineMissed, Window, describe_hours
from wanprobe.windows.profile import DAY_NAMES, Profile

FORMATS = ("text", "json", "rclone", "systemd")
MAX_LOOKBACK_S = 90 * 86400.0   # the store's downsampled history; Prometheus rarely keeps more
BYTES_HELP = "What to move, e.g. 20TB or 500GiB."
DEADLINE_HELP = "Finish within this long from now, e.g. 36h; says whether it can, and from when."
LOOKBACK_HELP = "How much history the profile reads, e.g. 14d (whole hours)."
FORMAT_HELP = ("text, json, rclone (a --bwlimit timetable: unlimited in the best window) or "
               "systemd (a timer that starts --unit in it).")
TZ_HELP = "Time zone of the text output and the rclone timetable (default: this host's)."


# the options both commands take, declared once
DeadlineOpt = Annotated[str | None, typer.Option("--deadline", help=DEADLINE_HELP)]
LookbackOpt = Annotated[str, typer.Option("--lookback", help=LOOKBACK_HELP)]
FormatOpt = Annotated[str, typer.Option("--format", help=FORMAT_HELP)]
TzOpt = Annotated[str | None, typer.Option("--tz", help=TZ_HELP)]
TopOpt = Annotated[int, typer.Option("--top", min=1, max=168, help="Windows listed.")]
ThrottleOpt = Annotated[str, typer.Option("--throttle", help="rclone: the limit outside the "
                                          "window, e.g. 100mbit.")]
UnitOpt = Annotated[str, typer.Option("--unit", help="systemd: the unit the timer starts.")]


@dataclass(frozen=True)
class Request:
    """Validated options of a windows question."""

    size_bytes: float
    deadline_s: float | None
    lookback_s: float
    top: int
    fmt: str
    tz: tzinfo | None
    throttle_bps: float
    unit: str


def parse_request(*, size: str, deadline: str | None, lookback: str, top: int, fmt: str,
                  as_json: bool, tz: str | None, throttle: str, unit: str) -> Request:
    """Check every option before anything is read (a bad one is one line, exit 2)."""
    size_bytes = float(units.parse_bytes(size))
    deadline_s = None
    if deadline is not None:
        deadline_s = units.parse_duration_s(deadline, default_unit="s", allow_zero=False)
    lookback_s = units.parse_duration_s(lookback, default_unit="s", allow_zero=False,
                                        maximum_s=MAX_LOOKBACK_S)
    if lookback_s < 3600:
        raise UsageError(f"--lookback must be at least 1h, not {shown(lookback)}")
    if fmt not in FORMATS:
        raise UsageError(f"--format: {shown(fmt)} is not one of {', '.join(FORMATS)}")
    if as_json and fmt not in ("text", "json"):
        raise UsageError("--json and --format rclone/systemd exclude each other")
    return Request(size_bytes, deadline_s, lookback_s, top, "json" if as_json else fmt,
                   parse_tz(tz), units.parse_rate_bps(throttle), formats.check_unit(unit))


def parse_tz(name: str | None) -> tzinfo | None:
    if name is None:
        return None
    try:
        return zoneinfo.ZoneInfo(name)
    except (ValueError, OSError, zoneinfo.ZoneInfoNotFoundError):
        raise UsageError(f"--tz: {shown(name)} is not a time zone (e.g. UTC, Asia/Taipei)") from None


def emit(a: Answer, req: Request, what: str) -> None:
    """Print the answer in the requested format; an unmet deadline then exits 1 (after the
    text or JSON, before a timetable or timer that could not keep it)."""
    d = a.deadline
    missed = None
    if d is not None and not d.can_meet:
        late = ("an hour without data" if d.earliest_finish_unix_s is None else
                _when(d.earliest_finish_unix_s, req.tz))
        missed = (f"{what}: cannot move {units.format_bytes(a.size_bytes)} within "
                  f"{units.format_duration(d.deadline_s)}: starting now it finishes at {late}")
    if req.fmt in ("rclone", "systemd") and missed:
        raise DeadlineMissed(missed)
    if req.fmt == "json":
        typer.echo(json.dumps(a.to_json(), indent=2))
    elif req.fmt == "rclone":
        typer.echo(formats.rclone_timetable(a, req.throttle_bps, req.tz))
    elif req.fmt == "systemd":
        typer.echo(formats.systemd_timer(a, req.unit, what, req.tz), nl=False)
    else:
        _text(a, req, what)
    if missed:
        raise DeadlineMissed(missed)


def _when(ts: float, tz: tzinfo | None) -> str:
    t = formats.local(ts, tz)
    return f"{DAY_NAMES[t.weekday()]} {t:%m-%d %H:%M} {t.tzname() or ''}".rstrip()


def _dur(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.2f}%"


def _rtt(w: Window) -> str:
    lo, hi = w.rtt_p50_min_seconds, w.rtt_p50_max_seconds
    return "-" if lo is None or hi is None else f"{lo * 1e3:.1f}-{hi * 1e3:.1f} ms"


def _text(a: Answer, req: Request, what: str) -> None:
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 132)
    p = a.profile
    console.print(f"[bold]{escape(what)}[/]: {units.format_bytes(a.size_bytes)}; profile of "
                  f"{(p.end_ts - p.start_ts) / 86400:g} days ({escape(_source(p))}), "
                  f"{168 - len(p.hours_without_goodput)} of 168 hours with throughput samples")
    table = Table(title=f"best start hours ({a.windows_evaluated} evaluated), times in "
                        f"{_zone(req.tz)}", title_justify="left")
    for col in ("start", "UTC", "expected", "p10 run", "rate p50", "rate p10", "loss fwd",
                "loss rev", "RTT p50"):
        table.add_column(col, justify="left" if col in ("start", "UTC") else "right", no_wrap=True)
    for w in a.windows:
        table.add_row(_when(w.start_unix_s, req.tz), w.label, _dur(w.duration_s),
                      _dur(w.p10_duration_s), units.format_rate(w.expected_bits_per_second),
                      "-" if w.p10_bits_per_second is None else
                      units.format_rate(w.p10_bits_per_second),
                      _pct(w.loss_forward_max_ratio), _pct(w.loss_reverse_max_ratio), _rtt(w))
    console.print(table)
    _print_deadline(console, a, req)
    _print_grid(console, p)


def _print_deadline(console: Console, a: Answer, req: Request) -> None:
    d = a.deadline
    if d is None:
        return
    head = f"deadline {units.format_duration(d.deadline_s)} ({_when(d.deadline_unix_s, req.tz)}): "
    if not d.can_meet:
        finish = ("runs into hours without data" if d.earliest_finish_unix_s is None else
                  "finishes " + _when(d.earliest_finish_unix_s, req.tz))
        console.print(head + f"[bold red]cannot be met[/]: started now it {finish}")
        return
    safe = ("even at p10, latest start " + _when(d.latest_start_p10_unix_s, req.tz)
            if d.can_meet_p10 and d.latest_start_p10_unix_s is not None else "not at p10")
    console.print(head + f"[bold green]can be met[/] at p50 if started by "
                  f"{_when(d.latest_start_unix_s, req.tz)}; {safe}; best start "
                  f"{_when(d.best_start_unix_s, req.tz)} ({_dur(d.best_duration_s)})")


LEVELS = "▁▂▃▄▅▆▇█"


def _print_grid(console: Console, p: Profile) -> None:
    """p50 goodput per hour of the week (UTC), one line per day, one character per hour
    scaled to the best hour; '·' = no samples."""
    top = max((b.p50_bits_per_second or 0.0 for b in p.hours), default=0.0)
    console.print(f"p50 goodput by hour of the week, UTC ({LEVELS[-1]} = "
                  f"{units.format_rate(top)}, · = no samples)")
    console.print("     " + "".join(f"{h:<6d}" for h in range(0, 24, 6)))
    for day in range(7):
        cells = ["·" if b.p50_bits_per_second is None else
                 LEVELS[min(len(LEVELS) - 1, int(b.p50_bits_per_second / top * len(LEVELS)))
                        if top > 0 else 0]
                 for b in p.hours[day * 24:(day + 1) * 24]]
        console.print(f"{DAY_NAMES[day]}  {''.join(cells)}", markup=False)
    if p.hours_without_goodput:
        console.print(f"hours without throughput samples: {describe_hours(p.hours_without_goodput)}")


def _source(p: Profile) -> str:
    s = p.source
    if s.get("kind") == "prometheus":
        return f"Prometheus {s.get('url')}, {s.get('series')} series"
    return f"store {s.get('path')}, {s.get('method')} probes"


def _zone(tz: tzinfo | None) -> str:
    return str(tz) if tz is not None else "this host's time zone"
