"""The real daemon as a process (real STAMP probes over loopback to its own reflector):
sd_notify READY/WATCHDOG/STOPPING on a socket the test binds, SIGHUP with a broken config keeps
the running one, SIGTERM stops within 2 s, and kill -9 during writes loses no committed row."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import free_port
from daemon_toml import daemon_toml

# real daemon processes (the fast tier, `pytest -m 'not lab'`, leaves them to CI)
pytestmark = pytest.mark.lab


def write_config(path: Path, state_dir: Path, *, metrics_port: int, reflector_port: int,
                 peers: int = 1, interval: str = "200ms", **tables: dict) -> None:
    path.write_text(daemon_toml(
        {"state_dir": state_dir, "metrics_listen": f"127.0.0.1:{metrics_port}",
         "reflector_listen": [f"127.0.0.1:{reflector_port}"]},
        probe={"interval": interval, "jitter": "20ms", "count": 5, "packet_interval": "5ms",
               "timeout": "1s"},
        counters={"enabled": False}, **tables,
        peers=[{"name": f"self-{i}", "address": "127.0.0.1", "port": reflector_port}
               for i in range(peers)]))


def wait_sessions(metrics_port: int, at_least: int, timeout: float = 20.0) -> None:
    """Wait until the daemon's wanprobe_probe_sessions_total (all peers) reaches ``at_least``."""
    deadline = time.monotonic() + timeout
    total = 0.0
    while time.monotonic() < deadline:
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
        total = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                    if line.startswith("wanprobe_probe_sessions_total{"))
        if total >= at_least:
            return
        time.sleep(0.1)
    raise AssertionError(f"only {total:g} probe sessions after {timeout} s")


