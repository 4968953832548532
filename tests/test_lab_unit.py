"""Unit tests of the lab's pure parts: settings validation, profiles, tbf sizing, the packet
operations of the delay line (checked against scapy) and its scheduling logic."""

from __future__ import annotations

import random
import struct

import pytest
from scapy.layers.inet import IP, TCP, UDP

from wanprobe.errors import UsageError
from wanprobe.lab import PROFILES, packet
from wanprobe.lab.arrivals import MATCH_BYTES, ArrivalStamps
from wanprobe.lab.delayline import DelayLine, wake_estimates
from wanprobe.lab.lab import effective_caps, resolve_settings, validate_name
from wanprobe.lab.settings import LinkSettings
from wanprobe.lab.shaping import tbf_burst_bytes, tbf_commands, tbf_limit_bytes
from wanprobe.lab.tun import (
    VIRTIO_NET_HDR_F_NEEDS_CSUM,
    VIRTIO_NET_HDR_GSO_TCPV4,
    VIRTIO_NET_HDR_GSO_UDP_L4,
    VNET_HDR,
    VnetHdr,
)


# -- settings and profiles -------------------------------------------------------------------
@pytest.mark.parametrize("kwargs", [
    {"rtt_ms": -1}, {"rtt_ms": float("nan")}, {"rtt_ms": "x"}, {"jitter_ms": -0.1},
    {"loss_ab": 1.5}, {"loss_ba": -0.01}, {"rate_bps": 0}, {"rate_bps": -5e6},
    {"mtu": 100}, {"mtu": 1400.5}, {"black_hole_mtu": 1600}, {"reorder": 2},
])
def test_bad_settings_are_one_line_usage_errors(kwargs):
    with pytest.raises(UsageError) as exc:
        LinkSettings(**kwargs).validated()
    assert "\n" not in str(exc.value)


def test_profile_values_and_explicit_overrides():
    s = resolve_settings("taipei-uswest")
    assert (s.rtt_ms, s.loss_ab, s.loss_ba, s.rate_bps) == (130.0, 0.001, 0.001, 100e6)
    s = resolve_settings("taipei-uswest", rtt_ms=140.0, loss_ba=0.02)
    assert (s.rtt_ms, s.loss_ab, s.loss_ba) == (140.0, 0.001, 0.02)
    s = resolve_settings(None, loss=0.01, loss_ab=0.0)
    assert (s.rtt_ms, s.loss_ab, s.loss_ba, s.rate_bps) == (60.0, 0.0, 0.01, None)
    with pytest.raises(UsageError, match="unknown lab profile"):
        resolve_settings("atlantis")


def test_required_profiles_exist_and_are_documented():
    import wanprobe.lab.profiles as mod
    rtts = {name: p.rtt_ms for name, p in PROFILES.items()}
    assert 1 <= rtts["metro"] <= 3 and 30 <= rtts["taipei-tokyo"] <= 40
    assert 45 <= rtts["taipei-singapore"] <= 55 and 120 <= rtts["taipei-uswest"] <= 140
    assert PROFILES["taipei-uswest"].loss == pytest.approx(0.001)
    assert PROFILES["subsea-degraded"].loss == pytest.approx(0.01)
    assert rtts["subsea-degraded"] > rtts["taipei-uswest"]
    assert "https://" in mod.__doc__ and all(p.description for p in PROFILES.values())
    # issue 35: the routes at line rate, 1-5 Gbit/s
    for name, route in (("taipei-tokyo-dci", "taipei-tokyo"), ("taipei-uswest-dci", "taipei-uswest")):
        assert PROFILES[name].rtt_ms == PROFILES[route].rtt_ms
        assert 1e9 <= PROFILES[name].rate_bps <= 5e9


@pytest.mark.parametrize("flags", [
    {"rtt": "-5ms"}, {"rtt": "soon"}, {"jitter": "-1ms"}, {"rate": "-1mbit"}, {"rate": "100"},
    {"rate": "fast"}, {"loss": "150%"}, {"loss": "-1%"}, {"loss_ab": "2"}, {"reorder": "x"},
])
def test_cli_unit_strings_are_parsed_by_wanprobe_units(flags):
    from wanprobe.commands.lab_settings import settings_kwargs
    with pytest.raises(UsageError):
        settings_kwargs(**flags)


