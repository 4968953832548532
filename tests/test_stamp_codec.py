"""Byte-level tests of the STAMP codec against the RFC 8762 / RFC 8972 layouts, and against
scapy's independent ``scapy.contrib.stamp`` encoder/decoder."""

import struct

import pytest

from wanprobe.probe import stamp_packet as sp


def test_ntp_conversion_epoch_and_fraction():
    # RFC 5905 §6: NTP era 0 starts 1900-01-01; Unix 0 is 2208988800 s later.
    assert sp.ntp_from_ns(0) == 2_208_988_800 << 32
    assert sp.ntp_from_ns(500_000_000) == (2_208_988_800 << 32) | 0x80000000
    ns = 1_764_000_000_123_456_789
    assert abs(sp.ns_from_ntp(sp.ntp_from_ns(ns)) - ns) <= 1


def test_sender_packet_offsets_match_rfc8762_4_2_1():
    p = sp.SenderPacket(seq=0x01020304, timestamp_ntp=0x1112131415161718, ssid=0xBEEF,
                        error_estimate=0x8001)
    raw = sp.pack_sender(p)
    assert len(raw) == 44
    assert raw[0:4] == bytes.fromhex("01020304")          # Sequence Number
    assert raw[4:12] == bytes.fromhex("1112131415161718")  # Timestamp
    assert raw[12:14] == bytes.fromhex("8001")             # Error Estimate (S=1, mult 1)
    assert raw[14:16] == bytes.fromhex("beef")             # SSID (RFC 8972 §3)
    assert raw[16:44] == bytes(28)                         # MBZ
    assert sp.unpack_sender(raw) == p


def test_reflector_packet_offsets_match_rfc8762_4_3_1():
    p = sp.ReflectorPacket(seq=7, timestamp_ntp=0xA1A2A3A4A5A6A7A8, receive_timestamp_ntp=0xB1B2B3B4B5B6B7B8,
                           sender_seq=0x0A0B0C0D, sender_timestamp_ntp=0xC1C2C3C4C5C6C7C8,
                           ssid=0x1234, error_estimate=0x0001, sender_error_estimate=0x3FFF,
                           sender_ttl=63)
    raw = sp.pack_reflector(p)
    assert len(raw) == 44
    assert raw[0:4] == (7).to_bytes(4, "big")
    assert raw[4:12] == bytes.fromhex("a1a2a3a4a5a6a7a8")   # T3
    assert raw[12:14] == bytes.fromhex("0001")
    assert raw[14:16] == bytes.fromhex("1234")
    assert raw[16:24] == bytes.fromhex("b1b2b3b4b5b6b7b8")  # Receive Timestamp T2
    assert raw[24:28] == bytes.fromhex("0a0b0c0d")          # Session-Sender Sequence Number
    assert raw[28:36] == bytes.fromhex("c1c2c3c4c5c6c7c8")  # Session-Sender Timestamp
    assert raw[36:38] == bytes.fromhex("3fff")              # Session-Sender Error Estimate
    assert raw[38:40] == bytes(2)                           # MBZ
    assert raw[40] == 63                                    # Ses-Sender TTL
    assert raw[41:44] == bytes(3)                           # MBZ
    assert sp.unpack_reflector(raw) == p


def test_twamp_light_41_octet_reply_decodes():
    raw = sp.pack_reflector(sp.ReflectorPacket(1, 2, 3, 4, 5, sender_ttl=9))[:41]
    p = sp.unpack_reflector(raw)
    assert (p.seq, p.timestamp_ntp, p.receive_timestamp_ntp, p.sender_seq, p.sender_ttl) == (1, 2, 3, 4, 9)
    with pytest.raises(sp.StampDecodeError):
        sp.unpack_reflector(raw[:40])
    with pytest.raises(sp.StampDecodeError):
        sp.unpack_sender(bytes(43))


def test_cos_tlv_bit_positions_rfc8972_4_4():
    # DSCP1(6) | DSCP2(6) | ECN(2) | RP(2) | Reserved(16), Type 4, Length 4, sender sets U.
    tlv = sp.cos_tlv(46, dscp2=26, ecn=3, rp=1)
    raw = tlv.pack()
    assert raw[:4] == bytes([0x80, 4, 0, 4])
    word = (46 << 10) | (26 << 4) | (3 << 2) | 1
    assert raw[4:6] == word.to_bytes(2, "big") == bytes([0b10111001, 0b10101101])
    assert raw[6:8] == bytes(2)
    assert sp.ClassOfService.unpack_value(raw[4:]) == sp.ClassOfService(46, 26, 3, 1)


def test_direct_measurement_tlv_rfc8972_4_5():
    raw = sp.direct_measurement_tlv(0x01020304).pack()
    assert raw == bytes([0x80, 5, 0, 12]) + bytes.fromhex("01020304") + bytes(8)
    dm = sp.DirectMeasurement.unpack_value(struct.pack("!III", 10, 9, 8))
    assert (dm.sender_tx_count, dm.reflector_rx_count, dm.reflector_tx_count) == (10, 9, 8)


def test_tlv_chain_and_malformed_rest():
    chain = sp.pack_tlvs([sp.cos_tlv(0), sp.padding_tlv(3)])
    tlvs, rest = sp.parse_tlvs(chain)
    assert [t.type for t in tlvs] == [4, 1] and rest == b""
    tlvs, rest = sp.parse_tlvs(chain + bytes([0, 1, 0, 9, 1]))  # length runs past the end
    assert len(tlvs) == 2 and rest == bytes([0, 1, 0, 9, 1])


scapy_stamp = pytest.importorskip("scapy.contrib.stamp")


def test_scapy_decodes_our_sender_packet():
    raw = sp.pack_sender(sp.SenderPacket(seq=42, timestamp_ntp=sp.ntp_from_ns(10**18), ssid=777,
                                         tlvs=(sp.cos_tlv(26), sp.padding_tlv(8))))
    pkt = scapy_stamp.STAMPSessionSenderTestUnauthenticated(raw)
    assert pkt.seq == 42 and pkt.ssid == 777 and pkt.mbz == 0
    assert [t.type for t in pkt.tlv_objects] == [4, 1]
    assert bytes(pkt.tlv_objects[0].value) == sp.ClassOfService(26).pack_value()
    assert bytes(pkt) == raw


def test_we_decode_scapy_reflector_packet():
    s = scapy_stamp
    pkt = s.STAMPSessionReflectorTestUnauthenticated(
        seq=5, ssid=99, seq_sender=11, ttl_sender=64,
        err_estimate=s.ErrorEstimate(S=1, scale=3, multiplier=7),
        tlv_objects=[s.STAMPTestTLV(flags=0, type=4, len=4, value=sp.ClassOfService(26, 0, 0, 0).pack_value())])
    p = sp.unpack_reflector(bytes(pkt))
    assert (p.seq, p.ssid, p.sender_seq, p.sender_ttl) == (5, 99, 11, 64)
    assert p.error_estimate == (1 << 15) | (3 << 8) | 7
    assert sp.ClassOfService.unpack_value(p.tlvs[0].value).dscp1 == 26
