#!/usr/bin/env python3
"""Daemon footprint: `wanprobe daemon` probing N peers (default 200) every second, measured for
its resident memory (VmRSS, VmHWM) and CPU share of one core.

Setup (as root): one network namespace with N addresses from 198.18.0.0/15 on its loopback and one
`wanprobe reflect` bound to 0.0.0.0, so every peer is a distinct address answered by a real STAMP
reflector; the daemon runs in the same namespace with its defaults (history, counters every 15 s,
baselines, /metrics) except the probe schedule. For scale, fping probing the same N targets at the
same per-target rate in the same namespace is measured too and printed as a ratio.

Targets: RSS < 80 MiB and CPU < 5 % of one core (issue 7); at 1,000 peers RSS <= 100 MiB and
CPU <= 1.0x fping on the same targets and rate (issue 15). Measures 200 and 1,000 peers by default.

By default each peer gets one probe per second, summarised every 10 s (``--interval 10 --count
10``); ``--interval 1 --count 1`` makes every 1 s probe its own session (row, metrics, baseline).

    python bench/daemon_footprint.py [--peers 200 1000] [--seconds 30] [--interval 10 --count 10]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from common import lacks_root, parser

TICK = os.sysconf("SC_CLK_TCK")


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


def cpu_s(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of ``pid`` from /proc/<pid>/stat fields 14 and 15."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICK, int(fields[12]) / TICK


def status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def addresses(n: int) -> list[str]:
    return [f"198.18.{100 + i // 250}.{1 + i % 250}" for i in range(n)]


def measure(pid: int, seconds: float) -> tuple[float, float, float]:
    """(user s, system s, wall s) used by ``pid`` over ``seconds``."""
    (u0, s0), t0 = cpu_s(pid), time.monotonic()
    time.sleep(seconds)
    u1, s1 = cpu_s(pid)
    return u1 - u0, s1 - s0, time.monotonic() - t0


def main() -> int:
    ap = parser(__doc__, ("--peers", [200, 1000], "peer counts to measure, one run each"),
                ("--seconds", 30.0),
                ("--warmup", 25.0,
                 "seconds before measuring: every peer has completed a session by then"),
                ("--interval", 10.0, "seconds per probe session (summary row, metrics update)"),
                ("--count", 10,
                 "STAMP packets per session, spread evenly: count/interval = probes/s per peer"))
    ap.add_argument("--profile", metavar="PATH",
                    help="run the daemon under cProfile and write its stats here (slows it)")
    args = ap.parse_args()
    if lacks_root():
        return 2
    rc = 0
    for n in args.peers:
        rc = max(rc, run_one(n, args))
    return rc


@contextmanager
def peer_namespace(n_peers: int, prefix: str):
    """A namespace with ``n_peers`` addresses on its loopback answered by one `wanprobe reflect`,
    and a temp dir: yields (namespace, temp dir, processes to stop); all removed afterwards."""
    ns = f"{prefix}{os.getpid()}"
    tmp = Path(tempfile.mkdtemp(prefix=f"wanprobe-{prefix}-"))
    procs: list[subprocess.Popen] = []
    sh("ip", "netns", "add", ns)
    try:
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        batch = "".join(f"address add {a}/32 dev lo\n" for a in addresses(n_peers))
        subprocess.run(["ip", "-n", ns, "-batch", "-"], input=batch, text=True, check=True)
        procs.append(subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-m", "wanprobe",
                                       "reflect", "--bind", "0.0.0.0", "--rate-limit", "100000",
                                       # one reflector stands in for every peer of one prober
                                       "--sessions-per-source", "65536"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        yield ns, tmp, procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


def run_one(n_peers: int, args: argparse.Namespace) -> int:
    """Measure the daemon (and fping) with ``n_peers`` peers; print one block."""
    with peer_namespace(n_peers, "wpbench") as (ns, tmp, procs):
        exec_ns = ["ip", "netns", "exec", ns]
        peers = "".join(f'[[peers]]\nname = "p{i}"\naddress = "{a}"\n'
                        for i, a in enumerate(addresses(n_peers)))
        cfg = tmp / "wanprobe.toml"
        cfg.write_text(f"""[daemon]
