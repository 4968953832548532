#!/usr/bin/env python3
"""Claim (issue 35): from 100 Mbit/s to 5 Gbit/s wanprobe is never the limit of its own
measurement. On the lab at each RTT × rate, each run measures the same link twice in a row:
iperf3 (bbr, tcp_rmem/tcp_wmem max 512 MiB at both ends, ``-t 12 -O 4``), then ``wanprobe
diagnose --quick`` between the same namespaces. Per point, over the runs:

- the capacity diagnose reports is within 0.9-1.15 × iperf3's goodput;
- diagnose's own TCP test (after its ramp-up) is ≥ 0.85 × iperf3;
- no TCP verdict says ``network`` below 0.8 × the capacity it reports.

Also printed, to say which estimate is right here: BBR's own bottleneck estimate from diagnose's
TCP test (TCP_CC_INFO, the largest after the ramp-up) over iperf3, the capacity's source, the
time diagnose took and the host's CPU steal during the run (/proc/stat). Exits 1 when a claim
is missed. Run as root: ``python bench/capacity_vs_rate.py [--rtt 50 130] [--rate 0.1 1 2 5]
[--runs 3] [--json]``. Every lab and process it starts is removed; the root namespace is not
touched (buffers and cc are per namespace).
"""

from __future__ import annotations

import json
import os
import sys
import time

import psutil
from common import lacks_root, parser, span

from wanprobe.lab import Lab, measure, netns
from wanprobe.lab.scenario import run_wanprobe_json, start_reflector

BIG = "4096 131072 536870912"
CAPACITY_BAND = (0.9, 1.15)
TCP_MIN = 0.85
NETWORK_SHARE = 0.8


def _steal(before, after) -> float:
    total = sum(after) - sum(before)
    return 100.0 * (after.steal - before.steal) / total if total > 0 else 0.0


def _bbr_estimate(tput: dict) -> float | None:
    """The largest BBR bandwidth estimate over the test's intervals after the ramp-up."""
    omit = tput.get("omit_s") or 0.0
    vals = [(s.get("tcp_info") or {}).get("bbr_bandwidth_bits_per_second")
            for iv in tput.get("intervals") or [] if iv["start_s"] >= omit - 1e-9
            for s in iv["streams"]]
    vals = [v for v in vals if isinstance(v, int | float)]
    return max(vals) if vals else None


def one_run(lab, seconds: float) -> dict:
    cpu0 = psutil.cpu_times()
    ip3 = measure.iperf3(lab, seconds, "-O", "4", "-C", "bbr").received_bits_per_second
    t0 = time.monotonic()
    report = run_wanprobe_json(lab.a, "diagnose", lab.b.addr, "--quick", timeout_s=300)
    took = time.monotonic() - t0
    steal = _steal(cpu0, psutil.cpu_times())
    m = report["measurements"]
    cap = (m.get("path") or {}).get("capacity_bits_per_second")
    source = (m.get("path") or {}).get("capacity_source")
    tcp = m.get("throughput") or {}
    verdicts = []
    for part in ("throughput", "throughput_reverse"):
        t = m.get(part) or {}
        if t:
            verdicts.append((t["limited_by"]["verdict"], t["bits_per_second"]))
    bad_network = [v for v, bps in verdicts
                   if v == "network" and cap and bps < NETWORK_SHARE * cap]
    return {"iperf3_bits_per_second": ip3, "capacity_bits_per_second": cap,
            "capacity_source": source, "tcp_bits_per_second": tcp.get("bits_per_second"),
            "bbr_estimate_bits_per_second": _bbr_estimate(tcp), "verdicts": verdicts,
            "network_below_capacity": bool(bad_network), "diagnose_s": round(took, 1),
            "steal_percent": round(steal, 2)}


def point(rtt_ms: float, rate_bps: float, runs: int, seconds: float) -> dict:
    with Lab(name=f"cvr{os.getpid() % 10000}", rtt_ms=rtt_ms, rate_bps=rate_bps) as lab:
        for end in (lab.a, lab.b):
            for key, value in (("net.ipv4.tcp_congestion_control", "bbr"),
                               ("net.ipv4.tcp_rmem", BIG), ("net.ipv4.tcp_wmem", BIG)):
                end.run(["sysctl", "-q", "-w", f"{key}={value}"], check=True)
        reflector = start_reflector(lab)
        try:
            rows = [one_run(lab, seconds) for _ in range(runs)]
        finally:
            netns.stop(reflector)
    return {"rtt_ms": rtt_ms, "rate_bps": rate_bps, "runs": rows}


def ratios(p: dict, key: str) -> list[float]:
    return [r[key] / r["iperf3_bits_per_second"] for r in p["runs"]
            if r[key] and r["iperf3_bits_per_second"]]


def verdict(p: dict) -> bool:
    cap, tcp = ratios(p, "capacity_bits_per_second"), ratios(p, "tcp_bits_per_second")
    return (len(cap) == len(p["runs"]) and all(CAPACITY_BAND[0] <= x <= CAPACITY_BAND[1]
                                               for x in cap)
            and len(tcp) == len(p["runs"]) and all(x >= TCP_MIN for x in tcp)
            and not any(r["network_below_capacity"] for r in p["runs"]))


def show(p: dict) -> str:
    ip3 = [r["iperf3_bits_per_second"] / 1e6 for r in p["runs"]]
    bbr = ratios(p, "bbr_estimate_bits_per_second")
    sources = sorted({r["capacity_source"] or "-" for r in p["runs"]})
    return (f"{p['rtt_ms']:4.0f} ms {p['rate_bps'] / 1e9:4.1f} Gbit/s  iperf3 "
            f"{span(ip3, '.0f')} Mbit/s  capacity/iperf3 "
            f"{span(ratios(p, 'capacity_bits_per_second') or [0], '.3f')} ({','.join(sources)})"
            f"  tcp/iperf3 {span(ratios(p, 'tcp_bits_per_second') or [0], '.3f')}"
            f"  bbr/iperf3 {span(bbr, '.3f') if bbr else '-'}"
            f"  diagnose {span([r['diagnose_s'] for r in p['runs']], '.0f')} s"
            f"  steal {span([r['steal_percent'] for r in p['runs']], '.1f')} %"
            f"  {'ok' if verdict(p) else 'MISSED'}")


def main() -> int:
    args = parser(__doc__, ("--rtt", [50.0, 130.0], "RTTs in ms"),
                  ("--rate", [0.1, 1.0, 2.0, 5.0], "rates in Gbit/s"),
                  ("--runs", 3), ("--seconds", 12.0, "iperf3 -t (after -O 4)"),
                  ("--json", False), first_line=True).parse_args()
    if lacks_root():
        return 2
    points = []
    for rtt in args.rtt:
        for rate in args.rate:
            p = point(rtt, rate * 1e9, args.runs, args.seconds)
            points.append(p)
            if not args.json:
                print(show(p), flush=True)
    if args.json:
        print(json.dumps(points, indent=1))
    return 0 if all(verdict(p) for p in points) else 1


if __name__ == "__main__":
    sys.exit(main())
