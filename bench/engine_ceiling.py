#!/usr/bin/env python3
"""Claim (issue 35): wanprobe's own engines reach more on this machine than the lab carries, so
the lab's figures are the lab's, not the engine's.

- the engines' ceilings on an unshaped veth pair between two fresh namespaces (no delay line):
  the UDP burst path (GSO sender, the far end's own GRO socket) asked for 60 Gbit/s for 0.5 s,
  and the TCP engine with one stream for 3 s;
- what the lab carries, unshaped, at 130 ms: iperf3 with one stream and bbr, 512 MiB buffers
  (``-t 6 -O 3``).

Prints each figure's range over ``--runs`` runs and the ratio of the lowest ceiling to the
highest lab figure (claim: ≥ 1). Run as root: ``python bench/engine_ceiling.py [--runs 3]``.
Creates and deletes its own namespaces (prefix ``wpceil``); the root namespace is untouched.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from common import lacks_root, parser, span, veth_pair

from wanprobe.diagnose.throughput_verdict import JUDGE
from wanprobe.lab import Lab, measure
from wanprobe.lab.netns import entered
from wanprobe.throughput.client import run_throughput

PORT = 5212
ADDR_A, ADDR_B = "198.19.1.1", "198.19.1.2"
BIG = "4096 131072 536870912"


def _server(popen, addr: str) -> subprocess.Popen:
    proc = popen([sys.executable, "-m", "wanprobe.throughput.server", "--bind", addr,
                  "--port", str(PORT), "--max-bytes", str(2**40)],
                 stdout=subprocess.PIPE, text=True)
    proc.stdout.readline()
    return proc


def veth_ceilings(runs: int) -> tuple[list[float], list[float], list[int | None]]:
    with veth_pair(f"wpceil{os.getpid()}", ADDR_A, ADDR_B) as (a, b):
        server = _server(lambda argv, **kw: subprocess.Popen(["ip", "netns", "exec", b, *argv],
                                                             **kw), ADDR_B)
        try:
            udp, tcp, drops = [], [], []
            with entered(a):
                for _ in range(runs):
                    r = run_throughput(ADDR_B, port=PORT, udp=True, udp_rate_bps=60e9,
                                       duration_s=0.5, interval_s=0.5, max_bytes=2**40)
                    udp.append(r.udp.bits_per_second)
                    drops.append(r.udp.host_drop_events)
                    time.sleep(0.5)
                    tcp.append(run_throughput(ADDR_B, port=PORT, duration_s=3.0,
                                              max_bytes=2**40, judge=JUDGE).bits_per_second)
            return udp, tcp, drops
        finally:
            server.kill()
            server.wait()


def lab_carries(runs: int) -> list[float]:
    with Lab(name=f"wpceil{os.getpid() % 10000}", rtt_ms=130) as lab:
        for end in (lab.a, lab.b):
            for key, value in (("net.ipv4.tcp_congestion_control", "bbr"),
                               ("net.ipv4.tcp_rmem", BIG), ("net.ipv4.tcp_wmem", BIG)):
                end.run(["sysctl", "-q", "-w", f"{key}={value}"], check=True)
        return [measure.iperf3(lab, 6, "-O", "3").received_bits_per_second for _ in range(runs)]


def main() -> int:
    args = parser(__doc__, ("--runs", 3), first_line=True).parse_args()
    if lacks_root():
        return 2
    udp, tcp, drops = veth_ceilings(args.runs)
    lab = lab_carries(args.runs)
    gbit = [x / 1e9 for x in udp], [x / 1e9 for x in tcp], [x / 1e9 for x in lab]
    ratio = min(min(udp), min(tcp)) / max(lab)
    print(f"engine ceiling, veth: UDP bursts {span(gbit[0])} Gbit/s (the far end's own drop "
          f"events per run: {drops}), TCP one stream "
          f"{span(gbit[1])} Gbit/s; the lab carries (130 ms, unshaped, iperf3 one stream) "
          f"{span(gbit[2])} Gbit/s; lowest ceiling / highest lab figure {ratio:.2f} "
          f"({'met' if ratio >= 1 else 'MISSED'}; {args.runs} runs, load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
    return 0 if ratio >= 1 else 1


if __name__ == "__main__":
    sys.exit(main())
