#!/usr/bin/env python3
"""Time and peak memory of `fleet matrix` and `fleet windows` against a fake Prometheus that
answers every query with N series (issue 37: 150,000 series took 51 s and 342 MB in `windows`,
529 MB in `matrix`).

Serves tests/hostile_prometheus.py's answer of --series series (one host pair each, one point)
on loopback, and runs each command as its own process (``python -m wanprobe``) --runs times,
first against one series (the same code path: the baseline), then against N. Then `fleet
windows` against answers just under the byte cap (MAX_REPLY_BYTES) split into --cap-series
series: the most a query can hold in memory. Prints the exit code, the error line, the wall
time (min-max over the runs) and the process's peak RSS (VmHWM, read as it exits).

    python bench/fleet_hostile_prometheus.py [--series 150000] [--runs 3]
        [--cap-series 1 100 10000]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from common import parser, span  # noqa: E402  (bench/ is on sys.path as a script)
from hostile_prometheus import (  # noqa: E402
    Fake,
    filling,
    fixed,
    many_series,
    run_measured,
    series,
    serving,
)

from wanprobe.fleet.prom_http import MAX_REPLY_BYTES  # noqa: E402

COMMANDS = {"matrix": ["fleet", "matrix", "--json"],
            "windows": ["fleet", "windows", "--from-site", "tpe", "--to-site", "usw",
                        "--bytes", "1GB", "--series", "raw"]}


def measure(argv: list[str], fake: Fake, runs: int, tmp: Path
            ) -> tuple[int, str, list[float], int]:
    """(exit code, first stderr line, wall seconds per run, highest peak RSS in bytes)."""
    seconds, peak, code, line = [], 0, 0, ""
    with serving(fake) as url:
        for _ in range(runs):
            code, err, rss, wall = run_measured([*argv, "--prometheus", url], tmp)
            seconds.append(wall)
            peak = max(peak, rss)
            line = (err.strip().splitlines() or [""])[0]
    return code, line, seconds, peak


def main() -> int:
    args = parser(__doc__, ("--series", 150_000), ("--runs", 3),
                  ("--cap-series", [1, 100, 10_000])).parse_args()
    with tempfile.TemporaryDirectory(prefix="wanprobe-hostile-prom-") as tmp:
        for name, argv in COMMANDS.items():
            kind = "vector" if name == "matrix" else "matrix"
            size = len(many_series(kind, args.series, 0.0))
            print(f"fleet {name}: an answer of {args.series:,} series is {size / 2**20:.1f} MiB")
            for n in (1, args.series):
                code, line, seconds, peak = measure(argv, series(n), args.runs, Path(tmp))
                print(f"  {n:>7,} series: exit {code}, {span(seconds)} s, peak RSS "
                      f"{peak / 2**20:.0f} MiB  {line[:150]}")
        print(f"fleet windows, answers just under the {MAX_REPLY_BYTES / 2**20:g} MiB cap:")
        for n in args.cap_series:
            body = filling(n, MAX_REPLY_BYTES - 2**16)
            code, line, seconds, peak = measure(COMMANDS["windows"], fixed(body), args.runs,
                                                Path(tmp))
            print(f"  {n:>7,} series, {len(body) / 2**20:.1f} MiB: exit {code}, {span(seconds)} s, "
                  f"peak RSS {peak / 2**20:.0f} MiB  {line[:150]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
