#!/usr/bin/env python3
"""Claim: wanprobe's TCP throughput engine is never the limit before iperf3 is (issue 26).

- unshaped veth pair between two fresh namespaces, 1, 4, 8 and 16 streams: wanprobe ≥ 1.0 ×
  iperf3 receiver throughput (median of the per-round ratios over alternating rounds), with
  each engine's own CPU per Gbit moved beside it (wanprobe: its data workers and processes at
  both ends, result cpu.engine_cpu_seconds_per_gigabit; iperf3: its client's and server's
  cpu_utilization_percent host_total + remote_total, src/iperf_api.c);
- emulated WAN lab at 100 Mbit/s, 60 ms RTT: within 5 % of iperf3.

Prints one line per case with both rates, the ratio and the CPU figures; exits 1 when a claim
is missed. Run as root: ``python bench/throughput_vs_iperf3.py [--rounds 3] [--duration 3]``.
Creates and always deletes its own namespaces (prefix ``wptput``); touches nothing else.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from common import veth_pair

from wanprobe.diagnose.throughput_verdict import JUDGE
from wanprobe.lab import Lab
from wanprobe.lab.netns import entered
from wanprobe.throughput.client import run_throughput

WP_PORT, IPERF_PORT = 5210, 5201
ADDR_A, ADDR_B = "198.19.0.1", "198.19.0.2"
NO_BYTE_CAP = 2**40
VETH_STREAMS = (1, 4, 8, 16)
# case, wanprobe bit/s, iperf3 bit/s, median ratio, lowest and highest round ratio,
# CPU s/Gbit of wanprobe and of iperf3 (medians), claim met
Row = tuple[str, float, float, float, float, float, float | None, float | None, bool]


def _cpu_per_gbit(result) -> float | None:
    """The engine's own CPU seconds (both ends) per Gbit it moved."""
    cpu = result.cpu or {}
    if result.engine == "wanprobe":
        return cpu.get("engine_cpu_seconds_per_gigabit")
    pct = cpu.get("iperf3_cpu_utilization_percent") or {}
    host, remote = pct.get("host_total"), pct.get("remote_total")
    if host is None or remote is None or not result.bits_per_second:
        return None
    return (host + remote) / 100.0 / (result.bits_per_second / 1e9)


def _median(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


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
    runs: dict[str, list] = {"wanprobe": [], "iperf3": []}
    with entered(ns_a):
        for n in range(rounds):
            # Alternate which engine goes first, so warm-up or load drift favours neither.
            for engine in (("iperf3", "wanprobe") if n % 2 == 0 else ("wanprobe", "iperf3")):
                port = IPERF_PORT if engine == "iperf3" else WP_PORT
                # veth moves more than the default 10 GiB cap in 2 s: lift it for both engines,
                # so that both run for the whole duration
                runs[engine].append(run_throughput(addr_b, port=port, duration_s=duration_s,
                                                   streams=streams, engine=engine,
                                                   max_bytes=NO_BYTE_CAP, judge=JUDGE))
    wp = [r.bits_per_second for r in runs["wanprobe"]]
    ip3 = [r.bits_per_second for r in runs["iperf3"]]
    ratios = [w / i for w, i in zip(wp, ip3, strict=True)]
    return (statistics.median(wp), statistics.median(ip3), statistics.median(ratios),
            min(ratios), max(ratios), _median([_cpu_per_gbit(r) for r in runs["wanprobe"]]),
            _median([_cpu_per_gbit(r) for r in runs["iperf3"]]))


def veth_case(rounds: int, duration_s: float) -> list[Row]:
    procs: list[subprocess.Popen] = []
    with veth_pair(f"wptput{os.getpid()}", ADDR_A, ADDR_B) as (a, b):
        try:
            procs = _servers(lambda argv, **kw: subprocess.Popen(["ip", "netns", "exec", b,
                                                                  *argv], **kw), ADDR_B)
            out = []
            for streams in VETH_STREAMS:
                w, i, r, lo, hi, cw, ci = _compare(a, ADDR_B, streams=streams, rounds=rounds,
                                                   duration_s=duration_s)
                out.append((f"veth unshaped, {streams} stream(s)", w, i, r, lo, hi, cw, ci,
                            r >= 1.0))
            return out
        finally:
            for p in procs:
                p.kill()
                p.wait()


def lab_case(rounds: int, duration_s: float) -> list[Row]:
    procs: list[subprocess.Popen] = []
    with Lab(name=f"wptput{os.getpid()}", rtt_ms=60, rate_bps=100e6) as lab:
        try:
            procs = _servers(lab.b.popen, lab.b.addr)
            w, i, r, lo, hi, cw, ci = _compare(lab.a.name, lab.b.addr, streams=1,
                                               rounds=rounds, duration_s=duration_s)
        finally:
            for p in procs:
                p.kill()
                p.wait()
    return [("lab 100 Mbit/s 60 ms, 1 stream", w, i, r, lo, hi, cw, ci, abs(r - 1) <= 0.05)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # Per-round ratios on the 2-core VM spread widely (host noise hits both engines), hence the
    # range column; a quiet machine is the reference, a loaded one only shows the method works.
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--no-lab", action="store_true", help="veth cases only")
    args = parser.parse_args()
    if args.rounds < 3:
        parser.error("--rounds must be at least 3 (a figure a result rests on is repeated)")
    rows = veth_case(args.rounds, args.duration)
    if not args.no_lab:
        rows += lab_case(args.rounds, args.duration + 1)
    ok = True
    print(f"{'case':32} {'wanprobe Gbit/s':>15} {'iperf3 Gbit/s':>13} {'ratio':>6} "
          f"{'rounds':>11} {'CPU s/Gbit wp':>13} {'iperf3':>7}  claim")
    for name, w, i, r, lo, hi, cw, ci, met in rows:
        ok &= met
        print(f"{name:32} {w / 1e9:15.3f} {i / 1e9:13.3f} {r:6.3f} {lo:5.2f}-{hi:<5.2f} "
              f"{_fmt(cw):>13} {_fmt(ci):>7}  {'met' if met else 'MISSED'}")
    print(f"(ratio: median and range of the per-round ratios; medians of {args.rounds} rounds "
          f"of {args.duration:g} s, engine order alternating; CPU s/Gbit: both ends' CPU "
          f"seconds per Gbit moved, median; load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} CPUs; {_iperf3_version()})")
    return 0 if ok else 1


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}"


def _iperf3_version() -> str:
    out = subprocess.run(["iperf3", "--version"], capture_output=True, text=True).stdout
    return out.splitlines()[0] if out else "iperf3 version unknown"


if __name__ == "__main__":
    sys.exit(main())
