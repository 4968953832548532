"""wanprobe throughput between two namespaces joined by an unshaped veth pair (real kernel TCP/UDP)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
from conftest import new_lab_name, require_tool

from wanprobe.diagnose.throughput_verdict import JUDGE
from wanprobe.lab.netns import entered
from wanprobe.throughput.client import run_throughput
from wanprobe.throughput.protocol import DATA_HEADER_BYTES

pytestmark = pytest.mark.netns

ADDR_A, ADDR_B = "198.19.0.1", "198.19.0.2"
WP_PORT, IPERF_PORT = 5210, 5201


class VethPair:
    """Namespaces ``a``/``b`` with a veth link; processes started here are ended on close."""

    def __init__(self) -> None:
        base = new_lab_name()
        self.a, self.b = f"{base}tpa", f"{base}tpb"
        self.procs: list[subprocess.Popen] = []

    def up(self) -> None:
        for cmd in (["ip", "netns", "add", self.a], ["ip", "netns", "add", self.b],
                    ["ip", "link", "add", "vtp0", "netns", self.a, "type", "veth",
                     "peer", "name", "vtp1", "netns", self.b],
                    ["ip", "-n", self.a, "addr", "add", f"{ADDR_A}/24", "dev", "vtp0"],
                    ["ip", "-n", self.b, "addr", "add", f"{ADDR_B}/24", "dev", "vtp1"],
                    ["ip", "-n", self.a, "link", "set", "vtp0", "up"],
                    ["ip", "-n", self.b, "link", "set", "vtp1", "up"],
                    ["ip", "-n", self.a, "link", "set", "lo", "up"],
                    ["ip", "-n", self.b, "link", "set", "lo", "up"]):
            subprocess.run(cmd, check=True, capture_output=True)

    def popen_b(self, argv: list[str], **kw) -> subprocess.Popen:
        proc = subprocess.Popen(["ip", "netns", "exec", self.b, *argv], **kw)
        self.procs.append(proc)
        return proc

    def start_wanprobe_server(self, *extra: str) -> subprocess.Popen:
        proc = self.popen_b([sys.executable, "-m", "wanprobe.throughput.server", "--bind", ADDR_B,
                             "--port", str(WP_PORT), *extra], stdout=subprocess.PIPE, text=True)
        assert "listening" in proc.stdout.readline()
        return proc

    def start_iperf3_server(self) -> subprocess.Popen:
        proc = self.popen_b(["iperf3", "-s", "-B", ADDR_B, "-p", str(IPERF_PORT)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.3)
        return proc

    def established(self, port: int) -> int:
        out = subprocess.run(["ip", "netns", "exec", self.b, "ss", "-tnH", "state", "established",
                              "sport", f"= :{port}"], capture_output=True, text=True).stdout
        return len(out.splitlines())

    def down(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(5)
        for ns in (self.a, self.b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@pytest.fixture
def veth():
    pair = VethPair()
    try:
        pair.up()
        yield pair
    finally:
        pair.down()


@pytest.mark.parametrize("streams", [1, 4])
def test_unshaped_veth_close_to_iperf3(veth, streams):
    """Sanity bound only, best of two alternating runs; the ≥ 0.9× claim is measured and printed by
    bench/throughput_vs_iperf3.py. 1 stream ≥ 0.6× (here 26-42 vs iperf3's 14-17 Gbit/s).
    4 streams ≥ 0.5×: on the 2-core AMD EPYC VM the bench's 9-round medians are 0.89-0.96× of
    iperf3 -P 4 (34-45 Gbit/s), but single 2 s rounds of either tool swing from 20 to 50 Gbit/s
    with the host, so a per-run bound has to stay loose."""
    require_tool("iperf3")
    no_cap = 2**40
    veth.start_wanprobe_server("--max-bytes", str(no_cap))
    veth.start_iperf3_server()
    wps, ip3s = [], []
    with entered(veth.a):
        for _ in range(2):
            # veth moves about the default 10 GiB cap in 2 s on this VM: lift it for both
            # engines, so that both run for the whole duration
            ip3s.append(run_throughput(ADDR_B, port=IPERF_PORT, duration_s=2, streams=streams,
                                       engine="iperf3", max_bytes=no_cap, judge=JUDGE))
            wps.append(run_throughput(ADDR_B, port=WP_PORT, duration_s=2, streams=streams,
                                      max_bytes=no_cap, judge=JUDGE))
    assert not any(r.partial for r in wps + ip3s), [
        (r.engine, r.partial_reason) for r in wps + ip3s if r.partial]
    best_wp = max(r.bits_per_second for r in wps)
    best_ip3 = max(r.bits_per_second for r in ip3s)
    print(f"\n{streams} stream(s): wanprobe {[round(r.bits_per_second / 1e9, 1) for r in wps]} "
          f"iperf3 {[round(r.bits_per_second / 1e9, 1) for r in ip3s]} Gbit/s")
    assert best_wp >= (0.6 if streams == 1 else 0.5) * best_ip3, (best_wp, best_ip3)
    j = wps[-1].to_json()
    assert len(j["streams"]) == streams and len(j["intervals"]) >= 2
    for s in j["streams"]:
        info = s["tcp_info"]
        # bytes_acked also counts the SYN, the FIN and our data-connection header.
        assert info["bytes_acked"] == s["bytes_sent"] + DATA_HEADER_BYTES + 2
        assert s["bytes_sent"] == s["bytes_received"]
        assert info["min_rtt_ms"] > 0 and info["cwnd_packets"] > 0
        assert info["delivery_rate_bits_per_second"] > 0
    assert sum(iv["bytes_received"] for iv in j["intervals"]) == j["bytes_received"]


def test_reverse_bidir_and_udp(veth):
    veth.start_wanprobe_server()
    with entered(veth.a):
        rev = run_throughput(ADDR_B, port=WP_PORT, duration_s=2, reverse=True, cc="cubic",
                             judge=JUDGE)
        bidir = run_throughput(ADDR_B, port=WP_PORT, duration_s=2, bidir=True, judge=JUDGE)
        udp = run_throughput(ADDR_B, port=WP_PORT, duration_s=2, udp=True, udp_rate_bps=50e6,
                             judge=JUDGE)
    r = rev.to_json()
    assert r["mode"] == "reverse" and r["cc"] == "cubic" and not r["partial"]
    # In reverse the server is the sender: its TCP_INFO came back over the control connection.
    assert r["streams"][0]["direction"] == "server_to_client"
    # The server's socket opened passively: its bytes_acked counts the FIN but not a SYN.
    assert r["streams"][0]["tcp_info"]["bytes_acked"] == r["streams"][0]["bytes_received"] + 1
    assert r["bits_per_second"] > 1e8
    b = bidir.to_json()
    assert b["reverse"]["bits_per_second"] > 1e8 and b["bits_per_second"] > 1e8
    assert {s["direction"] for s in b["streams"]} == {"client_to_server", "server_to_client"}
    u = udp.to_json()["udp"]
    assert u["packets_sent"] > 0 and u["lost_percent"] < 1.0
    assert u["bits_per_second"] == pytest.approx(50e6, rel=0.1)
    assert u["jitter_ms"] >= 0


def test_server_killed_mid_test_gives_partial_result(veth):
    server = veth.start_wanprobe_server()
    client = subprocess.Popen(["ip", "netns", "exec", veth.a, sys.executable, "-m", "wanprobe",
                               "throughput", ADDR_B, "--port", str(WP_PORT), "--duration", "4s",
                               "--interval", "0.5s", "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and veth.established(WP_PORT) < 2:
            time.sleep(0.1)  # until the control and data connections are up
        time.sleep(1.5)
        server.send_signal(signal.SIGKILL)
        out, err = client.communicate(timeout=30)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
    assert "Traceback" not in err
    assert client.returncode != 0
    doc = json.loads(out)
    assert doc["partial"] is True and doc["partial_reason"]
    assert doc["bytes_received"] > 0 and doc["intervals"]
    assert [line for line in err.splitlines() if line.strip()] == [
        f"wanprobe: warning: partial result: {doc['partial_reason']}"]


def test_dscp_and_pacing_rate_reach_the_wire(veth):
    require_tool("nft")
    veth.start_wanprobe_server()
    rules = ("add table ip wptest\n"
             "add chain ip wptest in { type filter hook input priority 0; policy accept; }\n"
             "add rule ip wptest in tcp dport 5210 ip dscp ef counter\n")
    subprocess.run(["ip", "netns", "exec", veth.b, "nft", "-f", "-"], input=rules, text=True,
                   check=True)
    with entered(veth.a):
        r = run_throughput(ADDR_B, port=WP_PORT, duration_s=2, dscp=46, pacing_rate_bps=200e6,
                           judge=JUDGE)
    counted = subprocess.run(["ip", "netns", "exec", veth.b, "nft", "list", "table", "ip",
                              "wptest"], capture_output=True, text=True, check=True).stdout
    packets = int(counted.split("counter packets ")[1].split()[0])
    assert packets > 100  # data segments (GRO-merged on veth) carried EF (46 << 2 = 0xb8)
    # SO_MAX_PACING_RATE caps the stream (TCP internal pacing, no fq needed).
    assert r.bits_per_second == pytest.approx(200e6, rel=0.15)
    assert r.limited_by.verdict == "pacing", r.limited_by
    assert r.streams[0].tcp_info["pacing_rate_bits_per_second"] <= 200e6 * 1.01


def test_served_by_wanprobe_reflect_tcp_and_udp_tap(veth):
    """The reflector runs ThroughputServer on its port and hands it our UDP test datagrams."""
    proc = veth.popen_b([sys.executable, "-m", "wanprobe", "reflect", "--bind", ADDR_B,
                         "--port", str(WP_PORT)], stderr=subprocess.PIPE, text=True)
    assert "throughput on tcp" in proc.stderr.readline()
    with entered(veth.a):
        tcp = run_throughput(ADDR_B, port=WP_PORT, duration_s=2, streams=2, judge=JUDGE)
        udp = run_throughput(ADDR_B, port=WP_PORT, duration_s=2, udp=True, udp_rate_bps=20e6,
                             judge=JUDGE)
    assert not tcp.partial and tcp.bits_per_second > 1e8 and len(tcp.streams) == 2
    assert not udp.partial and udp.udp.packets_received > 0.95 * udp.udp.packets_sent
    assert udp.udp.bits_per_second == pytest.approx(20e6, rel=0.1)
