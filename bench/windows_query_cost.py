#!/usr/bin/env python3
"""What one transfer-window profile query costs Prometheus at the 2,000-host mesh.

Builds the mesh of bench/mesh_targets.py (2,000 hosts in 8 sites, 2 representatives per remote
site), counts the host pairs of one site pair (every host of site0 probes 2 hosts of site1:
500), generates their history over the look-back (tests/windows_history.py: probe sessions and
one throughput test per hour, scraped every --scrape seconds) plus the series the recording
rules of ``fleet rules`` record (every --rule-interval), loads it into a real Prometheus with
``promtool tsdb create-blocks-from openmetrics`` and runs the profile of ``fleet windows``
(wanprobe.windows.from_prometheus) --runs times from raw series and from recorded ones. Prints,
per mode, the wall time of the whole profile (min-max over the runs) and the samples Prometheus
says the queries touched (``stats=all``: totalQueryableSamples), then per query.

    python bench/windows_query_cost.py [--hosts 2000] [--sites 8] [--representatives 2]
        [--days 14] [--scrape 240] [--rule-interval 90] [--runs 3] [--host-pairs N]

The raw samples scale with host pairs x look-back / scrape interval (a 15 s scrape touches 16x
those of the default 240 s, which keeps generating and loading the history near 10 minutes);
the recorded ones with the look-back / rule interval only.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from common import parser, span, timed  # noqa: E402  (bench/ is on sys.path as a script)
from mesh_targets import build  # noqa: E402
from windows_history import (  # noqa: E402
    HostPair,
    Shape,
    generate,
    load_prometheus,
    openmetrics,
    stop,
    weekday_nights,
)

from wanprobe.mesh.topology import select_peers  # noqa: E402
from wanprobe.windows.from_prometheus import prometheus_profile  # noqa: E402


def site_pair_hosts(hosts: int, sites: int, reps: int) -> list[HostPair]:
    """The host pairs of site0 -> site1 in the mesh the daemons would probe."""
    mesh = build(hosts, sites, reps)
    return [HostPair(me.site, me.name, p.site, p.name) for me in mesh.hosts if me.site == "site0"
            for p in select_peers(mesh, me) if p.site == "site1"]


def measure(url: str, series: str, days: float, runs: int) -> tuple[list[float], list[dict]]:
    """Seconds of each of ``runs`` profiles, and the per-query costs of the last one."""
    def profile() -> list[dict]:
        costs: list[dict] = []
        got = prometheus_profile(url, "site0", "site1", lookback_s=days * 86400, series=series,
                                 costs=costs)
        assert got.source["series"] == series
        return costs

    times, costs = timed(profile, runs)
    return times, costs or []


def main() -> int:
    ap = parser(__doc__, ("--hosts", 2000), ("--sites", 8), ("--representatives", 2),
                ("--days", 14.0),
                ("--scrape", 240.0,
                 "scrape (and session) interval, s; under the 5 min look-back delta"),
                ("--rule-interval", 90.0), ("--runs", 3))
    ap.add_argument("--host-pairs", type=int, default=None, help="use only this many")
    args = ap.parse_args()
    pairs = site_pair_hosts(args.hosts, args.sites, args.representatives)
    print(f"{args.hosts} hosts, {args.sites} sites, {args.representatives} representatives: "
          f"site0 -> site1 has {len(pairs)} host pairs")
    pairs = pairs[:args.host_pairs] if args.host_pairs else pairs
    shape = Shape(weekday_nights())
    t0 = time.perf_counter()
    history = generate(dict.fromkeys(pairs, shape), end_ts=time.time(), days=args.days,
                       session_s=args.scrape)
    with tempfile.TemporaryDirectory(prefix="wanprobe-windows-bench-") as tmp:
        url, proc = load_prometheus(openmetrics(history, recorded_eval_s=args.rule_interval),
                                    Path(tmp))
        print(f"{len(pairs)} host pairs, {args.days:g} days, scrape {args.scrape:g} s, rules every "
              f"{args.rule_interval:g} s: generated and loaded in {time.perf_counter() - t0:.0f} s")
        try:
            for series in ("raw", "recorded"):
                times, costs = measure(url, series, args.days, args.runs)
                samples = sum(c["samples"] or 0 for c in costs)
                print(f"{series:>8}: {span(times)} s per profile "
                      f"(median {statistics.median(times):.2f}, {args.runs} runs), "
                      f"{samples:,} samples")
                for c in costs:
                    print(f"          {c['name']:<16} {c['seconds']:.3f} s  "
                          f"{c['samples'] or 0:>12,} samples")
        finally:
            stop(proc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
