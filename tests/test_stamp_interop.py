"""Interop on loopback: our sender against independent reflectors written here from the RFC
layouts (scapy.contrib.stamp, and a bare TWAMP-Light one with struct), and our reflector
answering packets built byte by byte with scapy."""

import asyncio
import contextlib
import socket
import struct
import threading
import time

import pytest
import third_party_reflector
from conftest import udp_server

from collectors.clock_state import ClockState
from wanprobe.probe import stamp_packet as sp
from wanprobe.probe.local_clock import ClockWatcher
from wanprobe.probe.reflector import Reflector
from wanprobe.probe.sender import StampSender, probe_stamp

scapy_stamp = pytest.importorskip("scapy.contrib.stamp")
NTP_OFFSET = 2208988800


def scapy_reflector(stateful):
    """RFC 8762 §4.3 reflector built from scapy's layer: copies TLVs untouched (so U stays set)."""
    def handle(data, state, t2):
        s = scapy_stamp.STAMPSessionSenderTestUnauthenticated(data)
        reply = scapy_stamp.STAMPSessionReflectorTestUnauthenticated(
            seq=state["count"] if stateful else s.seq, ts=time.time() + NTP_OFFSET, ssid=s.ssid,
            ts_rx=t2 + NTP_OFFSET, seq_sender=s.seq, ts_sender=s.ts,
            err_estimate_sender=s.err_estimate, ttl_sender=64, tlv_objects=s.tlv_objects)
        return bytes(reply)[:len(data)]
    return handle


def twamp_light_reflector(data, state, t2):
    """RFC 5357 §4.2.1 reflector: 41-octet header, then the request's padding; no SSID, no TLVs."""
    seq, t1, err = struct.unpack_from("!IQH", data)
    t2n = sp.ntp_from_ns(int(t2 * 1e9))
    head = struct.pack("!IQHHQIQH2xB", state["count"], sp.ntp_from_ns(time.time_ns()), 1, 0, t2n,
                       seq, t1, err, 64)
    return head + data[41:]


def test_sender_against_scapy_stateful_reflector():
    with udp_server(scapy_reflector(stateful=True)) as port:
        r = asyncio.run(probe_stamp("127.0.0.1", port=port, count=30, interval_s=0.02, dscp=10))
    assert r.loss.sent == 30 and r.loss.received == 30
    assert r.loss.forward_ratio == 0.0 and r.loss.reverse_ratio == 0.0
    assert 0 < r.rtt.min <= r.rtt.p50 < 1000   # a slow Python reflector; accuracy is tested in the lab
    assert r.dscp.at_reflector is None          # TLV echoed with U=1: reflector did not process it
    assert r.dscp.returned == 0


def test_sender_splits_forward_loss_with_stateful_scapy_reflector():
    def lossy(data, state, t2):
        state["n"] = state.get("n", 0) + 1
        if state["n"] % 3 == 0:          # "lost on the way there": not counted, not answered
            state["count"] -= 1
            return None
        return scapy_reflector(True)(data, state, t2)
    with udp_server(lossy) as port:
        r = asyncio.run(probe_stamp("127.0.0.1", port=port, count=30, interval_s=0.02,
                                    timeout_s=1.0))
    # probe 29 is the last and is lost: it cannot be attributed, the 9 before it are forward
    assert r.loss.received == 20 and r.loss.forward_lost == 9 and r.loss.reverse_lost == 0
    assert r.loss.forward_ratio == pytest.approx(9 / 29)


def test_sender_against_twamp_light_reflector_without_ssid():
    with udp_server(twamp_light_reflector) as port:
        r = asyncio.run(probe_stamp("127.0.0.1", port=port, count=20, interval_s=0.005))
    assert r.loss.received == 20 and r.rtt is not None and r.rtt.p50 > 0


@contextlib.contextmanager
def our_reflector(**kw):
    loop = asyncio.new_event_loop()
    refl = Reflector(**kw)
    loop.run_until_complete(refl.start("127.0.0.1", 0))
    th = threading.Thread(target=loop.run_forever, daemon=True)
    th.start()
    try:
        yield refl
    finally:
        loop.call_soon_threadsafe(loop.stop)
        th.join()
        loop.run_until_complete(refl.close())
        loop.close()


def test_our_reflector_answers_scapy_built_packets():
    s = scapy_stamp
    with our_reflector() as refl:
        port = refl.address[1]
        cli = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        cli.settimeout(2)
        cli.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, 26 << 2)
        try:
            for i in range(3):
                req = s.STAMPSessionSenderTestUnauthenticated(
                    seq=100 + i, ssid=4242, ts=time.time() + NTP_OFFSET,
                    tlv_objects=[s.STAMPTestTLV(flags="U", type=4, len=4,
                                                value=struct.pack("!HH", 46 << 10, 0)),
                                 s.STAMPTestTLV(flags="U", type=250, len=3, value=b"xyz")])
                raw = bytes(req)
                cli.sendto(raw, ("127.0.0.1", port))
                data, _ = cli.recvfrom(65536)
                rep = s.STAMPSessionReflectorTestUnauthenticated(data)
                assert len(data) == len(raw)
                assert rep.seq == i and rep.seq_sender == 100 + i and rep.ssid == 4242
                assert rep.ttl_sender == 64
                cos, unknown = rep.tlv_objects
                assert int(cos.flags) & 0x80 == 0 and int(unknown.flags) & 0x80
                word = struct.unpack("!H", bytes(cos.value)[:2])[0]
                assert word >> 10 == 46 and (word >> 4) & 0x3F == 26
                assert rep.ts_rx >= req.ts        # T2 after T1 (same clock on loopback)
        finally:
            cli.close()
    st = refl.stats()  # read after the reflector's loop stopped: its counters are final
    assert st.reflected == 3 and st.sessions[0].rx == 3 and st.sessions[0].ssid == 4242


