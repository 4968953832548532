"""STAMP test packets: a pure codec for RFC 8762 (unauthenticated and authenticated mode) and
RFC 8972 TLVs.

Layouts (all big-endian):

Session-Sender (RFC 8762 §4.2.1, RFC 8972 §3), 44 octets + TLVs::

    0 Sequence Number(4) | 4 Timestamp T1(8) | 12 Error Estimate(2) | 14 SSID(2) | 16 MBZ(28)

Session-Reflector (RFC 8762 §4.3.1), 44 octets + TLVs::

    0 Sequence Number(4) | 4 Timestamp T3(8) | 12 Error Estimate(2) | 14 SSID(2)
    16 Receive Timestamp T2(8) | 24 Sender Sequence Number(4) | 28 Sender Timestamp T1(8)
    36 Sender Error Estimate(2) | 38 MBZ(2) | 40 Sender TTL(1) | 41 MBZ(3)

TWAMP-Light (RFC 5357 §4.1.2/§4.2.1) shares offsets 0-40 of both; its sender packet is 14+
octets and its reflector packet 41+ octets, so a TWAMP-Light reflector sees STAMP TLVs as padding
(RFC 8762 §4.6).

Authenticated Session-Sender (RFC 8762 §4.2.2 Figure 4, SSID from RFC 8972 §3), 112 octets + TLVs::

    0 Sequence Number(4) | 4 MBZ(12) | 16 Timestamp T1(8) | 24 Error Estimate(2) | 26 SSID(2)
    28 MBZ(68) | 96 HMAC(16)

Authenticated Session-Reflector (RFC 8762 §4.3.2 Figure 6, SSID from RFC 8972 §3), 112 octets::

    0 Sequence Number(4) | 4 MBZ(12) | 16 Timestamp T3(8) | 24 Error Estimate(2) | 26 SSID(2)
    28 MBZ(4) | 32 Receive Timestamp T2(8) | 40 MBZ(8) | 48 Sender Sequence Number(4)
    52 MBZ(12) | 64 Sender Timestamp T1(8) | 72 Sender Error Estimate(2) | 74 MBZ(6)
    80 Sender TTL(1) | 81 MBZ(15) | 96 HMAC(16)

HMAC (RFC 8762 §4.4): HMAC-SHA-256 over octets 0-95 (the first six 16-octet blocks), truncated to
128 bits, verified in constant time before any field is used. TLVs follow octet 112; in
authenticated mode they are protected by the HMAC TLV (RFC 8972 §4.8, type 8, 16-octet value):
HMAC-SHA-256 over the base packet's Sequence Number field followed by all TLVs before the HMAC
TLV (headers included, as on the wire), truncated to 128 bits. The HMAC TLV follows every other
TLV except Extra Padding; a packet whose HMAC TLV is missing, misplaced or wrong fails
verification: the reflector stops processing the TLVs, copies them and sets the I flag in each.

TLV (RFC 8972 §4): Flags(1) | Type(1) | Length(2, value octets) | Value. Flags bit 0 (0x80) is U
(unrecognised), bit 1 (0x40) M (malformed), bit 2 (0x20) I (integrity failed).
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass

BASE_LEN = 44
AUTH_BASE_LEN = 112            # RFC 8762 §4.2.2 / §4.3.2
AUTH_HMAC_OFFSET = 96          # RFC 8762 §4.4: HMAC covers octets 0-95
HMAC_LEN = 16                  # HMAC-SHA-256 truncated to 128 bits
HMAC_TLV_LEN = 4 + HMAC_LEN
TWAMP_REFLECTOR_MIN_LEN = 41  # RFC 5357 §4.2.1, erratum 5045
NTP_UNIX_OFFSET_S = 2_208_988_800  # seconds from 1900-01-01 to 1970-01-01 (RFC 5905 §6)

FLAG_U = 0x80
FLAG_M = 0x40
FLAG_I = 0x20

TLV_EXTRA_PADDING = 1
TLV_LOCATION = 2
TLV_TIMESTAMP_INFO = 3
TLV_CLASS_OF_SERVICE = 4
TLV_DIRECT_MEASUREMENT = 5
TLV_FOLLOW_UP = 7
TLV_HMAC = 8
# draft-ietf-ippm-asymmetrical-pkts "Reflected Test Packet Control" (RFC 10052 per stamp-suite):
# Reflected Packet Length(4) | Number of Reflected Packets(4) | Interval(4).
TLV_REFLECTED_CONTROL = 12

COS_LEN = 4
DIRECT_MEASUREMENT_LEN = 12
REFLECTED_CONTROL_LEN = 12
FOLLOW_UP_LEN = 16
FOLLOW_UP_MODE_SW_LOCAL = 2

# Error Estimate (RFC 4656 §4.1.2): S(1) Z(1) Scale(6) Multiplier(8). Unsynchronised software
# clock, scale 0, multiplier 1 = 2^-32 s claimed resolution; S=0 says "not synced to UTC".
DEFAULT_ERROR_ESTIMATE = 0x0001

# The one home of the STAMP layouts (sender.py, reflect_logic.py and mtu.py import these).
# Unauthenticated (RFC 8762 §4.2.1 / §4.3.1): seq, timestamp, error estimate, SSID (RFC 8972
# §3), then MBZ; the reflector adds receive timestamp, the sender's fields and its TTL.
SENDER_LAYOUT = struct.Struct("!IQHH28x")
SENDER_HEAD = struct.Struct("!IQHH")          # the sender fields a reflector copies
REFLECTOR_LAYOUT = struct.Struct("!IQHHQIQH2xB3x")
TLV_HEADER = struct.Struct("!BBH")            # flags, type, length (RFC 8972 §4)
# authenticated layouts, octets 0-95 (the HMAC follows): RFC 8762 §4.2.2 / §4.3.2
AUTH_SENDER_LAYOUT = struct.Struct("!I12xQHH68x")
AUTH_SENDER_HEAD = struct.Struct("!I12xQHH")  # octets 0-27
AUTH_REFLECTOR_LAYOUT = struct.Struct("!I12xQHH4xQ8xI12xQH6xB15x")


class StampDecodeError(ValueError):
    """The bytes are not a STAMP packet of the expected kind."""


class StampAuthError(StampDecodeError):
    """An authenticated packet is too short or its HMAC does not verify (RFC 8762 §4.4)."""


class HmacKey:
    """A STAMP HMAC key (RFC 8762 §4.4): HMAC-SHA-256 truncated to 16 octets. The keyed hash
    object is built once; each packet costs one ``.copy()``, one update and one digest."""

    __slots__ = ("_h",)

    def __init__(self, key: bytes | str) -> None:
        if isinstance(key, str):
            key = key.encode()
        if not key:
            raise ValueError("STAMP HMAC key is empty")
        self._h = hmac.new(bytes(key), digestmod=hashlib.sha256)

    @classmethod
    def of(cls, key: HmacKey | bytes | str | None) -> HmacKey | None:
        if key is None or isinstance(key, HmacKey):
            return key
        return cls(key)

    def digest(self, *parts) -> bytes:
        """The 16-octet truncated HMAC of the concatenation of ``parts`` (bytes-like)."""
        h = self._h.copy()
        for p in parts:
            h.update(p)
        return h.digest()[:HMAC_LEN]

    def base_hmac(self, packet) -> bytes:
        """HMAC of an authenticated base packet: octets 0-95 (RFC 8762 §4.4)."""
        h = self._h.copy()
        h.update(memoryview(packet)[:AUTH_HMAC_OFFSET])
        return h.digest()[:HMAC_LEN]

    def verify_base(self, packet, n: int | None = None) -> bool:
        """True if ``packet[:n]`` is at least 112 octets and octets 96-111 are the HMAC of 0-95.
        Constant-time comparison (hmac.compare_digest)."""
        n = len(packet) if n is None else n
        if n < AUTH_BASE_LEN:
            return False
        mv = memoryview(packet)
        return hmac.compare_digest(self.base_hmac(mv), mv[AUTH_HMAC_OFFSET:AUTH_BASE_LEN])

    def tlv_hmac(self, seq_field, tlv_bytes) -> bytes:
        """HMAC TLV value (RFC 8972 §4.8): over the Sequence Number field then the TLVs before the
        HMAC TLV, as on the wire."""
        h = self._h.copy()
        h.update(seq_field)
        h.update(tlv_bytes)
        return h.digest()[:HMAC_LEN]


def hmac_tlv(key: HmacKey, seq_field: bytes, preceding_tlvs: bytes, *, flags: int = FLAG_U) -> Tlv:
    """The HMAC TLV (RFC 8972 §4.8) protecting ``preceding_tlvs``."""
    return Tlv(TLV_HMAC, key.tlv_hmac(seq_field, preceding_tlvs), flags)


def check_tlv_hmac(key: HmacKey, seq_field, tlv_area) -> bool | None:
    """Verify the TLVs of an authenticated packet (RFC 8972 §4.8). ``tlv_area`` is everything
    after the 112-octet base. None: nothing to protect (no TLVs, zero padding or only Extra Padding
    TLVs); True: the HMAC TLV verifies and only Extra Padding follows it; False: an integrity
    failure (HMAC TLV missing, misplaced, of the wrong length, or wrong)."""
    data = bytes(tlv_area)
    if not any(data):
        return None
    off, n = 0, len(data)
    hmac_at = -1
    only_padding = True
    while off < n:
        if n - off < 4:
            if any(data[off:]):
                return False
            break
        _flags, typ, length = TLV_HEADER.unpack_from(data, off)
        end = off + 4 + length
        if end > n:
            return False
        if hmac_at >= 0:
            if typ != TLV_EXTRA_PADDING:
                return False  # only Extra Padding may follow the HMAC TLV
        elif typ == TLV_HMAC:
            if length != HMAC_LEN:
                return False
            hmac_at = off
        elif typ != TLV_EXTRA_PADDING:
            only_padding = False
        off = end
    if hmac_at < 0:
        return None if only_padding else False
    want = key.tlv_hmac(seq_field, data[:hmac_at])
    return hmac.compare_digest(want, data[hmac_at + 4:hmac_at + 4 + HMAC_LEN])


def ntp_from_ns(unix_ns: int) -> int:
    """Unix time in ns → 64-bit NTP timestamp (32.32 fixed point, epoch 1900; RFC 5905 §6)."""
    seconds, rem_ns = divmod(unix_ns, 1_000_000_000)
    fraction = (rem_ns << 32) // 1_000_000_000
    return (((seconds + NTP_UNIX_OFFSET_S) & 0xFFFFFFFF) << 32) | fraction


def ns_from_ntp(ntp: int) -> int:
    """64-bit NTP timestamp → Unix time in ns (era 0; valid until 2036)."""
    seconds = (ntp >> 32) - NTP_UNIX_OFFSET_S
    return seconds * 1_000_000_000 + (((ntp & 0xFFFFFFFF) * 1_000_000_000) >> 32)


@dataclass(frozen=True)
class Tlv:
    """One RFC 8972 TLV; ``value`` excludes the 4-octet header."""

    type: int
    value: bytes = b""
    flags: int = 0

    def pack(self) -> bytes:
        return TLV_HEADER.pack(self.flags, self.type, len(self.value)) + self.value


@dataclass(frozen=True)
class SenderPacket:
    """A Session-Sender test packet (RFC 8762 §4.2.1 with the RFC 8972 §3 SSID)."""

    seq: int
    timestamp_ntp: int
    ssid: int = 0
    error_estimate: int = DEFAULT_ERROR_ESTIMATE
    tlvs: tuple[Tlv, ...] = ()


@dataclass(frozen=True)
class ReflectorPacket:
    """A Session-Reflector test packet (RFC 8762 §4.3.1)."""

    seq: int
    timestamp_ntp: int          # T3
    receive_timestamp_ntp: int  # T2
    sender_seq: int
    sender_timestamp_ntp: int   # T1 (copied)
    ssid: int = 0
    error_estimate: int = DEFAULT_ERROR_ESTIMATE
    sender_error_estimate: int = DEFAULT_ERROR_ESTIMATE
    sender_ttl: int = 0
    tlvs: tuple[Tlv, ...] = ()
    trailer: bytes = b""        # bytes after the base that did not parse as TLVs (padding)


@dataclass(frozen=True)
class ClassOfService:
    """Class-of-Service TLV value (RFC 8972 §4.4; erratum 8199)::

        DSCP1(6) | DSCP2(6) | ECN(2) | RP(2) | Reserved(16)

    DSCP1: the DSCP the sender wants on the reflected packet; DSCP2/ECN: what arrived at the
    reflector; RP=1: the reflector's policy refused DSCP1 and it used the received DSCP.
    """

    dscp1: int = 0
    dscp2: int = 0
    ecn: int = 0
    rp: int = 0

    def pack_value(self) -> bytes:
        word = ((self.dscp1 & 0x3F) << 10) | ((self.dscp2 & 0x3F) << 4) | ((self.ecn & 3) << 2) \
            | (self.rp & 3)
        return struct.pack("!HH", word, 0)

    @classmethod
    def unpack_value(cls, value: bytes) -> ClassOfService:
        if len(value) != COS_LEN:
            raise StampDecodeError(f"Class-of-Service TLV length {len(value)} != {COS_LEN}")
        (word,) = struct.unpack_from("!H", value)
        return cls(dscp1=word >> 10, dscp2=(word >> 4) & 0x3F, ecn=(word >> 2) & 3, rp=word & 3)


@dataclass(frozen=True)
class DirectMeasurement:
    """Direct Measurement TLV value (RFC 8972 §4.5): S_TxC | R_RxC | R_TxC, 4 octets each."""

    sender_tx_count: int = 0
    reflector_rx_count: int = 0
    reflector_tx_count: int = 0

    def pack_value(self) -> bytes:
        return struct.pack("!III", self.sender_tx_count & 0xFFFFFFFF,
                           self.reflector_rx_count & 0xFFFFFFFF,
                           self.reflector_tx_count & 0xFFFFFFFF)

    @classmethod
    def unpack_value(cls, value: bytes) -> DirectMeasurement:
        if len(value) != DIRECT_MEASUREMENT_LEN:
            raise StampDecodeError(f"Direct Measurement TLV length {len(value)} != 12")
        return cls(*struct.unpack("!III", value))


def cos_tlv(dscp1: int, *, dscp2: int = 0, ecn: int = 0, rp: int = 0, flags: int = FLAG_U) -> Tlv:
    """A CoS TLV; senders set U=1 (RFC 8972 §4) so an echo-only reflector is detectable."""
    return Tlv(TLV_CLASS_OF_SERVICE, ClassOfService(dscp1, dscp2, ecn, rp).pack_value(), flags)


def direct_measurement_tlv(sender_tx_count: int, *, flags: int = FLAG_U) -> Tlv:
    """A Direct Measurement TLV with R_RxC and R_TxC zeroed, as a sender sends it."""
    return Tlv(TLV_DIRECT_MEASUREMENT, DirectMeasurement(sender_tx_count).pack_value(), flags)


def follow_up_tlv(*, flags: int = FLAG_U) -> Tlv:
    """A Follow-Up Telemetry TLV (RFC 8972 §4.7; erratum 8339) as the sender sends it, zeroed:
    Sequence Number(4) | Follow-up Timestamp(8) | Timestamp Mode(1) | Reserved(3). The reflector
    fills in its sequence number and the precise transmit time of its previous reflected packet."""
    return Tlv(TLV_FOLLOW_UP, bytes(FOLLOW_UP_LEN), flags)


def padding_tlv(n_value_octets: int, *, flags: int = FLAG_U) -> Tlv:
    """An Extra Padding TLV (RFC 8972 §4.1) of ``n_value_octets`` zero octets."""
    return Tlv(TLV_EXTRA_PADDING, bytes(n_value_octets), flags)


def pad_payload(body: bytes | bytearray, payload_len: int, *, flags: int = FLAG_U) -> bytes:
    """``body`` filled up to ``payload_len`` octets with one Extra Padding TLV (RFC 8972 §4.1);
    1-3 missing octets cannot hold a TLV header and are zero (reflectors copy them as padding)."""
    rest = payload_len - len(body)
    if rest >= 4:
        return bytes(body) + TLV_HEADER.pack(flags, TLV_EXTRA_PADDING, rest - 4) + bytes(rest - 4)
    return bytes(body) + bytes(max(rest, 0))


def reflected_control_tlv(reply_len: int, *, flags: int = FLAG_U) -> Tlv:
    """Reflected Test Packet Control TLV asking for one reply of ``reply_len`` UDP payload octets."""
    return Tlv(TLV_REFLECTED_CONTROL, struct.pack("!III", reply_len, 1, 0), flags)


def pack_tlvs(tlvs: tuple[Tlv, ...] | list[Tlv]) -> bytes:
    return b"".join(t.pack() for t in tlvs)


def parse_tlvs(data: bytes) -> tuple[tuple[Tlv, ...], bytes]:
    """Split ``data`` into TLVs. Returns (tlvs, rest): ``rest`` is non-empty when a TLV header or
    length runs past the end (RFC 8972 §4: processing stops at a malformed TLV)."""
    tlvs: list[Tlv] = []
    off = 0
    n = len(data)
    while off < n:
        if n - off < 4:
            return tuple(tlvs), data[off:]
        flags, typ, length = TLV_HEADER.unpack_from(data, off)
        if off + 4 + length > n:
            return tuple(tlvs), data[off:]
        tlvs.append(Tlv(typ, bytes(data[off + 4:off + 4 + length]), flags))
        off += 4 + length
    return tuple(tlvs), b""


def pack_sender(p: SenderPacket, *, pad_to: int = 0) -> bytes:
    """Encode a Session-Sender packet; ``pad_to`` adds zero octets after the TLVs."""
    raw = SENDER_LAYOUT.pack(p.seq & 0xFFFFFFFF, p.timestamp_ntp, p.error_estimate, p.ssid) \
        + pack_tlvs(p.tlvs)
    if len(raw) < pad_to:
        raw += bytes(pad_to - len(raw))
    return raw


def unpack_sender(data: bytes) -> SenderPacket:
    """Decode a Session-Sender packet; trailing bytes that are not TLVs are ignored."""
    if len(data) < BASE_LEN:
        raise StampDecodeError(f"sender packet is {len(data)} octets, STAMP needs {BASE_LEN}")
    seq, ts, err, ssid = SENDER_LAYOUT.unpack_from(data)
    tlvs, _rest = parse_tlvs(data[BASE_LEN:])
    return SenderPacket(seq, ts, ssid, err, tlvs)


def pack_reflector(p: ReflectorPacket) -> bytes:
    """Encode a Session-Reflector packet (base, TLVs, then the raw trailer)."""
    return REFLECTOR_LAYOUT.pack(
        p.seq & 0xFFFFFFFF, p.timestamp_ntp, p.error_estimate, p.ssid, p.receive_timestamp_ntp,
        p.sender_seq & 0xFFFFFFFF, p.sender_timestamp_ntp, p.sender_error_estimate,
        p.sender_ttl & 0xFF,
    ) + pack_tlvs(p.tlvs) + p.trailer


def unpack_reflector(data: bytes) -> ReflectorPacket:
    """Decode a Session-Reflector packet. Accepts 41-43 octet TWAMP-Light replies (no SSID TLVs)."""
    if len(data) < TWAMP_REFLECTOR_MIN_LEN:
        raise StampDecodeError(f"reflector packet is {len(data)} octets, needs >= 41")
    if len(data) < BASE_LEN:
        data = bytes(data) + bytes(BASE_LEN - len(data))
    seq, t3, err, ssid, t2, sseq, t1, serr, ttl = REFLECTOR_LAYOUT.unpack_from(data)
    rest = bytes(data[BASE_LEN:])
    if rest and not any(rest):
        tlvs, trailer = (), rest
    else:
        tlvs, trailer = parse_tlvs(rest)
    return ReflectorPacket(seq, t3, t2, sseq, t1, ssid, err, serr, ttl, tlvs, trailer)


def _auth_tlv_area(key: HmacKey, seq_field: bytes, tlvs: tuple[Tlv, ...]) -> bytes:
    """TLVs of an authenticated packet: the protected TLVs, then the HMAC TLV over them, then any
    Extra Padding (RFC 8972 §4.8). A given HMAC TLV is replaced by a freshly computed one."""
    protected = [t for t in tlvs if t.type not in (TLV_EXTRA_PADDING, TLV_HMAC)]
    padding = [t for t in tlvs if t.type == TLV_EXTRA_PADDING]
    if not protected:
        return pack_tlvs(padding)
    body = pack_tlvs(protected)
    given = find_tlv(tlvs, TLV_HMAC)
    flags = given.flags if given is not None else FLAG_U
    return body + hmac_tlv(key, seq_field, body, flags=flags).pack() + pack_tlvs(padding)


def _unpack_auth_tlvs(key: HmacKey, data: bytes, what: str) -> tuple[tuple[Tlv, ...], bytes]:
    rest = bytes(data[AUTH_BASE_LEN:])
    if check_tlv_hmac(key, data[:4], rest) is False:
        raise StampAuthError(f"{what} packet: the HMAC TLV does not verify (RFC 8972 §4.8)")
    if rest and not any(rest):
        return (), rest
    return parse_tlvs(rest)


def pack_sender_auth(p: SenderPacket, key: HmacKey | bytes, *, pad_to: int = 0) -> bytes:
    """Encode an authenticated Session-Sender packet (RFC 8762 §4.2.2): 96 octets, the HMAC of
    them, then the TLVs with an HMAC TLV when there are any besides Extra Padding."""
    key = HmacKey.of(key)
    head = AUTH_SENDER_LAYOUT.pack(p.seq & 0xFFFFFFFF, p.timestamp_ntp, p.error_estimate, p.ssid)
    raw = head + key.base_hmac(head) + _auth_tlv_area(key, head[:4], p.tlvs)
    if len(raw) < pad_to:
        raw += bytes(pad_to - len(raw))
    return raw


def unpack_sender_auth(data: bytes, key: HmacKey | bytes) -> SenderPacket:
    """Decode an authenticated Session-Sender packet; StampAuthError if it is shorter than 112
    octets or an HMAC (base, or the HMAC TLV) does not verify."""
    key = HmacKey.of(key)
    if not key.verify_base(data):
        raise StampAuthError(f"authenticated sender packet of {len(data)} octets: "
                             + ("too short" if len(data) < AUTH_BASE_LEN else "bad HMAC"))
    seq, ts, err, ssid = AUTH_SENDER_LAYOUT.unpack_from(data)
    tlvs, _rest = _unpack_auth_tlvs(key, data, "sender")
    return SenderPacket(seq, ts, ssid, err, tlvs)


def pack_reflector_auth(p: ReflectorPacket, key: HmacKey | bytes) -> bytes:
    """Encode an authenticated Session-Reflector packet (RFC 8762 §4.3.2), its TLVs protected by
    an HMAC TLV (RFC 8972 §4.8), then the raw trailer."""
    key = HmacKey.of(key)
    head = AUTH_REFLECTOR_LAYOUT.pack(
        p.seq & 0xFFFFFFFF, p.timestamp_ntp, p.error_estimate, p.ssid, p.receive_timestamp_ntp,
        p.sender_seq & 0xFFFFFFFF, p.sender_timestamp_ntp, p.sender_error_estimate,
        p.sender_ttl & 0xFF,
    )
    return head + key.base_hmac(head) + _auth_tlv_area(key, head[:4], p.tlvs) + p.trailer


def unpack_reflector_auth(data: bytes, key: HmacKey | bytes) -> ReflectorPacket:
    """Decode an authenticated Session-Reflector packet; StampAuthError if it is shorter than 112
    octets or an HMAC does not verify."""
    key = HmacKey.of(key)
    if not key.verify_base(data):
        raise StampAuthError(f"authenticated reflector packet of {len(data)} octets: "
                             + ("too short" if len(data) < AUTH_BASE_LEN else "bad HMAC"))
    seq, t3, err, ssid, t2, sseq, t1, serr, ttl = AUTH_REFLECTOR_LAYOUT.unpack_from(data)
    tlvs, trailer = _unpack_auth_tlvs(key, data, "reflector")
    return ReflectorPacket(seq, t3, t2, sseq, t1, ssid, err, serr, ttl, tlvs, trailer)


def find_tlv(tlvs: tuple[Tlv, ...], typ: int) -> Tlv | None:
    for t in tlvs:
        if t.type == typ:
            return t
    return None
