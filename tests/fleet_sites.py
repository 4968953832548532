"""Test plumbing for the fleet acceptance test: three sites joined by three lab links, and a
Prometheus, an Alertmanager and a webhook receiver started by the test in one site's namespace.

Topology: each lab is one emulated WAN link between its namespaces ``a`` and ``b``. Site i lives
in lab i's ``a`` namespace; lab i's ``b`` namespace is a router that a veth pair joins to site
i+1. So site i reaches site i+1 through lab i both ways (its RTT), and every site pair has its
own link, e.g. ``lab_ab.update(loss_ab=...)`` makes loss from site i to site i+1 only. Each site
has one address on its loopback (198.18.10i.1); nothing is configured in the root namespace.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import daemon_toml as toml

from wanprobe.lab import Lab
from wanprobe.lab.netns import Endpoint


@dataclass(frozen=True)
class Site:
    name: str
    host: str
    addr: str
    ns: Endpoint
    link: Lab          # towards the next site


def _ip(ns: str, *lines: str) -> None:
    subprocess.run(["ip", "-n", ns, "-batch", "-"], input="\n".join(lines) + "\n", text=True,
                   check=True, capture_output=True)


def wire_ring(names: list[str], labs: list[Lab]) -> list[Site]:
    """Turn len(names) labs into a ring of sites (see module docstring)."""
    n = len(names)
    sites = [Site(name, f"{name}-1", f"198.18.{101 + i}.1", labs[i].a, labs[i])
             for i, name in enumerate(names)]
    for i, site in enumerate(sites):
        nxt, router = sites[(i + 1) % n], labs[i].b
        v_r, v_s = f"198.18.{201 + i}.1", f"198.18.{201 + i}.2"  # router side, next-site side
        _ip(router.name, f"link add vr{i} type veth peer name vs{i} netns {nxt.ns.name}",
            f"addr add {v_r}/30 dev vr{i}", f"link set vr{i} up",
            f"route add {nxt.addr}/32 via {v_s}", f"route add {site.addr}/32 dev {router.ifname}")
        _ip(nxt.ns.name, f"addr add {v_s}/30 dev vs{i}", f"link set vs{i} up")
        subprocess.run(["ip", "netns", "exec", router.name, "sysctl", "-qw",
                        "net.ipv4.ip_forward=1"], check=True)
    for i, site in enumerate(sites):
        nxt, prev = sites[(i + 1) % n], sites[(i - 1) % n]
        _ip(site.ns.name, f"addr add {site.addr}/32 dev lo",
            f"route add {nxt.addr}/32 dev {site.ns.ifname} src {site.addr}",
            f"route add {prev.addr}/32 via 198.18.{201 + (i - 1) % n}.1 src {site.addr}")
    return sites


def mesh_toml(sites: list[Site], metrics_port: int) -> str:
    out = f"representatives = 1\nmetrics_port = {metrics_port}\n"
    for s in sites:
        out += f'[sites.{s.name}]\nhosts = [{{ name = "{s.host}", address = "{s.addr}" }}]\n'
    return out


def daemon_toml(site: Site, state: Path, mesh: Path, metrics_port: int) -> str:
    return toml.daemon_toml(
        {"state_dir": state, "hostname": site.host, "site": site.name, "mesh_file": mesh,
         "metrics_listen": f"{site.addr}:{metrics_port}", "reflector_listen": [f"{site.addr}:862"]},
        probe=dict(toml.LAB_PROBE, timeout="800ms"), counters={"enabled": False})


def prometheus_yml(rules: Path, targets: Path, alertmanager: str) -> str:
    return json.dumps({  # JSON is YAML
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]},
        "scrape_configs": [{"job_name": "wanprobe",
                            "file_sd_configs": [{"files": [str(targets)]}]}],
    }, indent=1)


def alertmanager_yml(webhook_url: str) -> str:
    return json.dumps({
        "route": {"receiver": "oncall", "group_by": ["alertname", "src_site", "dst_site"],
                  "group_wait": "1s", "group_interval": "1s", "repeat_interval": "1h"},
        "receivers": [{"name": "oncall", "webhook_configs": [{"url": webhook_url,
                                                               "send_resolved": False}]}],
    }, indent=1)


class Webhook:
    """An HTTP receiver for Alertmanager's webhook POSTs, listening inside ``ns``."""

    def __init__(self, ns: Endpoint) -> None:
        self.alerts: list[dict] = []
        self.lock = threading.Lock()
        received = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                size = min(int(self.headers.get("Content-Length") or 0), 1 << 20)
                try:
                    doc = json.loads(self.rfile.read(size))
                    with received.lock:
                        received.alerts += list(doc.get("alerts", []))
                except (ValueError, AttributeError):
                    pass
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        with ns.entered():  # the listening socket belongs to the site's namespace
            self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def firing(self) -> list[dict]:
        with self.lock:
            return [a for a in self.alerts if a.get("status") == "firing"]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def start(ns: Endpoint, argv: list[str], log: Path, procs: list[subprocess.Popen]) -> None:
    """Start ``argv`` inside ``ns`` with stderr to ``log``; track it in ``procs``."""
    with open(log, "w") as err:  # the child keeps its own copy of the descriptor
        procs.append(ns.popen(argv, stdout=subprocess.DEVNULL, stderr=err))


def start_daemons(sites: list[Site], tmp: Path, mesh: Path, metrics_port: int,
                  procs: list[subprocess.Popen]) -> None:
    """One ``wanprobe daemon`` per site, in the site's namespace."""
    for s in sites:
        cfg = tmp / f"{s.name}.toml"
        cfg.write_text(daemon_toml(s, tmp / s.name, mesh, metrics_port))
        start(s.ns, [sys.executable, "-m", "wanprobe", "daemon", "--config", str(cfg)],
              tmp / f"{s.name}.log", procs)


def start_prometheus_stack(hub: Endpoint, tmp: Path, webhook: Webhook, *, prometheus: str,
                           alertmanager: str, procs: list[subprocess.Popen]) -> int:
    """Alertmanager (to ``webhook``) and Prometheus (rules.yml, targets.json in ``tmp``) in
    ``hub``'s namespace, each with its own config and data directory; returns Prometheus's port."""
    # two different ports: one probe socket closed before the next bind may be handed the same
    # port again (a CI run had Prometheus answer its own alerts with 404 on Alertmanager's port)
    am_port, prom_port = free_ports_in(hub, 2)
    (tmp / "am.yml").write_text(alertmanager_yml(f"http://127.0.0.1:{webhook.port}/"))
    start(hub, [alertmanager, f"--config.file={tmp / 'am.yml'}", f"--storage.path={tmp / 'am'}",
                f"--web.listen-address=127.0.0.1:{am_port}", "--cluster.listen-address="],
          tmp / "am.log", procs)
    (tmp / "prometheus.yml").write_text(prometheus_yml(tmp / "rules.yml", tmp / "targets.json",
                                                       f"127.0.0.1:{am_port}"))
    start(hub, [prometheus, f"--config.file={tmp / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom_port}"],
          tmp / "prometheus.log", procs)
    return prom_port


def stop_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(5)
        if p.poll() is None:
            p.kill()
            p.wait(5)


def free_port_in(ns: Endpoint) -> int:
    return free_ports_in(ns, 1)[0]


def free_ports_in(ns: Endpoint, n: int) -> list[int]:
    """``n`` distinct TCP ports free on 127.0.0.1 in ``ns`` (all held open while picked)."""
    with ns.entered(), contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
