"""Path MTU by DF-bit search against a STAMP reflector (no ICMP needed).

A connected UDP socket with IP_MTU_DISCOVER = IP_PMTUDISC_PROBE sends DF-set datagrams up to the
local interface MTU, ignoring the kernel's PMTU cache (ip(7)). Each test packet is a STAMP
Session-Sender packet padded with an Extra Padding TLV (RFC 8972 §4.1) to the size under test,
with a Reflected Test Packet Control TLV (draft-ietf-ippm-asymmetrical-pkts) asking for a short
reply, so the reverse path is not what is measured; a reflector that ignores the TLV answers with
the same size (RFC 8762 §4), which still works on symmetric paths. A size passes when a reply
comes back; it fails after ``tries`` timeouts (a black hole sends nothing back, so timeouts are
the only signal). The search tries the local MTU first, then bisects between the largest size
known to pass and the smallest known to fail. With a key the probes are authenticated STAMP
packets (RFC 8762 §4.2.2, the TLVs under an HMAC TLV, RFC 8972 §4.8), for a reflector that runs
in authenticated mode and drops everything else.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time

from wanprobe.errors import ProbeError, UsageError
from wanprobe.probe import timestamps as ts
from wanprobe.probe.peer import IP_HEADER_BYTES, resolve_peer, silence_line, udp_silence_reason
from wanprobe.probe.result import MtuResult, MtuStep
from wanprobe.probe.sender import STAMP_PORT, UDP_HEADER
from wanprobe.probe.stamp_packet import (
    AUTH_BASE_LEN,
    BASE_LEN,
    HMAC_TLV_LEN,
    REFLECTED_CONTROL_LEN,
    SENDER_LAYOUT,
    HmacKey,
    SenderPacket,
    ntp_from_ns,
    pack_sender_auth,
    pad_payload,
    padding_tlv,
    reflected_control_tlv,
)

CONTROL_BYTES = 16
MIN_PAYLOAD = BASE_LEN + CONTROL_BYTES
REPLY_PAYLOAD = MIN_PAYLOAD
AUTH_MIN_PAYLOAD = AUTH_BASE_LEN + 4 + REFLECTED_CONTROL_LEN + HMAC_TLV_LEN
_SENDER_SEQ_OFFSET = {False: 24, True: 48}  # in the reflected packet: RFC 8762 §4.3.1 / §4.3.2


def auth_mtu_probe_packet(seq: int, ssid: int, payload_len: int, key: HmacKey) -> bytes:
    """The authenticated form of :func:`mtu_probe_packet` (Extra Padding after the HMAC TLV)."""
    if payload_len < AUTH_MIN_PAYLOAD:
        raise ValueError(f"payload {payload_len} below {AUTH_MIN_PAYLOAD}")
    tlvs = [reflected_control_tlv(AUTH_MIN_PAYLOAD)]
    rest = payload_len - AUTH_MIN_PAYLOAD
    if rest >= 4:
        tlvs.append(padding_tlv(rest - 4))
    return pack_sender_auth(SenderPacket(seq, ntp_from_ns(time.time_ns()), ssid, tlvs=tuple(tlvs)),
                            key, pad_to=payload_len)


def mtu_probe_packet(seq: int, ssid: int, payload_len: int) -> bytes:
    """A STAMP test packet of exactly ``payload_len`` UDP payload octets asking for a short reply."""
    if payload_len < MIN_PAYLOAD:
        raise ValueError(f"payload {payload_len} below {MIN_PAYLOAD}")
    body = SENDER_LAYOUT.pack(seq, ntp_from_ns(time.time_ns()), 0x0001, ssid)
    body += reflected_control_tlv(REPLY_PAYLOAD).pack()
    return pad_payload(body, payload_len)


class _Prober:
    def __init__(self, sock: socket.socket, family: int, timeout_s: float, tries: int,
                 key: HmacKey | None = None) -> None:
        self.sock = sock
        self.key = key
        self.overhead = IP_HEADER_BYTES[family] + UDP_HEADER
        self.timeout_s = timeout_s
        self.tries = tries
        self.seq = 0
        self.ssid = (time.time_ns() >> 10) % 0xFFFF + 1
        self.steps: list[MtuStep] = []

    async def passes(self, size: int, *, record: bool = True, tries: int | None = None) -> bool:
        loop = asyncio.get_running_loop()
        tries = tries or self.tries
        for attempt in range(1, tries + 1):
            seq = self.seq
            self.seq += 1
            try:
                self.sock.send(self._packet(seq, size - self.overhead))
            except OSError as exc:
                if exc.errno == 90:  # EMSGSIZE: larger than the local interface allows
                    break
                raise ProbeError(f"cannot send MTU probe: {exc.strerror}") from None
            deadline = loop.time() + self.timeout_s
            while (left := deadline - loop.time()) > 0:
                try:
                    data = await asyncio.wait_for(loop.sock_recv(self.sock, 65536), left)
                except TimeoutError:
                    break
                except ConnectionRefusedError:
                    raise ProbeError("no STAMP reflector listening (ICMP port unreachable)") from None
                off = _SENDER_SEQ_OFFSET[self.key is not None]
                if len(data) >= off + 4 and struct.unpack_from("!I", data, off)[0] == seq:
                    if record:
                        self.steps.append(MtuStep(size, True, attempt))
                    return True
        if record:
            self.steps.append(MtuStep(size, False, tries))
        return False

    def _packet(self, seq: int, payload_len: int) -> bytes:
        if self.key is None:
            return mtu_probe_packet(seq, self.ssid, payload_len)
        return auth_mtu_probe_packet(seq, self.ssid, payload_len, self.key)


async def probe_path_mtu(peer: str, *, port: int = STAMP_PORT, timeout_s: float | None = None,
                         tries: int = 3, max_size: int | None = None,
                         hmac_key: bytes | None = None) -> MtuResult:
    """Largest IP packet (bytes, header included) that reaches ``peer``'s reflector and is answered
    (``hmac_key``: the reflector runs in authenticated mode, RFC 8762 §4.4)."""
    if not 1 <= int(port) <= 65535:
        raise UsageError(f"port {port} out of range 1-65535")
    if tries < 1:
        raise UsageError("tries must be >= 1")
    family, addr = await resolve_peer(peer)
    sock = socket.socket(family, socket.SOCK_DGRAM)
    sock.setblocking(False)
    try:
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, ts.IPV6_MTU_DISCOVER, ts.IPV6_PMTUDISC_PROBE)
        else:
            sock.setsockopt(socket.IPPROTO_IP, ts.IP_MTU_DISCOVER, ts.IP_PMTUDISC_PROBE)
        try:
            sock.connect((addr, port))
        except OSError as exc:
            raise ProbeError(f"cannot reach {peer}: {exc.strerror}") from None
        level, opt = ((socket.IPPROTO_IPV6, ts.IPV6_MTU) if family == socket.AF_INET6
                      else (socket.IPPROTO_IP, ts.IP_MTU))
        local_mtu = sock.getsockopt(level, opt)
        overhead = IP_HEADER_BYTES[family] + UDP_HEADER
        key = HmacKey.of(hmac_key)
        smallest = overhead + (MIN_PAYLOAD if key is None else AUTH_MIN_PAYLOAD)
        hi = min(local_mtu, max_size or local_mtu)
        # RTT from small probes sets the timeout: the slowest of three answers, x3, + 50 ms.
        probe = _Prober(sock, family, timeout_s or 2.0, tries, key)
        t0 = time.monotonic()
        if not await probe.passes(smallest, tries=3):
            reason = await udp_silence_reason(peer, port, probe.timeout_s)
            raise ProbeError(silence_line(f"{peer} port {port}", reason, keyed=key is not None,
                                          lead="no STAMP reply from"))
        if timeout_s is None:
            rtts = [time.monotonic() - t0]
            for _ in range(2):
                t = time.monotonic()
                if await probe.passes(smallest, record=False, tries=1):
                    rtts.append(time.monotonic() - t)
            probe.timeout_s = max(0.15, 3 * max(rtts) + 0.05)
        if await probe.passes(hi):
            return MtuResult(peer, port, hi, local_mtu, "stamp-df-probe", "local MTU answered",
                             probe.timeout_s, tuple(probe.steps))
        lo = smallest
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if await probe.passes(mid):
                lo = mid
            else:
                hi = mid
        return MtuResult(peer, port, lo, local_mtu, "stamp-df-probe", "binary search on replies "
                         "and timeouts", probe.timeout_s, tuple(probe.steps))
    finally:
        with contextlib.suppress(OSError):
            sock.close()
