#!/usr/bin/env python3
"""The daemon's page at 1,000 peers: time to first byte, and the daemon's CPU with a browser
reloading the page every 5 s against the same daemon without viewers.

Setup as bench/daemon_footprint.py (as root): one network namespace with N addresses from
198.18.0.0/15 on its loopback and one `wanprobe reflect`, the daemon probing all N in the same
namespace. Its history is first filled with ``--history-hours`` of sessions for every peer (one
every ``--history-step`` seconds; 24 h x 1,000 peers x 60 s = 1.44 M rows), so the page reads a
full day as it would in production. Then, in rounds:

- quiet: no viewer for ``--seconds``;
- http: a plain client GETs ``/`` every 5 s (the daemon's cost alone, no browser on the CPUs);
- viewer: Debian's Chromium (selenium, headless, in the namespace) loads ``/`` and reloads it
  every 5 s for ``--seconds`` (the browser caches the script; each reload fetches the page).
  On a 2-core machine the browser's own rendering competes with the daemon for the CPUs.

For each phase: the daemon's CPU (share of one core, /proc/PID/stat), the probe sessions it stored
per second and the RTT they measured (loopback: a probe delayed by the daemon would show), and
how fast its event loop answers ``/healthz`` (sampled every 0.2 s; a render that held the loop
would show here). Before the rounds: time to first byte and total time of ``/``
and ``/peer/NAME`` with the daemon's page cache (one probe interval, 10 s here) expired (a render
each), 3 each, and the page's size.

    python bench/pictures_page.py [--peers 1000] [--seconds 30] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import lacks_root, parser  # noqa: E402
from daemon_footprint import addresses, cpu_s, peer_namespace  # noqa: E402 - the same setup

PORT = 9862


# -- clients, run inside the namespace (``--client``) -------------------------------------------
def fetch(path: str) -> tuple[float, float, int, int]:
    """(time to first byte s, total s, bytes, status) of one GET on the daemon."""
    t0 = time.perf_counter()
    with socket.create_connection(("127.0.0.1", PORT), timeout=60) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n".encode())
        first = s.recv(65536)
        ttfb = time.perf_counter() - t0
        data = first
        while chunk := s.recv(1 << 20):
            data += chunk
    status = int(first.split(b" ", 2)[1])
    return ttfb, time.perf_counter() - t0, len(data), status


def client_ttfb(paths: list[str], n: int) -> dict:
    out = {"first": [fetch(paths[0])]}   # the first page request loads the script (bokeh) once
    for path in paths:
        runs = []
        for _ in range(n):
            time.sleep(10.5)  # past the daemon's page cache (one probe interval): each GET renders
            runs.append(fetch(path))
        out[path] = runs
    return out


def client_healthz(seconds: float) -> list[float]:
    lat, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        lat.append(fetch("/healthz")[0])
        time.sleep(0.2)
    return lat


def client_http(seconds: float) -> dict:
    """A viewer without a browser: GET / every 5 s (the script is cached by a real one)."""
    loads, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.monotonic()
        fetch("/")
        loads += 1
        time.sleep(max(0.0, 5.0 - (time.monotonic() - t0)))
    return {"loads": loads}


def client_viewer(seconds: float) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from browser_check import CHROMIUM as BINARY
    from browser_check import DRIVER, FLAGS
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="wanprobe-bench-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = BINARY
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(options=opts, service=Service(DRIVER))
    loads, end = 0, time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            t0 = time.monotonic()
            driver.get(f"http://127.0.0.1:{PORT}/")
            loads += 1
            time.sleep(max(0.0, 5.0 - (time.monotonic() - t0)))
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
    return {"loads": loads}


# -- orchestration ----------------------------------------------------------------------------
def fill_history(db: Path, n_peers: int, hours: float, step_s: float) -> int:
    """Sessions for every peer over the last ``hours``: a 30 ms path with a little loss."""
    from wanprobe.history.store import Store

    Store(db).close()  # the schema
    con = sqlite3.connect(db)
    now, rows = time.time(), 0
    with con:
        for i in range(n_peers):
            ts = [now - hours * 3600 + k * step_s for k in range(int(hours * 3600 / step_s))]
            con.executemany(
                "INSERT INTO probes (ts, peer, method, sent, received, loss_ratio, rtt_min_ms, "
                "rtt_p50_ms, rtt_p90_ms, rtt_p99_ms, rtt_max_ms) VALUES "
                "(?, ?, 'stamp', 10, ?, ?, 30.0, ?, ?, ?, ?)",
                [(t, f"p{i}", 10 - (k % 97 == 0), (k % 97 == 0) / 10, 30.2 + (k % 7) * 0.1,
                  31.0, 32.0 + (k % 11), 35.0) for k, t in enumerate(ts)])
            rows += len(ts)
    con.close()
    return rows


def in_ns(ns: str, *args: str, timeout: float) -> dict | list:
    r = subprocess.run(["ip", "netns", "exec", ns, sys.executable, __file__, *args],
                       capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-2000:])
    return json.loads(r.stdout)


def phase(ns: str, pid: int, db: Path, seconds: float, viewer: str | None) -> dict:
    viewer_proc = None
    if viewer:
        viewer_proc = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, __file__,
                                        "--client", viewer, "--seconds", str(seconds + 2)],
                                       stdout=subprocess.PIPE, text=True)
        time.sleep(2.0)  # browser start-up is the browser's, not the daemon's
    con = sqlite3.connect(db)
    last_id = con.execute("SELECT coalesce(max(id), 0) FROM probes").fetchone()[0]
    con.close()
    (u0, s0), t0 = cpu_s(pid), time.monotonic()
    lat = in_ns(ns, "--client", "healthz", "--seconds", str(seconds), timeout=seconds + 60)
    (u1, s1), wall = cpu_s(pid), time.monotonic() - t0
    con = sqlite3.connect(db)
    # sessions the daemon stored while the phase ran (ids grow; the filled history is older)
    sessions = con.execute("SELECT count(*) FROM probes WHERE id > ?", (last_id,)).fetchone()[0]
    # what probing measured meanwhile (loopback: any delay added by the daemon shows here)
    p99s = sorted(r[0] for r in con.execute("SELECT rtt_p99_ms FROM probes WHERE id > ? AND "
                                            "rtt_p99_ms IS NOT NULL", (last_id,)))
    con.close()
    loads = json.loads(viewer_proc.communicate(timeout=120)[0])["loads"] if viewer_proc else 0
    lat_ms = sorted(x * 1e3 for x in lat)
    return {"cpu_pct": 100 * (u1 - u0 + s1 - s0) / wall, "sessions_per_s": sessions / wall,
            "healthz_p50_ms": statistics.median(lat_ms),
            "healthz_p99_ms": lat_ms[min(len(lat_ms) - 1, int(0.99 * len(lat_ms)))],
            "healthz_max_ms": lat_ms[-1], "loads": loads,
            "rtt_p99_median_ms": statistics.median(p99s) if p99s else float("nan"),
            "rtt_p99_p99_ms": p99s[int(0.99 * (len(p99s) - 1))] if p99s else float("nan")}


def span(values: list[float], fmt: str = "{:.2f}") -> str:
    lo, hi = min(values), max(values)
    return fmt.format(lo) if lo == hi else f"{fmt.format(lo)} to {fmt.format(hi)}"


def run(args: argparse.Namespace) -> int:
    n = args.peers
    with peer_namespace(n, "wppage") as (ns, tmp, procs):
        db = tmp / "state" / "history.sqlite3"
        db.parent.mkdir()
        t0 = time.monotonic()
        rows = fill_history(db, n, args.history_hours, args.history_step)
        print(f"history: {rows} sessions ({args.history_hours:g} h x {n} peers) written in "
              f"{time.monotonic() - t0:.0f} s, {db.stat().st_size / 2**20:.0f} MiB")
        peers = "".join(f'[[peers]]\nname = "p{i}"\naddress = "{a}"\n'
                        for i, a in enumerate(addresses(n)))
        (tmp / "wanprobe.toml").write_text(f"""[daemon]
