"""Pure per-packet operations of the delay line: header checksums, DSCP bleaching and the
software segmentation of TCP/IPv4 and UDP/IPv4 GSO super-packets into wire segments.

Segmentation follows the kernel's tcp_gso_segment()/inet_gso_segment() (net/ipv4/tcp_offload.c,
net/ipv4/af_inet.c): each segment carries ``gso_size`` payload bytes, the IPv4 total length and
header checksum are rewritten, the IP id increases by one per segment, the TCP sequence number
advances by the payload offset, CWR stays only on the first segment and FIN/PSH only on the last.
UDP (``UDP_SEGMENT`` senders, __udp_gso_segment() in net/ipv4/udp_offload.c) cuts the payload the
same way into datagrams, each with its own UDP length. The TCP or UDP checksum is left to the
receiver as CHECKSUM_PARTIAL (virtio NEEDS_CSUM) with the pseudo-header sum in the check field,
exactly as the kernel hands such packets to a device.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from wanprobe.lab.tun import (
    VIRTIO_NET_HDR_F_NEEDS_CSUM,
    VIRTIO_NET_HDR_GSO_ECN,
    VIRTIO_NET_HDR_GSO_NONE,
    VIRTIO_NET_HDR_GSO_TCPV4,
    VIRTIO_NET_HDR_GSO_UDP_L4,
    VNET_HDR,
)

TCP_FIN, TCP_PSH, TCP_CWR = 0x01, 0x08, 0x80
IPPROTO_TCP = 6
IPPROTO_UDP = 17
UDP_HEADER_LEN = 8


def ones_sum(data: bytes | bytearray | memoryview) -> int:
    """RFC 1071 16-bit ones'-complement sum, folded to 16 bits (not complemented)."""
    if len(data) % 2:
        data = bytes(data) + b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return total


def ipv4_header_checksum(header: bytes | bytearray) -> int:
    """RFC 791 header checksum of ``header`` with its checksum field taken as zero."""
    h = bytearray(header)
    h[10:12] = b"\0\0"
    return ~ones_sum(h) & 0xFFFF


def bleach_dscp(packet: bytes) -> bytes:
    """Zero the DSCP bits (RFC 2474) and keep the two ECN bits (RFC 3168); fix the IPv4
    header checksum. IPv6 has no header checksum; other packets are returned unchanged."""
    if not packet:
        return packet
    version = packet[0] >> 4
    if version == 4 and len(packet) >= 20:
        if packet[1] & 0xFC == 0:
            return packet
        p = bytearray(packet)
        p[1] &= 0x03
        ihl = (p[0] & 0x0F) * 4
        p[10:12] = ipv4_header_checksum(p[:ihl]).to_bytes(2, "big")
        return bytes(p)
    if version == 6 and len(packet) >= 40:
        tclass = ((packet[0] & 0x0F) << 4) | (packet[1] >> 4)
        if tclass & 0xFC == 0:
            return packet
        p = bytearray(packet)
        p[0] &= 0xF0  # DSCP high 4 bits live in byte 0's low nibble
        p[1] &= 0x3F  # low 2 DSCP bits; keep ECN (0x30) and flow label
        return bytes(p)
    return packet


def tcp4_headers_len(packet: bytes) -> int:
    """IPv4 + TCP header length of ``packet``."""
    ihl = (packet[0] & 0x0F) * 4
    return ihl + (packet[ihl + 12] >> 4) * 4


def headers_len(packet: bytes) -> int:
    """IPv4 + transport header length of a TCP or UDP ``packet``."""
    if packet[9] == IPPROTO_UDP:
        return (packet[0] & 0x0F) * 4 + UDP_HEADER_LEN
    return tcp4_headers_len(packet)


def gso_size_of(vnet: bytes, packet: bytes) -> int:
    """``gso_size`` of a TCP/IPv4 or UDP/IPv4 GSO super-packet (its raw virtio_net_hdr and the
    packet), 0 for anything else (one wire packet, or a kind the delay line does not cut)."""
    _, gso_type, _, gso_size, _, _ = VNET_HDR.unpack_from(vnet)
    kind = gso_type & ~VIRTIO_NET_HDR_GSO_ECN
    if not packet or packet[0] >> 4 != 4:
        return 0
    if kind == VIRTIO_NET_HDR_GSO_TCPV4 or (kind == VIRTIO_NET_HDR_GSO_UDP_L4
                                             and packet[9] == IPPROTO_UDP):
        return gso_size
    return 0