def test_cli_unit_strings_to_lab_arguments():
    from wanprobe.commands.lab_settings import settings_kwargs
    assert settings_kwargs(rtt="60ms", loss="0.5%", rate="100mbit", jitter="1") == {
        "rtt_ms": 60.0, "loss": 0.005, "rate_bps": 100e6, "jitter_ms": 1.0}


@pytest.mark.parametrize("name", ["", "-x", "a b", "x" * 41, "a/b", "ä"])
def test_bad_lab_names(name):
    with pytest.raises(UsageError):
        validate_name(name)


def test_effective_caps_parsing():
    assert effective_caps("Name:\tx\nCapEff:\t000001ffffffffff\n") == 0x1FFFFFFFFFF
    assert effective_caps("CapEff:\t0000000000000000\n") == 0


def test_tbf_sizing_holds_a_gso_packet_and_a_bdp():
    assert tbf_burst_bytes(50e6) >= 65536 + 54
    assert tbf_burst_bytes(10e9) == 10e9 / 8 * 0.001
    # one BDP of queue on top of the bucket, at least 20 ms worth
    assert tbf_limit_bytes(200e6, 60) == tbf_burst_bytes(200e6) + 200e6 / 8 * 0.060
    assert tbf_limit_bytes(200e6, 2) == tbf_burst_bytes(200e6) + 200e6 / 8 * 0.020
    assert "tbf rate 50000000bit" in tbf_commands("wan0", 50e6, 20)[0]
    assert "tbf" not in tbf_commands("wan0", None, 20)[0]


def test_wake_estimates_are_median_and_bounded_spin():
    credit, spin = wake_estimates([10_000] * 16 + [80_000] * 16)
    assert credit == 80_000 and spin == 120_000
    credit, spin = wake_estimates([10_000] * 16 + [200_000] * 16)
    assert credit == 100_000 and spin == 300_000  # credit is capped, spin is not
    credit, spin = wake_estimates([1_000] * 32)
    assert credit == 1_000 and spin == 50_000  # minimum spin


# -- packet operations, checked with scapy ----------------------------------------------------
def tcp4_packet(payload_len: int, flags: str = "PA", tos: int = 0) -> bytes:
    return bytes(IP(src="198.18.0.1", dst="198.18.0.2", id=1000, tos=tos, flags="DF")
                 / TCP(sport=5201, dport=40000, seq=4_294_967_000, ack=7, flags=flags,
                       options=[("Timestamp", (1, 2))])
                 / bytes(i % 251 for i in range(payload_len)))


def complete_partial_checksum(seg: bytes, csum_start: int, csum_offset: int) -> bytes:
    """What a NIC does for CHECKSUM_PARTIAL: sum from csum_start, store the complement."""
    s = bytearray(seg)
    value = ~packet.ones_sum(s[csum_start:]) & 0xFFFF
    s[csum_start + csum_offset:csum_start + csum_offset + 2] = value.to_bytes(2, "big")
    return bytes(s)


def test_segment_tcp4_matches_kernel_rules_and_scapy_checksums():
    orig = tcp4_packet(3000, flags="FPAC")  # FIN, PSH, ACK, CWR
    hl = packet.tcp4_headers_len(orig)
    assert hl == 20 + 32
    assert packet.segment_sizes(orig, 1448) == [hl + 1448, hl + 1448, hl + 104]
    segs = list(packet.segment_tcp4(orig, 1448))
    assert len(segs) == 3
    payload = b""
    for i, (vnet, seg) in enumerate(segs):
        h = VnetHdr.unpack(vnet)
        assert h.flags == VIRTIO_NET_HDR_F_NEEDS_CSUM and h.gso_type == 0
        assert (h.csum_start, h.csum_offset) == (20, 16)
        ip = IP(complete_partial_checksum(seg, h.csum_start, h.csum_offset))
        assert ip.len == len(seg) and ip.id == 1000 + i
        assert ip.seq == (4_294_967_000 + i * 1448) % 2**32
        ref = IP(bytes(ip))
        del ref.chksum, ref[TCP].chksum
        ref = IP(bytes(ref))  # scapy recomputes both checksums
        assert ip.chksum == ref.chksum and ip[TCP].chksum == ref[TCP].chksum
        flags = str(ip[TCP].flags)
        assert ("C" in flags) == (i == 0)
        assert ("F" in flags) == ("P" in flags) == (i == 2)
        assert "A" in flags
        payload += bytes(ip[TCP].payload)
    assert payload == orig[hl:]


