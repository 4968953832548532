"""sd_notify against a real AF_UNIX datagram socket, journald log lines, systemd unit hardening,
the auto-apply gate."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import socket
import subprocess
from pathlib import Path

import pytest
from conftest import require_tool

from wanprobe.daemon import logging as dlog
from wanprobe.daemon.auto_apply import REQUEST_NAME, check_plan, request_apply
from wanprobe.daemon.config import AutoApply
from wanprobe.daemon.sd_notify import Notifier, socket_address, watchdog_interval_s
from wanprobe.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def notify_socket(tmp_path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = tmp_path / "notify.sock"
    sock.bind(str(path))
    sock.settimeout(2.0)
    yield str(path), sock
    sock.close()


def test_sd_notify_datagrams_on_a_real_socket(notify_socket):
    path, sock = notify_socket
    n = Notifier({"NOTIFY_SOCKET": path})
    assert n.ready("probing 3 peers every 10 s")
    assert sock.recv(4096) == b"READY=1\nSTATUS=probing 3 peers every 10 s"
    assert n.watchdog()
    assert sock.recv(4096) == b"WATCHDOG=1"
    assert n.status("line one\nline two")  # a newline would start a new assignment
    assert sock.recv(4096) == b"STATUS=line one line two"
    assert n.stopping()
    assert sock.recv(4096).split(b"\n") == [b"STOPPING=1", b"STATUS=stopping"]
    n.close()


def test_sd_notify_abstract_namespace():
    name = f"wanprobe-test-{os.getpid()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(b"\0" + name.encode())
    sock.settimeout(2.0)
    try:
        assert socket_address("@" + name) == b"\0" + name.encode()
        n = Notifier({"NOTIFY_SOCKET": "@" + name})
        assert n.ready()
        assert sock.recv(4096) == b"READY=1"
    finally:
        sock.close()


def test_sd_notify_without_systemd_or_with_a_dead_socket_never_raises(tmp_path):
    assert Notifier({}).ready() is False
    n = Notifier({"NOTIFY_SOCKET": str(tmp_path / "nobody-listens")})
    assert n.ready() is False and "failed" in n.last_error


def test_watchdog_interval_is_half_of_watchdog_usec():
    assert watchdog_interval_s({"WATCHDOG_USEC": "30000000"}) == 15.0
    assert watchdog_interval_s({"WATCHDOG_USEC": "4000000", "WATCHDOG_PID": "42"}, pid=42) == 2.0
    assert watchdog_interval_s({"WATCHDOG_USEC": "4000000", "WATCHDOG_PID": "43"}, pid=42) is None
    assert watchdog_interval_s({}) is None
    assert watchdog_interval_s({"WATCHDOG_USEC": "junk"}) is None


def test_journal_and_logfmt_lines():
    buf = io.StringIO()
    dlog.setup("journal", stream=buf)
    dlog.log(logging.WARNING, "probe failed", peer="tokyo-1", error="no answer within 2.2 s")
    dlog.log(logging.ERROR, "reload refused", problem="probe.interval: bad")
    lines = buf.getvalue().splitlines()
    assert lines[0] == '<4>probe failed peer=tokyo-1 error="no answer within 2.2 s"'
    assert lines[1].startswith("<3>reload refused problem=")
    dlog.set_style("logfmt")
    dlog.log(logging.INFO, "started", peers=2)
    assert re.fullmatch(r'ts=\S+Z level=info msg=started peers=2', buf.getvalue().splitlines()[2])


def test_systemd_analyze_security_exposure_at_most_3():
    tool = require_tool("systemd-analyze")
    r = subprocess.run([tool, "security", "--offline=true", "--no-pager",
                        str(REPO / "systemd" / "wanprobe.service")],
                       capture_output=True, text=True, timeout=60)
    m = re.search(r"Overall exposure level for wanprobe\.service: (\d+\.\d+)", r.stdout)
    assert m, r.stdout + r.stderr
    exposure = float(m.group(1))
    print(f"\nsystemd-analyze security --offline=true systemd/wanprobe.service: exposure {exposure}")
    assert exposure <= 3.0


def test_units_grant_only_the_capabilities_they_need():
    def keys(name: str) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for line in (REPO / "systemd" / name).read_text().splitlines():
            if "=" in line and not line.startswith("#"):
                k, v = line.split("=", 1)
                out.setdefault(k.strip(), []).append(v.strip())
        return out

    svc, tune = keys("wanprobe.service"), keys("wanprobe-tune.service")
    assert svc["Type"] == ["notify"] and svc["Restart"] == ["on-failure"] and "WatchdogSec" in svc
    assert set(svc["CapabilityBoundingSet"][0].split()) == {"CAP_NET_RAW", "CAP_NET_BIND_SERVICE"}
    assert set(svc["AmbientCapabilities"][0].split()) == {"CAP_NET_RAW", "CAP_NET_BIND_SERVICE"}
    assert "CAP_NET_ADMIN" not in " ".join(sum(svc.values(), []))
    assert tune["Type"] == ["oneshot"] and tune["CapabilityBoundingSet"] == ["CAP_NET_ADMIN"]
    assert "--check-plan" in tune["ExecCondition"][0]


def test_auto_apply_gate_checks_sign_off_and_whitelist(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"changes": [{"tuner": "sysctl", "key": "net.ipv4.tcp_rmem",
                                             "new": "4096 131072 67108864"}]}))
    digest = hashlib.sha256(plan.read_bytes()).hexdigest()
    assert len(check_plan(AutoApply(True, ("sysctl",), plan, digest))) == 1
    with pytest.raises(ConfigError, match="not in auto_apply.tuners"):
        check_plan(AutoApply(True, ("link",), plan, digest))
    plan.write_text(plan.read_text().replace("67108864", "134217728"))  # edited after review
    with pytest.raises(ConfigError, match="not the signed-off plan"):
        check_plan(AutoApply(True, ("sysctl",), plan, digest))
    with pytest.raises(ConfigError, match="off"):
        check_plan(AutoApply())


def test_apply_request_is_gated_rate_limited_and_watched_by_the_path_unit(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"changes": [{"tuner": "sysctl", "key": "net.ipv4.tcp_rmem",
                                             "new": "4096 131072 67108864"}]}))
    digest = hashlib.sha256(plan.read_bytes()).hexdigest()
    auto = AutoApply(True, ("sysctl",), plan, digest, min_interval_s=600.0)
    why = {"peer": "tokyo-1", "metric": "loss", "report": "/r.json"}
    assert request_apply(AutoApply(), tmp_path, reason=why, now_s=1000.0, last_request_s=None) is None
    path = request_apply(auto, tmp_path, reason=why, now_s=1000.0, last_request_s=None)
    doc = json.loads(path.read_text())
    assert path.name == REQUEST_NAME and doc["plan_sha256"] == digest and doc["reason"] == why
    assert request_apply(auto, tmp_path, reason=why, now_s=1500.0, last_request_s=1000.0) is None
    assert request_apply(auto, tmp_path, reason=why, now_s=1600.0, last_request_s=1000.0) == path
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp left
    plan.write_text(plan.read_text().replace("67108864", "134217728"))  # edited after sign-off
    with pytest.raises(ConfigError, match="not the signed-off plan"):
        request_apply(auto, tmp_path, reason=why, now_s=9000.0, last_request_s=None)
    # the path unit watches exactly that file in the daemon's StateDirectory, for the tune unit
    unit = (REPO / "systemd" / "wanprobe-tune.path").read_text()
    svc = (REPO / "systemd" / "wanprobe.service").read_text()
    state_dir = re.search(r"^StateDirectory=(\S+)", svc, re.M).group(1)
    assert f"PathChanged=/var/lib/{state_dir}/{REQUEST_NAME}" in unit.splitlines()
    assert "Unit=wanprobe-tune.service" in unit.splitlines()


def test_metrics_exposition_names_units_and_forgetting_a_peer():
    from prometheus_client.parser import text_string_to_metric_families

    from wanprobe.daemon.metrics import DaemonMetrics
    from wanprobe.mesh.peer import Peer

    m = DaemonMetrics(site="taipei", host="tpe-1")
    peer = Peer("tokyo-1", "198.18.0.2", site="tokyo")
    m.set_peers((peer,))
    doc = {"rtt_ms": {"min": 35.0, "p50": 36.0, "p90": 37.0, "p99": 40.0, "max": 41.0},
           "loss": {"sent": 100, "received": 97, "ratio": 0.03, "forward_ratio": 0.01,
                    "reverse_ratio": 0.0202, "forward_lost": 1, "reverse_lost": 2}, "jitter_ms": 0.5}
    m.observe_probe(peer, "stamp", doc)
    m.observe_probe(peer, "stamp", doc)
    m.observe_probe_error(peer, "stamp")
    m.observe_throughput(peer, {"bits_per_second": 9.4e8, "bytes_sent": 5, "bytes_received": 4})
    m.observe_rates({("netdevs.eth0.stats", "rx_bytes"): 1250.0})
    m.set_findings({"warning": 2})
    fams = {f.name: f for f in text_string_to_metric_families(m.exposition().decode())}
    value = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in fams.values()
             for s in f.samples}
    path = (("dst_host", "tokyo-1"), ("dst_site", "tokyo"), ("peer", "tokyo-1"),
            ("src_host", "tpe-1"), ("src_site", "taipei"))

    def key(name, *extra):
        return name, tuple(sorted(path + extra))

    lab = (("method", "stamp"),)
    assert value[key("wanprobe_rtt_seconds", ("stat", "p99"), *lab)] == 0.040
    assert value[key("wanprobe_rtt_seconds", ("stat", "min"), *lab)] == 0.035
    assert value[key("wanprobe_loss_ratio", ("direction", "forward"), *lab)] == 0.01
    assert value[key("wanprobe_jitter_seconds", *lab)] == 0.0005
    # raw counters, summed over sessions (Prometheus takes the rate)
    assert value[key("wanprobe_probe_packets_sent_total", *lab)] == 200
    assert value[key("wanprobe_probe_packets_received_total", *lab)] == 194
    assert value[key("wanprobe_probe_packets_lost_total", ("direction", "forward"), *lab)] == 2
    assert value[key("wanprobe_probe_packets_lost_total", ("direction", "reverse"), *lab)] == 4
    assert value[key("wanprobe_probe_packets_lost_total", ("direction", "round_trip"), *lab)] == 6
    assert value[key("wanprobe_probe_sessions_total", *lab)] == 3
    assert value[key("wanprobe_probe_errors_total")] == 1
    assert value[key("wanprobe_throughput_bytes_per_second")] == 9.4e8 / 8  # base unit bytes
    assert value[key("wanprobe_peer_info", ("address", "198.18.0.2"), ("methods", "stamp"))] == 1
    assert value[("wanprobe_findings", (("severity", "warning"),))] == 2
    assert value[("wanprobe_host_stat_rate_per_second", (("counter", "rx_bytes"),
                                                          ("source", "netdevs.eth0.stats")))] == 1250
    assert not any(name.endswith("_created") for name, _ in value), "no _created twins"
    for name in fams:  # Prometheus conventions: prefix, base units, no ms/percent
        assert name.startswith("wanprobe_") and not re.search(r"_(ms|milliseconds|percent)\b", name)
    m.forget_peer("tokyo-1")
    text = m.exposition().decode()
    assert 'wanprobe_rtt_seconds{' not in text and 'wanprobe_loss_ratio{' not in text
    assert 'wanprobe_probe_errors_total{dst_host="tokyo-1"' in text  # counters keep their history


@pytest.mark.parametrize("peers,methods", [(1, 1), (10, 1), (200, 1), (50, 3)])
def test_series_per_host_is_linear_in_peers_as_documented(peers, methods):
    """Cardinality stays bounded: the exposition of a daemon whose every peer has probed, failed
    once and run a throughput test has exactly series_per_host(peers, methods) series."""
    from prometheus_client.parser import text_string_to_metric_families

    from wanprobe.daemon.metrics import DaemonMetrics, series_per_host
    from wanprobe.mesh.peer import METHODS, Peer
    from wanprobe.probe.loss_window import PeerLossWindows

    m = DaemonMetrics(site="a", host="a-1")
    ps = tuple(Peer(f"p{i}", f"198.18.{i // 250}.{1 + i % 250}", site=f"s{i % 4}",
                    methods=METHODS[:methods]) for i in range(peers))
    m.set_peers(ps)
    doc = {"rtt_ms": {"min": 1, "p50": 2, "p90": 3, "p99": 4, "max": 5}, "jitter_ms": 0.1,
           "loss": {"sent": 10, "received": 8, "ratio": 0.2, "forward_ratio": 0.1,
                    "reverse_ratio": 0.1, "forward_lost": 1, "reverse_lost": 1,
                    "forward_of": 10, "reverse_of": 9}}
    windows = PeerLossWindows(300, 3600)
    for p in ps:
        for method in p.methods:
            m.observe_probe(p, method, doc)
            m.observe_probe_error(p, method)
        windows.add(p.name, 1000.0, doc)
        m.loss_window.observe(m.path_labels(p), windows.loss(p.name, "short", 1000.0))
        m.observe_throughput(p, {"bits_per_second": 1e9, "bytes_sent": 10, "bytes_received": 10})
    series = [s for f in text_string_to_metric_families(m.exposition().decode()) for s in f.samples]
    assert len(series) == series_per_host(peers, methods)
    assert series_per_host(1000, 1) == 7 + 1000 * 28  # the figure docs/fleet.md quotes


def test_counter_rates_keep_children_and_drop_vanished_counters():
    from wanprobe.daemon.metrics import DaemonMetrics

    m = DaemonMetrics()
    m.observe_rates({("netdevs.eth0.stats", "rx_bytes"): 1.0, ("netdevs.eth1.stats", "rx_bytes"): 2.0})
    m.observe_rates({("netdevs.eth0.stats", "rx_bytes"): 3.0})
    text = m.exposition().decode()
    assert 'wanprobe_host_stat_rate_per_second{counter="rx_bytes",source="netdevs.eth0.stats"} 3.0' in text
    assert "eth1" not in text


def test_host_counters_are_exported_raw_as_read():
    """Raw counters as ``_total`` (node_exporter's way; Prometheus takes rates): the value for
    lo's rx_packets lies between two direct sysfs reads around the daemon's sample."""
    from pathlib import Path

    from wanprobe.daemon.metrics import DaemonMetrics
    from wanprobe.services.counters import CounterSampler

    sysfs = Path("/sys/class/net/lo/statistics/rx_packets")
    counters = CounterSampler(Path("/sys"), Path("/proc"))
    m = DaemonMetrics()
    m.watch_host_counters(lambda: counters.raw)
    assert "wanprobe_host_stat_total{" not in m.exposition().decode()  # nothing read yet
    before = int(sysfs.read_text())
    counters.sample()
    after = int(sysfs.read_text())
    line = next(ln for ln in m.exposition().decode().splitlines()
                if ln.startswith('wanprobe_host_stat_total{counter="rx_packets",'
                                 'source="netdevs.lo.'))
    assert before <= float(line.rsplit(" ", 1)[1]) <= after


def test_exposition_is_generate_latest_byte_for_byte():
    """The label-caching exposition (daemon/exposition.py) writes what prometheus_client's
    generate_latest writes, also after series are removed, with escapes and scraped families."""
    from prometheus_client import generate_latest

    from wanprobe.daemon.metrics import DaemonMetrics
    from wanprobe.mesh.peer import Peer

    m = DaemonMetrics(site='a"b', host="h\\1")
    ps = tuple(Peer(f"p{i}\n", f"198.18.0.{i + 1}", site="s") for i in range(30))
    m.set_peers(ps)
    m.watch_refusals(lambda: {"busy": 3, "dscp": 1})
    for p in ps:
        m.observe_probe(p, "stamp", {"rtt_ms": {"min": 1.5, "p50": 2}, "jitter_ms": 0.25,
                                     "loss": {"sent": 10, "received": 9, "ratio": 0.1}})
        m.observe_path(p, 1.0, float("nan"))
    for _ in range(2):
        assert m.exposition() == generate_latest(m.registry)
    m.forget_peer("p3\n")
    assert m.exposition() == generate_latest(m.registry)


def test_peer_budget_refuses_configured_peers_and_samples_a_mesh_with_one_line():
    from wanprobe.daemon import budget
    from wanprobe.errors import ConfigInvalid
    from wanprobe.mesh.peer import Peer

    one = budget.peer_series(Peer("x", "198.18.0.1"))
    room = (budget.MAX_SERIES - budget.SERIES_PER_HOST) // one
    mk = lambda n, site="a": [Peer(f"{site}{i:05d}", f"10.{i // 65536}.{i // 256 % 256}.{i % 256}",  # noqa: E731
                                   site) for i in range(n)]
    with pytest.raises(ConfigInvalid, match="over this daemon's budget"):
        budget.fit(mk(room + 1), [], site="a", host="h")
    peers, note = budget.fit(mk(room), [], site="a", host="h")
    assert len(peers) == room and note is None
    local, remote = mk(room + 500), mk(6, "b")
    peers, note = budget.fit([], local + remote, site="a", host="a00100")
    assert len(peers) == room and budget.series_of(peers) <= budget.MAX_SERIES
    assert sum(p.site == "b" for p in peers) == 6  # every other site's representatives kept
    assert peers[6].name == "a00101"  # then the hosts after this one, around the ring
    assert f"probing {room} of them" in note and "\n" not in note
    assert budget.peer_series(Peer("x", "198.18.0.1", flows=8)) == one + 8 * 6
