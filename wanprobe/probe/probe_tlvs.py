"""The TLVs wanprobe's STAMP sender puts in every probe (Class of Service, RFC 8972 §4.7;
Direct Measurement, §4.5; Follow-Up Telemetry, §4.6; Timestamp Information, §4.3, and the
Same-clock TLV of clock_tlvs.py; the HMAC TLV in authenticated mode, §4.8)
and how it reads them back from a reply: a fixed-offset fast path for its own layout, a TLV
walk for anything else. The base layouts come from :mod:`wanprobe.probe.stamp_packet`."""

from __future__ import annotations

import struct
from typing import Any

from wanprobe.probe.clock_tlvs import request_tlvs as clock_request_tlvs
from wanprobe.probe.reflector_report import TLV_LEN as REPORT_TLV_LEN  # noqa: F401 (sender.py)
from wanprobe.probe.reflector_report import ReportLog  # noqa: F401 (sender.py)
from wanprobe.probe.reflector_report import sender_tlv as report_tlv
from wanprobe.probe.stamp_packet import (
    AUTH_BASE_LEN,
    BASE_LEN,
    FLAG_U,
    SENDER_LAYOUT,
    TLV_CLASS_OF_SERVICE,
    TLV_DIRECT_MEASUREMENT,
    TLV_FOLLOW_UP,
    TLV_HEADER,
    TLV_HMAC,
    ClassOfService,
    cos_tlv,
    follow_up_tlv,
    ns_from_ntp,
    pad_payload,
    parse_tlvs,
)

_DM_HEAD = struct.Struct("!BBHIII")
# CoS (flags type len word reserved) | DM (flags type len S_TxC R_RxC R_TxC) | Follow-Up
OWN_TLVS = struct.Struct("!BBHHHBBHIIIBBHIQ4x")
OWN_LAYOUT_LEN = BASE_LEN + OWN_TLVS.size
_COS_CACHE: dict[int, ClassOfService] = {}


def slow_tlvs(sess: Any, area: bytes, sseq: int | None = None):
    """CoS and Direct Measurement from a reply's TLVs (skipping unprocessed ones, U set), and
    the Follow-Up Telemetry and Reflector Report TLVs (of answer ``sseq``) into the session."""
    cos = dm = None
    if sseq is not None:
        sess.report.note_area(sseq, area)
    tlvs, _rest = parse_tlvs(area)
    for t in tlvs:
        if t.flags & FLAG_U:
            continue  # reflector did not process it (RFC 8972 §4)
        if t.type == TLV_CLASS_OF_SERVICE and len(t.value) == 4:
            cos = ClassOfService.unpack_value(t.value)
        elif t.type == TLV_DIRECT_MEASUREMENT and len(t.value) == 12:
            dm = struct.unpack("!III", t.value)
        elif t.type == TLV_FOLLOW_UP and len(t.value) == 16:
            fseq, fts = struct.unpack_from("!IQ", t.value)
            if fts:
                sess.follow_up_ns[fseq] = ns_from_ntp(fts)
    return cos, dm


def own_tlvs(sess: Any, data, offset: int, sseq: int | None = None,
             n: int = 0) -> tuple[ClassOfService | None, tuple | None]:
    """(CoS, (0, R_RxC)) from the CoS, Direct Measurement and Follow-Up TLVs this sender put at
    ``offset``, skipping any the reflector left flagged U; records the Follow-Up T3 and, for
    answer ``sseq`` of ``n`` octets, the Reflector Report TLV (reflector_report.py)."""
    if sseq is not None:
        sess.report.note_own(sseq, data, n, sess.template, offset)
    (cf, _ct, cl, cword, _cr, df, _dt, dl, _s, r_rx, _r_tx, ff, _ft, fl, fseq,
     fts) = OWN_TLVS.unpack_from(data, offset)
    cos = dm = None
    if not cf & FLAG_U and cl == 4:
        cos = _COS_CACHE.get(cword)
        if cos is None:
            cos = _COS_CACHE[cword] = ClassOfService(
                cword >> 10, (cword >> 4) & 0x3F, (cword >> 2) & 3, cword & 3)
    if not df & FLAG_U and dl == 12:
        dm = (0, r_rx)
    if not ff & FLAG_U and fl == 16 and fts:
        sess.follow_up_ns[fseq] = ns_from_ntp(fts)
    return cos, dm


def probe_template(sess: Any) -> bytearray:
    """The probe bytes with sequence/timestamp/S_TxC left to fill in per packet: the base packet
    (44 octets, or 112 in authenticated mode, RFC 8762 §4.2.2, base HMAC per packet), then CoS,
    Direct Measurement, Follow-Up, Timestamp Information and Same-clock (clock_tlvs.py), our
    Reflector Report (reflector_report.py), in authenticated mode the HMAC TLV (value per packet,
    RFC 8972 §4.8, covering all before it), and Extra Padding up to the payload length."""
    body = bytearray(SENDER_LAYOUT.size if sess.auth is None else AUTH_BASE_LEN)
    body += cos_tlv(sess.dscp).pack()
    body += _DM_HEAD.pack(FLAG_U, TLV_DIRECT_MEASUREMENT, 12, 0, 0, 0)
    body += follow_up_tlv().pack()
    body += clock_request_tlvs(sess.clock.local.boot_id if sess.clock is not None else None)
    body += report_tlv()   # reflector_report.py: the reflector's drops, limit and session epoch
    if sess.auth is not None:
        body += TLV_HEADER.pack(FLAG_U, TLV_HMAC, 16) + bytes(16)
    return bytearray(pad_payload(body, sess.payload_len))
