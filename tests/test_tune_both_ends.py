"""Issue 13 on the lab, both ends: only the receiver (the peer) has small buffers. diagnose must
blame the peer's tcp_rmem (quoting the peer's own value), the plan for the peer is refused on the
measuring host and, applied on the peer, fills the path (re-measured, ramp-up omitted)."""

from __future__ import annotations

import json
import sys

import pytest

from wanprobe.lab import netns
from wanprobe.lab.scenario import start_reflector
from wanprobe.services.verify import verify_path

pytestmark = pytest.mark.netns
SMALL = "4096 131072 262144"


def wanprobe(node, *args, check=True):
    r = node.run([sys.executable, "-m", "wanprobe", *args], capture_output=True, text=True,
                 timeout=180)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def rmem(node) -> str:
    return " ".join(node.run(["sysctl", "-n", "net.ipv4.tcp_rmem"], capture_output=True,
                             text=True).stdout.split())


def test_receiver_only_small_buffers_are_the_peers_and_the_peer_plan_fixes_it(lab_factory,
                                                                                tmp_path):
    lab = lab_factory(rtt_ms=60, rate_bps=100e6)
    lab.b.run(["sysctl", "-q", "-w", f"net.ipv4.tcp_rmem={SMALL}"], check=True)
    local_rmem = rmem(lab.a)
    refl = start_reflector(lab)
    try:
        report = tmp_path / "report.json"
        wanprobe(lab.a, "diagnose", lab.b.addr, "--quick", "-o", str(report), "--json")
        doc = json.loads(report.read_text())
        assert doc["peer"]["address"] == lab.b.addr and doc["host"]["address"] == lab.a.addr
        assert doc["measurements"]["peer_facts"]["tcp_rmem_bytes"] == [4096, 131072, 262144]
        assert doc["measurements"]["path"]["capacity_source"].startswith("udp_burst")
        win = next(f for f in doc["findings"] if f["id"] == "path.window_limited")
        assert (win["host"], win["direction"]) == ("peer", "forward")
        assert win["evidence"]["tcp_rmem"] == SMALL != local_rmem  # the peer's, not ours
        rmem_knobs = [k for k in win["knobs"] if k["key"] == "net.ipv4.tcp_rmem"]
        assert [k["host"] for k in rmem_knobs] == ["peer"]
        # the plan for the peer, made here, is bound to the peer's address
        plan = tmp_path / "peer.json"
        out = json.loads(wanprobe(lab.a, "tune", "plan", "-r", str(report), "--host", "peer",
                                  "-o", str(plan), "--json").stdout)
        assert out["host_address"] == lab.b.addr and out["for_host"] == "peer"
        new = {c["key"]: c["new"] for c in out["changes"]}["net.ipv4.tcp_rmem"]
        bdp = 100e6 * 0.060 / 8
        assert 2 * bdp <= int(new.split()[2]) <= 16 * bdp
        # bad input: applied on the wrong host → one line, nothing changed
        state = str(tmp_path / "state")
        r = wanprobe(lab.a, "tune", "apply", str(plan), "--yes", "--state-dir", state, check=False)
        assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "not an address of this host" in r.stderr and rmem(lab.a) == local_rmem
        # applied on the peer: the path fills
        wanprobe(lab.b, "tune", "apply", str(plan), "--yes", "--state-dir", state)
        assert rmem(lab.b) == new
        with lab.a.entered():
            after = verify_path(lab.b.addr, duration_s=5.0, omit_s=2.0)
        before = win["evidence"]["bits_per_second"]
        capacity = doc["measurements"]["path"]["capacity_bits_per_second"]
        # fixed: the window no longer limits (verdict), and the rate is the path's, not the
        # 170 KB window's (≈ 22 Mbit/s at 60 ms); "full" only at >= 90 % of the capacity the
        # loop measured itself (issue 20)
        assert after.limit != "window" and after.verdict != "receive_window", after
        assert after.path_full == (after.share_of_capacity >= 0.9), after
        assert after.bits_per_second_after_omit >= 0.75 * capacity, (after, capacity)
        assert after.bits_per_second_after_omit > 3 * before
        wanprobe(lab.b, "tune", "rollback", "--state-dir", state)
        assert rmem(lab.b) == SMALL
    finally:
        netns.stop(refl)
