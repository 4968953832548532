#!/usr/bin/env python3
"""Preflight scale: `wanprobe preflight` over N hosts (default 64) — how long the whole run takes
against its 30 s bound, with every host answering and with some silent, and fping probing the
same hosts with the same count and per-host interval in the same run, as a ratio.

Setup (as root): two network namespaces joined by a veth pair; the far one holds N addresses
from 198.18.0.0/15 on its loopback and one `wanprobe reflect` bound to 0.0.0.0 (every host is a
distinct address answered by a real STAMP reflector, which also serves host facts); the near
one runs preflight and fping. "Silent" hosts have every packet dropped by iptables in the far
namespace, so preflight pays its ICMP fallback for them.

    python bench/preflight_scale.py [--hosts 64] [--silent 8] [--runs 3] [--count 200]

BENCH_DEBUG=1 also prints the first host's reasons and both namespaces' UDP receive-buffer
drops (nstat UdpRcvbufErrors): where replies were lost when the probe rate was too high.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import lacks_root, parser, span


def sh(*argv: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=True, capture_output=True, text=True, **kw)


def addresses(n: int) -> list[str]:
    return [f"198.18.{100 + i // 250}.{1 + i % 250}" for i in range(n)]


def setup(near: str, far: str, n: int) -> None:
    for ns in (near, far):
        sh("ip", "netns", "add", ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
    sh("ip", "link", "add", "wpv0", "netns", near, "type", "veth", "peer", "name", "wpv1",
       "netns", far)
    batch_near = ("address add 198.18.0.1/30 dev wpv0\nlink set wpv0 up\n"
                  "route add 198.18.100.0/22 via 198.18.0.2\n")
    batch_far = ("address add 198.18.0.2/30 dev wpv1\nlink set wpv1 up\n"
                 + "".join(f"address add {a}/32 dev lo\n" for a in addresses(n)))
    subprocess.run(["ip", "-n", near, "-batch", "-"], input=batch_near, text=True, check=True)
    subprocess.run(["ip", "-n", far, "-batch", "-"], input=batch_far, text=True, check=True)


def preflight(near: str, hosts: Path, count: int) -> tuple[float, float, dict]:
    """(elapsed_s the command reports, wall s of the process, the document)."""
    t0 = time.monotonic()
    r = subprocess.run(["ip", "netns", "exec", near, sys.executable, "-m", "wanprobe", "preflight",
                        "--hosts", str(hosts), "--json", "--count", str(count),
                        "--history", "/nonexistent"], capture_output=True, text=True, timeout=120)
    wall = time.monotonic() - t0
    doc = json.loads(r.stdout)
    return doc["elapsed_s"], wall, doc


def fping(near: str, targets: list[str], count: int) -> float:
    t0 = time.monotonic()
    subprocess.run(["ip", "netns", "exec", near, "fping", "-q", "-C", str(count), "-p", "10",
                    "-i", "1", "-t", "1000", *targets], capture_output=True, timeout=300)
    return time.monotonic() - t0


def main() -> int:
    args = parser(__doc__, ("--hosts", 64), ("--silent", 8), ("--runs", 3),
                  ("--count", 200)).parse_args()
    if lacks_root("network namespaces"):
        return 2
    near, far = f"wppfa{os.getpid()}", f"wppfb{os.getpid()}"
    tmp = Path(tempfile.mkdtemp(prefix="wanprobe-preflight-"))
    reflector = None
    try:
        setup(near, far, args.hosts)
        reflector = subprocess.Popen(["ip", "netns", "exec", far, sys.executable, "-m", "wanprobe",
                                      "reflect", "--bind", "0.0.0.0", "--rate-limit", "100000"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(5)
        hosts = tmp / "hosts"
        targets = addresses(args.hosts)
        hosts.write_text("".join(f"{a}\n" for a in targets))
        rows = {}
        for label, silent in (("all answer", 0), (f"{args.silent} silent", args.silent)):
            for a in targets[:silent]:
                sh("ip", "netns", "exec", far, "iptables", "-A", "INPUT", "-d", a, "-j", "DROP")
            runs = [preflight(near, hosts, args.count) for _ in range(args.runs)]
            fp = [fping(near, targets, args.count) for _ in range(args.runs)]
            nogo = sum(not h["go"] for h in runs[-1][2]["hosts"])
            if os.environ.get("BENCH_DEBUG"):
                print(json.dumps([h["reasons"] for h in runs[-1][2]["hosts"]][:1])[:300])
                for ns in (near, far):
                    print(ns, sh("ip", "netns", "exec", ns, "nstat", "-az", "UdpRcvbufErrors",
                                 "UdpInErrors", "UdpInDatagrams").stdout)
            rows[label] = (runs, fp, nogo)
            sh("ip", "netns", "exec", far, "iptables", "-F", "INPUT")
        print(f"preflight over {args.hosts} hosts, {args.count} probes each "
              f"(bound {runs[0][2]['bound_s']:g} s), {args.runs} runs:")
        for label, (runs, fp, nogo) in rows.items():
            el = [r[0] for r in runs]
            wall = [r[1] for r in runs]
            print(f"  {label:>10}: elapsed {span(el)} s (process {span(wall)} s), {nogo} no-go; "
                  f"fping same targets/count {span(fp)} s; preflight/fping "
                  f"{span([min(el) / max(fp), max(el) / min(fp)])}x")
        return 0
    finally:
        if reflector is not None:
            reflector.kill()
            reflector.wait(10)
        for ns in (near, far):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
