"""STAMP authenticated mode (RFC 8762 §4.2.2, §4.3.2, §4.4; RFC 8972 §4.8 HMAC TLV).

Packets are built here byte by byte from the RFC offsets (struct.pack_into at written-out offsets,
HMAC from the stdlib), independently of the codec. Reflector and sender run on real UDP sockets on
127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import itertools
import socket
import struct
import threading
import time

import pytest
from conftest import udp_server
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wanprobe.probe import stamp_packet as sp
from wanprobe.probe.reflect_logic import build_reply
from wanprobe.probe.reflector import Reflector
from wanprobe.probe.sender import StampSender, probe_stamp

KEY = b"0123456789abcdef-stamp-test-key"
OTHER_KEY = b"fedcba9876543210-another-key!!"
NTP_OFFSET_S = 2_208_988_800


def mac(key: bytes, data: bytes) -> bytes:
    """HMAC-SHA-256 truncated to 128 bits (RFC 8762 §4.4), straight from the stdlib."""
    return hmac.new(key, data, hashlib.sha256).digest()[:16]


def ntp_now() -> int:
    t = time.time()
    return (int(t) + NTP_OFFSET_S) << 32 | int((t % 1) * 2**32)


def auth_sender_bytes(seq: int, ts: int, ssid: int, key: bytes, *, err: int = 0x0001,
                      tlvs: bytes = b"") -> bytes:
    """RFC 8762 §4.2.2 Figure 4 (SSID from RFC 8972 §3): Seq 0-3, MBZ 4-15, Timestamp 16-23,
    Error Estimate 24-25, SSID 26-27, MBZ 28-95, HMAC 96-111, TLVs from 112."""
    b = bytearray(112)
    struct.pack_into("!I", b, 0, seq)
    struct.pack_into("!Q", b, 16, ts)
    struct.pack_into("!H", b, 24, err)
    struct.pack_into("!H", b, 26, ssid)
    b[96:112] = mac(key, bytes(b[0:96]))
    return bytes(b) + tlvs


def auth_reflector_bytes(*, seq, t3, err, ssid, t2, sseq, t1, serr, ttl, key) -> bytes:
    """RFC 8762 §4.3.2 Figure 6: Seq 0-3, MBZ 4-15, T3 16-23, ErrEst 24-25, SSID 26-27, MBZ 28-31,
    T2 32-39, MBZ 40-47, Sender Seq 48-51, MBZ 52-63, Sender Timestamp 64-71, Sender ErrEst 72-73,
    MBZ 74-79, Sender TTL 80, MBZ 81-95, HMAC 96-111."""
    b = bytearray(112)
    struct.pack_into("!I", b, 0, seq)
    struct.pack_into("!Q", b, 16, t3)
    struct.pack_into("!H", b, 24, err)
    struct.pack_into("!H", b, 26, ssid)
    struct.pack_into("!Q", b, 32, t2)
    struct.pack_into("!I", b, 48, sseq)
    struct.pack_into("!Q", b, 64, t1)
    struct.pack_into("!H", b, 72, serr)
    b[80] = ttl
    b[96:112] = mac(key, bytes(b[0:96]))
    return bytes(b)


def tlv(flags: int, typ: int, value: bytes) -> bytes:
    return struct.pack("!BBH", flags, typ, len(value)) + value


def with_hmac_tlv(packet_seq_field: bytes, tlvs: bytes, key: bytes, padding: bytes = b"") -> bytes:
    """RFC 8972 §4.8: HMAC TLV over the Sequence Number field and the preceding TLVs."""
    return tlvs + tlv(0x80, 8, mac(key, packet_seq_field + tlvs)) + padding


# -- codec: byte layout -------------------------------------------------------------------------

def test_sender_layout_decodes_and_encodes_byte_for_byte():
    raw = auth_sender_bytes(0xA1B2C3D4, 0x0102030405060708, 0xBEEF, KEY, err=0x8001)
    assert len(raw) == 112
    p = sp.unpack_sender_auth(raw, KEY)
    assert (p.seq, p.timestamp_ntp, p.error_estimate, p.ssid, p.tlvs) == (
        0xA1B2C3D4, 0x0102030405060708, 0x8001, 0xBEEF, ())
    assert sp.pack_sender_auth(p, KEY) == raw
    assert sp.pack_sender_auth(p, sp.HmacKey(KEY), pad_to=300) == raw + bytes(188)


def test_reflector_layout_decodes_and_encodes_byte_for_byte():
    fields = dict(seq=7, t3=0x1111111122222222, err=0x0001, ssid=0x1234, t2=0x3333333344444444,
                  sseq=0xDEADBEEF, t1=0x5555555566666666, serr=0x0002, ttl=63)
    raw = auth_reflector_bytes(key=KEY, **fields)
    r = sp.unpack_reflector_auth(raw, KEY)
    assert (r.seq, r.timestamp_ntp, r.error_estimate, r.ssid, r.receive_timestamp_ntp,
            r.sender_seq, r.sender_timestamp_ntp, r.sender_error_estimate, r.sender_ttl) == (
        7, 0x1111111122222222, 1, 0x1234, 0x3333333344444444, 0xDEADBEEF, 0x5555555566666666, 2, 63)
    built = sp.pack_reflector_auth(sp.ReflectorPacket(
        seq=7, timestamp_ntp=fields["t3"], receive_timestamp_ntp=fields["t2"],
        sender_seq=fields["sseq"], sender_timestamp_ntp=fields["t1"], ssid=0x1234,
        error_estimate=1, sender_error_estimate=2, sender_ttl=63), KEY)
    assert built == raw


def test_hmac_known_answers():
    # RFC 4231 test case 2 (HMAC-SHA-256, key "Jefe"), truncated to 128 bits as RFC 8762 §4.4 says
    assert sp.HmacKey(b"Jefe").digest(b"what do ya want ", b"for nothing?").hex() == \
        "5bdcc146bf60754e6a042426089575c7"
    raw = auth_sender_bytes(1, 2, 3, KEY)
    assert raw[96:112] == hmac.new(KEY, raw[:96], hashlib.sha256).digest()[:16]
    assert sp.HmacKey(KEY).base_hmac(raw) == raw[96:112]
    # a fixed packet's HMAC, computed once with the stdlib: catches a silent change of coverage
    assert raw[96:112].hex() == mac(KEY, struct.pack("!I12xQHH68x", 1, 2, 1, 3)).hex()


@pytest.mark.parametrize("damage", ["short", "body_bit", "hmac_bit", "wrong_key"])
def test_codec_rejects_bad_packets(damage):
    raw = bytearray(auth_sender_bytes(5, 6, 7, KEY))
    key = KEY
    if damage == "short":
        raw = raw[:111]
    elif damage == "body_bit":
        raw[20] ^= 0x01
    elif damage == "hmac_bit":
        raw[111] ^= 0x80
    else:
        key = OTHER_KEY
    with pytest.raises(sp.StampAuthError):
        sp.unpack_sender_auth(bytes(raw), key)
    assert not sp.HmacKey(key).verify_base(bytes(raw))


def test_hmac_tlv_covers_sequence_number_and_preceding_tlvs():
    head = auth_sender_bytes(9, 10, 11, KEY)
    cos = tlv(0x80, 4, struct.pack("!HH", 46 << 10, 0))
    pad = tlv(0x80, 1, bytes(8))
    area = with_hmac_tlv(head[:4], cos, KEY, padding=pad)
    k = sp.HmacKey(KEY)
    assert sp.check_tlv_hmac(k, head[:4], area) is True
    assert sp.check_tlv_hmac(k, b"\x00\x00\x00\x0a", area) is False      # other sequence number
    bad = bytearray(area)
    bad[6] ^= 0x04                                                        # CoS value changed
    assert sp.check_tlv_hmac(k, head[:4], bytes(bad)) is False
    assert sp.check_tlv_hmac(k, head[:4], cos) is False                   # HMAC TLV missing
    assert sp.check_tlv_hmac(k, head[:4], area + cos) is False            # non-padding after it
    assert sp.check_tlv_hmac(k, head[:4], pad) is None                    # padding only: exempt
    assert sp.check_tlv_hmac(k, head[:4], bytes(20)) is None              # zero padding
    # the codec builds the same area: protected TLVs, HMAC TLV, then Extra Padding
    p = sp.SenderPacket(9, 10, 11, tlvs=(sp.Tlv(4, cos[4:], 0x80), sp.Tlv(1, bytes(8), 0x80)))
    assert sp.pack_sender_auth(p, KEY) == head + area
    assert sp.unpack_sender_auth(head + area, KEY).tlvs[1].type == sp.TLV_HMAC
    with pytest.raises(sp.StampAuthError):
        sp.unpack_sender_auth(head + bytes(bad), KEY)


def test_build_reply_authenticated_layout():
    t1 = ntp_now()
    req = auth_sender_bytes(42, t1, 0x0A0B, KEY) + bytes(40)
    reply = build_reply(req, reflector_seq=3, rx_count=4, tx_count=4, t2_ntp=t1 + 10,
                        t3_ntp=t1 + 20, ttl=64, tos_received=0, auth=sp.HmacKey(KEY))
    assert len(reply.data) == len(req)
    expect = auth_reflector_bytes(seq=3, t3=t1 + 20, err=1, ssid=0x0A0B, t2=t1 + 10, sseq=42,
                                  t1=t1, serr=1, ttl=64, key=KEY)
    assert reply.data == expect + bytes(40)
    for bad in (req[:111], req[:44], bytes([req[0] ^ 1]) + req[1:]):
        assert build_reply(bad, reflector_seq=0, rx_count=1, tx_count=1, t2_ntp=1, t3_ntp=2,
                           ttl=64, tos_received=0, auth=sp.HmacKey(KEY)) is None


# -- reflector on a real socket ------------------------------------------------------------------

@contextlib.contextmanager
def reflector_thread(**kw):
    """A Reflector in its own event loop thread on 127.0.0.1; yields (reflector, port)."""
    loop = asyncio.new_event_loop()
    th = threading.Thread(target=loop.run_forever, daemon=True)
    th.start()
    r = Reflector(**kw)
    asyncio.run_coroutine_threadsafe(r.start("127.0.0.1", 0), loop).result(5)
    try:
        yield r, r.address[1]
    finally:
        asyncio.run_coroutine_threadsafe(r.close(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        th.join(5)
        loop.close()


@contextlib.contextmanager
def client():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    try:
        yield s
    finally:
        s.close()


def recv_or_none(sock, timeout=0.3):
    sock.settimeout(timeout)
    try:
        return sock.recv(65536)
    except TimeoutError:
        return None


def stats(r, until=None, timeout=2.0):
    """The reflector's counters; with ``until(stats)``, wait (up to ``timeout``) until it holds,
    since the reflector thread counts a reply just after sending it."""
    end = time.monotonic() + timeout
    while True:
        s = r.stats().to_json()
        if until is None or until(s) or time.monotonic() > end:
            return s
        time.sleep(0.01)


def test_reflector_answers_valid_authenticated_probe():
    with reflector_thread(hmac_key=KEY) as (r, port), client() as c:
        t1 = ntp_now()
        c.sendto(auth_sender_bytes(77, t1, 0x5151, KEY), ("127.0.0.1", port))
        data = recv_or_none(c, 2)
        after = ntp_now()
        assert data is not None and len(data) == 112
        assert data[96:112] == mac(KEY, data[:96]), "reply HMAC does not verify"
        assert struct.unpack_from("!H", data, 26)[0] == 0x5151            # SSID copied
        assert struct.unpack_from("!I", data, 48)[0] == 77                # sender seq
        assert struct.unpack_from("!Q", data, 64)[0] == t1                # sender timestamp
        assert struct.unpack_from("!H", data, 72)[0] == 1                 # sender error est.
        assert data[80] == 64                                             # loopback TTL
        t2 = struct.unpack_from("!Q", data, 32)[0]
        t3 = struct.unpack_from("!Q", data, 16)[0]
        assert t1 - (1 << 32) <= t2 <= t3 <= after, (t1, t2, t3, after)   # T2 <= T3, now-ish
        assert (t3 - t2) < (1 << 32) // 10                                # under 100 ms inside
        for lo, hi in ((4, 16), (28, 32), (40, 48), (52, 64), (74, 80), (81, 96)):
            assert data[lo:hi] == bytes(hi - lo), f"MBZ {lo}-{hi - 1} not zero"
        # stateful: the second reply of the session has reflector seq 1; same size as request
        c.sendto(auth_sender_bytes(78, ntp_now(), 0x5151, KEY) + bytes(88), ("127.0.0.1", port))
        data2 = recv_or_none(c, 2)
        assert len(data2) == 200 and struct.unpack_from("!I", data2, 0)[0] == 1
        assert data2[96:112] == mac(KEY, data2[:96])
        s = stats(r, lambda s: s["reflected"] == 2)
        assert s["reflected"] == 2 and s["auth_failed"] == 0 and s["authenticated"] is True


def test_reflector_drops_and_counts_bad_packets_and_keeps_answering():
    good = auth_sender_bytes(1, ntp_now(), 9, KEY)
    body_bit = bytearray(good)
    body_bit[30] ^= 0x10
    hmac_bit = bytearray(good)
    hmac_bit[100] ^= 0x01
    unauth = sp.pack_sender(sp.SenderPacket(2, ntp_now(), 9))
    assert len(unauth) == 44
    bad = [auth_sender_bytes(1, ntp_now(), 9, OTHER_KEY), bytes(body_bit), bytes(hmac_bit),
           unauth, good[:100], good[:111], b""]
    with reflector_thread(hmac_key=KEY) as (r, port), client() as c:
        for b in bad:
            c.sendto(b, ("127.0.0.1", port))
            assert recv_or_none(c, 0.2) is None, f"answered a bad packet of {len(b)} octets"
        s = stats(r, lambda s: s["auth_failed"] == len(bad))
        assert s["auth_failed"] == len(bad) and s["reflected"] == 0 and s["sessions"] == []
        c.sendto(auth_sender_bytes(3, ntp_now(), 9, KEY), ("127.0.0.1", port))
        data = recv_or_none(c, 2)
        assert data is not None and struct.unpack_from("!I", data, 48)[0] == 3
        assert struct.unpack_from("!I", data, 0)[0] == 0    # bad packets never touched the session


def test_reflector_tlvs_in_authenticated_mode():
    """CoS, Direct Measurement and Follow-Up are answered behind a good HMAC TLV; the reply's
    HMAC TLV is the reflector's own; a bad HMAC TLV gets the TLVs copied with I set."""
    cos = tlv(0x80, 4, struct.pack("!HH", 34 << 10, 0))
    dm = tlv(0x80, 5, struct.pack("!III", 1, 0, 0))
    fu = tlv(0x80, 7, bytes(16))
    with reflector_thread(hmac_key=KEY) as (r, port), client() as c:
        replies = []
        for seq in range(2):
            head = auth_sender_bytes(seq, ntp_now(), 21, KEY)
            c.sendto(head + with_hmac_tlv(head[:4], cos + dm + fu, KEY, tlv(0x80, 1, bytes(12))),
                     ("127.0.0.1", port))
            replies.append(recv_or_none(c, 2))
        for data in replies:
            assert data[96:112] == mac(KEY, data[:96])
            area = data[112:]
            tlvs, rest = sp.parse_tlvs(area)
            assert rest == b"" and [t.type for t in tlvs] == [4, 5, 7, 8, 1]
            assert all(not t.flags & (sp.FLAG_U | sp.FLAG_I | sp.FLAG_M) for t in tlvs[:4])
            assert tlvs[3].value == mac(KEY, data[:4] + area[:8 + 16 + 20])
            assert sp.ClassOfService.unpack_value(tlvs[0].value).dscp1 == 34
            assert sp.DirectMeasurement.unpack_value(tlvs[1].value).reflector_rx_count >= 1
        fseq, fts = struct.unpack_from("!IQ", sp.parse_tlvs(replies[1][112:])[0][2].value)
        assert fseq == 0  # follow-up of the first reply (its timestamp needs TX stamps: may be 0)
        # a bad HMAC TLV: answered (the base HMAC is good) but TLVs copied with I, not processed
        head = auth_sender_bytes(5, ntp_now(), 21, KEY)
        area = bytearray(with_hmac_tlv(head[:4], cos + dm, KEY))
        area[-1] ^= 0x01
        c.sendto(head + bytes(area), ("127.0.0.1", port))
        data = recv_or_none(c, 2)
        tlvs, _ = sp.parse_tlvs(data[112:])
        assert all(t.flags & sp.FLAG_I for t in tlvs)
        assert tlvs[1].value == struct.pack("!III", 1, 0, 0), "TLV processed despite bad HMAC"
        assert stats(r, lambda s: s["tlv_auth_failed"] == 1)["tlv_auth_failed"] == 1


