"""What a stateful STAMP Session-Reflector answers to one datagram: a pure function.

RFC 8762 §4.3 (reflected packet, stateful sequence numbering), §4.6 (TWAMP-Light interop),
RFC 8972 §4 (TLV flags: U for unrecognised, M for malformed, processing stops at a malformed TLV),
§4.4 (Class of Service with erratum 8199), §4.5 (Direct Measurement). One deliberate deviation
from RFC 8762 §4.6: a request shorter than 44 octets is answered with at most as many octets as it
had (a 41-43 octet TWAMP-Light probe gets the 41-octet TWAMP reflector header), never the full base
packet, so the reflector can never amplify.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from wanprobe.probe.stamp_packet import (
    BASE_LEN,
    COS_LEN,
    DIRECT_MEASUREMENT_LEN,
    FLAG_M,
    FLAG_U,
    FOLLOW_UP_LEN,
    FOLLOW_UP_MODE_SW_LOCAL,
    REFLECTED_CONTROL_LEN,
    TLV_CLASS_OF_SERVICE,
    TLV_DIRECT_MEASUREMENT,
    TLV_EXTRA_PADDING,
    TLV_FOLLOW_UP,
    TLV_REFLECTED_CONTROL,
    TWAMP_REFLECTOR_MIN_LEN,
)

_REFLECTOR_BASE = struct.Struct("!IQHHQIQH2xB3x")
_SENDER_HEAD = struct.Struct("!IQHH")
_TLV_HEADER = struct.Struct("!BBH")


@dataclass(frozen=True, slots=True)
class Reply:
    """The reflected datagram and the TOS byte to send it with."""

    data: bytes
    tos: int
    malformed_tlv: bool = False


def build_reply(request: bytes, *, reflector_seq: int, rx_count: int, tx_count: int,
                t2_ntp: int, t3_ntp: int, ttl: int, tos_received: int,
                error_estimate: int = 0x0001,
                dscp_permitted: Callable[[int], bool] | None = None,
                follow_up: tuple[int, int] | None = None) -> Reply | None:
    """Answer ``request`` (a UDP payload) or return None when it is too short to answer.

    ``rx_count``/``tx_count`` are the session's counts including this packet (Direct
    Measurement R_RxC, R_TxC). ``follow_up`` = (reflector seq, NTP transmit time) of this
    session's previous reflected packet, for the Follow-Up Telemetry TLV (RFC 8972 §4.7). Without a CoS TLV the reply carries the received DSCP (ECN
    cleared). The reply is never longer than the request.
    """
    n = len(request)
    if n < TWAMP_REFLECTOR_MIN_LEN:
        return None
    sseq, t1, serr, ssid = _SENDER_HEAD.unpack_from(request)
    if n < BASE_LEN:  # TWAMP-Light sender with a little padding: no SSID, no TLVs
        ssid = 0
    base = _REFLECTOR_BASE.pack(reflector_seq & 0xFFFFFFFF, t3_ntp, error_estimate, ssid,
                                t2_ntp, sseq, t1, serr, ttl & 0xFF)
    reply_tos = tos_received & 0xFC
    if n < BASE_LEN:
        return Reply(base[:n], reply_tos)
    rest = request[BASE_LEN:]
    if not any(rest):  # plain zero padding (TWAMP-Light symmetric size, RFC 6038): copy
        return Reply(base + rest, reply_tos)

    out: list[bytes] = []
    padding_idx: list[int] = []
    want_len: int | None = None
    malformed = False
    off = 0
    m = len(rest)
    while off < m:
        if m - off < 4:  # 1-3 trailing octets cannot be a TLV: zeros are padding
            if any(rest[off:]):
                malformed = True
            else:
                padding_idx.append(len(out))
            out.append(rest[off:])
            break
        flags, typ, length = _TLV_HEADER.unpack_from(rest, off)
        end = off + 4 + length
        if end > m:
            out.append(bytes([flags | FLAG_M]) + rest[off + 1:])
            malformed = True
            break
        value = rest[off + 4:end]
        flags &= ~FLAG_U & 0xFF
        if typ == TLV_CLASS_OF_SERVICE and length == COS_LEN:
            (word,) = struct.unpack_from("!H", value)
            dscp1 = word >> 10
            dscp_rx, ecn_rx = tos_received >> 2, tos_received & 3
            if dscp_permitted is None or dscp_permitted(dscp1):
                rp, reply_tos = 0, dscp1 << 2
            else:
                rp, reply_tos = 1, dscp_rx << 2
            word = (dscp1 << 10) | (dscp_rx << 4) | (ecn_rx << 2) | rp
            value = struct.pack("!H", word) + value[2:]
        elif typ == TLV_DIRECT_MEASUREMENT and length == DIRECT_MEASUREMENT_LEN:
            value = value[:4] + struct.pack("!II", rx_count & 0xFFFFFFFF, tx_count & 0xFFFFFFFF)
        elif typ == TLV_FOLLOW_UP and length == FOLLOW_UP_LEN:
            if follow_up is None:
                value = bytes(FOLLOW_UP_LEN)
            else:
                value = struct.pack("!IQB3x", follow_up[0] & 0xFFFFFFFF, follow_up[1],
                                    FOLLOW_UP_MODE_SW_LOCAL)
        elif typ == TLV_REFLECTED_CONTROL and length == REFLECTED_CONTROL_LEN:
            (want_len,) = struct.unpack_from("!I", value)
        elif typ == TLV_EXTRA_PADDING:
            padding_idx.append(len(out))
        elif typ in (TLV_CLASS_OF_SERVICE, TLV_DIRECT_MEASUREMENT, TLV_REFLECTED_CONTROL,
                     TLV_FOLLOW_UP):
            flags |= FLAG_M  # known type, wrong length: RFC 8972 §4 malformed
        else:
            flags |= FLAG_U  # not understood: echo it with U set
        out.append(_TLV_HEADER.pack(flags, typ, length) + value)
        off = end

    if want_len is not None and want_len < n and not malformed:
        # Asymmetrical reply (draft-ietf-ippm-asymmetrical-pkts): drop the Extra Padding and
        # pad back up to the requested length, never above the request.
        kept = [b for i, b in enumerate(out) if i not in padding_idx]
        body = base + b"".join(kept)
        if want_len >= len(body) + 4:
            body += _TLV_HEADER.pack(0, TLV_EXTRA_PADDING, want_len - len(body) - 4) \
                + bytes(want_len - len(body) - 4)
        return Reply(body[:n], reply_tos)
    return Reply(base + b"".join(out), reply_tos, malformed)
