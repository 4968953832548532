"""The daemon's /metrics passes Prometheus's own linter, `promtool check metrics` (issue 36): no
metric name holding a type (`_counter_`), no `quantile` label on a gauge, base units only.

Two ways: every family the daemon declares, each with samples, from the registry in this
process (fast tier); and the scrape of a real daemon process after probe sessions, a
throughput test and counter samples against a real `wanprobe reflect` on loopback (lab). Each
also feeds promtool the same text with one of the old shapes put back and requires it to be
refused, so a promtool that accepts anything cannot pass these tests."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import free_port, require_tool
from daemon_toml import daemon_toml

# what promtool said about the exposition before issue 36, put back one at a time
OLD_SHAPES = [
    ('wanprobe_rtt_seconds{', 'stat="p50"', 'quantile="0.5"',
     'non-summary metrics should not have "quantile" label'),
    ("wanprobe_host_stat_total", "wanprobe_host_stat_total", "wanprobe_host_counter_total",
     "metric name should not include type 'counter'"),
    ("wanprobe_throughput_bytes_per_second", "wanprobe_throughput_bytes_per_second",
     "wanprobe_throughput_bits_per_second", 'use base unit "bytes" instead of "bits"'),
]


def promtool_check(text: str) -> tuple[int, str]:
    promtool = require_tool("promtool")
    r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                       text=True, timeout=60)
    return r.returncode, (r.stdout + r.stderr).strip()


def check_clean_and_old_shapes_refused(text: str) -> None:
    rc, said = promtool_check(text)
    assert rc == 0 and said == "", said
    for line_start, new, old, complaint in OLD_SHAPES:
        old_text = "".join(ln.replace(new, old) if ln.startswith(line_start) else ln
                           for ln in text.splitlines(keepends=True))
        assert old_text != text, f"no {line_start} line to put the old shape back in"
        rc, said = promtool_check(old_text)
        assert rc != 0 and complaint in said, (old, said)


def families(text: str) -> set[str]:
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


def sampled(text: str) -> set[str]:
    return {line.split("{")[0].split()[0] for line in text.splitlines()
            if line and not line.startswith("#")}


def test_every_family_of_the_registry_passes_promtool():
    from wanprobe.daemon.metrics import DaemonMetrics
    from wanprobe.mesh.peer import Peer
    from wanprobe.probe.loss_window import PeerLossWindows

    m = DaemonMetrics(site="taipei", host="tpe-1")
    peer = Peer("tokyo-1", "198.18.0.2", site="tokyo")
    m.set_peers((peer,))
    owd = {"min": 10.0, "p50": 10.2, "p90": 10.4, "p99": 10.9}
    m.observe_probe(peer, "stamp", {
        "rtt_ms": {"min": 35.0, "p50": 36.0, "p90": 37.0, "p99": 40.0, "max": 41.0},
        "jitter_ms": 0.5, "owd_ms": {"clock_error_bound_ms": 0.0, "forward": owd, "reverse": owd},
        "loss": {"sent": 100, "received": 96, "ratio": 0.04, "forward_ratio": 0.01,
                 "reverse_ratio": 0.0202, "forward_lost": 1, "reverse_lost": 2,
                 "reflector_rate_limited": 1, "reflector_replays_refused": 1,
                 "reflector_resets": 1}})
    m.observe_probe_error(peer, "stamp")
    windows = PeerLossWindows(300, 3600)
    windows.add("tokyo-1", 1000.0, {"loss": {"sent": 100, "received": 96, "forward_lost": 1,
                                             "forward_of": 99, "reverse_lost": 2,
                                             "reverse_of": 97}})
    m.loss_window.observe(m.path_labels(peer), windows.loss("tokyo-1", "short", 1000.0))
    m.observe_throughput(peer, {"bits_per_second": 9.4e8, "bytes_sent": 5, "bytes_received": 4})
    m.observe_rates({("netdevs.eth0.stats", "rx_bytes"): 1250.0})
    m.watch_host_counters(lambda: {("netdevs.eth0.stats", "rx_bytes"): 123456})
    m.watch_refusals(lambda: {"busy": 3})
    m.observe_path(peer, 35.0, 2.0)
    m.path_event(peer, "rerouted")
    m.observe_regression(peer, "rtt")
    m.observe_fingerprints("tokyo-1", [{"fingerprint": "ab12", "flows": 3, "loss_ratio": 0.0,
                                        "rtt_ms": {"p50": 36.0, "p99": 39.0}}])
    text = m.exposition().decode()
    declared = families(text)  # every family the daemon declares, each with a sample here
    assert declared <= sampled(text), declared - sampled(text)
    assert len(declared) >= 30, sorted(declared)
    check_clean_and_old_shapes_refused(text)


@pytest.fixture
def processes():
    started: list[subprocess.Popen] = []
    yield started.append
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait(10)


def scrape(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()


@pytest.mark.lab
def test_real_daemon_scrape_passes_promtool(tmp_path, processes):
    """A daemon probing a `wanprobe reflect` on loopback over two flows, with its own reflector,
    counters and one throughput test: its scrape, once every family has samples, passes
    `promtool check metrics` with nothing to say."""
    require_tool("promtool")
    mport, own, far = free_port(), free_port(), free_port()
    cfg = tmp_path / "wanprobe.toml"
    cfg.write_text(daemon_toml(
        {"state_dir": tmp_path / "state", "metrics_listen": f"127.0.0.1:{mport}",
         "reflector_listen": [f"127.0.0.1:{own}"]},
        probe={"interval": "300ms", "jitter": "20ms", "count": 5, "packet_interval": "5ms",
               "timeout": "1s", "flows": 2},
        counters={"enabled": True, "interval": "1s"},
        throughput={"enabled": True, "interval": "10s", "duration": "1s", "streams": 1,
                    "budget_per_day": "2GiB", "max_bytes_per_test": "2GiB",
                    "tests_per_hour_per_client": 360},
        peers=[{"name": "far-1", "address": "127.0.0.1", "port": far}]))
    log = (tmp_path / "daemon.log").open("w")
    processes(subprocess.Popen([sys.executable, "-m", "wanprobe", "reflect", "--bind",
                                "127.0.0.1", "--port", str(far)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    processes(subprocess.Popen([sys.executable, "-m", "wanprobe", "daemon", "--config", str(cfg)],
                               stdout=log, stderr=subprocess.STDOUT))
    want = {"wanprobe_rtt_seconds", "wanprobe_owd_seconds", "wanprobe_host_stat_total",
            "wanprobe_host_stat_rate_per_second", "wanprobe_throughput_bytes_per_second",
            "wanprobe_path_fingerprint_rtt_seconds", "wanprobe_reflector_refusals_total",
            "wanprobe_probe_packets_received_total", "wanprobe_path_rtt_floor_seconds"}
    text, deadline = "", time.monotonic() + 60
    while time.monotonic() < deadline and not want <= sampled(text):
        time.sleep(0.5)
        try:
            text = scrape(mport)
        except OSError:
            continue
    log.close()
    assert want <= sampled(text), (want - sampled(text),
                                   Path(tmp_path / "daemon.log").read_text()[-2000:])
    received = [float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
                if ln.startswith("wanprobe_probe_packets_received_total{")]
    assert received and received[0] > 0, "the reflector answered no probe"
    assert 'stat="p50"' in text and "quantile=" not in text
    check_clean_and_old_shapes_refused(text)