class DaemonProcess:
    """``wanprobe daemon`` in a subprocess with NOTIFY_SOCKET bound by the test."""

    def __init__(self, tmp: Path, config: Path, *, watchdog_usec: int | None = None) -> None:
        self.notify_path = tmp / f"notify-{time.monotonic_ns()}.sock"
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(str(self.notify_path))
        self.messages: list[bytes] = []
        env = {**os.environ, "NOTIFY_SOCKET": str(self.notify_path), "PYTHONUNBUFFERED": "1"}
        env.pop("WATCHDOG_PID", None)
        if watchdog_usec:
            env["WATCHDOG_USEC"] = str(watchdog_usec)
        self.proc = subprocess.Popen([sys.executable, "-m", "wanprobe", "daemon", "--config", str(config)],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_message(self, key: bytes, timeout: float = 30.0) -> bytes:
        deadline = time.monotonic() + timeout
        for m in self.messages:
            if key in m.split(b"\n"):
                return m
        while time.monotonic() < deadline:
            self.notify.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                m = self.notify.recv(4096)
            except TimeoutError:
                break
            self.messages.append(m)
            if key in m.split(b"\n"):
                return m
        raise AssertionError(f"no {key!r} from the daemon; got {self.messages}; log: {self.lines[-20:]}")

    def wait_log(self, text: str, timeout: float = 10.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if text in line:
                    return line
            time.sleep(0.05)
        raise AssertionError(f"no log line with {text!r}: {self.lines[-20:]}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.notify.close()
        self._reader.join(5)


@pytest.fixture
def daemons(tmp_path):
    started: list[DaemonProcess] = []

    def start(config: Path, **kw) -> DaemonProcess:
        d = DaemonProcess(tmp_path, config, **kw)
        started.append(d)
        return d

    yield start
    for d in started:
        d.close()


def http_json(port: int, path: str) -> dict:
    return json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5).read())


def count_rows(db: Path) -> int:
    con = sqlite3.connect(db, timeout=10)
    try:
        return con.execute("SELECT count(*) FROM probes").fetchone()[0]
    finally:
        con.close()


def test_sighup_bad_config_keeps_old_one_and_sigterm_stops_within_2s(tmp_path, daemons):
    mport, rport = free_port(), free_port()
    cfg = tmp_path / "wanprobe.toml"
    write_config(cfg, tmp_path / "state", metrics_port=mport, reflector_port=rport)
    d = daemons(cfg, watchdog_usec=1_000_000)
    ready = d.wait_message(b"READY=1")
    assert b"STATUS=probing 1 peers" in ready
    d.wait_message(b"WATCHDOG=1", timeout=5)  # pinged at half of WATCHDOG_USEC
    before = http_json(mport, "/healthz")
    assert before["ok"] and before["peers"] == 1 and before["probe_interval_s"] == 0.2

    good = cfg.read_text()
    cfg.write_text(good.replace('interval = "200ms"', 'interval = "fast"')
                   .replace('address = "127.0.0.1"', 'address = "127.0.0.300"'))
    d.proc.send_signal(signal.SIGHUP)
    line1 = d.wait_log('problem="probe.interval')
    line2 = d.wait_log('problem="peers[0].address')
    assert "reload refused, keeping the running config" in line1 and line1.startswith("<3>")
    assert line2 != line1
    time.sleep(0.5)
    after = http_json(mport, "/healthz")
    assert after["peers"] == 1 and after["probe_interval_s"] == 0.2
    assert after["config_loaded_at"] == before["config_loaded_at"]
    rows = count_rows(tmp_path / "state" / "history.sqlite3")
    time.sleep(1.5)
    assert count_rows(tmp_path / "state" / "history.sqlite3") > rows, "still probing after refusal"

    cfg.write_text(good + f'[[peers]]\nname = "added"\naddress = "127.0.0.1"\nport = {rport}\n')
    d.proc.send_signal(signal.SIGHUP)
    d.wait_log("config reloaded")
    assert http_json(mport, "/healthz")["peers"] == 2  # counts, not names (issue 19)

    t0 = time.monotonic()
    d.proc.send_signal(signal.SIGTERM)
    rc = d.proc.wait(timeout=10)
    elapsed = time.monotonic() - t0
    stopping = d.wait_message(b"STOPPING=1", timeout=1)
    print(f"\nSIGTERM → exit in {elapsed:.3f} s, rc {rc}, last datagram {stopping!r}")
    assert rc == 0 and elapsed < 2.0


def test_kill_9_during_writes_loses_no_committed_row(tmp_path, daemons):
    mport, rport = free_port(), free_port()
    cfg = tmp_path / "wanprobe.toml"
    state = tmp_path / "state"
    db = state / "history.sqlite3"
    write_config(cfg, state, metrics_port=mport, reflector_port=rport, peers=8, interval="100ms")
    d = daemons(cfg)
    d.wait_message(b"READY=1")
    for cycle in range(2):
        start_rows = count_rows(db) if db.exists() else 0
        deadline = time.monotonic() + 15
        while count_rows(db) < start_rows + 40 and time.monotonic() < deadline:
            time.sleep(0.1)
        con = sqlite3.connect(db, timeout=10)
        committed = {r[0] for r in con.execute("SELECT id FROM probes")}
        con.close()
        time.sleep(0.35)  # more sessions finish and flush while we aim
        killed_at = time.time()
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait(10)
        con = sqlite3.connect(db, timeout=10)
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        ids = {r[0] for r in con.execute("SELECT id FROM probes")}
        last_ts = con.execute("SELECT max(ts) FROM probes").fetchone()[0]
        ok_rows = con.execute("SELECT count(*) FROM probes WHERE error IS NULL AND received > 0").fetchone()[0]
        con.close()
        assert committed <= ids, f"cycle {cycle}: {len(committed - ids)} committed rows lost"
        # at most the last flush interval (1 s) plus one session is lost
        assert killed_at - last_ts < 2.5, killed_at - last_ts
        assert ok_rows >= 0.9 * len(ids), "probes to the daemon's own reflector should answer"
        d = daemons(cfg)
        d.wait_message(b"READY=1")
    d.proc.send_signal(signal.SIGTERM)
    assert d.proc.wait(10) == 0
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    con.close()


def test_history_command_reads_the_store_with_a_real_throughput_test(tmp_path, daemons):
    mport, rport = free_port(), free_port()
    cfg = tmp_path / "wanprobe.toml"
    # a peer's first test comes at a random point of its first interval (throughput_spread.py):
    # a short interval brings it soon, and the day's budget (one 2 GiB test) keeps it the only one
    write_config(cfg, tmp_path / "state", metrics_port=mport, reflector_port=rport,
                 throughput={"enabled": True, "interval": "20s", "duration": "1s", "streams": 1,
                             "budget_per_day": "2GiB", "max_bytes_per_test": "2GiB",
                             "tests_per_hour_per_client": 180})
    d = daemons(cfg)
    d.wait_message(b"READY=1")
    d.wait_log("throughput test", timeout=40)
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=5).read().decode()
    assert any(line.startswith("wanprobe_throughput_bytes_per_second{") and 'peer="self-0"' in line
               for line in metrics.splitlines()), metrics
    wait_sessions(mport, 4)  # the throughput test may finish before the 4th probe session
    d.proc.send_signal(signal.SIGTERM)
    assert d.proc.wait(10) == 0
    r = subprocess.run([sys.executable, "-m", "wanprobe", "history", "self-0", "--state-dir",
                        str(tmp_path / "state"), "--since", "5m", "--json"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert len(doc["probes"]) >= 4
    p = doc["probes"][-1]
    assert p["sent"] == 5 and p["received"] == 5 and 0 < p["rtt_p50_ms"] < 5  # loopback
    assert p["loss_forward_lost"] == 0 and 4 <= p["loss_forward_of"] <= 5  # the sample, kept
    r = subprocess.run([sys.executable, "-m", "wanprobe", "history", "self-0", "--state-dir",
                        str(tmp_path / "state"), "--since", "5m"],
                       capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "200"})
    assert r.returncode == 0 and "0.00% (0/5)" in r.stdout, r.stdout
    (t,) = doc["throughput"]  # one: the day's budget, however long the daemon runs
    assert t["error"] is None and t["bits_per_second"] > 1e8 and t["bytes"] > 0
    r = subprocess.run([sys.executable, "-m", "wanprobe", "history", "self-0", "--state-dir",
                        str(tmp_path / "nowhere")], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1 and "no history" in r.stderr


def test_hmac_key_authenticates_the_daemons_reflector_and_its_probes(tmp_path, daemons):
    """With daemon.hmac_key the reflector answers only authenticated STAMP (RFC 8762 §4.4) and
    the daemon's own peer probes carry the key: its probes to itself are answered, an
    unauthenticated `wanprobe probe` to the same reflector is not."""
    mport, rport = free_port(), free_port()
    cfg = tmp_path / "wanprobe.toml"
    state = tmp_path / "state"
    db = state / "history.sqlite3"
    key = "k3y-0f-at-least-16-chars"
    write_config(cfg, state, metrics_port=mport, reflector_port=rport, peers=2)
    cfg.write_text(cfg.read_text().replace("[daemon]\n", f'[daemon]\nhmac_key = "{key}"\n', 1))
    d = daemons(cfg)
    d.wait_message(b"READY=1")
    deadline = time.monotonic() + 20
    while (not db.exists() or count_rows(db) < 6) and time.monotonic() < deadline:
        time.sleep(0.1)
    keyfile = tmp_path / "key"
    keyfile.write_text(key + "\n")
    plain = subprocess.run([sys.executable, "-m", "wanprobe", "probe", "127.0.0.1", "--port",
                            str(rport), "--count", "5", "--interval", "10ms", "--json"],
                           capture_output=True, text=True, timeout=60)
    keyed = subprocess.run([sys.executable, "-m", "wanprobe", "probe", "127.0.0.1", "--port",
                            str(rport), "--count", "5", "--interval", "10ms", "--json",
                            "--hmac-key-file", str(keyfile)], capture_output=True, text=True,
                           timeout=60)
    d.proc.send_signal(signal.SIGTERM)
    assert d.proc.wait(10) == 0
    con = sqlite3.connect(db)
    rows = con.execute("SELECT sent, received, error FROM probes").fetchall()
    con.close()
    assert len(rows) >= 6 and all(r[2] is None and r[1] == r[0] > 0 for r in rows), rows
    assert json.loads(plain.stdout)["loss"]["ratio"] == 1.0, plain.stdout + plain.stderr
    assert json.loads(keyed.stdout)["loss"]["ratio"] == 0.0, keyed.stdout + keyed.stderr
