"""One-way delay and its clock bound (issue 20), without a network: the RFC 4656 §4.1.2 Error
Estimate both ways, the reflector's answers to the clock TLVs, when absolute one-way delays are
withheld, which direction the path watch says a queue builds in, and the daemon's gauges."""

from __future__ import annotations

import random
import struct
from dataclasses import replace

import pytest

from collectors.clock_state import ClockState
from wanprobe.probe import error_estimate as ee
from wanprobe.probe.clock_tlvs import (
    TLV_SAME_CLOCK,
    FarClock,
    SessionClock,
    request_tlvs,
    unpack_timestamp_info,
)
from wanprobe.probe.local_clock import ClockAnswer, ClockWatcher
from wanprobe.probe.owd import OwdClock, judge, merge, owd_report, text_rows
from wanprobe.probe.reflect_logic import build_reply
from wanprobe.probe.stamp_packet import (
    BASE_LEN,
    FLAG_U,
    TLV_TIMESTAMP_INFO,
    SenderPacket,
    pack_sender,
    parse_tlvs,
    unpack_reflector,
)

BOOT = "0c0ffee0-1111-4222-8333-444455556666"
SYNCED = ClockState("chrony", True, 1.62, "ntp", "chrony: normal", boot_id=BOOT)
UNSYNCED = ClockState("kernel", False, None, "free-running", "kernel: not synchronised",
                      boot_id=BOOT)
S_1MS = 0x8F84   # S=1, Z=0, Scale 15, Multiplier 132: 132 × 2^-32 × 2^15 s = 1.00708 ms


# -- RFC 4656 §4.1.2 -----------------------------------------------------------------------
@pytest.mark.parametrize("word,s,z,scale,mult,error_s", [
    (0x0001, False, False, 0, 1, 2.0 ** -32),
    (S_1MS, True, False, 15, 132, 132 * 2.0 ** -17),
    (0x3FFF, False, False, 63, 255, 255 * 2.0 ** 31),
    (0xC105, True, True, 1, 5, 5 * 2.0 ** -31),
    (0xC100, True, True, 1, 0, None),            # Multiplier 0 is invalid: no error known
])
def test_error_estimate_decodes_the_rfc_4656_fields(word, s, z, scale, mult, error_s):
    e = ee.decode(word)
    assert (e.synchronized, e.ptp_format, e.scale, e.multiplier) == (s, z, scale, mult)
    assert e.error_s == error_s


def test_error_estimate_encodes_the_smallest_value_not_below_the_error():
    assert ee.encode(1e-3, synchronized=True) == S_1MS      # 4294967.3 units → 132 × 2^15
    assert ee.encode(2.0 ** -32, synchronized=False) == 0x0001
    assert ee.encode(0.0, synchronized=True) == 0x8001      # never claims zero error
    assert ee.encode(None, synchronized=False) == ee.UNKNOWN_ERROR_WORD == 0x3FFF
    assert ee.encode(float("nan"), synchronized=True) == 0xBFFF
    assert ee.encode(1e15, synchronized=True) == 0x3FFF     # beyond the field: S cleared
    assert ee.encode(1e-3, synchronized=True, ptp_format=True) == S_1MS | ee.Z_BIT
    rng = random.Random(4656)
    for _ in range(2000):
        err = 10 ** rng.uniform(-9, 3)
        got = ee.decode(ee.encode(err, synchronized=True)).error_s
        assert err <= got <= err * (1 + 1 / 128) + 2.0 ** -32   # Multiplier ≥ 128 once Scale > 0


def test_error_estimate_bits_match_scapy():
    scapy_stamp = pytest.importorskip("scapy.contrib.stamp")
    for word in (S_1MS, 0x0001, 0x3FFF, 0xC105):
        e = ee.decode(word)
        built = scapy_stamp.ErrorEstimate(S=int(e.synchronized), Z=int(e.ptp_format),
                                          scale=e.scale, multiplier=e.multiplier)
        assert bytes(built) == struct.pack("!H", word)
        parsed = scapy_stamp.ErrorEstimate(struct.pack("!H", word))
        assert (parsed.S, parsed.Z, parsed.scale, parsed.multiplier) == \
            (e.synchronized, e.ptp_format, e.scale, e.multiplier)


# -- the reflector's answers and what a session reads from them ---------------------------------
def probe_bytes(boot_id=BOOT) -> bytes:
    return pack_sender(SenderPacket(7, 0, 4242, S_1MS)) + request_tlvs(boot_id)


