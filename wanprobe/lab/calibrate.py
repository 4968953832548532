"""End-to-end calibration of the delay line's own overhead.

Even at zero configured delay a packet through the lab pays the host's costs: waking the
forwarder on a (virtual) CPU, two TUN crossings, the stack. On a VM that is ~0.1-0.3 ms per
round trip, systematic and roughly constant. After ``up()`` the lab sends a few ICMP echo
requests from namespace a (raw socket, kernel receive timestamps, as iputils ping measures),
takes the measured RTT minus the configured RTT, and tells the forwarder to shorten each
direction by half of its lower quartile (at most MAX_OFFSET_NS). ``lab.stats()["offset_ns"]`` shows it.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import time

from wanprobe.lab import netns, packet

MAX_OFFSET_NS = 100_000  # per direction; a noisy calibration must not make the link fast
SO_TIMESTAMPNS = 35
ICMP_ECHO_REQUEST, ICMP_ECHO_REPLY = 8, 0


def echo_request(ident: int, seq: int, payload: bytes = bytes(48)) -> bytes:
    """ICMP echo request (RFC 792) with a valid checksum."""
    header = struct.pack("!BBHHH", ICMP_ECHO_REQUEST, 0, 0, ident, seq)
    csum = ~packet.ones_sum(header + payload) & 0xFFFF
    return struct.pack("!BBHHH", ICMP_ECHO_REQUEST, 0, csum, ident, seq) + payload


def parse_echo_reply(ip_packet: bytes) -> tuple[int, int] | None:
    """(identifier, sequence) of an IPv4 ICMP echo reply, else None."""
    if len(ip_packet) < 28 or ip_packet[0] >> 4 != 4:
        return None
    ihl = (ip_packet[0] & 0x0F) * 4
    if len(ip_packet) < ihl + 8 or ip_packet[ihl] != ICMP_ECHO_REPLY:
        return None
    ident, seq = struct.unpack_from("!HH", ip_packet, ihl + 4)
    return ident, seq


def offset_ns(rtts_ns: list[int], configured_rtt_ms: float) -> int:
    """Per-direction offset: half of (25th-percentile RTT - configured), within [0, MAX].

    The lower quartile, not the median, so that a burst of load during calibration (which
    only ever adds delay) does not inflate the offset."""
    if not rtts_ns:
        return 0
    ordered = sorted(rtts_ns)
    bias_ns = ordered[len(ordered) // 4] - configured_rtt_ms * 1e6
    return int(min(max(bias_ns / 2, 0), MAX_OFFSET_NS))


def measure_rtts_ns(ns_name: str, dst: str, *, count: int = 24, spacing_s: float = 0.002,
                    timeout_s: float = 1.0) -> list[int]:
    """ICMP echo RTTs from inside ``ns_name`` to ``dst`` (kernel rx timestamps)."""
    ident = os.getpid() & 0xFFFF
    with netns.entered(ns_name):
        sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    with sock:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        sent: dict[int, int] = {}
        rtts: list[int] = []
        deadline = time.monotonic() + count * spacing_s + timeout_s
        next_send = time.monotonic()
        seq = 0
        while time.monotonic() < deadline and len(rtts) < count:
            now = time.monotonic()
            if seq < count and now >= next_send:
                sent[seq] = time.time_ns()
                sock.sendto(echo_request(ident, seq), (dst, 0))
                seq += 1
                next_send = now + spacing_s
            wait = max(0.0, min(next_send if seq < count else deadline, deadline) - time.monotonic())
            ready, _, _ = select.select([sock], [], [], wait)
            if not ready:
                continue
            data, anc, _, _ = sock.recvmsg(2048, socket.CMSG_SPACE(16))
            got = parse_echo_reply(data)
            if got is None or got[0] != ident or got[1] not in sent:
                continue
            stamp = next((struct.unpack("qq", d[:16]) for lvl, typ, d in anc
                          if lvl == socket.SOL_SOCKET and typ == SO_TIMESTAMPNS), None)
            rx_ns = stamp[0] * 10**9 + stamp[1] if stamp else time.time_ns()
            rtts.append(rx_ns - sent.pop(got[1]))
        return rtts
