#!/usr/bin/env python3
"""Daemon at scale: the largest mesh it accepts, with scrapers that never read.

Setup (as root): one network namespace with N+1 addresses from 198.18.0.0/15 on its loopback,
one `wanprobe reflect` bound to 0.0.0.0 answering all of them, and the daemon (host ``h0``) with
a one-site mesh file of N+1 hosts, so it selects N peers and samples them down to its series
budget (wanprobe/daemon/budget.py) with one log line. Once its sessions have filled the series,
K clients send ``GET /metrics`` and never read; meanwhile a reading client scrapes 3 times.

Printed: peers probed, series and bytes of /metrics, the reading scrapes' times against the
Prometheus default scrape_timeout (10 s), the daemon's peak RSS (VmHWM) against the unit's
``MemoryMax`` (systemd/wanprobe.service), and RSS after the non-reading clients closed.

    python bench/daemon_scale.py [--mesh 1200] [--scrapers 5] [--seconds 10]
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # a sibling, also when loaded by a test
from common import lacks_root, parser, span  # noqa: E402
from daemon_footprint import addresses, peer_namespace  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SCRAPE_TIMEOUT_S = 10.0  # Prometheus' default scrape_timeout
PORT = 9862


def memory_max_mib() -> float:
    """MemoryMax= of systemd/wanprobe.service, in MiB."""
    unit = (REPO / "systemd" / "wanprobe.service").read_text()
    value = re.search(r"^MemoryMax=(\d+)([KMG])$", unit, re.M)
    n, unit_ = int(value.group(1)), value.group(2)
    return n * {"K": 1 / 1024, "M": 1, "G": 1024}[unit_]


def status_mib(pid: int, key: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def in_ns(exec_ns: list[str], code: str, timeout: float = 60.0) -> str:
    """Run Python ``code`` in the namespace (``ip netns exec NS``) and return its stdout."""
    r = subprocess.run([*exec_ns, sys.executable, "-c", code],
                       capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(r.stderr.strip()[-300:])
    return r.stdout


SCRAPE = """
import json, time, urllib.request
out = []
for path in {paths!r}:
    t0 = time.monotonic()
    try:
        body = urllib.request.urlopen("http://127.0.0.1:{port}" + path, timeout={timeout}).read()
    except OSError as exc:
        out.append([path, time.monotonic() - t0, 0, 0, str(exc)])
        continue
    out.append([path, time.monotonic() - t0, len(body),
                sum(1 for ln in body.splitlines() if ln and not ln.startswith(b"#")), None])
print(json.dumps(out))
"""

HOLD = """
import socket, sys, time
socks = []
for _ in range({k}):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", {port}))
    s.sendall(b"GET /metrics HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n")
    socks.append(s)
print("holding", flush=True)
sys.stdin.readline()
"""


def scrape(ns: list[str], *paths: str) -> list[list]:
    return json.loads(in_ns(ns, SCRAPE.format(paths=list(paths), port=PORT,
                                              timeout=SCRAPE_TIMEOUT_S * 3)))


def server_side(exec_ns: list[str]) -> list[str]:
    """The daemon's connections on its metrics port still open or holding unsent data."""
    out = subprocess.run(exec_ns + ["ss", "-tanH", f"( sport = :{PORT} )"], capture_output=True,
                         text=True, check=True).stdout.splitlines()
    return [ln for ln in out if ln.split()[0] in ("ESTAB", "FIN-WAIT-1", "CLOSE-WAIT")]


def write_config(tmp: Path, n_hosts: int, interval_s: float) -> Path:
    """A one-site mesh of ``n_hosts`` (this daemon is h0) and a config probing it: sessions of
    5 packets every ``interval_s``."""
    hosts = "".join(f'  {{ name = "h{i}", address = "{a}" }},\n'
                    for i, a in enumerate(addresses(n_hosts)))
    (tmp / "mesh.toml").write_text(f"[sites.s]\nhosts = [\n{hosts}]\n")
    cfg = tmp / "wanprobe.toml"
    cfg.write_text(f"""[daemon]
state_dir = "{tmp / 'state'}"
metrics_listen = "127.0.0.1:{PORT}"
reflector = false
mesh_file = "{tmp / 'mesh.toml'}"
hostname = "h0"
log_format = "logfmt"
[probe]
interval = "{interval_s}s"
jitter = "{interval_s / 10}s"
count = 5
packet_interval = "{interval_s / 10}s"
timeout = "1s"
[counters]
interval = "60s"
""")
    return cfg