def reflect(request: bytes, clock) -> bytes:
    reply = build_reply(request, reflector_seq=0, rx_count=1, tx_count=1, t2_ntp=1, t3_ntp=2,
                        ttl=64, tos_received=0, clock=clock,
                        error_estimate=clock.error_estimate if clock else 0x0001)
    return reply.data


def test_reflector_fills_timestamp_information_error_estimate_and_same_clock():
    data = reflect(probe_bytes(), ClockAnswer(SYNCED))
    rep = unpack_reflector(data)
    assert rep.error_estimate == ee.encode(1.62e-3, synchronized=True)
    assert rep.sender_error_estimate == S_1MS                   # the sender's, copied
    ts, same = rep.tlvs
    assert ts.type == TLV_TIMESTAMP_INFO and not ts.flags & FLAG_U
    assert unpack_timestamp_info(ts.value) == (1, 2, 1, 2)      # NTP, SW local, in and out
    assert same.type == TLV_SAME_CLOCK and not same.flags & FLAG_U and same.value[12] == 1
    sess = SessionClock(SYNCED)
    sess.note_far(rep.error_estimate)
    sess.read_tlvs(data[BASE_LEN:])
    far = sess.far()
    assert far.same_clock is True and far.sync_source == "ntp"
    assert far.timestamp_method == "sw-local" and far.synchronized
    assert far.error_bound_ms == pytest.approx(ee.decode(rep.error_estimate).error_s * 1e3)


def test_another_boot_id_is_another_clock_and_unsynchronised_says_free_running():
    other = replace(UNSYNCED, boot_id="ffffffff-0000-4000-8000-000000000000")
    data = reflect(probe_bytes(), ClockAnswer(other))
    rep = unpack_reflector(data)
    assert ee.decode(rep.error_estimate).synchronized is False
    assert unpack_timestamp_info(rep.tlvs[0].value) == (5, 2, 5, 2)   # local free-running
    sess = SessionClock(SYNCED)
    sess.read_tlvs(data[BASE_LEN:])
    assert sess.far().same_clock is False


def test_a_reflector_that_does_not_know_the_tlvs_leaves_them_flagged():
    data = reflect(probe_bytes(), None)          # our reflect logic without a clock: echo, U
    assert all(t.flags & FLAG_U for t in parse_tlvs(data[BASE_LEN:])[0])
    sess = SessionClock(SYNCED)
    sess.read_tlvs(data[BASE_LEN:])
    far = sess.far()
    assert far.same_clock is None and far.sync_source is None and not sess.pending


def test_wrong_length_timestamp_information_is_malformed():
    bad = pack_sender(SenderPacket(1, 0, 1)) + struct.pack("!BBH", FLAG_U, 3, 3) + b"\0\0\0"
    reply = build_reply(bad, reflector_seq=0, rx_count=1, tx_count=1, t2_ntp=1, t3_ntp=2,
                        ttl=64, tos_received=0, clock=ClockAnswer(SYNCED))
    (t,), _ = parse_tlvs(reply.data[BASE_LEN:])
    assert t.flags & 0x40 and t.value == b"\0\0\0"               # M set, value untouched


def test_clock_watcher_reads_once_then_refreshes_in_the_background():
    calls = []

    def read():
        calls.append(1)
        return SYNCED

    w = ClockWatcher(read, refresh_s=3600)
    assert w.current() is SYNCED and w.current() is SYNCED and len(calls) == 1
    assert w.answer() is w.answer()              # rebuilt only when the state changes


# -- when absolute one-way delays are reported ----------------------------------------------
def far(words=(S_1MS,), same=None, sync="ntp") -> FarClock:
    return FarClock(tuple(words), sync, "sw-local", same)


