"""Pure codec of Linux ``struct tcp_info`` (include/uapi/linux/tcp.h, x86-64 little-endian).

Offsets are the kernel 6.18 layout (280 bytes, with the AccECN tail; ``tcp_get_info()`` in
net/ipv4/tcp.c fills it). The kernel copies ``min(len, sizeof)`` bytes, so an older
kernel returns a shorter buffer: every field that does not fit in the returned length is ``None``
(unknown), never 0.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, fields

from wanprobe.json_fields import Decoded

# (name, byte offset, struct code). Units: *_us microseconds, *_ms milliseconds, rates bytes/s,
# cwnd/ssthresh/retrans in packets (segments), bytes_* in bytes.
LAYOUT: tuple[tuple[str, int, str], ...] = (
    ("state", 0, "B"), ("ca_state", 1, "B"), ("retransmits", 2, "B"), ("probes", 3, "B"),
    ("backoff", 4, "B"), ("options", 5, "B"), ("wscale", 6, "B"), ("app_limited_bits", 7, "B"),
    ("rto_us", 8, "I"), ("ato_us", 12, "I"), ("snd_mss", 16, "I"), ("rcv_mss", 20, "I"),
    ("unacked", 24, "I"), ("sacked", 28, "I"), ("lost", 32, "I"), ("retrans", 36, "I"),
    ("fackets", 40, "I"), ("last_data_sent_ms", 44, "I"), ("last_ack_sent_ms", 48, "I"),
    ("last_data_recv_ms", 52, "I"), ("last_ack_recv_ms", 56, "I"), ("pmtu", 60, "I"),
    ("rcv_ssthresh", 64, "I"), ("rtt_us", 68, "I"), ("rttvar_us", 72, "I"),
    ("snd_ssthresh", 76, "I"), ("snd_cwnd", 80, "I"), ("advmss", 84, "I"),
    ("reordering", 88, "I"), ("rcv_rtt_us", 92, "I"), ("rcv_space", 96, "I"),
    ("total_retrans", 100, "I"), ("pacing_rate", 104, "Q"), ("max_pacing_rate", 112, "Q"),
    ("bytes_acked", 120, "Q"), ("bytes_received", 128, "Q"), ("segs_out", 136, "I"),
    ("segs_in", 140, "I"), ("notsent_bytes", 144, "I"), ("min_rtt_us", 148, "I"),
    ("data_segs_in", 152, "I"), ("data_segs_out", 156, "I"), ("delivery_rate", 160, "Q"),
    ("busy_time_us", 168, "Q"), ("rwnd_limited_us", 176, "Q"), ("sndbuf_limited_us", 184, "Q"),
    ("delivered", 192, "I"), ("delivered_ce", 196, "I"), ("bytes_sent", 200, "Q"),
    ("bytes_retrans", 208, "Q"), ("dsack_dups", 216, "I"), ("reord_seen", 220, "I"),
    ("rcv_ooopack", 224, "I"), ("snd_wnd", 228, "I"), ("rcv_wnd", 232, "I"),
    ("rehash", 236, "I"), ("total_rto", 240, "H"), ("total_rto_recoveries", 242, "H"),
    ("total_rto_time_ms", 244, "I"), ("received_ce", 248, "I"),
    ("delivered_e1_bytes", 252, "I"), ("delivered_e0_bytes", 256, "I"),
    ("delivered_ce_bytes", 260, "I"), ("received_e1_bytes", 264, "I"),
    ("received_e0_bytes", 268, "I"), ("received_ce_bytes", 272, "I"), ("ecn_bits", 276, "I"),
)
SIZE_BYTES = 280  # sizeof(struct tcp_info) on 6.18
MAX_MIN_RTT_US = 0xFFFFFFFF  # ~0U: the kernel's "no RTT sample yet" for min_rtt


@dataclass(frozen=True)
class TcpInfo(Decoded, json_name="tcp_info"):  # from_json: any field may be absent
    """One ``TCP_INFO`` sample; ``None`` means the kernel did not return the field."""

    state: int | None = None
    ca_state: int | None = None
    retransmits: int | None = None
    probes: int | None = None
    backoff: int | None = None
    options: int | None = None
    wscale: int | None = None
    app_limited_bits: int | None = None
    rto_us: int | None = None
    ato_us: int | None = None
    snd_mss: int | None = None
    rcv_mss: int | None = None
    unacked: int | None = None
    sacked: int | None = None
    lost: int | None = None
    retrans: int | None = None
    fackets: int | None = None
    last_data_sent_ms: int | None = None
    last_ack_sent_ms: int | None = None
    last_data_recv_ms: int | None = None
    last_ack_recv_ms: int | None = None
    pmtu: int | None = None
    rcv_ssthresh: int | None = None
    rtt_us: int | None = None
    rttvar_us: int | None = None
    snd_ssthresh: int | None = None
    snd_cwnd: int | None = None
    advmss: int | None = None
    reordering: int | None = None
    rcv_rtt_us: int | None = None
    rcv_space: int | None = None
    total_retrans: int | None = None
    pacing_rate: int | None = None
    max_pacing_rate: int | None = None
    bytes_acked: int | None = None
    bytes_received: int | None = None
    segs_out: int | None = None
    segs_in: int | None = None
    notsent_bytes: int | None = None
    min_rtt_us: int | None = None
    data_segs_in: int | None = None
    data_segs_out: int | None = None
    delivery_rate: int | None = None
    busy_time_us: int | None = None
    rwnd_limited_us: int | None = None
    sndbuf_limited_us: int | None = None
    delivered: int | None = None
    delivered_ce: int | None = None
    bytes_sent: int | None = None
    bytes_retrans: int | None = None
    dsack_dups: int | None = None
    reord_seen: int | None = None
    rcv_ooopack: int | None = None
    snd_wnd: int | None = None
    rcv_wnd: int | None = None
    rehash: int | None = None
    total_rto: int | None = None
    total_rto_recoveries: int | None = None
    total_rto_time_ms: int | None = None
    received_ce: int | None = None
    delivered_e1_bytes: int | None = None
    delivered_e0_bytes: int | None = None
    delivered_ce_bytes: int | None = None
    received_e1_bytes: int | None = None
    received_e0_bytes: int | None = None
    received_ce_bytes: int | None = None
    ecn_bits: int | None = None

    @property
    def snd_wscale(self) -> int | None:
        """Send window scale: low nibble of byte 6 (``tcpi_snd_wscale : 4``)."""
        return None if self.wscale is None else self.wscale & 0x0F

    @property
    def rcv_wscale(self) -> int | None:
        """Receive window scale: high nibble of byte 6."""
        return None if self.wscale is None else self.wscale >> 4

    @property
    def delivery_rate_app_limited(self) -> bool | None:
        """``tcpi_delivery_rate_app_limited:1`` (bit 0 of byte 7)."""
        return None if self.app_limited_bits is None else bool(self.app_limited_bits & 1)

    def to_json(self) -> dict:
        """All raw fields by name (kernel units; see LAYOUT)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def parse_tcp_info(raw: bytes) -> TcpInfo:
    """Decode the bytes ``getsockopt(IPPROTO_TCP, TCP_INFO, n)`` returned.

    Fields beyond ``len(raw)`` are left ``None``; bytes past 280 (a newer kernel) are ignored.
    """
    values = {}
    size = len(raw)
    for name, offset, code in LAYOUT:
        width = struct.calcsize(code)
        if offset + width <= size:
            values[name] = struct.unpack_from("<" + code, raw, offset)[0]
    return TcpInfo(**values)


