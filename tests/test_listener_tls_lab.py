"""Issue 37, must show: Debian's Prometheus scrapes a daemon over TLS with basic auth, in lab
namespaces, with the job `fleet targets --format scrape-config` writes. The target is up; without the password 401; plain HTTP gets no page; `daemon --check`
refuses a non-bcrypt hash; and under 40 hostile clients — 20 dribbling an unfinished TLS
handshake from the daemon's own namespace, 20 asking /metrics with the password and never
reading from Prometheus's own address — at least 9 in 10 of Prometheus's scrapes succeed."""

from __future__ import annotations

import base64
import json
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from conftest import free_port, require_tool
from daemon_toml import LAB_PROBE, daemon_toml
from fleet_sites import free_port_in, start, stop_all
from test_daemon_process import daemons, write_config  # noqa: F401 - the daemon fixture
from tls_certs import PASSWORD, bcrypt_hash, make_certs, web_config

pytestmark = [pytest.mark.alone, pytest.mark.lab]
HOSTILE = Path(__file__).with_name("hostile_clients.py")
ATTACK_S = 24.0


def https_get(url: str, ca: Path, user: str | None = None, password: str = PASSWORD):
    req = urllib.request.Request(url)
    if user:
        req.add_header("Authorization", "Basic " + base64.b64encode(
            f"{user}:{password}".encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=5,
                                    context=ssl.create_default_context(cafile=str(ca))) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def prom_query(port: int, query: str) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())["data"]["result"]


