"""What a stateful STAMP Session-Reflector answers to one datagram: a pure function.

RFC 8762 §4.3 (reflected packet, stateful sequence numbering), §4.6 (TWAMP-Light interop),
RFC 8972 §4.3 (Timestamp Information, answered from this host's clock with its Error Estimate),
RFC 8972 §4 (TLV flags: U for unrecognised, M for malformed, processing stops at a malformed TLV),
§4.4 (Class of Service with erratum 8199), §4.5 (Direct Measurement), §4.8 (HMAC TLV), and our
Reflector Report TLV (reflector_report.py, a Private Use type, RFC 8972 §5.1); RFC 8762
§4.3.2/§4.4 for authenticated mode (112-octet base packets with an HMAC over octets 0-95). One deliberate deviation
from RFC 8762 §4.6: a request shorter than 44 octets is answered with at most as many octets as it
had (a 41-43 octet TWAMP-Light probe gets the 41-octet TWAMP reflector header), never the full base
packet, so the reflector can never amplify.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from wanprobe.probe.clock_tlvs import SAME_CLOCK_LEN, TIMESTAMP_INFO_LEN, TLV_SAME_CLOCK
from wanprobe.probe.reflector_report import TLV_REFLECTOR_REPORT, reflector_value
from wanprobe.probe.stamp_packet import (
    AUTH_BASE_LEN,
    BASE_LEN,
    COS_LEN,
    DIRECT_MEASUREMENT_LEN,
    FLAG_I,
    FLAG_M,
    FLAG_U,
    FOLLOW_UP_LEN,
    FOLLOW_UP_MODE_SW_LOCAL,
    HMAC_LEN,
    REFLECTED_CONTROL_LEN,
    TLV_CLASS_OF_SERVICE,
    TLV_DIRECT_MEASUREMENT,
    TLV_EXTRA_PADDING,
    TLV_FOLLOW_UP,
    TLV_HMAC,
    TLV_REFLECTED_CONTROL,
    TLV_TIMESTAMP_INFO,
    TWAMP_REFLECTOR_MIN_LEN,
    HmacKey,
    check_tlv_hmac,
)
from wanprobe.probe.stamp_packet import AUTH_REFLECTOR_LAYOUT as _AUTH_REFLECTOR_HEAD
from wanprobe.probe.stamp_packet import AUTH_SENDER_HEAD as _AUTH_SENDER_HEAD
from wanprobe.probe.stamp_packet import REFLECTOR_LAYOUT as _REFLECTOR_BASE
from wanprobe.probe.stamp_packet import SENDER_HEAD as _SENDER_HEAD
from wanprobe.probe.stamp_packet import TLV_HEADER as _TLV_HEADER


@dataclass(frozen=True, slots=True)
class Reply:
    """The reflected datagram and the TOS byte to send it with."""

    data: bytes
    tos: int
    malformed_tlv: bool = False
    integrity_failed: bool = False  # RFC 8972 §4.8: the HMAC TLV did not verify; TLVs copied, I set


def build_reply(request: bytes, *, reflector_seq: int, rx_count: int, tx_count: int,
                t2_ntp: int, t3_ntp: int, ttl: int, tos_received: int,
                error_estimate: int = 0x0001,
                dscp_permitted: Callable[[int], bool] | None = None,
                follow_up: tuple[int, int] | None = None,
                auth: HmacKey | None = None, base_verified: bool = False,
                clock=None,
                report: tuple[int, int, int, int] | None = None) -> Reply | None:
    """Answer ``request`` (a UDP payload) or return None when it is too short to answer.

    ``rx_count``/``tx_count`` are the session's counts including this packet (Direct
    Measurement R_RxC, R_TxC). ``follow_up`` = (reflector seq, NTP transmit time) of this
    session's previous reflected packet, for the Follow-Up Telemetry TLV (RFC 8972 §4.7);
    ``report`` = (epoch, rate limit, rate-limited, refused) for a Reflector Report TLV (None:
    the TLV is answered as unknown). Without
    a CoS TLV the reply carries the received DSCP (ECN cleared) if ``dscp_permitted`` allows it,
    else CS0 (``_reply_tos``). The reply is never longer than the request.

    With ``auth`` (authenticated mode, RFC 8762 §4.3.2/§4.4) the request must be at least 112
    octets with a valid HMAC (checked here unless ``base_verified``), else None; the reply uses the
    authenticated layout with its own HMAC, and its TLVs are answered only if the request's HMAC
    TLV verifies (RFC 8972 §4.8), else copied with the I flag set.

    ``clock`` (a :class:`~wanprobe.probe.local_clock.ClockAnswer`) answers the Timestamp
    Information TLV (RFC 8972 §4.3) and wanprobe's Same-clock TLV (clock_tlvs.py); without it
    both are echoed as not understood (U set).
    """
    if auth is not None:
        return _build_auth_reply(
            request, auth, base_verified=base_verified, reflector_seq=reflector_seq,
            rx_count=rx_count, tx_count=tx_count, t2_ntp=t2_ntp, t3_ntp=t3_ntp, ttl=ttl,
            tos_received=tos_received, error_estimate=error_estimate,
            dscp_permitted=dscp_permitted, follow_up=follow_up, clock=clock, report=report)
    n = len(request)
    if n < TWAMP_REFLECTOR_MIN_LEN:
        return None
    sseq, t1, serr, ssid = _SENDER_HEAD.unpack_from(request)
    if n < BASE_LEN:  # TWAMP-Light sender with a little padding: no SSID, no TLVs
        ssid = 0
    base = _REFLECTOR_BASE.pack(reflector_seq & 0xFFFFFFFF, t3_ntp, error_estimate, ssid,
                                t2_ntp, sseq, t1, serr, ttl & 0xFF)
    reply_tos = _reply_tos(tos_received >> 2, dscp_permitted)
    if n < BASE_LEN:
        return Reply(base[:n], reply_tos)
    rest = request[BASE_LEN:]
    if not any(rest):  # plain zero padding (TWAMP-Light symmetric size, RFC 6038): copy
        return Reply(base + rest, reply_tos)
    out, padding_idx, want_len, malformed, reply_tos, _hmac_idx = _reflect_tlvs(
        rest, tos_received, rx_count, tx_count, dscp_permitted, follow_up, auth=False,
        clock=clock, report=report)
    if want_len is not None and want_len < n and not malformed:
        # Asymmetrical reply (draft-ietf-ippm-asymmetrical-pkts): drop the Extra Padding and
        # pad back up to the requested length, never above the request.
        kept = [b for i, b in enumerate(out) if i not in padding_idx]
        return Reply(_padded_to(base + b"".join(kept), want_len)[:n], reply_tos)
    return Reply(base + b"".join(out), reply_tos, malformed)


def _reply_tos(dscp: int, dscp_permitted: Callable[[int], bool] | None) -> int:
    """The TOS byte of a reply that would carry ``dscp`` (ECN cleared): ``dscp`` when the policy
    lets this reflector send it, else CS0 (RFC 2474 §4.1, default forwarding). RFC 8972 §4.4
    leaves the DSCP of the reply to the reflector's local policy; so a probe that arrives in a
    class the policy forbids (CS7 by default, issue 37) is not echoed into it, with or without
    a Class-of-Service TLV — the TLV still reports the DSCP received (DSCP2)."""
    return dscp << 2 if dscp_permitted is None or dscp_permitted(dscp) else 0


def _padded_to(body: bytes, want_len: int) -> bytes:
    """An asymmetrical reply (draft-ietf-ippm-asymmetrical-pkts) padded up to ``want_len`` with
    one Extra Padding TLV, if there is room for its header."""
    if want_len >= len(body) + 4:
        return body + _TLV_HEADER.pack(0, TLV_EXTRA_PADDING, want_len - len(body) - 4) \
            + bytes(want_len - len(body) - 4)
    return body


def _reflect_tlvs(rest: bytes, tos_received: int, rx_count: int, tx_count: int,
                  dscp_permitted: Callable[[int], bool] | None,
                  follow_up: tuple[int, int] | None, *, auth: bool, clock=None,
                  report: tuple[int, int, int, int] | None = None):
    """Answer each TLV (RFC 8972 §4). Returns (reply TLV byte strings, indices of Extra Padding,
    Reflected Control length or None, malformed, reply TOS, index of the HMAC TLV or None). The
    HMAC TLV (auth only) is copied as is; the caller recomputes its value. Long because: one
    branch per TLV type of RFC 8972 §4, on the per-packet path (a table of handlers would cost
    a call per TLV)."""
    out: list[bytes] = []
    padding_idx: list[int] = []
    want_len: int | None = None
    hmac_idx: int | None = None
    malformed = False
    reply_tos = _reply_tos(tos_received >> 2, dscp_permitted)
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
                rp, reply_tos = 1, _reply_tos(dscp_rx, dscp_permitted)
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
        elif clock is not None and typ == TLV_TIMESTAMP_INFO and length == TIMESTAMP_INFO_LEN:
            value = clock.timestamp_info
        elif clock is not None and typ == TLV_SAME_CLOCK and length == SAME_CLOCK_LEN:
            value = clock.same_clock(value)
        elif auth and typ == TLV_HMAC and length == HMAC_LEN and hmac_idx is None:
            hmac_idx = len(out)
        elif typ == TLV_REFLECTOR_REPORT and report is not None \
                and (filled := reflector_value(value, report)) is not None:
            value = filled
        elif typ in (TLV_CLASS_OF_SERVICE, TLV_DIRECT_MEASUREMENT, TLV_REFLECTED_CONTROL,
                     TLV_FOLLOW_UP) or (clock is not None and typ == TLV_TIMESTAMP_INFO):
            flags |= FLAG_M  # known type, wrong length: RFC 8972 §4 malformed
        else:
            flags |= FLAG_U  # not understood: echo it with U set
        out.append(_TLV_HEADER.pack(flags, typ, length) + value)
        off = end
    return out, padding_idx, want_len, malformed, reply_tos, hmac_idx


def _integrity_failed_copy(rest: bytes) -> bytes:
    """RFC 8972 §4.8: on an HMAC TLV failure stop processing, copy the TLVs and set I in each."""
    out = bytearray(rest)
    off, m = 0, len(rest)
    while m - off >= 4:
        out[off] |= FLAG_I
        (length,) = struct.unpack_from("!H", rest, off + 2)
        if off + 4 + length > m:
            out[off] |= FLAG_M
            break
        off += 4 + length
    return bytes(out)


def _build_auth_reply(request: bytes, key: HmacKey, *, base_verified: bool, reflector_seq: int,
                      rx_count: int, tx_count: int, t2_ntp: int, t3_ntp: int, ttl: int,
                      tos_received: int, error_estimate: int,
                      dscp_permitted: Callable[[int], bool] | None,
                      follow_up: tuple[int, int] | None, clock=None,
                      report: tuple[int, int, int, int] | None = None) -> Reply | None:
    n = len(request)
    if n < AUTH_BASE_LEN or not (base_verified or key.verify_base(request)):
        return None
    sseq, t1, serr, ssid = _AUTH_SENDER_HEAD.unpack_from(request)
    head = _AUTH_REFLECTOR_HEAD.pack(reflector_seq & 0xFFFFFFFF, t3_ntp, error_estimate, ssid,
                                     t2_ntp, sseq, t1, serr, ttl & 0xFF)
    base = head + key.base_hmac(head)
    reply_tos = _reply_tos(tos_received >> 2, dscp_permitted)
    rest = request[AUTH_BASE_LEN:]
    if not any(rest):
        return Reply(base + rest, reply_tos)
    integrity = check_tlv_hmac(key, request[:4], rest)
    if integrity is False:
        return Reply(base + _integrity_failed_copy(rest), reply_tos, integrity_failed=True)
    out, padding_idx, want_len, malformed, reply_tos, hmac_idx = _reflect_tlvs(
        rest, tos_received, rx_count, tx_count, dscp_permitted, follow_up, auth=True,
        clock=clock, report=report)
    asym = want_len is not None and want_len < n and not malformed
    keep = [i for i in range(len(out)) if not (asym and i in padding_idx)]
    tlvs = [out[i] for i in keep]
    if hmac_idx is not None:
        pos = keep.index(hmac_idx)
        tlvs[pos] = tlvs[pos][:4] + key.tlv_hmac(head[:4], b"".join(tlvs[:pos]))
    body = base + b"".join(tlvs)
    if asym:
        body = _padded_to(body, want_len)
    return Reply(body[:n], reply_tos, malformed)
