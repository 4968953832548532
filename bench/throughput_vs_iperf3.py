#!/usr/bin/env python3
"""Claim: wanprobe's TCP throughput test measures as well as iperf3 in the same run.

- unshaped veth pair between two fresh namespaces, 1 and 4 streams: wanprobe ≥ 0.9 × iperf3
  receiver throughput (median over alternating rounds);
- emulated WAN lab at 100 Mbit/s, 60 ms RTT: within 5 % of iperf3.

Prints one line per case with both rates and the ratio; exits 1 when a claim is missed.
Run as root: ``python bench/throughput_vs_iperf3.py [--rounds 9] [--duration 3]``.
Creates and always deletes its own namespaces (prefix ``wptput``); touches nothing else.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from wanprobe.lab import Lab
from wanprobe.lab.netns import entered
from wanprobe.throughput.client import run_throughput

WP_PORT, IPERF_PORT = 5210, 5201
ADDR_A, ADDR_B = "198.19.0.1", "198.19.0.2"
NO_BYTE_CAP = 2**40
# case, wanprobe bit/s, iperf3 bit/s, median ratio, lowest and highest round ratio, claim met
Row = tuple[str, float, float, float, float, float, bool]


def _servers(run_in_b, addr: str) -> list[subprocess.Popen]:
    wp = run_in_b([sys.executable, "-m", "wanprobe.throughput.server", "--bind", addr,
                   "--port", str(WP_PORT), "--max-bytes", str(NO_BYTE_CAP)],
                  stdout=subprocess.PIPE, text=True)
    wp.stdout.readline()
    ip3 = run_in_b(["iperf3", "-s", "-B", addr, "-p", str(IPERF_PORT)],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.3)
    return [wp, ip3]


def _compare(ns_a: str, addr_b: str, *, streams: int, rounds: int, duration_s: float):
    wp, ip3 = [], []
    with entered(ns_a):
        for n in range(rounds):
            # Alternate which engine goes first, so warm-up or load drift favours neither.
            for engine in (("iperf3", "wanprobe") if n % 2 == 0 else ("wanprobe", "iperf3")):
                port = IPERF_PORT if engine == "iperf3" else WP_PORT
                # veth moves more than the default 10 GiB cap in 2 s: lift it for both engines,
                # so that both run for the whole duration
                bps = run_throughput(addr_b, port=port, duration_s=duration_s, streams=streams,
                                     engine=engine, max_bytes=NO_BYTE_CAP).bits_per_second
                (ip3 if engine == "iperf3" else wp).append(bps)
    ratios = [w / i for w, i in zip(wp, ip3, strict=True)]
    return (statistics.median(wp), statistics.median(ip3), statistics.median(ratios),
            min(ratios), max(ratios))


def veth_case(rounds: int, duration_s: float) -> list[Row]:
    a, b = f"wptput{os.getpid()}a", f"wptput{os.getpid()}b"
    procs: list[subprocess.Popen] = []
    try:
        for cmd in (["ip", "netns", "add", a], ["ip", "netns", "add", b],
                    ["ip", "link", "add", "vb0", "netns", a, "type", "veth", "peer", "name", "vb1",
                     "netns", b],
                    ["ip", "-n", a, "addr", "add", f"{ADDR_A}/24", "dev", "vb0"],
                    ["ip", "-n", b, "addr", "add", f"{ADDR_B}/24", "dev", "vb1"],
                    ["ip", "-n", a, "link", "set", "vb0", "up"],
                    ["ip", "-n", b, "link", "set", "vb1", "up"]):
            subprocess.run(cmd, check=True, capture_output=True)
        procs = _servers(lambda argv, **kw: subprocess.Popen(["ip", "netns", "exec", b, *argv],
                                                             **kw), ADDR_B)
        out = []
        for streams in (1, 4):
            w, i, r, lo, hi = _compare(a, ADDR_B, streams=streams, rounds=rounds,
                                       duration_s=duration_s)
            out.append((f"veth unshaped, {streams} stream(s)", w, i, r, lo, hi, r >= 0.9))
        return out
    finally:
        for p in procs:
            p.kill()
            p.wait()
        for ns in (a, b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def lab_case(rounds: int, duration_s: float) -> list[Row]:
    procs: list[subprocess.Popen] = []
    with Lab(name=f"wptput{os.getpid()}", rtt_ms=60, rate_bps=100e6) as lab:
        try:
            procs = _servers(lab.b.popen, lab.b.addr)
            w, i, r, lo, hi = _compare(lab.a.name, lab.b.addr, streams=1, rounds=rounds,
                                       duration_s=duration_s)
        finally:
            for p in procs:
                p.kill()
                p.wait()
    return [("lab 100 Mbit/s 60 ms, 1 stream", w, i, r, lo, hi, abs(r - 1) <= 0.05)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # Per-round ratios on the 2-core VM spread over 0.4-1.3 (host noise hits both engines), and
    # repeated 9-round medians still differ by several percent: hence the range column.
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--duration", type=float, default=3.0)
    args = parser.parse_args()
    rows = veth_case(args.rounds, args.duration) + lab_case(args.rounds, args.duration + 1)
    ok = True
    print(f"{'case':36} {'wanprobe Mbit/s':>16} {'iperf3 Mbit/s':>14} {'ratio':>6} "
          f"{'rounds':>11}  claim")
    for name, w, i, r, lo, hi, met in rows:
        ok &= met
        print(f"{name:36} {w / 1e6:16.1f} {i / 1e6:14.1f} {r:6.3f} {lo:5.2f}-{hi:<5.2f}  "
              f"{'met' if met else 'MISSED'}")
    print(f"(ratio: median and range of the per-round ratios; medians of {args.rounds} rounds "
          f"of {args.duration:g} s, engine order alternating; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