def scrape_config(tmp_path: Path, addr: str, port: int, certs, password_file: Path) -> str:
    """prometheus.yml: the job `wanprobe fleet targets --format scrape-config` writes for this
    host of a one-site mesh, scraped every 2 s."""
    mesh = tmp_path / "mesh.toml"
    mesh.write_text(f'metrics_port = {port}\n[sites.tpe]\n'
                    f'hosts = [{{ name = "tpe-1", address = "{addr}" }}]\n')
    r = subprocess.run([sys.executable, "-m", "wanprobe", "fleet", "targets", "--mesh", str(mesh),
                        "--format", "scrape-config", "--scheme", "https", "--ca-file",
                        str(certs.ca), "--basic-auth-user", "prometheus", "--password-file",
                        str(password_file)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "scheme: https" in r.stdout, r.stderr
    return 'global: {scrape_interval: 2s, scrape_timeout: 2s}\n' + r.stdout


def test_prometheus_scrapes_over_tls_with_basic_auth_and_hostile_clients(lab_factory, tmp_path):
    prometheus = require_tool("prometheus")
    lab = lab_factory(rtt_ms=2)
    certs = make_certs(tmp_path / "certs", server_sans=f"IP:{lab.a.addr}")
    web = web_config(tmp_path / "web.yml", certs,
                     users={"prometheus": bcrypt_hash(cost=10)})
    port = free_port_in(lab.a)
    cfg = tmp_path / "daemon.toml"
    cfg.write_text(daemon_toml(
        {"state_dir": tmp_path / "state", "hostname": "tpe-1",
         "metrics_listen": f"{lab.a.addr}:{port}", "reflector_listen": [f"{lab.a.addr}:8862"],
         "web_config_file": web, "web_healthz_open": True},
        probe=dict(LAB_PROBE, port=8862), counters={"enabled": False},
        peers=[{"name": "tyo-1", "address": lab.b.addr}]))
    check = [sys.executable, "-m", "wanprobe", "daemon", "--check", "--config", str(cfg)]
    r = subprocess.run(check, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "TLS, basic auth" in r.stdout, r.stdout + r.stderr
    bad = web_config(tmp_path / "bad.yml", certs, users={"prometheus": "plaintext"})
    r = subprocess.run(check + ["--web-config-file", str(bad)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "not a bcrypt hash" in r.stderr and "Traceback" not in r.stderr
    procs: list[subprocess.Popen] = []
    try:
        start(lab.a, [sys.executable, "-m", "wanprobe", "daemon", "--config", str(cfg)],
              tmp_path / "daemon.log", procs)
        base = f"https://{lab.a.addr}:{port}"
        with lab.b.entered():
            _wait(lambda: https_get(f"{base}/healthz", certs.ca)[0] == 200, 30, "daemon up")
            assert https_get(f"{base}/metrics", certs.ca)[0] == 401            # no password
            status, body = https_get(f"{base}/metrics", certs.ca, "prometheus")
            assert status == 200 and b"wanprobe_" in body
            assert _plain_http(lab.a.addr, port) == b""                         # no page
        password_file = tmp_path / "password"
        password_file.write_text(PASSWORD)
        (tmp_path / "prometheus.yml").write_text(
            scrape_config(tmp_path, lab.a.addr, port, certs, password_file))
        prom_port = free_port_in(lab.b)
        start(lab.b, [prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
                      f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                      f"--web.listen-address=127.0.0.1:{prom_port}"], tmp_path / "prom.log", procs)
        with lab.b.entered():
            _wait(lambda: _up(prom_port) == [1.0], 60, "target up")
        attackers = [
            lab.a.popen([sys.executable, str(HOSTILE), "slow", lab.a.addr, str(port), "20",
                         str(ATTACK_S)], stdout=subprocess.PIPE, text=True),
            lab.b.popen([sys.executable, str(HOSTILE), "nonreading", lab.a.addr, str(port), "20",
                         str(ATTACK_S), str(certs.ca), "prometheus", PASSWORD],
                        stdout=subprocess.PIPE, text=True)]
        procs += attackers
        opened = [int(p.communicate(timeout=ATTACK_S + 30)[0].split("=")[1]) for p in attackers]
        assert min(opened) >= 20, opened   # all 40 were there
        with lab.b.entered():
            samples = prom_query(prom_port, f'up{{job="wanprobe"}}[{int(ATTACK_S) - 2}s]')
        values = [float(v) for _t, v in samples[0]["values"]]
        print(f"scrapes up under attack: {sum(values):.0f} of {len(values)}; opened {opened}")
        assert len(values) >= 10 and sum(values) / len(values) >= 0.9, values
    finally:
        stop_all(procs)
    log = (tmp_path / "daemon.log").read_text()
    assert "Traceback" not in log, log[-2000:]


def _plain_http(addr: str, port: int) -> bytes:
    with socket.create_connection((addr, port), timeout=10) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        got = b""
        try:
            while chunk := s.recv(4096):
                got += chunk
        except (ConnectionResetError, TimeoutError):
            pass
        return got


def _up(prom_port: int) -> list[float]:
    try:
        return [float(s["value"][1]) for s in prom_query(prom_port, 'up{job="wanprobe"}')]
    except (OSError, ValueError, KeyError):
        return []


def _wait(cond, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if cond():
                return
        except OSError:  # not listening yet
            pass
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def test_sighup_reloads_the_web_config_and_a_bad_one_keeps_the_listener(tmp_path, daemons):  # noqa: F811
    """A reload re-reads the web config; one the checks refuse (a plain password) keeps the
    running listener, users and all, and logs why; a good one takes effect for new
    connections (a second user)."""
    certs = make_certs(tmp_path / "certs")
    web = web_config(tmp_path / "web.yml", certs, users={"prometheus": bcrypt_hash()})
    mport, rport = free_port(), free_port()
    cfg = tmp_path / "wanprobe.toml"
    write_config(cfg, tmp_path / "state", metrics_port=mport, reflector_port=rport)
    cfg.write_text(cfg.read_text().replace("[daemon]\n", f'[daemon]\nweb_config_file = "{web}"\n'))
    d = daemons(cfg)
    d.wait_message(b"READY=1")
    url = f"https://127.0.0.1:{mport}/metrics"
    assert https_get(url, certs.ca, "prometheus")[0] == 200
    assert https_get(url, certs.ca)[0] == 401
    web_config(web, certs, users={"prometheus": bcrypt_hash(), "grafana": "hunter2"})
    d.proc.send_signal(signal.SIGHUP)
    line = d.wait_log("not a bcrypt hash")
    assert "reload refused" in line and "basic_auth_users.grafana" in line
    assert https_get(url, certs.ca, "prometheus")[0] == 200       # the old listener serves on
    web_config(web, certs, users={"prometheus": bcrypt_hash(), "grafana": bcrypt_hash("g")})
    d.proc.send_signal(signal.SIGHUP)
    d.wait_log("config reloaded")
    assert https_get(url, certs.ca, "grafana", "g")[0] == 200
    assert https_get(url, certs.ca, "prometheus")[0] == 200
