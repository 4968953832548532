"""The STAMP side of issue 14: one source cannot fill the session table, the table is never
walked per packet, a CoS TLV cannot get network-control DSCP, sources outside ``allow`` are
dropped unparsed, and control connections that never finish a line are closed. Real reflector
and server on loopback."""

from __future__ import annotations

import asyncio
import socket
import struct
import time

import pytest
from reflector_helpers import Served, ServedThroughput

from wanprobe.probe import stamp_packet as sp
from wanprobe.probe.access import DEFAULT_COS_DSCP, AllowList, DscpPolicy
from wanprobe.probe.reflector import Reflector
from wanprobe.probe.sender import probe_stamp
from wanprobe.probe.session_table import SessionTable
from wanprobe.throughput import protocol as proto
from wanprobe.throughput.limits import ServerLimits

FLOOD = struct.Struct("!IQHH28x")  # the reproducer packet: seq, t, err, SSID


def ServedReflector(**kwargs) -> Served:  # noqa: N802 (reads like the class it makes)
    return Served(Reflector, **kwargs)


def test_session_table_evicts_per_source_and_globally_in_lru_order():
    t = SessionTable(max_sessions=6, per_source=3, idle_s=100.0)
    for ssid in range(10):  # one source: only its own oldest sessions are recycled
        t.touch((ssid, "a", 1, None), now_s=ssid)
    assert len(t) == 3 and {k[0] for k, _ in t.items()} == {7, 8, 9}
    t.touch((7, "a", 1, None), now_s=10)  # used again: now the newest of a's
    for src in "bc":
        for ssid in range(3):
            t.touch((ssid, src, 1, None), now_s=11)
    assert len(t) == 6 and t.sources() == 2  # full: the global LRU (a's 8, 9, then 7) went
    assert {k[0] for k, _ in t.items() if k[1] == "a"} == set()
    t.expire(now_s=200.0, limit=100)
    assert len(t) == 0 and t.sources() == 0


def _flood(port: int, n: int, src: str = "127.0.0.1") -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((src, 0))
    s.connect(("127.0.0.1", port))
    for i in range(n):
        s.send(FLOOD.pack(i, 0, 1, i & 0xFFFF))
        if i % 200 == 199:
            time.sleep(0.004)  # let the reflector keep up: the point is distinct SSIDs, not loss
    s.close()


def _settled(r: Reflector):
    """Stats once the reflector has read everything queued (received stops changing)."""
    last = -1
    while (stats := r.stats()).received != last:
        last = stats.received
        time.sleep(0.2)
    return stats


@pytest.mark.slow
def test_a_session_flood_from_one_source_does_not_lock_out_a_new_probe():
    """The issue's reproducer (distinct SSIDs from one source, under the rate limit), scaled
    down: the flooder only recycles its own share, and a new probe, from the same source or
    another, is answered in full."""
    with ServedReflector(rate_pps=1e6, burst=10**5, sessions_per_source=512,
                         max_sessions=2048) as r:
        port = r.address[1]
        _flood(port, 20000)
        stats = _settled(r)
        print(f"flood: received {stats.received}, reflected {stats.reflected}, "
              f"evicted {stats.evicted}, table {len(stats.sessions)}")
        # every flood packet opened a session; all beyond the source's share evicted its own
        assert stats.received > 5000 and len(stats.sessions) == 512
        assert stats.evicted == stats.received - 512
        res = asyncio.run(probe_stamp("127.0.0.1", port=port, count=20, interval_s=0.01,
                                      timeout_s=1.0))
        assert res.loss.received == 20
        for src in ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"):
            _flood(port, 2000, src)
        assert len(r.stats().sessions) <= 2048