@pytest.mark.parametrize("local,farc,fmin,rmin,bound,withheld,note", [
    (UNSYNCED, far(same=True), 10, 50, 0.0, None, False),        # one kernel clock
    (SYNCED, far(), 10, 50, 1.62 + 132 * 2 ** -17 * 1e3, None, True),
    (UNSYNCED, far(), 10, 50, None, "this host's clock is not synchronised", True),
    (SYNCED, far(words=(0x0001,), same=False), 10, 50, None, "reflector's clock", False),
    (SYNCED, far(words=(0x8F00,)), 10, 50, None, "reflector's clock", True),   # Multiplier 0
    (SYNCED, far(same=False), 1.5, 50, 1.62 + 132 * 2 ** -17 * 1e3, "not smaller", False),
    (SYNCED, far(same=False), -9.0, 69, 1.62 + 132 * 2 ** -17 * 1e3, "is wrong", False),
])
def test_judge(local, farc, fmin, rmin, bound, withheld, note):
    got_bound, source, reason, got_note = judge(OwdClock(local, farc), fmin, rmin)
    assert got_bound == (None if bound is None else pytest.approx(bound))
    assert (reason is None) if withheld is None else (withheld in reason)
    assert (got_note is not None) == note
    assert source == ("same-clock" if farc.same_clock else f"{local.source}/ntp")


def test_withheld_report_keeps_the_variation():
    rng = random.Random(1)
    fwd = [10 + rng.expovariate(1) for _ in range(200)]
    rev = [50 + rng.expovariate(4) for _ in range(200)]
    shifted = owd_report([x + 700 for x in fwd], [x - 700 for x in rev],
                         OwdClock(UNSYNCED, far(same=False)))
    plain = owd_report(fwd, rev, OwdClock(UNSYNCED, far(same=True)))
    assert shifted.forward is None and shifted.reverse is None and shifted.withheld
    assert plain.forward[1] == pytest.approx(sorted(fwd)[99] / 2 + sorted(fwd)[100] / 2)
    # a 700 ms clock offset moves the delays, not their variation (RFC 5481 §4.2)
    assert shifted.forward_variation == pytest.approx(plain.forward_variation)
    assert shifted.reverse_variation == pytest.approx(plain.reverse_variation)
    assert plain.forward_variation[2] == pytest.approx(plain.forward[3] - plain.forward[0])
    doc = shifted.to_json()
    assert doc["forward"] == dict.fromkeys(("min", "p50", "p90", "p99"))
    assert doc["variation"]["forward"]["p99"] > 0 and doc["clock_error_bound_ms"] is None
    assert "boot_id" not in str(doc)                 # the boot id never leaves the host
    rows = dict(text_rows(shifted))
    assert rows["one-way forward min / p50 / p99"] == "withheld"
    assert "not synchronised" in rows["one-way withheld"]
    pooled = merge([plain, plain])
    assert pooled.forward == pytest.approx(plain.forward) and len(pooled.forward_samples_ms) == 400


# -- the path watch: which direction queues -------------------------------------------------
def owd_sessions(rng, n, *, fwd_queue=0.0, rev_queue=0.0, count=20):
    """(min, p99, forward spread, reverse spread) of sessions on a 10 + 50 ms path."""
    out = []
    for _ in range(n):
        f = sorted(10 + abs(rng.gauss(0, 0.05)) + (rng.expovariate(1 / fwd_queue) if fwd_queue
                                                   else 0) for _ in range(count))
        r = sorted(50 + abs(rng.gauss(0, 0.05)) + (rng.expovariate(1 / rev_queue) if rev_queue
                                                   else 0) for _ in range(count))
        rtt = sorted(a + b for a, b in zip(f, r, strict=True))
        k = int(0.99 * (count - 1))
        out.append((rtt[0], rtt[k], f[k] - f[0], r[k] - r[0]))
    return out


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("fwd_q,rev_q,want", [(0, 15, "reverse"), (15, 0, "forward"),
                                              (15, 15, "both")])
def test_path_watch_names_the_direction_of_the_queue(seed, fwd_q, rev_q, want):
    from wanprobe.diagnose.context import Context, PathChange
    from wanprobe.diagnose.engine import first
    from wanprobe.diagnose.path_watch import PathWatch

    rng = random.Random(seed)
    watch = PathWatch()
    rows = owd_sessions(rng, 30) + owd_sessions(rng, 20, fwd_queue=fwd_q, rev_queue=rev_q)
    events = [e for lo, hi, f, r in rows
              for e in watch.observe("p", lo, hi, forward_spread_ms=f, reverse_spread_ms=r)]
    assert [e.event for e in events] == ["queueing"]
    ev = events[0]
    assert ev.direction == want
    finding = first(Context(path_event=PathChange("p", "198.18.0.2", ev)))
    assert finding.evidence["direction"] == want
    assert {"forward": "way to p", "reverse": "way back from p", "both": "both"}[want] \
        in finding.title


