#!/usr/bin/env python3
"""Capacity of the lab's delay line, measured with iperf3 and iputils ping in the same run.

1. iperf3 TCP throughput through the delay line at 20 ms RTT, no rate limit (target ≥ 500 Mbit/s).
2. Added RTT error at 1 kpps: ``ping -i 0.001`` median minus the configured RTT (target < 0.2 ms;
   measured on the same lab switched to 5 ms, where ping prints 10 µs resolution),
   next to the same ping over a plain veth pair (no delay line) as the host's own floor.

Run as root: ``python bench/lab_capacity.py [--seconds 10] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from common import veth_pair

from wanprobe.lab import Lab, measure

TARGET_MBIT = 500.0
TARGET_RTT_ERR_MS = 0.2


def veth_floor_ms(count: int) -> float | None:
    """ping median over a bare veth pair between two fresh namespaces (no delay line)."""
    try:
        with veth_pair(f"wpbench{os.getpid()}", "198.19.255.1", "198.19.255.2", 30) as (a, _b):
            r = subprocess.run(["ip", "netns", "exec", a, "ping", "-n", "-c", str(count), "-i",
                                "0.001", "198.19.255.2"], capture_output=True, text=True)
            return measure.median(measure.parse_ping_rtts_ms(r.stdout))
    except subprocess.CalledProcessError:
        return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0, help="iperf3 duration")
    ap.add_argument("--pings", type=int, default=3000, help="pings at 1 kpps")
    ap.add_argument("--rtt-ms", type=float, default=20.0)
    ap.add_argument("--ping-rtt-ms", type=float, default=5.0, help="RTT for the 1 kpps ping")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    with Lab(name=f"bench{os.getpid()}", rtt_ms=args.rtt_ms) as lab:
        tcp = measure.iperf3(lab, args.seconds)
        stats = lab.stats()
        offset_ms = stats["offset_ns"] / 1e6
        # iputils prints 2 decimals below 10 ms RTT, 1 decimal up to 100 ms: ping a 5 ms link
        lab.update(rtt_ms=args.ping_rtt_ms)
        r = lab.a.run(["ping", "-n", "-c", str(args.pings), "-i", "0.001", lab.b.addr],
                      capture_output=True, text=True)
        rtts = measure.parse_ping_rtts_ms(r.stdout)
    floor = veth_floor_ms(args.pings)
    mbit = tcp.received_bits_per_second / 1e6
    med = measure.median(rtts)
    err = med - args.ping_rtt_ms if med is not None else None
    ab = stats["ab"]
    result = {
        "rtt_ms": args.rtt_ms,
        "iperf3_mbit_per_s": round(mbit, 1),
        "iperf3_retransmits": tcp.retransmits,
        "gso_segments_per_read": round(ab["segments"] / max(ab["packets"], 1), 1),
        "ping_rtt_ms": args.ping_rtt_ms,
        "ping_1kpps_median_ms": med,
        "ping_1kpps_replies": len(rtts),
        "added_rtt_error_ms": round(err, 3) if err is not None else None,
        "calibration_offset_ms_per_direction": offset_ms,
        "added_rtt_error_uncalibrated_ms": round(err + 2 * offset_ms, 3) if err is not None else None,
        "veth_floor_median_ms": floor,
        "throughput": "PASS" if mbit >= TARGET_MBIT else "MISS",
        "rtt_error": "PASS" if err is not None and abs(err) < TARGET_RTT_ERR_MS else "MISS",
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(f"delay line at {args.rtt_ms:g} ms RTT, {os.cpu_count()} CPUs")
        print(f"  iperf3 TCP through the delay line: {mbit:8.1f} Mbit/s   target ≥ {TARGET_MBIT:g}"
              f"   ratio {mbit / TARGET_MBIT:.2f}   {result['throughput']}"
              f"   ({result['gso_segments_per_read']} segments per TUN read)")
        print(f"  ping at 1 kpps, median:            {med:8.3f} ms      configured {args.ping_rtt_ms:g} ms"
              f"   added error {err:+.3f} ms (target < {TARGET_RTT_ERR_MS}) {result['rtt_error']}")
        print(f"  (the lab measured and subtracted {offset_ms * 1e3:.0f} µs per direction of host overhead"
              f" at start-up; without it the error would be {err + 2 * offset_ms:+.3f} ms)")
        if floor is not None:
            print(f"  same ping over a bare veth pair:   {floor:8.3f} ms      (host floor, no delay line)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