def _cos_reply(port: int, dscp: int | None, sent: int = 0) -> tuple[int | None, int]:
    """(RP flag, DSCP the reply carried) for a probe sent with DSCP ``sent`` and a CoS TLV
    asking for ``dscp`` (RFC 8972 §4.4; None: no TLV, RP None). The reply's TOS is read with
    IP_RECVTOS, as it arrived."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
    s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, sent << 2)
    s.settimeout(2)
    try:
        tlvs = (sp.cos_tlv(dscp),) if dscp is not None else ()
        pkt = sp.pack_sender(sp.SenderPacket(1, 0, ssid=9, tlvs=tlvs))
        s.sendto(pkt, ("127.0.0.1", port))
        data, anc, _, _ = s.recvmsg(2048, 64)
    finally:
        s.close()
    tos = next(c[2][0] for c in anc if c[1] == socket.IP_TOS)
    if dscp is None:
        return None, tos >> 2
    cos = sp.find_tlv(sp.unpack_reflector(data).tlvs, sp.TLV_CLASS_OF_SERVICE)
    return struct.unpack("!H", cos.value[:2])[0] & 1, tos >> 2


@pytest.mark.parametrize(("permitted", "asked", "granted"), [
    (None, 46, True), (None, 48, False), (None, 56, False),
    (frozenset({26}), 26, True), (frozenset({26}), 46, False)])
def test_cos_tlv_dscp_is_restricted_to_the_configured_set(permitted, asked, granted):
    policy = DscpPolicy(permitted) if permitted is not None else None
    with ServedReflector(dscp_permitted=policy) as r:
        rp, tos_dscp = _cos_reply(r.address[1], asked)
    assert (rp == 0) == granted and (tos_dscp == asked) == granted
    assert 48 not in DEFAULT_COS_DSCP and 56 not in DEFAULT_COS_DSCP


def test_a_reply_never_carries_network_control_under_the_default_policy():
    """Issue 37: a CS7 probe got a CS7 reply. IP precedence 6 and 7 (DSCP 48-63, RFC 791 and
    RFC 2474 §4.2.2.2) are network control; the reflector's local policy decides what its
    replies carry (RFC 8972 §4.4), echoed or asked for: such a probe is answered in CS0."""
    control = range(48, 64)
    with ServedReflector() as r:  # no dscp_permitted: the reflector's own default
        port = r.address[1]
        for sent in range(64):
            assert _cos_reply(port, None, sent) == (None, 0 if sent in control else sent), sent
        assert _cos_reply(port, 56, sent=56) == (1, 0)        # refused, and not echoed either
        assert _cos_reply(port, 34, sent=56) == (0, 34)       # a permitted class is granted
    with ServedReflector(dscp_permitted=DscpPolicy(frozenset(range(64)))) as r:
        assert _cos_reply(r.address[1], None, 56) == (None, 56)  # the operator allowed it


def test_sources_outside_allow_are_dropped_before_parsing():
    with ServedReflector(allow=("127.0.0.2/32",)) as r:
        port = r.address[1]
        res = asyncio.run(probe_stamp("127.0.0.1", port=port, count=3, interval_s=0.05,
                                      timeout_s=0.3))
        assert res.loss.received == 0
        assert r.stats().not_allowed >= 3 and r.stats().received == 0
        assert r.refusals()["not_allowed"] >= 3
    assert AllowList(["10.0.0.0/8"]).permits("::ffff:10.1.2.3")
    assert not AllowList(["10.0.0.0/8"]).permits("11.0.0.1")


def test_connections_that_never_finish_a_line_are_closed():
    """Slow-loris: a byte every 0.2 s never completes the hello; the handshake deadline closes
    it regardless, and a 10 MB line without a newline is refused after 16 KiB."""
    with ServedThroughput(limits=ServerLimits(handshake_timeout_s=1.0)) as server:
        slow = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        slow.sendall(proto.MAGIC_CONTROL)
        t0, closed = time.monotonic(), False
        for ch in b'{"op":"hello","version":2,"nonce":"' + b"0" * 60:
            try:
                slow.sendall(bytes([ch]))
            except OSError:
                closed = True
                break
            slow.settimeout(0.2)
            try:
                if slow.recv(1) == b"":
                    closed = True
                    break
            except TimeoutError:
                pass
        slow.close()
        assert closed and time.monotonic() - t0 < 5.0
        big = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        try:
            big.sendall(proto.MAGIC_CONTROL + b"a" * (10 * 2**20))
        except OSError:
            pass  # reset once the server refused and closed: fine
        reply = big.makefile("rb").readline()
        big.close()
        assert b"longer than 16384 bytes" in reply or reply == b""
        assert server.refusals().get("timeout") == 1
        assert server.refusals().get("line_too_long") == 1


def test_mtu_search_speaks_authenticated_stamp_to_a_keyed_reflector():
    """`mtu --hmac-key-file`: the DF search against a reflector that drops unsigned probes
    finds the largest size the reflector answers (its 9216-octet datagram cap + IPv4/UDP)."""
    from reflector_helpers import KEY

    from wanprobe.errors import ProbeError
    from wanprobe.probe.mtu import probe_path_mtu
    from wanprobe.probe.reflector import MAX_DATAGRAM

    with ServedReflector(hmac_key=KEY) as r:
        port = r.address[1]
        res = asyncio.run(probe_path_mtu("127.0.0.1", port=port, hmac_key=KEY, timeout_s=0.3,
                                         tries=1, max_size=9400))
        assert res.path_mtu == MAX_DATAGRAM + 28
        with pytest.raises(ProbeError, match="no STAMP reply"):
            asyncio.run(probe_path_mtu("127.0.0.1", port=port, timeout_s=0.2, tries=1))
        assert r.stats().auth_failed >= 1
