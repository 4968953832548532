"""Issue 20 on the lab: a capped sender is not "the path is full". The route to the peer locks
the congestion window (`ip route ... cwnd lock 60`), so every connection after the first carries
at most 60 segments per round trip — about a third of the link at 20 ms — while no buffer and
no loss limits it: the throughput verdict alone says "network". The closed loop compares with
the capacity it measures, tests again for longer, and names the congestion window."""

from __future__ import annotations

import pytest

from wanprobe.diagnose.throughput_verdict import JUDGE
from wanprobe.lab import netns
from wanprobe.lab.scenario import start_reflector
from wanprobe.services.verify import verify_path
from wanprobe.throughput.client import run_throughput

pytestmark = pytest.mark.netns
CWND_LOCK = 60


def test_a_sender_held_to_a_third_of_the_capacity_is_not_full(lab_factory):
    lab = lab_factory(rtt_ms=20, rate_bps=100e6)
    lab.a.run(["ip", "route", "replace", f"{lab.b.addr}/32", "dev", lab.a.ifname, "src",
               lab.a.addr, "cwnd", "lock", str(CWND_LOCK)], check=True)
    refl = start_reflector(lab)
    try:
        with lab.a.entered():
            # the kernel copies a route's locked metrics into its TCP metrics cache when the
            # first connection to the peer closes (tcp_metrics.c, tcpm_suck_dst); this is it
            run_throughput(lab.b.addr, duration_s=0.5, judge=JUDGE)
            v = verify_path(lab.b.addr, duration_s=2.0, omit_s=1.0)
    finally:
        netns.stop(refl)
    j = v.to_json()
    assert v.capacity_source.startswith("udp_burst") and v.capacity_bits_per_second > 50e6, j
    assert v.share_of_capacity < 0.9 and not v.path_full, j
    assert "path is full" not in v.next_step
    # measured again, twice as long with twice the ramp-up left out, and still below
    assert [(a.duration_s, a.omit_s) for a in v.attempts] == [(2.0, 1.0), (4.0, 2.0)], j
    assert v.limit == "congestion_control" and "congestion window" in v.summary, j
    mss = 1448
    assert v.evidence["cwnd_max_bytes"] <= CWND_LOCK * mss, j
    # the figure it names carries the rate: 60 x 1448 B per ~20 ms is ~35 Mbit/s
    assert v.bits_per_second_after_omit <= 1.1 * v.evidence["cwnd_allows_bits_per_second"], j


def test_apply_verify_writes_the_report_with_its_before_and_after(lab_factory, tmp_path):
    """`tune apply --verify PEER --report-out R`: the plan's report again, with the verify under
    measurements.verify (the writer the report page's before/after chart reads, issue 21)."""
    import json
    import sys

    lab = lab_factory(rtt_ms=20, rate_bps=100e6)
    lab.a.run(["sysctl", "-q", "-w", "net.ipv4.tcp_rmem=4096 65536 262144"], check=True)

    def wanprobe(*args, check=True):
        r = lab.a.run([sys.executable, "-m", "wanprobe", *args], capture_output=True, text=True,
                      timeout=180)
        assert not check or r.returncode == 0, r.stderr
        return r

    report, plan, out = tmp_path / "r.json", tmp_path / "plan.json", tmp_path / "after.json"
    state = ["--state-dir", str(tmp_path / "state")]
    refl = start_reflector(lab)
    try:
        wanprobe("diagnose", lab.b.addr, "--quick", "-o", str(report))
        wanprobe("tune", "plan", "-r", str(report), "--host", "local", "-o", str(plan))
        # without --verify: one line, nothing applied
        r = wanprobe("tune", "apply", str(plan), "--yes", *state, "--report-out", str(out),
                     check=False)
        assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "--verify" in r.stderr and not out.exists()
        wanprobe("tune", "apply", str(plan), "--yes", *state, "--verify", lab.b.addr,
                 "--report-out", str(out))
        page = tmp_path / "after.html"
        wanprobe("report", "show", str(out), "--format", "html", "-o", str(page))
        wanprobe("tune", "rollback", *state)
    finally:
        netns.stop(refl)
    doc, before = json.loads(out.read_text()), json.loads(report.read_text())
    assert doc["id"] == before["id"] and doc["findings"] == before["findings"]
    v = doc["measurements"]["verify"]
    assert v["bits_per_second_after_omit"] > 0 and v["capacity_source"].startswith("udp_burst")
    assert {k: x for k, x in doc["measurements"].items() if k != "verify"} == \
        before["measurements"]
    # the verify measured as the diagnose test did (issue 36: not a 6 s test against a 2 s one)
    t = before["measurements"]["throughput"]
    assert t["omit_s"] > 0, t
    assert (v["attempts"][0]["duration_s"], v["attempts"][0]["omit_s"]) == \
        (t["requested_duration_s"], t["omit_s"]), v["attempts"]
    assert "Throughput before and after tuning, by one method" in page.read_text()
