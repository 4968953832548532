"""A site pair's profile from a fleet's Prometheus: hourly range queries over the daemon's series.

Every query is a range query with a one-hour step whose points close each hour of the lookback
(https://prometheus.io/docs/prometheus/latest/querying/api/#range-queries); the point at T
covers (T - 1 h, T] and goes to the hour of the week of T - 1 h.

- Goodput: ``wanprobe_throughput_bytes_per_second`` (× 8: bit/s; the bit/s gauge of daemons
  before issue 36, rules.throughput_bits) holds the last scheduled test of each host pair
  (daemon/metrics.py). A new test shows as a new value at the next hourly point, so every
  change of a host pair's value is one sample of the hour it appeared in. A daemon spaces one
  peer's tests ``throughput.interval`` apart (default 2 h); below an hour, all but the last
  test of each hour are hidden (the store keeps them).
- Loss: ``increase()`` of the packet counters summed over the pair's host pairs, forward
  ``lost_fwd / sent``, reverse ``lost_rev / (sent - lost_fwd)`` (rules.py); RTT: the median over
  host pairs of each one's hourly median of session medians (``stat="p50"``, or the
  ``quantile="0.5"`` of daemons before issue 36: rules.rtt_series).
- With the recording rules of ``fleet rules`` (profile_queries) the path figures read one
  recorded series per figure instead of every host pair's raw samples; ``auto`` uses them when
  their history covers the whole lookback.
- Every point is checked against its figure's range (``fleet.figures``): an infinite, negative
  or absurd count, RTT or rate refuses the answer in one line (it made the profile overflow).
"""

from __future__ import annotations

import math
import time
from typing import Any

from wanprobe.errors import UsageError, shown
from wanprobe.fleet import prom_http
from wanprobe.fleet.figures import BITS_PER_SECOND, COUNT, RTT_SECONDS, check_points
from wanprobe.fleet.rules import rtt_series, throughput_bits
from wanprobe.windows.profile import (
    HOUR_S,
    GoodputSample,
    PathObservation,
    Profile,
    ProfileError,
    build_profile,
    lookback_span,
)

PAIR = "src_site, dst_site"
SERIES_CHOICES = ("auto", "raw", "recorded")
MAX_SITE_CHARS = 200
RANGES = {"rtt_p50_seconds": RTT_SECONDS, "sent": COUNT, "lost_forward": COUNT,
          "lost_reverse": COUNT, "sessions": COUNT, "goodput": BITS_PER_SECOND}


def _sel(src: str, dst: str, extra: str = "") -> str:
    return (f"src_site={prom_http.label_value(src)}, dst_site={prom_http.label_value(dst)}"
            + (f", {extra}" if extra else ""))


def raw_queries(src: str, dst: str, method: str = "stamp") -> dict[str, str]:
    """Hourly path figures from every host pair's own series."""
    m = f'method={prom_http.label_value(method)}'

    def inc(metric: str, extra: str = "") -> str:
        return f"sum by ({PAIR}) (increase({metric}{{{_sel(src, dst, m + extra)}}}[1h]))"

    return {
        "rtt_p50_seconds": f"quantile by ({PAIR}) (0.5, "
                           f"{rtt_series(_sel(src, dst, m), 'p50', '1h', 'quantile_over_time(0.5, ')})",
        "sent": inc("wanprobe_probe_packets_sent_total"),
        "lost_forward": inc("wanprobe_probe_packets_lost_total", ', direction="forward"'),
        "lost_reverse": inc("wanprobe_probe_packets_lost_total", ', direction="reverse"'),
        "sessions": inc("wanprobe_probe_sessions_total"),
    }


def recorded_queries(src: str, dst: str) -> dict[str, str]:
    """The same figures from the recording rules (per-second rates, averaged over the hour)."""
    def per_hour(record: str) -> str:
        return f"avg_over_time({record}{{{_sel(src, dst)}}}[1h]) * 3600"

    return {
        "rtt_p50_seconds": f"quantile_over_time(0.5, site_pair:wanprobe_rtt_p50:seconds"
                           f"{{{_sel(src, dst)}}}[1h])",
        "sent": per_hour("site_pair:wanprobe_probe_packets_sent:rate"),
        "lost_forward": per_hour("site_pair:wanprobe_probe_packets_lost_forward:rate"),
        "lost_reverse": per_hour("site_pair:wanprobe_probe_packets_lost_reverse:rate"),
        "sessions": per_hour("site_pair:wanprobe_probe_sessions:rate"),
    }


def goodput_query(src: str, dst: str) -> str:
    return throughput_bits(_sel(src, dst))


