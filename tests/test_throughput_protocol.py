"""Pure parts of the throughput test: wire headers, UDP loss/jitter accounting, iperf3 -J mapping."""

from __future__ import annotations

import pytest

from wanprobe.diagnose.throughput_verdict import JUDGE
from wanprobe.errors import ProbeError
from wanprobe.throughput import protocol as proto
from wanprobe.throughput.iperf3_engine import iperf3_argv, parse_iperf3_json
from wanprobe.throughput.udp import UdpReceiverStats


def test_data_and_udp_headers_round_trip():
    cookie = bytes(range(8))
    raw = proto.pack_data_header(cookie, 3, proto.DOWN)
    assert len(raw) == proto.DATA_HEADER_BYTES and raw[:4] == proto.MAGIC_DATA
    assert proto.unpack_data_header(raw) == (cookie, 3, proto.DOWN)
    dgram = proto.pack_udp_header(cookie, 2**40, 123456789) + b"\0" * 100
    assert proto.unpack_udp_header(dgram) == (cookie, 2**40, 123456789)
    # A STAMP test packet (sequence number first) is not ours.
    assert proto.unpack_udp_header(b"\x00\x00\x00\x01" + b"\0" * 40) is None


def test_control_messages_and_request_validation():
    line = proto.encode("hello", version=1, test=proto.TestRequest(duration_s=2).to_json())
    msg = proto.decode(line)
    assert msg["op"] == "hello" and proto.TestRequest.from_json(msg["test"]).duration_s == 2
    with pytest.raises(ProbeError):
        proto.decode(b"not json\n")
    with pytest.raises(ProbeError):
        proto.decode(b"[1,2]\n")
    with pytest.raises(ProbeError):
        proto.TestRequest.from_json({"duration_s": "ten"})
    assert proto.TestRequest(duration_s=1, bidir=True).directions() == [proto.UP, proto.DOWN]
    assert proto.TestRequest(duration_s=1, reverse=True).directions() == [proto.DOWN]


def test_udp_jitter_follows_rfc3550_and_loss_counts_gaps():
    s = UdpReceiverStats()
    # Transit times 10, 12, 11 ms (send every 1 ms); seq 2 lost, seq 4 arrives late.
    s.update(0, 0, 10_000_000, 1400)
    s.update(1, 1_000_000, 13_000_000, 1400)   # D = 2 ms → J = 2/16 ms
    s.update(3, 3_000_000, 14_000_000, 1400)   # D = 1 ms → J += (1 - 0.125)/16
    s.update(5, 5_000_000, 16_000_000, 1400)   # D = 0
    s.update(4, 4_000_000, 16_500_000, 1400)   # late: transit 12.5 → D = 1.5 ms
    j = 0.0
    for d in (2.0, 1.0, 0.0, 1.5):
        j += (d - j) / 16
    snap = s.snapshot(packets_sent=6)
    assert snap["jitter_ms"] == pytest.approx(j, abs=1e-4)
    assert snap["packets"] == 5 and snap["lost_packets"] == 1 and snap["out_of_order"] == 1
    assert s.lost_packets() == 1  # up to max seq 5 without the sender's count


def test_iperf3_argv_maps_every_option():
    argv = iperf3_argv("198.18.0.2", port=5201, duration_s=3, streams=4, reverse=True,
                       bidir=False, cc="cubic", window_bytes=65536, dscp=46,
                       pacing_rate_bps=5e8, udp=False, udp_rate_bps=None, interval_s=0.5)
    assert argv[:4] == ["iperf3", "-c", "198.18.0.2", "-p"]
    for flag in ("-J", "-R", "-P", "-C", "-w", "--dscp", "--fq-rate"):
        assert flag in argv
    assert argv[argv.index("-w") + 1] == "65536" and argv[argv.index("-C") + 1] == "cubic"


IPERF3_DOC = {
    "start": {"tcp_mss_default": 1448,
              "test_start": {"protocol": "TCP", "num_streams": 1, "reverse": 0, "bidir": 0}},
    "intervals": [
        {"streams": [{"socket": 5, "start": 0, "end": 1.0, "seconds": 1.0, "bytes": 11_000_000,
                      "bits_per_second": 88e6, "retransmits": 2, "snd_cwnd": 760_000,
                      "rtt": 61_000, "rttvar": 900, "sender": True}],
         "sum": {"start": 0, "end": 1.0, "seconds": 1.0, "bytes": 11_000_000,
                 "bits_per_second": 88e6, "retransmits": 2, "sender": True}},
    ],
    "end": {
        "streams": [{"sender": {"socket": 5, "start": 0, "end": 1.0, "seconds": 1.0,
                                "bytes": 11_000_000, "bits_per_second": 88e6, "retransmits": 2,
                                "max_snd_cwnd": 760_000, "max_snd_wnd": 3_000_000,
                                "max_rtt": 65_000, "min_rtt": 60_000, "mean_rtt": 61_000,
                                "sender": True},
                     "receiver": {"socket": 5, "start": 0, "end": 1.06, "seconds": 1.06,
                                  "bytes": 10_800_000, "bits_per_second": 81.5e6,
                                  "sender": True}}],
        "sum_sent": {"start": 0, "end": 1.0, "seconds": 1.0, "bytes": 11_000_000,
                     "bits_per_second": 88e6, "retransmits": 2, "sender": True},
        "sum_received": {"start": 0, "end": 1.06, "seconds": 1.06, "bytes": 10_800_000,
                         "bits_per_second": 81.5e6, "sender": True},
        "cpu_utilization_percent": {"host_total": 12.0, "remote_total": 20.0},
        "sender_tcp_congestion": "cubic", "receiver_tcp_congestion": "cubic"},
}


def test_iperf3_json_maps_into_the_same_result_keys():
    r = parse_iperf3_json(IPERF3_DOC, peer="p", port=5201, requested_duration_s=1.0,
                          streams_requested=1, window_bytes=None, dscp=0,
                          pacing_rate_bps=None, udp_rate_bps=None, judge=JUDGE)
    j = r.to_json()
    assert j["engine"] == "iperf3" and j["cc"] == "cubic"
    assert j["bits_per_second"] == 81.5e6 and j["sender_bits_per_second"] == 88e6
    assert j["retransmits"] == 2 and j["partial"] is False
    s = j["streams"][0]
    assert s["tcp_info"]["min_rtt_ms"] == 60.0 and s["rtt_mean_ms"] == 61.0
    assert s["tcp_info"]["cwnd_packets"] == 760_000 // 1448
    assert j["intervals"][0]["streams"][0]["rtt_ms"] == 61.0
    assert j["min_rtt_ms"] == 60.0 and j["bdp_bytes"] == round(81.5e6 * 0.060 / 8)
    assert j["limited_by"]["verdict"] in {"network", "congestion", "receive_window", "host_cpu"}
    for key in ("bits_per_second", "sender_bits_per_second", "retransmits", "streams",
                "intervals", "limited_by", "bdp_bytes", "cc", "duration_s", "peer", "partial"):
        assert key in j


def test_iperf3_error_document_is_partial():
    doc = {**IPERF3_DOC, "error": "control socket has closed unexpectedly"}
    r = parse_iperf3_json(doc, peer="p", port=5201, requested_duration_s=1.0,
                          streams_requested=1, window_bytes=None, dscp=0,
                          pacing_rate_bps=None, udp_rate_bps=None, judge=JUDGE)
    assert r.partial and "closed" in r.partial_reason