def udp4_gso_packet(payload_len: int) -> bytes:
    """A UDP/IPv4 packet as a UDP_SEGMENT sender hands it down: one header over all of it."""
    return bytes(IP(src="198.18.0.1", dst="198.18.0.2", id=65534, tos=26 << 2)
                 / UDP(sport=40000, dport=862) / bytes(i % 253 for i in range(payload_len)))


def test_segment_udp4_matches_the_kernels_datagrams_and_scapy_checksums():
    orig = udp4_gso_packet(3 * 1400 + 123)
    assert packet.headers_len(orig) == 28
    assert packet.segment_sizes(orig, 1400) == [1428, 1428, 1428, 151]
    payload = b""
    for i, (vnet, seg) in enumerate(packet.segment(orig, 1400)):
        h = VnetHdr.unpack(vnet)
        assert h.flags == VIRTIO_NET_HDR_F_NEEDS_CSUM and h.gso_type == 0
        assert (h.csum_start, h.csum_offset) == (20, 6)
        ip = IP(complete_partial_checksum(seg, h.csum_start, h.csum_offset))
        assert ip.len == len(seg) and ip.id == (65534 + i) % 2**16 and ip.tos == 26 << 2
        assert ip[UDP].len == len(seg) - 20 and ip[UDP].dport == 862
        ref = IP(bytes(ip))
        del ref.chksum, ref[UDP].chksum
        ref = IP(bytes(ref))  # scapy recomputes both checksums
        assert ip.chksum == ref.chksum and ip[UDP].chksum == ref[UDP].chksum
        payload += bytes(ip[UDP].payload)
    assert payload == orig[28:]


def test_gso_size_is_read_for_tcp_and_udp_super_packets_only():
    udp, tcp = udp4_gso_packet(5000), tcp4_packet(5000)
    uso = VNET_HDR.pack(VIRTIO_NET_HDR_F_NEEDS_CSUM, VIRTIO_NET_HDR_GSO_UDP_L4, 28, 1400, 20, 6)
    tso = VNET_HDR.pack(VIRTIO_NET_HDR_F_NEEDS_CSUM, VIRTIO_NET_HDR_GSO_TCPV4, 52, 1448, 20, 16)
    assert packet.gso_size_of(uso, udp) == 1400 and packet.gso_size_of(tso, tcp) == 1448
    assert packet.gso_size_of(uso, tcp) == 0  # the header and the packet disagree: one unit
    assert packet.gso_size_of(bytes(10), udp) == 0


def test_bleach_zeroes_dscp_keeps_ecn_and_fixes_checksum():
    orig = tcp4_packet(10, tos=(26 << 2) | 0b01)
    out = packet.bleach_dscp(orig)
    ip = IP(out)
    assert ip.tos == 0b01
    ref = IP(out)
    del ref.chksum
    assert IP(bytes(ref)).chksum == ip.chksum  # scapy recomputes the header checksum
    assert packet.ones_sum(out[:20]) == 0xFFFF  # valid header checksum
    assert out[20:] == orig[20:]
    clean = tcp4_packet(10, tos=0b10)
    assert packet.bleach_dscp(clean) is clean


# -- the delay line's logic, with a recording writer instead of TUN fds ------------------------
FD_A, FD_B = 1001, 1002


def delay_line(settings: LinkSettings, *, offload: bool, seed: int):
    sent: dict[int, list[bytes]] = {FD_A: [], FD_B: []}
    line = DelayLine(FD_A, FD_B, settings.validated(), offload=offload, rng=random.Random(seed),
                     write=lambda fd, data: sent[fd].append(data))
    return line, sent


def gso_frame(payload_len: int, gso_size: int = 1448) -> bytes:
    pkt = tcp4_packet(payload_len)
    vnet = VNET_HDR.pack(VIRTIO_NET_HDR_F_NEEDS_CSUM, VIRTIO_NET_HDR_GSO_TCPV4, 52, gso_size, 20, 16)
    return vnet + pkt


def test_jitter_never_reorders_but_reorder_does():
    line, sent = delay_line(LinkSettings(rtt_ms=20, jitter_ms=3), offload=False, seed=1)
    for i in range(300):
        line.receive(line.ab, struct.pack("!I", i) + bytes(40), i * 100_000)
    line.release_due(10**12)
    order = [struct.unpack("!I", d[:4])[0] for d in sent[FD_B]]
    assert order == list(range(300))
    sent[FD_B].clear()
    line.apply(LinkSettings(rtt_ms=20, jitter_ms=3, reorder=0.2).validated())
    for i in range(300):
        line.receive(line.ab, struct.pack("!I", i) + bytes(40), 10**9 + i * 100_000)
    line.release_due(10**12)
    order = [struct.unpack("!I", d[:4])[0] for d in sent[FD_B]]
    assert sorted(order) == list(range(300)) and order != list(range(300))