def test_rate_limit_applies_in_authenticated_mode():
    with reflector_thread(hmac_key=KEY, rate_pps=0.001, burst=2) as (r, port), client() as c:
        for seq in range(5):
            c.sendto(auth_sender_bytes(seq, ntp_now(), 3, KEY), ("127.0.0.1", port))
        got = [d for d in (recv_or_none(c, 0.5) for _ in range(5)) if d is not None]
        assert len(got) == 2
        s = stats(r, lambda s: s["rate_limited"] == 3)
        assert s["rate_limited"] == 3 and s["auth_failed"] == 0


def test_unauthenticated_reflector_unchanged():
    with reflector_thread() as (r, port), client() as c:
        c.sendto(sp.pack_sender(sp.SenderPacket(4, ntp_now(), 5)), ("127.0.0.1", port))
        data = recv_or_none(c, 2)
        assert len(data) == 44 and sp.unpack_reflector(data).sender_seq == 4
        assert stats(r)["authenticated"] is False


# -- sender against reflector ------------------------------------------------------------------

async def _with_reflector(coro_fn, **kw):
    r = Reflector(**kw)
    await r.start("127.0.0.1", 0)
    try:
        return await coro_fn(r.address[1]), r.stats().to_json()
    finally:
        await r.close()


def test_sender_with_key_against_reflector_with_key():
    async def go(port):
        return await probe_stamp("127.0.0.1", port=port, count=20, interval_s=0.005, dscp=26,
                                 hmac_key=KEY, timeout_s=1.0)
    res, s = asyncio.run(_with_reflector(go, hmac_key=KEY))
    j = res.to_json()
    assert j["loss"]["sent"] == 20 and j["loss"]["received"] == 20 and j["loss"]["ratio"] == 0.0
    assert j["rtt_ms"]["p50"] is not None and 0 < j["rtt_ms"]["p50"] < 100
    assert j["loss"]["forward_ratio"] == 0.0            # Direct Measurement TLV answered
    assert j["dscp"]["at_reflector"] == 26              # CoS TLV answered
    assert s["reflected"] == 20 and s["auth_failed"] == 0 and s["tlv_auth_failed"] == 0


