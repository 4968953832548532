#!/usr/bin/env python3
"""Scale: wanprobe STAMP-probing N reflector endpoints at 1 probe/s each vs fping, same targets.

Builds two throwaway namespaces joined by a veth pair; namespace B holds N addresses from
198.18.0.0/15 on its loopback device (this kernel has no dummy driver) and ONE `wanprobe reflect` bound to 0.0.0.0 answers all of them
(replies leave from the probed address via IP_PKTINFO). From namespace A, one wanprobe process
runs N concurrent ``probe_stamp`` sessions on one event loop (one socket), then
``fping -C <duration> -p 1000 -i 1`` probes the same N addresses at the same per-target rate.
CPU seconds come from getrusage of each child process (user + system), for the whole process
(wanprobe: interpreter start and imports included) and, for wanprobe, for the probing alone.

Usage (root): python3 bench/probe_scale.py [--targets 500] [--duration 30]
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import os
import resource
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sh(*argv: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), check=check, capture_output=True, text=True, **kw)


def targets(n: int) -> list[str]:
    base = ipaddress.IPv4Address("198.18.1.1")
    return [str(base + i) for i in range(n)]


def setup(ns_a: str, ns_b: str, addrs: list[str]) -> None:
    sh("ip", "netns", "add", ns_a)
    sh("ip", "netns", "add", ns_b)
    sh("ip", "-n", ns_a, "link", "add", "va", "type", "veth", "peer", "name", "vb", "netns", ns_b)
    for ns in (ns_a, ns_b):
        sh("ip", "-n", ns, "link", "set", "lo", "up")
    sh("ip", "-n", ns_a, "addr", "add", "198.18.0.1/30", "dev", "va")
    sh("ip", "-n", ns_a, "link", "set", "va", "up")
    sh("ip", "-n", ns_b, "addr", "add", "198.18.0.2/30", "dev", "vb")
    sh("ip", "-n", ns_b, "link", "set", "vb", "up")
    batch = "".join(f"addr add {a}/32 dev lo\n" for a in addrs)
    subprocess.run(["ip", "-n", ns_b, "-batch", "-"], input=batch, text=True, check=True)
    sh("ip", "-n", ns_a, "route", "add", "198.18.0.0/15", "via", "198.18.0.2")


def teardown(ns_a: str, ns_b: str) -> None:
    for ns in (ns_a, ns_b):
        sh("ip", "netns", "del", ns, check=False)


def cpu_of(argv: list[str]) -> tuple[str, float, float]:
    """Like run_measured, using RUSAGE_CHILDREN deltas (robust to Popen's own wait)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.monotonic()
    res = subprocess.run(argv, capture_output=True, text=True)
    wall = time.monotonic() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return res.stdout + res.stderr, cpu, wall


def worker(addrs: list[str], duration_s: float, port: int, tx_timestamps: bool) -> None:
    """Runs inside namespace A: N concurrent STAMP sessions, prints JSON with rusage."""
    start = resource.getrusage(resource.RUSAGE_SELF)
    from wanprobe.probe.sender import probe_stamp

    async def all_peers():
        return await asyncio.gather(*[
            probe_stamp(a, port=port, duration_s=duration_s, interval_s=1.0, timeout_s=1.0,
                        tx_timestamps=tx_timestamps)
            for a in addrs])

    before = resource.getrusage(resource.RUSAGE_SELF)
    results = asyncio.run(all_peers())
    after = resource.getrusage(resource.RUSAGE_SELF)
    sent = sum(r.loss.sent for r in results)
    received = sum(r.loss.received for r in results)
    print(json.dumps({
        "sent": sent, "received": received,
        "probing_cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "import_cpu_s": (before.ru_utime - start.ru_utime) + (before.ru_stime - start.ru_stime),
        "p50_ms": sorted(r.rtt.p50 for r in results if r.rtt)[len(results) // 2],
    }))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", type=int, default=500)
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--port", type=int, default=862)
    ap.add_argument("--no-tx-timestamps", action="store_true",
                    help="wanprobe reads the clock before sendmsg instead of kernel TX stamps")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--addrs", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.addrs.split(","), args.duration, args.port, not args.no_tx_timestamps)
        return 0
    if os.geteuid() != 0:
        print("probe_scale: needs root (network namespaces)", file=sys.stderr)
        return 2
    addrs = targets(args.targets)
    tag = f"wpbench{os.getpid()}"
    ns_a, ns_b = f"{tag}a", f"{tag}b"
    refl = None
    try:
        setup(ns_a, ns_b, addrs)
        refl = subprocess.Popen(
            ["ip", "netns", "exec", ns_b, sys.executable, "-m", "wanprobe", "reflect", "--bind",
             "0.0.0.0", "--port", str(args.port), "--rate-limit", "100000"],
            stderr=subprocess.PIPE, text=True, cwd=REPO)
        line = refl.stderr.readline()
        if "STAMP on udp" not in line:
            raise SystemExit(f"reflector did not start: {line}")
        out, wp_cpu, wp_wall = cpu_of(
            ["ip", "netns", "exec", ns_a, sys.executable, os.path.abspath(__file__), "--worker",
             "--duration", str(args.duration), "--port", str(args.port), "--addrs", ",".join(addrs),
             *(["--no-tx-timestamps"] if args.no_tx_timestamps else [])])
        wp = json.loads(out.strip().splitlines()[-1])
        count = int(round(args.duration))
        fp_out, fp_cpu, fp_wall = cpu_of(
            ["ip", "netns", "exec", ns_a, "fping", "-q", "-C", str(count), "-p", "1000", "-i", "1",
             "-t", "1000", *addrs])
        fp_lines = [ln for ln in fp_out.splitlines() if " : " in ln]
        fp_sent = sum(len(ln.split(" : ")[1].split()) for ln in fp_lines)
        fp_recv = sum(sum(1 for v in ln.split(" : ")[1].split() if v != "-") for ln in fp_lines)
    finally:
        if refl is not None:
            refl.terminate()
            refl.wait()
        teardown(ns_a, ns_b)
    print(f"targets: {args.targets}, 1 probe/s each for {args.duration:.0f} s")
    mode = "clock before sendmsg" if args.no_tx_timestamps else "kernel TX timestamps"
    print(f"wanprobe (stamp, {mode}): {wp['sent']} sent, {wp['received']} answered, median p50 "
          f"{wp['p50_ms']:.3f} ms, wall {wp_wall:.1f} s")
    print(f"  CPU whole process {wp_cpu:.2f} s (imports {wp['import_cpu_s']:.2f} s, "
          f"probing {wp['probing_cpu_s']:.2f} s)")
    print(f"fping (icmp):     {fp_sent} sent, {fp_recv} answered, wall {fp_wall:.1f} s")
    print(f"  CPU whole process {fp_cpu:.2f} s")
    print(f"ratio wanprobe/fping CPU: whole process {wp_cpu / fp_cpu:.2f}, "
          f"probing only {wp['probing_cpu_s'] / fp_cpu:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