def test_rate_limit_and_tap():
    seen = []

    def tap(data, addr, rx_ns):
        seen.append(rx_ns)
        return data.startswith(b"TPUT")

    with our_reflector(rate_pps=1, burst=5, udp_tap=tap) as refl:
        cli = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        cli.settimeout(0.3)
        try:
            cli.sendto(b"TPUT" + bytes(60), refl.address)
            for i in range(20):
                cli.sendto(sp.pack_sender(sp.SenderPacket(i, 0, 1)), refl.address)
            got = 0
            with contextlib.suppress(TimeoutError):
                while True:
                    cli.recvfrom(2048)
                    got += 1
        finally:
            cli.close()
        st = refl.stats()
    assert got == 5 and st.rate_limited == 15 and st.tapped == 1 and len(seen) == 21


def test_concurrent_sessions_share_one_socket_and_loop():
    with our_reflector() as refl:
        port = refl.address[1]

        async def many():
            return await asyncio.gather(*[
                probe_stamp("127.0.0.1", port=port, count=10, interval_s=0.01, dscp=d % 64)
                for d in range(20)])

        results = asyncio.run(many())
    sessions = refl.stats().sessions
    assert all(r.loss.received == 10 for r in results)
    assert [r.dscp.at_reflector for r in results] == list(range(20))
    assert len(sessions) == 20 and len({s.peer_port for s in sessions}) == 1
    assert len({s.ssid for s in sessions}) == 20 and all(s.rx == 10 for s in sessions)


def test_dual_stack_reflector_keeps_dscp_for_ipv4_and_ipv6():
    try:
        socket.socket(socket.AF_INET6, socket.SOCK_DGRAM).bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")

    async def run():
        refl = Reflector()
        await refl.start("::", 0)
        try:
            port = refl.address[1]
            return [await probe_stamp(peer, port=port, count=5, interval_s=0.01, dscp=46)
                    for peer in ("::1", "127.0.0.1")]
        finally:
            await refl.close()

    for r in asyncio.run(run()):
        assert r.loss.received == 5
        assert (r.dscp.at_reflector, r.dscp.returned, r.dscp.bleached) == (46, 46, "none")


# -- clock information (issue 20): the Error Estimate (RFC 4656 §4.1.2) and TLV 3 (RFC 8972 §4.3)
SYNCED = ClockState("chrony", True, 0.5, "ntp", "chrony: normal",
                    boot_id="0c0ffee0-1111-4222-8333-444455556666")


def test_scapy_parses_our_probe_and_ours_parses_its_clock_answers():
    async def run(port):
        sender = StampSender(clock=ClockWatcher(lambda: SYNCED))
        try:
            return await probe_stamp("127.0.0.1", port=port, count=20, interval_s=0.005,
                                     sender=sender)
        finally:
            sender.close()

    requests = []

    def keep(data, state, t2):   # what scapy parsed of our probe, then its reply
        requests.append(scapy_stamp.STAMPSessionSenderTestUnauthenticated(data))
        return third_party_reflector.reply(data, state["count"], t2)

    with udp_server(keep) as port:
        r = asyncio.run(run(port))
    req = requests[0]
    # scapy reads our Error Estimate (chrony 0.5 ms, synchronised) and our TLVs
    assert (req.err_estimate.S, req.err_estimate.Z) == (1, 0)
    assert req.err_estimate.multiplier * 2.0 ** (req.err_estimate.scale - 32) >= 0.5e-3
    types = [t.type for t in req.tlv_objects]
    assert types[:5] == [4, 5, 7, 3, 244]
    ts_tlv = req.tlv_objects[3]
    assert int(ts_tlv.flags) & 0x80 and ts_tlv.len == 4 and bytes(ts_tlv.value) == bytes(4)
    owd = r.to_json()["owd_ms"]
    # ours reads scapy's answer: TLV 3, its Error Estimate; it did not answer Same-clock
    far = owd["far_clock"]
    assert far["sync_source"] == "ntp" and far["timestamp_method"] == "sw-local"
    assert far["synchronized"] and far["error_bound_ms"] == pytest.approx(132 * 2 ** -17 * 1e3)
    assert owd["same_clock"] is None and "third-party" in owd["note"]
    assert owd["clock_source"] == "chrony/ntp"
    assert owd["clock_error_bound_ms"] == pytest.approx(0.5 + 132 * 2 ** -17 * 1e3)
    # loopback delays are far below a 1.5 ms bound: absolute values withheld, variation kept
    assert owd["forward"]["p50"] is None and "not smaller" in owd["withheld"]
    assert owd["variation"]["forward"]["p99"] is not None