state_dir = "{tmp / 'state'}"
metrics_listen = "127.0.0.1:{PORT}"
reflector = false
[probe]
interval = "10s"
jitter = "1s"
count = 10
packet_interval = "1s"
timeout = "1s"
{peers}""")
        daemon = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-m", "wanprobe",
                                   "daemon", "--config", str(tmp / "wanprobe.toml")],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(daemon)
        time.sleep(args.warmup)
        if daemon.poll() is not None:
            print("daemon exited early", file=sys.stderr)
            return 1
        ttfb = in_ns(ns, "--client", "ttfb", timeout=300)
        print(f"daemon probing {n} peers (a session of 10 probes every 10 s each); page cache "
              f"(one probe interval) expired before each GET (a render each), 3 GETs per page:")
        for path, runs in ttfb.items():
            print(f"  GET {path if path != 'first' else '/ (first)':12} status {runs[0][3]}  TTFB {span([r[0] * 1e3 for r in runs], '{:.0f}')} ms"
                  f"  total {span([r[1] * 1e3 for r in runs], '{:.0f}')} ms  "
                  f"{runs[0][2] / 1024:.0f} KiB")
        kinds = (("quiet", None, "no viewer"), ("http", "http", "GET / every 5 s, no browser"),
                 ("viewer", "viewer", "Chromium reloading / every 5 s"))
        results: dict[str, list[dict]] = {k: [] for k, _, _ in kinds}
        for _ in range(args.rounds):
            for kind, client, _ in kinds:
                results[kind].append(phase(ns, daemon.pid, db, args.seconds, client))
        print(f"{args.rounds} rounds of {args.seconds:g} s each, ranges over the rounds:")
        for kind, _, label in kinds:
            rs = results[kind]
            print(f"  {label:32} CPU {span([r['cpu_pct'] for r in rs])} % of one core; "
                  f"{span([r['sessions_per_s'] for r in rs], '{:.0f}')} sessions/s stored; "
                  f"/healthz p50 {span([r['healthz_p50_ms'] for r in rs], '{:.1f}')} ms, "
                  f"p99 {span([r['healthz_p99_ms'] for r in rs], '{:.1f}')} ms, "
                  f"max {span([r['healthz_max_ms'] for r in rs], '{:.0f}')} ms; sessions' "
                  f"RTT p99: median {span([r['rtt_p99_median_ms'] for r in rs], '{:.3f}')} ms, "
                  f"99th percentile {span([r['rtt_p99_p99_ms'] for r in rs], '{:.2f}')} ms"
                  + (f"; {span([r['loads'] for r in rs], '{:.0f}')} page loads" if kind != "quiet" else ""))
        for kind in ("http", "viewer"):
            extra = [v["cpu_pct"] - q["cpu_pct"] for q, v in zip(results["quiet"], results[kind],
                                                                 strict=True)]
            print(f"  {kind} - quiet: {span(extra)} % of one core (same round)")
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(10)
        except subprocess.TimeoutExpired:   # peer_namespace kills it
            print("  (the daemon did not stop within 10 s of SIGTERM)")
        return 0


def main() -> int:
    ap = parser(__doc__, ("--peers", 1000), ("--seconds", 30.0, "length of each phase"),
                ("--rounds", 3), ("--warmup", 25.0), ("--history-hours", 24.0),
                ("--history-step", 60.0))
    ap.add_argument("--client", choices=("ttfb", "healthz", "http", "viewer"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.client == "ttfb":
        print(json.dumps(client_ttfb(["/", "/peer/p0"], 3)))
        return 0
    if args.client == "healthz":
        print(json.dumps(client_healthz(args.seconds)))
        return 0
    if args.client == "http":
        print(json.dumps(client_http(args.seconds)))
        return 0
    if args.client == "viewer":
        print(json.dumps(client_viewer(args.seconds)))
        return 0
    if lacks_root():
        return 2
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
