"""How long one full counter collection takes on this host (target < 50 ms, so the daemon can
sample every few seconds).

Times, median of N runs each:
  * ``collectors.snapshot.collect()`` — one-shot: opens its rtnetlink/ethtool sockets each time;
  * ``Collector.sample()`` — persistent handles, as the daemon and ``counters --watch`` use;
  * the shell equivalent measured in the same run: ``ethtool -S`` for every netdev +
    ``ip -j -s link`` + ``tc -j -s qdisc`` + reading /proc/net/{snmp,netstat}.

Prints milliseconds, the ratio to the shell equivalent, and PASS/MISS against the target.
Usage: python bench/collect_speed.py [-n 50]
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import parser, timed  # noqa: E402  (bench/ is on sys.path as a script)

from collectors.snapshot import Collector, collect  # noqa: E402

TARGET_MS = 50.0


def median_ms(fn, n: int) -> tuple[float, float, float]:
    fn()  # warm up (imports, first socket)
    xs = [s * 1e3 for s in timed(fn, n)[0]]
    return statistics.median(xs), min(xs), max(xs)


def shell_equivalent() -> None:
    for name in os.listdir("/sys/class/net"):
        subprocess.run(["ethtool", "-S", name], capture_output=True)
    subprocess.run(["ip", "-j", "-s", "link"], capture_output=True)
    subprocess.run(["tc", "-j", "-s", "qdisc"], capture_output=True)
    for f in ("/proc/net/snmp", "/proc/net/netstat"):
        Path(f).read_bytes()


def main() -> int:
    n = parser(__doc__, ("-n", 50, "runs per measurement (median reported)"),
               first_line=True).parse_args().n
    snap = collect()
    counters = sum(len(cs.values) for cs in snap.counter_sets().values())
    print(f"host: {len(snap.netdevs)} netdevs, {len(snap.rdma)} RDMA devices, "
          f"{counters} counters per sample, {len(snap.errors)} errors; {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.2f}")
    one_shot = median_ms(collect, n)
    with Collector() as c:
        persistent = median_ms(c.sample, n)
    shell = None
    if shutil.which("ethtool") and shutil.which("ip") and shutil.which("tc"):
        shell = median_ms(shell_equivalent, max(5, n // 5))
    for label, (med, lo, hi) in (("collect() one-shot", one_shot),
                                 ("Collector.sample() persistent", persistent)):
        ratio = f"; shell-equivalent/ours = {shell[0] / med:.2f}" if shell else ""
        verdict = "PASS" if med < TARGET_MS else "MISS"
        print(f"{label:32s} median {med:6.1f} ms (min {lo:.1f}, max {hi:.1f}; n={n}) "
              f"target < {TARGET_MS:.0f} ms: {verdict}{ratio}")
    if shell:
        print(f"{'shell equivalent':32s} median {shell[0]:6.1f} ms (ethtool -S ×"
              f"{len(os.listdir('/sys/class/net'))}, ip -s link, tc -s qdisc, /proc/net)")
    return 0 if one_shot[0] < TARGET_MS else 1


if __name__ == "__main__":
    sys.exit(main())