def test_sender_with_wrong_key_gets_nothing():
    async def go(port):
        return await probe_stamp("127.0.0.1", port=port, count=10, interval_s=0.005,
                                 hmac_key=OTHER_KEY, timeout_s=0.3)
    res, s = asyncio.run(_with_reflector(go, hmac_key=KEY))
    assert res.loss.sent == 10 and res.loss.received == 0 and res.loss.ratio == 1.0
    assert s["auth_failed"] == 10 and s["reflected"] == 0


def forging_reflector(mode):
    """Answers authenticated probes itself: ``wrong_key`` signs replies with another key;
    ``bad_tlv_hmac`` signs the base correctly but breaks the HMAC TLV."""
    key = OTHER_KEY if mode == "wrong_key" else KEY

    def handle(data, state, t2):
        n, now = state["count"], ntp_now()
        reply = build_reply(data, reflector_seq=n, rx_count=n + 1, tx_count=n + 1,
                            t2_ntp=now, t3_ntp=now, ttl=64, tos_received=0,
                            auth=sp.HmacKey(key), base_verified=True)
        out = bytearray(reply.data)
        if mode == "bad_tlv_hmac":
            out[175] ^= 0x01       # last octet of the HMAC TLV value (sender layout)
        return bytes(out)

    return udp_server(handle)