def test_loss_and_black_hole_act_on_wire_segments():
    line, sent = delay_line(LinkSettings(rtt_ms=0, loss_ab=0.3), offload=True, seed=7)
    for _ in range(50):
        line.receive(line.ab, gso_frame(44 * 1448 + 100), 0)
    line.release_due(1)
    c = line.ab.counters
    assert c["packets"] == 50 and c["segments"] == 50 * 45
    frames = sent[FD_B]
    kept = sum(len(packet.segment_sizes(f[10:], VnetHdr.unpack(f[:10]).gso_size))
               if VnetHdr.unpack(f[:10]).gso_type else 1 for f in frames)
    assert kept == c["segments"] - c["lost"]
    assert 0.2 < c["lost"] / c["segments"] < 0.4
    # black hole: 1500-byte segments vanish, the 152-byte tail passes
    before = len(frames)
    line.apply(LinkSettings(rtt_ms=0, black_hole_mtu=1380).validated())
    line.receive(line.ab, gso_frame(3 * 1448 + 100), 0)
    line.release_due(1)
    frames = sent[FD_B][before:]
    assert [len(f) - 10 for f in frames] == [152]
    assert line.ab.counters["black_holed"] == 3


def test_loss_acts_on_each_datagram_of_a_udp_super_packet():
    line, sent = delay_line(LinkSettings(rtt_ms=0, loss_ab=0.3), offload=True, seed=11)
    vnet = VNET_HDR.pack(VIRTIO_NET_HDR_F_NEEDS_CSUM, VIRTIO_NET_HDR_GSO_UDP_L4, 28, 1400, 20, 6)
    for _ in range(40):
        line.receive(line.ab, vnet + udp4_gso_packet(45 * 1400), 0)
    line.release_due(1)
    c = line.ab.counters
    assert c["segments"] == 40 * 45
    kept = sum(len(packet.segment_sizes(f[10:], 1400)) if VnetHdr.unpack(f[:10]).gso_type
               else 1 for f in sent[FD_B])
    assert kept == c["segments"] - c["lost"] and 0.2 < c["lost"] / c["segments"] < 0.4
    assert all(IP(f[10:])[UDP].len == len(f) - 30 for f in sent[FD_B]
               if not VnetHdr.unpack(f[:10]).gso_type)


# -- calibration ----------------------------------------------------------------------------
def test_echo_request_is_valid_icmp_and_reply_parses():
    from scapy.layers.inet import ICMP

    from wanprobe.lab import calibrate
    req = calibrate.echo_request(0x1234, 7)
    icmp = ICMP(req)
    assert (icmp.type, icmp.id, icmp.seq) == (8, 0x1234, 7)
    ref = ICMP(req)
    del ref.chksum
    assert ICMP(bytes(ref)).chksum == icmp.chksum
    reply = bytes(IP(src="198.18.0.2", dst="198.18.0.1") / ICMP(type=0, id=0x1234, seq=7))
    assert calibrate.parse_echo_reply(reply) == (0x1234, 7)
    assert calibrate.parse_echo_reply(bytes(IP() / ICMP(type=8))) is None


def test_calibration_offset_is_half_the_low_quartile_bias_and_bounded():
    from wanprobe.lab.calibrate import MAX_OFFSET_NS, offset_ns
    ms = 1_000_000
    assert offset_ns([10 * ms + 100_000] * 5 + [30 * ms] * 2, 10) == 50_000  # robust to spikes
    assert offset_ns([9 * ms] * 5, 10) == 0  # never lengthen the configured delay
    assert offset_ns([20 * ms] * 5, 10) == MAX_OFFSET_NS
    assert offset_ns([], 10) == 0