state_dir = "{tmp / 'state'}"
metrics_listen = "127.0.0.1:9862"
reflector = false
[probe]
interval = "{args.interval}s"
jitter = "{args.interval / 10}s"
count = {args.count}
packet_interval = "{args.interval / args.count}s"
timeout = "1s"
{peers}""")
        profile = ["-m", "cProfile", "-o", args.profile] if args.profile else []
        daemon = subprocess.Popen(exec_ns + [sys.executable, *profile, "-m", "wanprobe", "daemon",
                                             "--config", str(cfg)], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        procs.append(daemon)
        time.sleep(args.warmup)
        if daemon.poll() is not None:
            print("daemon exited early", file=sys.stderr)
            return 1
        user, system, wall = measure(daemon.pid, args.seconds)
        cpu = user + system
        rss_mib = status_kib(daemon.pid, "VmRSS") / 1024
        hwm_mib = status_kib(daemon.pid, "VmHWM") / 1024
        import sqlite3

        con = sqlite3.connect(tmp / "state" / "history.sqlite3")
        sessions, answered = con.execute(
            "SELECT count(*), sum(received > 0) FROM probes WHERE ts >= ?",
            (time.time() - wall,)).fetchone()
        con.close()
        t_stop = time.monotonic()
        daemon.send_signal(signal.SIGTERM)
        rc = daemon.wait(10)
        stop_s = time.monotonic() - t_stop

        fping_cpu_pct = None
        if shutil.which("fping"):
            n_probes = max(1, int(args.seconds))
            period_ms = str(int(1000 * args.interval / args.count))
            fp = subprocess.Popen(exec_ns + ["fping", "-q", "-C", str(n_probes), "-p", period_ms,
                                             "-i", "1", *addresses(n_peers)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append(fp)
            time.sleep(1.0)
            fu, fs, fwall = measure(fp.pid, min(args.seconds, n_probes - 2))
            fping_cpu_pct = 100 * (fu + fs) / fwall
            fp.kill()
            fp.wait(10)

        cpu_pct = 100 * cpu / wall
        per_peer = args.count / args.interval
        print(f"daemon probing {n_peers} peers at {per_peer:g} probe/s each "
              f"({n_peers * per_peer:g} STAMP probes/s; a session of {args.count} every "
              f"{args.interval:g} s) for {wall:.1f} s:")
        print(f"  sessions stored {sessions} ({sessions / wall:.0f}/s, {answered} answered)")
        print(f"  RSS {rss_mib:.1f} MiB (peak {hwm_mib:.1f} MiB)   targets < 80 MiB (issue 7), "
              f"<= 100 MiB (issue 15)   {'OK' if hwm_mib < 80 else 'OK/OVER' if hwm_mib <= 100 else 'OVER'}")
        print(f"  CPU {cpu_pct:.2f} % of one core (user {user:.2f} s + system {system:.2f} s)   "
              f"target < 5 %   "
              f"{'OK' if cpu_pct < 5 else 'OVER'}")
        print(f"  SIGTERM with {n_peers} sessions in flight: exit {rc} after {stop_s:.2f} s "
              f"(limit 2 s)")
        if fping_cpu_pct is not None:
            ratio = cpu_pct / max(fping_cpu_pct, 1e-3)
            print(f"  fping, same targets and rate: CPU {fping_cpu_pct:.2f} % of one core; "
                  f"daemon/fping = {ratio:.2f}x   target <= 1.0x (issue 15)   "
                  f"{'OK' if ratio <= 1.0 else 'OVER'} (the daemon also stores, exports and "
                  f"baselines every session)")
        return 0


if __name__ == "__main__":
    sys.exit(main())