def new_tests(points: list[tuple[float, float]], first_step_s: float) -> list[GoodputSample]:
    """Samples from one host pair's hourly gauge points: each value that differs from the last
    one seen is a test that ended in the hour before its point. A value already there at the
    first step is the test before the lookback; a series that appears later is a daemon's
    first test."""
    out, last = [], None
    for t, v in points:
        if v != last and (last is not None or t > first_step_s) and math.isfinite(v):
            out.append(GoodputSample(t - HOUR_S, v))
        last = v
    return out


def check_site(option: str, site: str) -> str:
    if not site or len(site) > MAX_SITE_CHARS or not site.isprintable():
        raise UsageError(f"{option}: {shown(site)} is not a site name")
    return site


class _Queries:
    """Runs range queries over one lookback and keeps what each cost (for the bench)."""

    def __init__(self, url: str, start_s: float, end_s: float, timeout_s: float) -> None:
        self.url, self.start_s, self.end_s, self.timeout_s = url, start_s, end_s, timeout_s
        self.costs: list[dict[str, Any]] = []

    def run(self, name: str, promql: str, first_s: float) -> prom_http.Series:
        t0 = time.perf_counter()
        series, stats = prom_http.query_range(self.url, promql, start_s=first_s, end_s=self.end_s,
                                              step_s=HOUR_S, timeout_s=self.timeout_s, stats=True)
        for labels, points in series:
            check_points(points.values, RANGES[name], name, labels, self.url)
        self.costs.append({"name": name, "query": promql, "seconds": time.perf_counter() - t0,
                           "samples": (stats.get("samples") or {}).get("totalQueryableSamples")})
        return series


def _finite(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) else None


def _path_observations(points: dict[str, dict[float, float]]) -> list[PathObservation]:
    return [PathObservation(ts=t - HOUR_S, sessions=sessions,
                            rtt_p50_seconds=_finite(points["rtt_p50_seconds"].get(t)),
                            sent=_finite(points["sent"].get(t)),
                            lost_forward=_finite(points["lost_forward"].get(t)),
                            lost_reverse=_finite(points["lost_reverse"].get(t)))
            for t, sessions in points["sessions"].items()]


def _uses_recorded(q: _Queries, src: str, dst: str, series: str) -> bool:
    if series != "auto":
        return series == "recorded"
    first = prom_http.query(q.url, "last_over_time(site_pair:wanprobe_probe_packets_sent:rate"
                                   f"{{{_sel(src, dst)}}}[1h])", timeout_s=q.timeout_s,
                            at_s=q.start_s + HOUR_S)
    return bool(first)


def prometheus_profile(url: str, src: str, dst: str, *, lookback_s: float,
                       now_ts: float | None = None, timeout_s: float = 30.0,
                       series: str = "auto", costs: list | None = None) -> Profile:
    """The profile of ``src`` → ``dst`` over the last ``lookback_s`` (whole hours)."""
    if series not in SERIES_CHOICES:
        raise UsageError(f"--series: {shown(series)} is not one of {', '.join(SERIES_CHOICES)}")
    now_ts = time.time() if now_ts is None else now_ts
    start, end = lookback_span(now_ts, lookback_s)
    q = _Queries(url, start, end, timeout_s)
    recorded = _uses_recorded(q, src, dst, series)
    queries = recorded_queries(src, dst) if recorded else raw_queries(src, dst)
    points: dict[str, dict[float, float]] = {}
    for name, promql in queries.items():
        got = q.run(name, promql, start + HOUR_S)
        points[name] = dict(got[0][1]) if got else {}
    goodput = q.run("goodput", goodput_query(src, dst), start)
    if costs is not None:
        costs.extend(q.costs)
    if not goodput and not any(points.values()):
        raise ProfileError(f"no wanprobe series from site {shown(src)} to site {shown(dst)} in "
                           f"the last {lookback_s / 86400:g} days at {url}; "
                           + known_pairs(url, timeout_s))
    samples = [s for _, pts in goodput for s in new_tests(pts, start)]
    return build_profile(samples, _path_observations(points), start_ts=start, end_ts=end,
                         source={"kind": "prometheus", "url": url, "src_site": src,
                                 "dst_site": dst, "series": "recorded" if recorded else "raw"})


def known_pairs(url: str, timeout_s: float, limit: int = 12) -> str:
    """``pairs it has: a->b, b->a`` from the peers the daemons export now."""
    got = prom_http.query(url, f"count by ({PAIR}) (wanprobe_peer_info)", timeout_s=timeout_s)
    pairs = sorted(f"{shown(lab.get('src_site', ''))}->{shown(lab.get('dst_site', ''))}"
                   for lab, _ in got)
    if not pairs:
        return "it has no wanprobe daemons now (are they scraped?)"
    more = f" and {len(pairs) - limit} more" if len(pairs) > limit else ""
    return "site pairs it has: " + ", ".join(pairs[:limit]) + more