def pack_tcp_info(info: TcpInfo, length: int = SIZE_BYTES) -> bytes:
    """Inverse of :func:`parse_tcp_info` (for tests and fixtures); ``None`` packs as 0."""
    buf = bytearray(SIZE_BYTES)
    for name, offset, code in LAYOUT:
        value = getattr(info, name)
        struct.pack_into("<" + code, buf, offset, value or 0)
    return bytes(buf[:length])


MAX_U64 = 2**64 - 1


def tcp_info_summary(info: TcpInfo | None, bbr_bandwidth_bps: float | None = None
                     ) -> dict | None:
    """The TCP_INFO fields a throughput report carries, converted to unit-carrying names, with
    BBR's own bottleneck estimate when the sampler read one (sockopts.read_bbr_bandwidth_bps)."""
    if info is None:
        return None

    def us_to_ms(v: int | None) -> float | None:
        return None if v is None else v / 1000.0

    def rate_bits(v: int | None) -> float | None:
        return None if v is None or v >= MAX_U64 else v * 8.0

    min_rtt = info.min_rtt_us if info.min_rtt_us not in (None, 0xFFFFFFFF) else None
    return {
        "rtt_ms": us_to_ms(info.rtt_us),
        "min_rtt_ms": us_to_ms(min_rtt),
        "rttvar_ms": us_to_ms(info.rttvar_us),
        "cwnd_packets": info.snd_cwnd,
        "snd_mss_bytes": info.snd_mss,
        "total_retrans_packets": info.total_retrans,
        "bytes_retrans": info.bytes_retrans,
        "bytes_sent": info.bytes_sent,
        "bytes_acked": info.bytes_acked,
        "delivery_rate_bits_per_second": rate_bits(info.delivery_rate),
        "pacing_rate_bits_per_second": rate_bits(info.pacing_rate),
        "busy_time_ms": us_to_ms(info.busy_time_us),
        "rwnd_limited_ms": us_to_ms(info.rwnd_limited_us),
        "sndbuf_limited_ms": us_to_ms(info.sndbuf_limited_us),
        "snd_wnd_bytes": info.snd_wnd,
        "ca_state": info.ca_state,
        # the sender ran out of data to send within the last round trip (tcp_rate.c)
        "delivery_rate_app_limited": info.delivery_rate_app_limited,
        "bbr_bandwidth_bits_per_second": bbr_bandwidth_bps,
    }