def test_sender_rejects_replies_signed_with_another_key():
    with forging_reflector("wrong_key") as port:
        sender = StampSender()

        async def go():
            try:
                return await probe_stamp("127.0.0.1", port=port, count=10, interval_s=0.005,
                                         hmac_key=KEY, timeout_s=0.3, sender=sender)
            finally:
                sender.close()
        res = asyncio.run(go())
    assert res.loss.sent == 10 and res.loss.received == 0 and res.loss.ratio == 1.0


def test_sender_ignores_tlvs_whose_hmac_fails_but_keeps_the_rtt():
    with forging_reflector("bad_tlv_hmac") as port:
        res = asyncio.run(probe_stamp("127.0.0.1", port=port, count=10, interval_s=0.005,
                                      hmac_key=KEY, timeout_s=0.5, dscp=10))
    j = res.to_json()
    assert j["loss"]["received"] == 10 and j["rtt_ms"]["p50"] is not None
    assert j["dscp"]["at_reflector"] is None      # the CoS TLV answer was not used


def test_shared_socket_mixes_authenticated_and_unauthenticated_sessions():
    async def go():
        auth_r, plain_r = Reflector(hmac_key=KEY), Reflector()
        await auth_r.start("127.0.0.1", 0)
        await plain_r.start("127.0.0.1", 0)
        ap, pp = auth_r.address[1], plain_r.address[1]
        try:
            kw = dict(count=30, interval_s=0.003, timeout_s=0.5)
            return await asyncio.gather(
                probe_stamp("127.0.0.1", port=ap, hmac_key=KEY, **kw),
                probe_stamp("127.0.0.1", port=pp, **kw),
                probe_stamp("127.0.0.1", port=ap, **kw),                 # no key: dropped
                probe_stamp("127.0.0.1", port=pp, hmac_key=KEY, **kw),   # plain reflector
                probe_stamp("127.0.0.1", port=ap, hmac_key=OTHER_KEY, **kw),
                probe_stamp("127.0.0.1", port=ap, hmac_key=KEY, size=400, **kw),
            ), auth_r.stats().to_json()
        finally:
            await auth_r.close()
            await plain_r.close()
    results, s = asyncio.run(go())
    ratios = [r.loss.ratio for r in results]
    assert ratios == [0.0, 0.0, 1.0, 1.0, 1.0, 0.0], ratios
    assert all(r.loss.sent == 30 for r in results)
    assert s["auth_failed"] == 60 and s["reflected"] == 60


