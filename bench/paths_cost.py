#!/usr/bin/env python3
"""Cost: ``wanprobe paths --flows 16`` vs one ``wanprobe probe`` sending the same packets.

Builds a 4-path multipath lab (wanprobe/lab/multipath.py, 20 ms per path), runs a reflector in
namespace b, then from namespace a, alternately:

- ``wanprobe paths B --flows F --count C --interval I --json`` (trace phase + F STAMP sessions),
- ``wanprobe probe B --count F*C --interval I/F --json`` (one session, the same packet count and
  the same aggregate packet rate).

CPU seconds are user + system of each command (getrusage of the waited-for child; interpreter
start and imports included in both). Prints each run and the ratio paths / probe (median over
rounds). The issue's bound: ratio <= 2.

Usage (root): python3 bench/paths_cost.py [--flows 16] [--count 200] [--interval 0.1] [--rounds 3]
"""

from __future__ import annotations

import json
import os
import resource
import select
import statistics
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/, also loaded by a test

from common import parser  # noqa: E402

from wanprobe.lab.multipath import MultipathLab  # noqa: E402
from wanprobe.lab.settings import LinkSettings  # noqa: E402


def cpu_of(lab, argv: list[str]) -> tuple[float, dict]:
    """Run ``argv`` in namespace a; (its CPU seconds, its JSON output)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = lab.a.run(argv, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": REPO})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {r.stderr.strip()}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, json.loads(r.stdout)


def main() -> int:
    args = parser(__doc__, ("--flows", 16), ("--count", 200), ("--interval", 0.1),
                  ("--rounds", 3), first_line=True).parse_args()
    f, c, i = args.flows, args.count, args.interval
    lab = MultipathLab(f"bench{os.getpid()}", [LinkSettings(rtt_ms=20) for _ in range(4)])
    ratios = []
    with lab:
        refl = lab.b.popen([sys.executable, "-m", "wanprobe", "reflect", "--bind", lab.b.addr],
                           stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": REPO})
        try:
            select.select([refl.stderr], [], [], 30)
            refl.stderr.readline()
            py = [sys.executable, "-m", "wanprobe"]
            for rnd in range(args.rounds):
                cpu_paths, doc = cpu_of(lab, [*py, "paths", lab.b.addr, "--flows", str(f),
                                              "--count", str(c), "--interval", f"{i}s", "--json"])
                cpu_probe, pdoc = cpu_of(lab, [*py, "probe", lab.b.addr, "--count", str(f * c),
                                               "--interval", f"{i / f}s", "--json"])
                sent = sum(fl["loss"]["sent"] for fl in doc["flows"])
                traced = sum(fl["trace_probes"] for fl in doc["flows"])
                ratios.append(cpu_paths / cpu_probe)
                print(f"round {rnd}: paths {cpu_paths:.2f} s CPU ({sent} STAMP + {traced} trace "
                      f"packets, {doc['summary']['distinct_paths']} paths), probe "
                      f"{cpu_probe:.2f} s CPU ({pdoc['loss']['sent']} packets): "
                      f"ratio {ratios[-1]:.2f}")
        finally:
            refl.terminate()
            refl.wait(10)
    print(f"paths --flows {f} / probe, same packets: median CPU ratio "
          f"{statistics.median(ratios):.2f} (bound 2.0; loadavg {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
