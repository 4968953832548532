"""Acceptance in the emulated WAN lab: the daemon runs in namespace a with b as its peer
(reflector in b), its store and /metrics (scraped from inside a) hold RTTs that match the lab, and
raising a→b loss midway produces a regression report naming the peer and the loss figures."""

from __future__ import annotations

import hashlib
import json
import signal
import sqlite3
import statistics
import subprocess
import sys
import time

import pytest
from daemon_toml import LAB_PROBE, daemon_toml, scrape_command

RTT_MS = 40.0

SCRAPE = scrape_command()


def _metric(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


@pytest.mark.netns
def test_daemon_in_lab_matches_rtt_and_reports_loss_regression(lab_factory, tmp_path):
    lab = lab_factory(rtt_ms=RTT_MS)
    state = tmp_path / "state"
    cfg = tmp_path / "wanprobe.toml"
    plan = tmp_path / "plan.json"  # the operator's signed-off plan, for the auto-apply trigger
    plan.write_text(json.dumps({"changes": [{"tuner": "sysctl", "key": "net.ipv4.tcp_rmem",
                                             "new": "4096 131072 33554432"}]}))
    digest = hashlib.sha256(plan.read_bytes()).hexdigest()
    cfg.write_text(daemon_toml(
        {"state_dir": state, "metrics_listen": "127.0.0.1:9862",
         "reflector_listen": [f"{lab.a.addr}:862"]},
        probe=LAB_PROBE, counters={"interval": "2s"},
        baseline={"min_samples": 6, "recent": 3, "loss_increase": "2%", "loss_window": 5},
        auto_apply={"enabled": True, "tuners": ["sysctl"], "plan": plan, "plan_sha256": digest},
        peers=[{"name": "lab-b", "address": lab.b.addr, "site": "tokyo",
                "methods": ["stamp", "icmp", "tcp"]}]))
    reflector = lab.b.popen([sys.executable, "-m", "wanprobe", "reflect", "--bind", lab.b.addr],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    daemon = lab.a.popen([sys.executable, "-m", "wanprobe", "daemon", "--config", str(cfg)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        time.sleep(11.0)  # ~20 sessions before the loss step; ~20 s of daemon in total
        assert daemon.poll() is None and reflector.poll() is None
        metrics = lab.a.run([sys.executable, "-c", SCRAPE], capture_output=True, text=True,
                            timeout=30).stdout
        ping = lab.a.run(["ping", "-c", "10", "-i", "0.05", "-q", lab.b.addr], capture_output=True,
                         text=True, timeout=30).stdout
        lab.update(loss_ab=0.2)
        reports = []
        deadline = time.monotonic() + 12
        while not reports and time.monotonic() < deadline:
            time.sleep(0.5)
            reports = sorted((state / "reports").glob("*-lab-b-loss.json"))
        time.sleep(1.5)  # one more flush for the finding row
        daemon.send_signal(signal.SIGTERM)
        rc = daemon.wait(timeout=10)
    finally:
        for p in (daemon, reflector):
            if p.poll() is None:
                p.kill()
                p.wait(10)
    log = daemon.stdout.read()
    assert rc == 0, log

    # /metrics scraped from inside namespace a
    p50_s = _metric(metrics, "wanprobe_rtt_seconds", peer="lab-b", stat="p50", method="stamp")
    assert p50_s is not None, metrics
    ping_avg_ms = float(ping.strip().splitlines()[-1].split("=")[1].split("/")[1])
    # the store: per-session medians before the loss step
    con = sqlite3.connect(state / "history.sqlite3")
    rows = con.execute("SELECT rtt_p50_ms, rtt_p99_ms, sent, received FROM probes "
                       "WHERE peer = 'lab-b' AND method = 'stamp' AND error IS NULL "
                       "ORDER BY ts").fetchall()
    other = {m: statistics.median(r[0] for r in con.execute(
        "SELECT rtt_p50_ms FROM probes WHERE peer = 'lab-b' AND method = ? AND error IS NULL "
        "ORDER BY ts LIMIT 10", (m,))) for m in ("icmp", "tcp")}
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    findings = con.execute("SELECT finding_id, severity, report_path FROM findings "
                           "WHERE peer = 'lab-b'").fetchall()
    counter_samples = con.execute("SELECT count(*) FROM counter_rates").fetchone()[0]
    con.close()
    store_p50 = statistics.median(r[0] for r in rows[:10])
    print(f"\nlab RTT {RTT_MS} ms: /metrics p50 {p50_s * 1e3:.3f} ms, store median p50 "
          f"{store_p50:.3f} ms, ping avg {ping_avg_ms:.3f} ms, sessions {len(rows)}; "
          f"icmp p50 {other['icmp']:.3f} ms, tcp connect p50 {other['tcp']:.3f} ms")
    tol_ms = max(0.5, 0.02 * RTT_MS)
    assert abs(p50_s * 1e3 - RTT_MS) <= tol_ms
    assert _metric(metrics, "wanprobe_peer_info", dst_host="lab-b", dst_site="tokyo") == 1
    sent = _metric(metrics, "wanprobe_probe_packets_sent_total", dst_host="lab-b", method="stamp")
    assert sent is not None and sent >= 20 * 12 and sent % 20 == 0
    assert abs(store_p50 - RTT_MS) <= tol_ms
    assert all(abs(v - RTT_MS) <= tol_ms for v in other.values()), other
    assert len(rows) >= 12 and all(r[2] == 20 for r in rows)
    # counters of namespace a sampled every 2 s: rates stored and exported
    assert counter_samples >= 3, log
    assert 'wanprobe_host_stat_rate_per_second{counter="rx_packets",source="netdevs.' in metrics

    assert reports, f"no loss regression report; log:\n{log}"
    doc = json.loads(reports[0].read_text())
    from wanprobe.report.document import validate

    validate(doc)  # the diagnose report schema
    assert "errors" not in doc["measurements"]
    finding = doc["findings"][0]
    ev = finding["evidence"]
    print(f"report {reports[0].name}: {finding['title']}; baseline {ev['baseline']:.4f}, "
          f"current {ev['current']:.4f}, forward {ev.get('forward_ratio')}, "
          f"reverse {ev.get('reverse_ratio')}, CI95 {ev['recent_ci95']}")
    assert doc["peer"]["name"] == "lab-b" and doc["peer"]["address"] == lab.b.addr
    assert finding["id"] == "path.loss_regression" and "lab-b" in finding["title"]
    # 20 % a→b loss; the report fires once the recent sessions' CI clears baseline + 2 %
    assert ev["baseline"] < 0.02 and 0.05 <= ev["current"] <= 0.4
    assert ev["forward_ratio"] >= 0.05 and ev["reverse_ratio"] < 0.03, "loss is a→b only"
    assert doc["measurements"]["path"]["loss"]["sent"] == 20
    assert any(f[0] == "path.loss_regression" and f[2] == str(reports[0]) for f in findings)
    assert "path.loss_regression" not in {f[0] for f in findings[1:]}, "hysteresis: one report"
    assert "Loss to lab-b rose" in log
    # auto-apply on: the regression asked wanprobe-tune.path/.service for the signed-off plan,
    # once (min_interval 1 h), naming the report; the daemon itself changed nothing
    request = json.loads((state / "apply-request.json").read_text())
    assert request["plan_sha256"] == digest and request["reason"]["peer"] == "lab-b", request
    assert request["reason"]["report"] in {str(p) for p in (state / "reports").glob("*.json")}
    assert log.count("auto-apply: requested wanprobe-tune.service") == 1, log
