"""SIGHUP runs what `daemon --check` runs (issue 37): a real daemon process, a real SIGHUP.

A config the next start would refuse with exit 2 (systemd's ``RestartPreventExitStatus=2`` then
leaves the daemon down) is refused by the reload too, and the running config stays."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from conftest import free_port
from test_daemon_process import daemons, http_json, write_config  # noqa: F401 - fixture

pytestmark = pytest.mark.lab  # a real daemon process


def reloads(port: int) -> dict[str, float]:
    """wanprobe_config_reloads_total by result, from the daemon's /metrics."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {line.split('result="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("wanprobe_config_reloads_total{")}


def check(config) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "wanprobe", "daemon", "--check", "--config",
                           str(config)], capture_output=True, text=True, timeout=60)


def test_sighup_refuses_a_state_dir_that_check_refuses(tmp_path, daemons):  # noqa: F811
    mport, rport = free_port(), free_port()
    cfg = tmp_path / "wanprobe.toml"
    write_config(cfg, tmp_path / "state", metrics_port=mport, reflector_port=rport)
    d = daemons(cfg)
    d.wait_message(b"READY=1")
    loaded = http_json(mport, "/healthz")["config_loaded_at"]
    good = cfg.read_text()

    cfg.write_text(good.replace(str(tmp_path / "state"), "/etc/passwd"))
    r = check(cfg)
    assert r.returncode == 2 and "daemon.state_dir '/etc/passwd'" in r.stderr, r.stderr
    d.proc.send_signal(signal.SIGHUP)
    line = d.wait_log("reload refused, keeping the running config")
    assert line.startswith("<3>") and "daemon.state_dir '/etc/passwd'" in line, line
    assert "File exists" in line or "Not a directory" in line, line
    time.sleep(0.3)
    assert not [ln for ln in d.lines if "config reloaded" in ln or "restart only" in ln], d.lines
    assert reloads(mport) == {"refused": 1.0, "applied": 0.0}
    assert http_json(mport, "/healthz")["config_loaded_at"] == loaded

    # a restart-only key that validates is still reloaded, and said to wait for the restart
    cfg.write_text(good.replace(str(tmp_path / "state"), str(tmp_path / "moved")))
    assert check(cfg).returncode == 0
    d.proc.send_signal(signal.SIGHUP)
    assert "keys=state_dir" in d.wait_log("take effect on restart only")
    d.wait_log("config reloaded")
    assert reloads(mport) == {"refused": 1.0, "applied": 1.0}
    assert http_json(mport, "/healthz")["config_loaded_at"] > loaded
    d.proc.send_signal(signal.SIGTERM)
    assert d.proc.wait(10) == 0