def segment_sizes(packet: bytes, gso_size: int) -> list[int]:
    """Wire sizes (IP total length) of the segments a TCP/IPv4 or UDP/IPv4 GSO packet becomes."""
    hl = headers_len(packet)
    payload = len(packet) - hl
    full, rest = divmod(payload, gso_size)
    return [hl + gso_size] * full + ([hl + rest] if rest else [])


def segment(packet: bytes, gso_size: int) -> Iterator[tuple[bytes, bytes]]:
    """Split a TCP/IPv4 or UDP/IPv4 GSO super-packet into (virtio_net_hdr, segment) pairs."""
    if packet[9] == IPPROTO_UDP:
        return segment_udp4(packet, gso_size)
    return segment_tcp4(packet, gso_size)


def _ip_segment(packet: bytes, ihl: int, ip_id: int, total_len: int) -> bytearray:
    """The IPv4 header of one segment: its total length, id and header checksum."""
    ip = bytearray(packet[:ihl])
    struct.pack_into("!HH", ip, 2, total_len, ip_id & 0xFFFF)
    ip[10:12] = ipv4_header_checksum(ip).to_bytes(2, "big")
    return ip


def _cut(packet: bytes, gso_size: int, hl: int, proto: int, csum_offset: int,
         fix) -> Iterator[tuple[bytes, bytes]]:
    """The segments of a GSO super-packet whose headers (IPv4 + transport) are ``hl`` bytes:
    each gets its IPv4 header (length, id, checksum) and its transport header, which
    ``fix(header, i, n, length, pseudo)`` completes for segment ``i`` of ``n`` (``length``: its
    transport length; ``pseudo``: the pseudo-header sum over it, left in the checksum field for
    CHECKSUM_PARTIAL)."""
    ihl = (packet[0] & 0x0F) * 4
    payload = memoryview(packet)[hl:]
    n = max(1, -(-len(payload) // gso_size))
    ip_id = struct.unpack_from("!H", packet, 4)[0]
    addrs = packet[12:20]
    vnet = VNET_HDR.pack(VIRTIO_NET_HDR_F_NEEDS_CSUM, VIRTIO_NET_HDR_GSO_NONE, hl, 0, ihl,
                         csum_offset)
    for i in range(n):
        chunk = payload[i * gso_size:(i + 1) * gso_size]
        ip = _ip_segment(packet, ihl, ip_id + i, hl + len(chunk))
        header = bytearray(packet[ihl:hl])
        length = hl - ihl + len(chunk)
        fix(header, i, n, length, ones_sum(addrs + struct.pack("!BBH", 0, proto, length)))
        yield vnet, bytes(ip) + bytes(header) + bytes(chunk)


def segment_udp4(packet: bytes, gso_size: int) -> Iterator[tuple[bytes, bytes]]:
    """Split a UDP/IPv4 GSO super-packet into (virtio_net_hdr, datagram) pairs."""
    def fix(udp: bytearray, _i: int, _n: int, length: int, pseudo: int) -> None:
        struct.pack_into("!HH", udp, 4, length, pseudo)

    return _cut(packet, gso_size, (packet[0] & 0x0F) * 4 + UDP_HEADER_LEN, IPPROTO_UDP, 6, fix)


def segment_tcp4(packet: bytes, gso_size: int) -> Iterator[tuple[bytes, bytes]]:
    """Split a TCP/IPv4 GSO super-packet into (virtio_net_hdr, segment) pairs."""
    ihl = (packet[0] & 0x0F) * 4
    seq = struct.unpack_from("!I", packet, ihl + 4)[0]
    flags = packet[ihl + 13]

    def fix(tcp: bytearray, i: int, n: int, _length: int, pseudo: int) -> None:
        struct.pack_into("!I", tcp, 4, (seq + i * gso_size) & 0xFFFFFFFF)
        f = flags
        if i > 0:
            f &= ~TCP_CWR
        if i < n - 1:
            f &= ~(TCP_FIN | TCP_PSH)
        tcp[13] = f
        struct.pack_into("!H", tcp, 16, pseudo)

    return _cut(packet, gso_size, tcp4_headers_len(packet), IPPROTO_TCP, 16, fix)