def test_our_reflector_answers_scapy_clock_requests():
    s = scapy_stamp
    with our_reflector(clock=ClockWatcher(lambda: SYNCED)) as refl:
        cli = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        cli.settimeout(2)
        try:
            req = s.STAMPSessionSenderTestUnauthenticated(
                seq=1, ssid=77, ts=time.time() + NTP_OFFSET,
                err_estimate=s.ErrorEstimate(S=0, Z=0, scale=63, multiplier=255),
                tlv_objects=[s.STAMPTestTLV(flags="U", type=3, len=4, value=bytes(4))])
            cli.sendto(bytes(req), refl.address)
            rep = s.STAMPSessionReflectorTestUnauthenticated(cli.recvfrom(2048)[0])
        finally:
            cli.close()
    assert (rep.err_estimate_sender.S, rep.err_estimate_sender.scale,
            rep.err_estimate_sender.multiplier) == (0, 63, 255)     # the sender's, copied
    e = rep.err_estimate
    assert e.S == 1 and e.Z == 0 and 0.5e-3 <= e.multiplier * 2.0 ** (e.scale - 32) < 0.51e-3
    (tlv,) = rep.tlv_objects
    assert tlv.type == 3 and int(tlv.flags) & 0x80 == 0 and bytes(tlv.value) == bytes((1, 2, 1, 2))


# -- the Reflector Report TLV (issue 20): RFC 8972 §4 rules with an independent implementation --


def test_scapy_parses_our_probes_with_the_reflector_report_tlv():
    seen = []

    def recording(data, state, t2):
        seen.append(data)
        return scapy_reflector(stateful=True)(data, state, t2)

    with udp_server(recording) as port:
        r = asyncio.run(probe_stamp("127.0.0.1", port=port, count=3, interval_s=0.02))
    assert r.loss.received == 3
    for raw in seen:
        pkt = scapy_stamp.STAMPSessionSenderTestUnauthenticated(raw)
        assert len(bytes(pkt)) == len(raw)
        tlvs = [(int(t.flags), t.type, t.len) for t in pkt.tlv_objects]
        assert tlvs[:3] == [(0x80, 4, 4), (0x80, 5, 12), (0x80, 7, 16)]
        assert (0x80, 252, 20) in tlvs[3:]
    # the scapy reflector copied our TLV untouched, U still set: it cannot report its drops
    assert r.reflector is not None and r.reflector.counts == "not_supported"
    assert r.reflector.limit_pps is None and r.loss.reflector_rate_limited is None


def test_third_party_loss_above_a_typical_limit_gets_a_note():
    from wanprobe.probe.rate_guard import TYPICAL_LIMIT_PPS, note

    def lossy(data, state, t2):
        state["n"] = state.get("n", 0) + 1
        return None if state["n"] % 4 == 0 else scapy_reflector(True)(data, state, t2)

    with udp_server(lossy) as port:
        r = asyncio.run(probe_stamp("127.0.0.1", port=port, count=40, interval_s=0.003,
                                    timeout_s=1.0))
    doc = r.to_json()
    assert doc["loss"]["ratio"] > 0 and 1 / 0.003 > TYPICAL_LIMIT_PPS
    line = note(doc["loss"], doc["reflector"], 1 / 0.003)
    assert line is not None and "cannot report its own drops" in line
    assert note(doc["loss"], doc["reflector"], 100) is None   # below it: plain loss


def test_our_reflector_fills_the_report_tlv_in_a_scapy_built_packet():
    from wanprobe.probe.reflector_report import sender_tlv

    s = scapy_stamp
    ours = sender_tlv()
    with our_reflector(rate_pps=1234) as refl:
        cli = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        cli.settimeout(2)
        try:
            req = s.STAMPSessionSenderTestUnauthenticated(
                seq=0, ssid=77, ts=time.time() + NTP_OFFSET,
                tlv_objects=[s.STAMPTestTLV(flags="U", type=252, len=20, value=ours[4:]),
                             s.STAMPTestTLV(flags="U", type=252, len=20,
                                            value=b"xx" + ours[6:])])   # another's private use
            cli.sendto(bytes(req), refl.address)
            rep = s.STAMPSessionReflectorTestUnauthenticated(cli.recvfrom(65536)[0])
        finally:
            cli.close()
    mine, other = rep.tlv_objects
    assert int(mine.flags) & 0x80 == 0 and int(other.flags) & 0x80   # U cleared / kept
    magic, version, epoch, limit, limited, refused = struct.unpack("!HBxIIII", bytes(mine.value))
    assert (magic, version, limit, limited, refused) == (0x7770, 1, 1234, 0, 0) and epoch
    assert bytes(other.value) == b"xx" + ours[6:]