def run(mesh_hosts: int, *, scrapers: int = 5, seconds: float = 10.0, interval_s: float = 10.0,
        warmup_s: float = 90.0) -> dict:
    """Measure one daemon whose mesh has ``mesh_hosts`` hosts (itself included); see the module
    docstring. Returns the figures as a dict."""
    with peer_namespace(mesh_hosts, "wpscale") as (ns, tmp, procs):
        exec_ns = ["ip", "netns", "exec", ns]
        cfg = write_config(tmp, mesh_hosts, interval_s)
        with open(tmp / "daemon.log", "w") as log:
            daemon = subprocess.Popen(exec_ns + [sys.executable, "-m", "wanprobe", "daemon",
                                                 "--config", str(cfg)], stdout=log, stderr=log)
        procs.append(daemon)
        out = warm_up(exec_ns, daemon, warmup_s)
        base_rss = status_mib(daemon.pid, "VmRSS")
        holder = subprocess.Popen(exec_ns + [sys.executable, "-c", HOLD.format(k=scrapers, port=PORT)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        procs.append(holder)
        holder.stdout.readline()
        peak = base_rss
        t0 = time.monotonic()
        scrapes = []
        while time.monotonic() - t0 < seconds or len(scrapes) < 3:
            scrapes += scrape(exec_ns, "/metrics")
            peak = max(peak, status_mib(daemon.pid, "VmRSS"))
        held = server_side(exec_ns)  # the clients that never read were reset by now
        holder.stdin.write("\n")
        holder.stdin.flush()
        holder.wait(10)
        time.sleep(1.0)
        health = json.loads(in_ns(exec_ns, "import urllib.request; print(urllib.request.urlopen("
                                      f"'http://127.0.0.1:{PORT}/healthz', timeout=10).read()"
                                      ".decode())"))
        text = (tmp / "daemon.log").read_text()
        return {"mesh_hosts": mesh_hosts, "peers": health["peers"], "scrapers": scrapers,
                "series": scrapes[-1][3], "metrics_bytes": scrapes[-1][2],
                "scrape_s": [round(s[1], 3) for s in scrapes],
                "scrape_errors": [s[4] for s in scrapes if s[4]], "held_connections": held,
                "rss_before_mib": base_rss,
                "rss_peak_mib": peak, "hwm_mib": status_mib(daemon.pid, "VmHWM"),
                "rss_after_mib": status_mib(daemon.pid, "VmRSS"),
                "memory_max_mib": memory_max_mib(), "warmup": out,
                "budget_lines": [ln for ln in text.splitlines() if "over this daemon's budget" in ln],
                "tracebacks": text.count("Traceback")}


def warm_up(ns: list[str], daemon: subprocess.Popen, limit_s: float) -> dict:
    """Wait until nearly every probed peer has a finished session (its series exist)."""
    t0 = time.monotonic()
    last = {}
    while time.monotonic() - t0 < limit_s:
        time.sleep(3.0)
        if daemon.poll() is not None:
            raise RuntimeError("the daemon exited")
        try:
            body = in_ns(ns, "import urllib.request; print(urllib.request.urlopen("
                         f"'http://127.0.0.1:{PORT}/metrics', timeout=30).read().decode())")
        except RuntimeError:
            continue
        peers = re.search(r"^wanprobe_peers (\S+)$", body, re.M)
        done = len(re.findall(r"^wanprobe_last_probe_timestamp_seconds\{", body, re.M))
        last = {"peers": float(peers.group(1)) if peers else 0, "peers_with_a_session": done,
                "warmup_s": round(time.monotonic() - t0, 1)}
        if peers and done >= 0.95 * float(peers.group(1)):
            return last
    return last


def report(r: dict, seconds: float) -> None:
    """Print the figures ``run`` returned, its clients not reading held for ``seconds``."""
    print(f"mesh of {r['mesh_hosts']} hosts: probing {r['peers']} peers; /metrics "
          f"{r['series']:,} series, {r['metrics_bytes'] / 2**20:.1f} MiB, scrapes "
          f"{span(r['scrape_s'])} s (timeout {SCRAPE_TIMEOUT_S:g} s) with {r['scrapers']} "
          f"clients not reading")
    print(f"  RSS {r['rss_before_mib']:.0f} MiB before, peak {r['hwm_mib']:.0f} MiB (VmHWM), "
          f"{r['rss_after_mib']:.0f} MiB after; MemoryMax {r['memory_max_mib']:.0f} MiB "
          f"({r['hwm_mib'] / r['memory_max_mib']:.2f}x)")
    print(f"  budget lines logged: {len(r['budget_lines'])}; warm-up {r['warmup']}; "
          f"failed scrapes: {r['scrape_errors'] or 'none'}; connections of the clients not "
          f"reading still held after {seconds:g} s: {len(r['held_connections'])}")


def main() -> int:
    args = parser(__doc__,
                  ("--mesh", [1200],
                   "hosts in the one-site mesh file (the daemon's included), one run each"),
                  ("--scrapers", 5, "clients that never read"), ("--seconds", 10.0)).parse_args()
    if lacks_root():
        return 2
    if shutil.which("ip") is None:
        print("needs iproute2", file=sys.stderr)
        return 2
    socket.setdefaulttimeout(30)
    for n in args.mesh:
        report(run(n, scrapers=args.scrapers, seconds=args.seconds), args.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
