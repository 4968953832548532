#!/usr/bin/env python3
"""Tuned vs oracle over a grid of RTT × loss on the lab (issue 13; line rate, issue 35).

For each point: iperf3 with bbr and 64 MiB buffers at both ends (512 MiB from 1 Gbit/s: the
oracle), then both ends
untuned (reno, 256 KiB), `wanprobe diagnose` → `tune plan --host local|peer` → `tune apply` at
each end, and the same iperf3 run again (tuned). Prints tuned/oracle and the applied tcp_rmem
max over the BDP wanprobe measured (capacity × min RTT), whether the rollback restored every
sysctl at both ends, and what the plans leave to the operator (the NCCL socket counts when one
stream cannot fill the path). Ramp-up omitted (-O), best of two runs; ``--runs`` repeats each
point and prints the range.

Run as root: ``python bench/tune_vs_oracle.py [--rtt 20,60,130,250] [--loss 0,0.001,0.01]
[--rate 100mbit] [--seconds 4] [--omit 2] [--runs 1] [--json]``. Figures taken on a shared
machine are noisy.
"""

from __future__ import annotations

import argparse
import json
import os

from wanprobe.lab.tune_check import LINE_RATE_ORACLE_BUFFER, ORACLE_BUFFER, run_point
from wanprobe.units import parse_rate_bps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rtt", default="20,60,130,250", help="RTTs in ms, comma separated")
    ap.add_argument("--loss", default="0,0.001,0.01", help="loss ratios, comma separated")
    ap.add_argument("--rate", default="100mbit")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--omit", type=float, default=2.0)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rate = parse_rate_bps(args.rate)
    oracle = LINE_RATE_ORACLE_BUFFER if rate >= 1e9 else ORACLE_BUFFER
    rows = []
    for rtt in (float(x) for x in args.rtt.split(",")):
        for loss in (float(x) for x in args.loss.split(",")):
            for _ in range(args.runs):
                p = run_point(f"tvo{os.getpid() % 10000}", rtt_ms=rtt, loss=loss, rate_bps=rate,
                              seconds=args.seconds, omit_s=args.omit, oracle_buffer=oracle)
                rows.append(p.to_json())
                if not args.json:
                    b2b = p.buffer_to_bdp
                    print(f"rtt {rtt:5.0f} ms  loss {loss:6.2%}  oracle "
                          f"{p.oracle_bits_per_second / 1e6:6.1f}  tuned "
                          f"{p.tuned_bits_per_second / 1e6:6.1f} Mbit/s  tuned/oracle "
                          f"{p.tuned_to_oracle:4.2f}  tcp_rmem/BDP {b2b:5.1f}  rollback exact "
                          f"{p.rollback_exact}  manual {' '.join(p.plan_manual) or '-'}"
                          if b2b else f"rtt {rtt} loss {loss}: no buffer applied "
                          f"({p.to_json()})", flush=True)
    if args.json:
        print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
