#!/usr/bin/env python3
"""`wanprobe ring` against iperf3 on the same links, in a two-site lab (two hosts per site, one
WAN link each way, 35 ms): for each rate, three runs of the naive ring (tpe1 → tyo1 → tpe2 →
tyo2, every edge across the WAN) with its proposed order, and in the same run iperf3 (bbr,
4 streams like the ring's; both on tcp_rmem/tcp_wmem raised to 64 MiB inside each host
namespace, the root namespace untouched): one WAN pair alone, and the two pairs of one
direction at once. Prints the ring's figures over iperf3's: alone/iperf3 alone, together/iperf3
two-at-once, proposed ring/iperf3 alone. Needs root and iperf3.

Usage: python bench/ring_vs_pairs.py [--rates 100e6 1e9] [--runs 3] [--json]
"""

from __future__ import annotations

import json
import select
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from common import lacks_root, parser, span  # noqa: E402

from wanprobe.lab import netns  # noqa: E402
from wanprobe.lab.sites import SitesLab, sites_profile  # noqa: E402

KEY = "ring-bench-shared-key-0123456789"
RTT_MS = 35.0
NAIVE = ("tpe1", "tyo1", "tpe2", "tyo2")
BUFFERS = "4096 131072 67108864"  # per-namespace autotuning up to 64 MiB (root untouched)


def iperf3(lab, pairs, rate: float, secs: int = 5) -> list[float]:
    """Receiver goodput of each (src, dst) pair run at once (iperf3 -O 1, bbr, 4 streams);
    once more if a server was not listening yet."""
    try:
        return _iperf3(lab, pairs, rate, secs)
    except SystemExit:
        time.sleep(2.0)
        return _iperf3(lab, pairs, rate, secs)


def _iperf3(lab, pairs, rate: float, secs: int) -> list[float]:
    servers = [lab.host(d).popen(["iperf3", "-s", "-1", "-p", str(5300 + i)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for i, (_, d) in enumerate(pairs)]
    time.sleep(1.0)
    clients = [lab.host(s).popen(["iperf3", "-c", lab.host(d).addr, "-p", str(5300 + i), "-t",
                                  str(secs), "-O", "1", "-P", "4", "-C", "bbr", "-J"], stdout=subprocess.PIPE, text=True)
               for i, (s, d) in enumerate(pairs)]
    out = [json.loads(c.communicate(timeout=secs + 60)[0]) for c in clients]
    for s in servers:
        netns.stop(s, 5)
    bad = [o.get("error") for o in out if "sum_received" not in o.get("end", {})]
    if bad:
        raise SystemExit(f"iperf3 failed: {bad[0]}")
    return [o["end"]["sum_received"]["bits_per_second"] for o in out]


def ring(lab, key: Path) -> dict:
    argv = [sys.executable, "-m", "wanprobe", "ring", *[lab.host(h).addr for h in NAIVE],
            "--hmac-key-file", str(key), "--duration", "5s", "--omit", "1s", "--streams", "4",
            "--json"]
    r = lab.host("tpe1").run(argv, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise SystemExit(f"ring failed: {r.stderr.strip()}")
    return json.loads(r.stdout)


def one_rate(rate: float, runs: int, key: Path) -> dict:
    sites, links = sites_profile("tpe-tyo", hosts=2)
    links = {k: v.changed(rate_bps=rate, jitter_ms=0.0) for k, v in links.items()}
    lab = SitesLab("rbench", sites, links)
    procs, rows = [], []
    try:
        lab.up()
        for h in lab.hosts:  # generous autotuning in each host namespace, the same for both
            h.run(["sysctl", "-q", "-w", f"net.ipv4.tcp_rmem={BUFFERS}",
                   f"net.ipv4.tcp_wmem={BUFFERS}"], check=True)
            p = h.popen([sys.executable, "-m", "wanprobe", "reflect", "--bind", h.addr, "--allow",
                         "198.18.0.0/15", "--hmac-key-file", str(key)],
                        stderr=subprocess.PIPE, text=True)
            select.select([p.stderr], [], [], 30)
            p.stderr.readline()
            procs.append(p)
        for _ in range(runs):
            doc = ring(lab, key)
            wan = [e for e in doc["edges"] if e["wan"]]
            alone = iperf3(lab, [("tpe1", "tyo1")], rate)[0]
            both = iperf3(lab, [("tpe1", "tyo1"), ("tpe2", "tyo2")], rate)
            rows.append({
                "ring_alone_mean": statistics.mean(e["alone_bits_per_second"] for e in wan),
                "ring_together_mean": statistics.mean(e["bits_per_second"] for e in wan),
                "ring": doc["ring_bits_per_second"], "best": doc["best_ring_bits_per_second"],
                "iperf3_alone": alone, "iperf3_two_at_once_mean": statistics.mean(both),
                "notes": doc["notes"]})
    finally:
        for p in procs:
            netns.stop(p, 10)
        lab.down()
    return {"rate_bps": rate, "runs": rows}


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__, ("--rates", [100e6, 1e9]), ("--runs", 3), ("--json", False)
                  ).parse_args(argv)
    if lacks_root():
        return 1
    with tempfile.TemporaryDirectory() as d:
        key = Path(d) / "key"
        key.write_text(KEY)
        key.chmod(0o600)
        results = [one_rate(rate, args.runs, key) for rate in args.rates]
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    for res in results:
        rows = res["runs"]
        print(f"{res['rate_bps'] / 1e6:g} Mbit/s link, 35 ms, {len(rows)} runs:")
        print("  ring edge alone / iperf3 alone          "
              + span(r["ring_alone_mean"] / r["iperf3_alone"] for r in rows))
        print("  ring edge together / iperf3 two at once "
              + span(r["ring_together_mean"] / r["iperf3_two_at_once_mean"] for r in rows))
        print("  naive ring / iperf3 alone               "
              + span(r["ring"] / r["iperf3_alone"] for r in rows))
        print("  proposed ring / iperf3 alone            "
              + span(r["best"] / r["iperf3_alone"] for r in rows))
        print("  proposed ring / link                    "
              + span(r["best"] / res["rate_bps"] for r in rows))
        for note in sorted({n for r in rows for n in r["notes"] if "CPU" in n}):
            print(f"  note: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