def test_path_watch_without_one_way_delays_says_no_direction():
    from wanprobe.diagnose.path_watch import PathWatch, one_way_spreads

    rng = random.Random(9)
    watch = PathWatch()
    rows = owd_sessions(rng, 30) + owd_sessions(rng, 20, rev_queue=15)
    events = [e for lo, hi, _f, _r in rows for e in watch.observe("p", lo, hi)]
    assert [(e.event, e.direction) for e in events] == [("queueing", None)]
    assert one_way_spreads({"owd_ms": None}) == (None, None)


# -- the daemon exports one-way delay only with a known bound ----------------------------------
def test_daemon_gauges_only_with_a_bound():
    from prometheus_client.parser import text_string_to_metric_families

    from wanprobe.daemon import loss_metrics
    from wanprobe.daemon.metrics import DaemonMetrics, series_per_host
    from wanprobe.mesh.peer import Peer

    fwd, rev = [10.0 + i / 100 for i in range(50)], [50.0 + i / 100 for i in range(50)]
    known = {"owd_ms": owd_report(fwd, rev, OwdClock(UNSYNCED, far(same=True))).to_json()}
    unknown = {"owd_ms": owd_report(fwd, rev, OwdClock(UNSYNCED, far(same=False))).to_json()}
    m = DaemonMetrics(site="a", host="a-1")
    peer = Peer("p0", "198.18.0.2", site="s")
    m.set_peers((peer,))

    def owd_series():
        text = m.exposition().decode()
        return {(s.labels.get("direction"), s.labels.get("stat")): s.value
                for f in text_string_to_metric_families(text) for s in f.samples
                if s.name.startswith("wanprobe_owd")}

    m.observe_probe(peer, "stamp", unknown)
    assert owd_series() == {}
    m.observe_probe(peer, "stamp", known)
    got = owd_series()
    assert got[("forward", "p50")] == pytest.approx(0.010245) and got[(None, None)] == 0.0
    assert len(got) == 9
    m.observe_probe_error(peer, "stamp")
    m.observe_throughput(peer, {"bits_per_second": 1e9, "bytes_sent": 1, "bytes_received": 1})
    series = [s for f in text_string_to_metric_families(m.exposition().decode())
              for s in f.samples]
    # every series but the windowed loss's, which the daemon sets beside (loss_metrics.py)
    assert len(series) == series_per_host(1, 1, owd=True) - loss_metrics.SERIES_PER_PEER
    m.observe_probe(peer, "stamp", unknown)       # the clocks lost their bound: values go
    assert owd_series() == {}


def test_authenticated_session_reads_the_clock_tlvs_under_the_hmac():
    """RFC 8762 §4.4 / RFC 8972 §4.8: the clock TLVs sit before the HMAC TLV, so they are
    protected; a loopback session against our reflector learns the one clock and both
    Error Estimates."""
    import asyncio

    from wanprobe.probe.reflector import Reflector
    from wanprobe.probe.sender import StampSender, probe_stamp

    key = b"0123456789abcdef-owd-test-key"
    other = replace(SYNCED, boot_id="ffffffff-0000-4000-8000-000000000000")

    async def run(reflector_clock):
        refl = Reflector(hmac_key=key, clock=ClockWatcher(lambda: reflector_clock))
        sender = StampSender(clock=ClockWatcher(lambda: SYNCED))
        await refl.start("127.0.0.1", 0)
        try:
            return await probe_stamp("127.0.0.1", port=refl.address[1], count=10,
                                     interval_s=0.005, hmac_key=key, sender=sender)
        finally:
            sender.close()
            await refl.close()

    same = asyncio.run(run(SYNCED)).to_json()["owd_ms"]
    assert same["same_clock"] is True and same["clock_error_bound_ms"] == 0.0
    assert same["far_clock"]["sync_source"] == "ntp" and same["forward"]["p50"] is not None
    apart = asyncio.run(run(other)).to_json()["owd_ms"]
    assert apart["same_clock"] is False and apart["clock_source"] == "chrony/ntp"
    # two synchronised clocks, 1.62 ms each: loopback delays are far below 3.24 ms
    assert apart["clock_error_bound_ms"] == pytest.approx(
        1.62 + ee.decode(ee.encode(1.62e-3, synchronized=True)).error_s * 1e3)
    assert apart["forward"]["p50"] is None and "not smaller" in apart["withheld"]