def test_probe_size_minimum_in_authenticated_mode():
    from wanprobe.errors import UsageError
    with pytest.raises(UsageError, match="authenticated"):
        asyncio.run(probe_stamp("127.0.0.1", port=9, count=1, hmac_key=KEY, size=100))


# -- fuzz --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def fuzz_target():
    with reflector_thread(hmac_key=KEY, rate_pps=1e9, burst=10**9) as (r, port), client() as c:
        yield r, port, c


_LIVENESS_SEQ = itertools.count(0xF00D)   # a fresh number each time: a repeat is a replay


def _valid_probe_answered(c, port, seq):
    c.sendto(auth_sender_bytes(seq, ntp_now(), 77, KEY), ("127.0.0.1", port))
    data = recv_or_none(c, 2)
    assert data is not None, "reflector stopped answering"
    assert struct.unpack_from("!I", data, 48)[0] == seq, "a garbage datagram was answered"


garbage = st.one_of(
    st.binary(min_size=0, max_size=400),
    # a valid packet with one to three bits flipped in the HMAC-covered part or the HMAC
    st.tuples(st.integers(0, 2**32 - 1), st.lists(st.integers(0, 111 * 8 + 7), min_size=1,
                                                  max_size=3, unique=True),
              st.binary(max_size=100)).map(
        lambda t: _flip(auth_sender_bytes(t[0], ntp_now(), 77, KEY) + t[2], t[1])),
    # right length, random HMAC
    st.binary(min_size=112, max_size=112),
)


def _flip(raw: bytes, bits: list[int]) -> bytes:
    b = bytearray(raw)
    for bit in bits:
        b[bit // 8] ^= 0x80 >> (bit % 8)
    return bytes(b)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@pytest.mark.slow
@given(batch=st.lists(garbage, min_size=1, max_size=5))
def test_fuzz_garbage_at_authenticated_reflector(fuzz_target, batch):
    r, port, c = fuzz_target
    before = r.stats()
    for g in batch:
        c.sendto(g, ("127.0.0.1", port))
    _valid_probe_answered(c, port, next(_LIVENESS_SEQ))
    after = stats(r, lambda s: s["reflected"] - before.reflected == 1)
    assert after["auth_failed"] - before.auth_failed == len(batch)
    assert after["reflected"] - before.reflected == 1
    assert after["malformed"] == 0
