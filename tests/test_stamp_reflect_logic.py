"""The reflector's answer to one datagram (pure function): sizes, stateful numbering, TLVs."""

import struct

from wanprobe.probe import stamp_packet as sp
from wanprobe.probe.reflect_logic import build_reply

KW = dict(reflector_seq=4, rx_count=5, tx_count=5, t2_ntp=0x0102030405060708,
          t3_ntp=0x1112131415161718, ttl=61, tos_received=(26 << 2) | 1)


def req(*tlvs, seq=9, ssid=321, pad=0):
    return sp.pack_sender(sp.SenderPacket(seq, 0xAAAAAAAABBBBBBBB, ssid, tlvs=tuple(tlvs)), pad_to=pad)


def test_base_reply_fields_and_symmetric_size():
    r = build_reply(req(pad=200), **KW)
    assert len(r.data) == 200
    p = sp.unpack_reflector(r.data)
    assert p.seq == 4                       # stateful: the reflector's own counter
    assert p.sender_seq == 9 and p.sender_timestamp_ntp == 0xAAAAAAAABBBBBBBB
    assert p.receive_timestamp_ntp == KW["t2_ntp"] and p.timestamp_ntp == KW["t3_ntp"]
    assert p.ssid == 321 and p.sender_ttl == 61
    assert r.tos == 26 << 2                 # no CoS TLV: received DSCP, ECN cleared


def test_cos_tlv_reports_received_dscp_ecn_and_sets_return_dscp():
    r = build_reply(req(sp.cos_tlv(46)), **KW)
    t = sp.unpack_reflector(r.data).tlvs[0]
    assert t.flags & sp.FLAG_U == 0         # processed: U cleared
    assert sp.ClassOfService.unpack_value(t.value) == sp.ClassOfService(46, 26, 1, 0)
    assert r.tos == 46 << 2


def test_cos_policy_refusal_sets_rp_and_keeps_received_dscp():
    r = build_reply(req(sp.cos_tlv(46)), **KW, dscp_permitted=lambda d: d != 46)
    cos = sp.ClassOfService.unpack_value(sp.unpack_reflector(r.data).tlvs[0].value)
    assert cos.rp == 1 and r.tos == 26 << 2


def test_direct_measurement_filled_with_session_counts():
    r = build_reply(req(sp.direct_measurement_tlv(10)), **KW)
    dm = sp.DirectMeasurement.unpack_value(sp.unpack_reflector(r.data).tlvs[0].value)
    assert (dm.sender_tx_count, dm.reflector_rx_count, dm.reflector_tx_count) == (10, 5, 5)


def test_unknown_tlv_echoed_with_u_and_malformed_with_m():
    unknown = sp.Tlv(200, b"abcd", 0)
    r = build_reply(req(unknown), **KW)
    t = sp.unpack_reflector(r.data).tlvs[0]
    assert t.flags & sp.FLAG_U and t.value == b"abcd"
    bad = req() + bytes([0x80, 4, 0, 40]) + b"xy"   # length runs past the end
    r = build_reply(bad, **KW)
    assert r.malformed_tlv and len(r.data) == len(bad)
    assert r.data[44] & sp.FLAG_M and r.data[45:] == bad[45:]


def test_short_and_twamp_light_requests_never_amplified():
    assert build_reply(bytes(40), **KW) is None
    twamp = struct.pack("!IQH", 3, 77, 1) + bytes(27)   # 41 octets: RFC 6038 symmetric
    r = build_reply(twamp, **KW)
    assert len(r.data) == 41
    p = sp.unpack_reflector(r.data)
    assert p.sender_seq == 3 and p.sender_timestamp_ntp == 77 and p.sender_ttl == 61


def test_reflected_control_asks_for_a_shorter_reply():
    big = req(sp.reflected_control_tlv(60), sp.padding_tlv(1000))
    r = build_reply(big, **KW)
    assert len(r.data) == 60 and len(big) > 1000
    assert [t.type for t in sp.unpack_reflector(r.data).tlvs] == [sp.TLV_REFLECTED_CONTROL]
    # never longer than the request, whatever is asked
    r = build_reply(req(sp.reflected_control_tlv(5000)), **KW)
    assert len(r.data) == 60


def test_follow_up_telemetry_reports_previous_transmit_time():
    r = build_reply(req(sp.follow_up_tlv()), **KW, follow_up=(3, 0x0102030405060708))
    t = sp.unpack_reflector(r.data).tlvs[0]
    assert t.type == sp.TLV_FOLLOW_UP and not t.flags & sp.FLAG_U
    assert t.value == bytes.fromhex("00000003" "0102030405060708" "02" "000000")
    first = build_reply(req(sp.follow_up_tlv()), **KW)          # nothing sent yet: zeros
    assert sp.unpack_reflector(first.data).tlvs[0].value == bytes(16)