def test_arrival_stamps_pair_frames_in_order_and_skip_dropped_ones():
    """Stamps are taken before the TUN ring; a frame the ring dropped leaves a stamp that the
    next frame's match must skip, and a frame with no stamp gets None (read time is used)."""
    stamps = ArrivalStamps.__new__(ArrivalStamps)
    stamps.counters = {"stamped": 0, "unmatched": 0, "skipped": 0}
    stamps.drain = lambda: None
    frames = [bytes([0x45, 0, 0, 60, i]) + bytes(MATCH_BYTES) for i in range(4)]
    import collections
    stamps.pending = collections.deque((f[:MATCH_BYTES], 1000 + i) for i, f in enumerate(frames))
    assert stamps.arrival_ns(frames[0]) == 1000
    assert stamps.arrival_ns(frames[2]) == 1002       # frames[1] was dropped by the ring
    assert stamps.arrival_ns(frames[1]) is None       # its stamp is gone with it
    assert stamps.arrival_ns(frames[3] + b"payload") == 1003
    assert stamps.counters == {"stamped": 3, "unmatched": 1, "skipped": 1}
    assert not stamps.pending


# -- one-way delays and queues per direction (issue 20) ---------------------------------------
def test_one_way_delays_combine_with_the_rtt():
    s = resolve_settings(None, delay_ab_ms=10, delay_ba_ms=50)
    assert (s.rtt_ms, s.delay_ms("ab"), s.delay_ms("ba")) == (60.0, 10.0, 50.0)
    s = resolve_settings(None, rtt_ms=60.0, delay_ab_ms=10)           # the rest goes back
    assert (s.delay_ms("ab"), s.delay_ms("ba")) == (10.0, 50.0)
    s = resolve_settings("taipei-tokyo", delay_ba_ms=30)                # the other keeps rtt/2
    assert (s.delay_ms("ab"), s.delay_ms("ba"), s.rtt_ms) == (17.5, 30.0, 47.5)
    assert s.changed(rtt_ms=80).delay_ms("ab") == 40.0                  # an rtt alone: symmetric
    assert s.changed(delay_ab_ms=5).rtt_ms == 35.0
    assert s.changed(queue_ba_ms=15).queue_of("ab") == 0.0
    assert LinkSettings.from_json(s.to_json()).validated() == s
    for bad in ({"rtt_ms": 20, "delay_ab_ms": 30}, {"rtt_ms": 20, "delay_ab_ms": 3,
                                                    "delay_ba_ms": 4},
                {"delay_ab_ms": -1, "delay_ba_ms": 1}, {"delay_ab_ms": 9000, "delay_ba_ms": 9000}):
        with pytest.raises(UsageError) as exc:
            resolve_settings(None, **bad)
        assert "\n" not in str(exc.value)
    with pytest.raises(UsageError, match="both one-way delays"):
        LinkSettings(delay_ab_ms=3).validated()


def test_cli_one_way_flags_to_lab_arguments():
    from wanprobe.commands.lab_settings import describe, settings_kwargs
    kw = settings_kwargs(delay_ab="10ms", delay_ba="0.05s", queue_ba="15")
    assert kw == {"delay_ab_ms": 10.0, "delay_ba_ms": 50.0, "queue_ba_ms": 15.0}
    with pytest.raises(UsageError):
        settings_kwargs(delay_ab="-3ms")
    s = resolve_settings(None, delay_ab_ms=10, delay_ba_ms=50).changed(queue_ba_ms=15)
    assert describe(s).startswith("rtt 60 ms (a→b 10 ms, b→a 50 ms)")
    assert "queue a→b 0 ms b→a 15 ms" in describe(s)


def test_delay_line_delays_and_queues_each_direction_on_its_own():
    s = LinkSettings(delay_ab_ms=10, delay_ba_ms=50, queue_ba_ms=20)
    line, sent = delay_line(s, offload=False, seed=3)
    assert (line.ab.delay_ns, line.ba.delay_ns) == (10_000_000, 50_000_000)
    assert (line.ab.queue_ns, line.ba.queue_ns) == (0, 20_000_000)
    gap = 1_000_000_000   # arrivals 1 s apart: no packet waits behind another (FIFO)
    for i in range(200):
        line.receive(line.ab, struct.pack("!I", i) + bytes(40), i * gap)
        line.receive(line.ba, struct.pack("!I", i) + bytes(40), i * gap)
    delays = {d.name: sorted(r % gap for r, _, dd, _ in line.heap if dd is d)
              for d in (line.ab, line.ba)}
    assert set(delays["ab"]) == {10_000_000}
    ba = delays["ba"]
    assert ba[0] >= 50_000_000 and 65e6 < sum(ba) / len(ba) < 75e6   # + exponential, mean 20 ms
    line.set_offset(100_000)
    assert (line.ab.delay_ns, line.ba.delay_ns) == (9_900_000, 49_900_000)
