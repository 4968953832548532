#!/usr/bin/env python3
"""One-way delay accuracy on an asymmetric lab link, next to iputils ping in the same run.

A lab with ``--delay-ab`` / ``--delay-ba`` (default 10 / 50 ms), `wanprobe reflect` in namespace
b, then per run: `wanprobe probe --json` from a (forward and reverse one-way p50, the clock bound)
and ``ping`` over the same link (its RTT p50). Prints each run, the range over runs of each
direction's error against the set value (target ≤ 1 ms) and of (forward + reverse) against
ping's RTT.

Run as root: ``python bench/owd_accuracy.py [--runs 5] [--count 200] [--json]``.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys

from common import parser, span

from wanprobe.lab import Lab, measure, netns

TARGET_MS = 1.0


def one_run(lab: Lab, count: int) -> dict:
    r = lab.a.run([sys.executable, "-m", "wanprobe", "probe", lab.b.addr, "--count", str(count),
                   "--interval", "10ms", "--json"], capture_output=True, text=True, timeout=120)
    owd = json.loads(r.stdout)["owd_ms"]
    p = lab.a.run(["ping", "-n", "-c", str(count), "-i", "0.01", lab.b.addr],
                  capture_output=True, text=True, timeout=120)
    return {"forward_p50_ms": owd["forward"]["p50"], "reverse_p50_ms": owd["reverse"]["p50"],
            "bound_ms": owd["clock_error_bound_ms"], "clock_source": owd["clock_source"],
            "ping_p50_ms": measure.median(measure.parse_ping_rtts_ms(p.stdout))}


def main() -> int:
    args = parser(__doc__, ("--runs", 5),
                  ("--count", 200, "probes (and pings) per run, 10 ms apart"),
                  ("--delay-ab-ms", 10.0), ("--delay-ba-ms", 50.0), ("--json", False),
                  first_line=True).parse_args()

    with Lab(name=f"bench{os.getpid()}", delay_ab_ms=args.delay_ab_ms,
             delay_ba_ms=args.delay_ba_ms) as lab:
        refl = lab.b.popen([sys.executable, "-m", "wanprobe", "reflect", "--bind", lab.b.addr],
                           stderr=subprocess.PIPE, text=True)
        try:
            select.select([refl.stderr], [], [], 30)
            refl.stderr.readline()
            runs = [one_run(lab, args.count) for _ in range(args.runs)]
        finally:
            netns.stop(refl, 10)
    fwd_err = [r["forward_p50_ms"] - args.delay_ab_ms for r in runs]
    rev_err = [r["reverse_p50_ms"] - args.delay_ba_ms for r in runs]
    vs_ping = [r["forward_p50_ms"] + r["reverse_p50_ms"] - r["ping_p50_ms"] for r in runs]
    out = {"set_ms": [args.delay_ab_ms, args.delay_ba_ms], "runs": runs,
           "forward_error_ms": [min(fwd_err), max(fwd_err)],
           "reverse_error_ms": [min(rev_err), max(rev_err)],
           "sum_minus_ping_ms": [min(vs_ping), max(vs_ping)]}
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        for r in runs:
            print(f"forward p50 {r['forward_p50_ms']:.3f} ms, reverse p50 {r['reverse_p50_ms']:.3f} "
                  f"ms, ping RTT p50 {r['ping_p50_ms']:.3f} ms, bound {r['bound_ms']} "
                  f"({r['clock_source']})")
        print(f"over {len(runs)} runs: forward error {span(fwd_err, '+.3f', '..')} ms, "
              f"reverse error {span(rev_err, '+.3f', '..')} ms (target ±{TARGET_MS} ms); "
              f"forward + reverse - ping {span(vs_ping, '+.3f', '..')} ms")
    ok = max(map(abs, fwd_err + rev_err)) <= TARGET_MS
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
