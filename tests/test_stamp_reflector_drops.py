"""Issues 19 and 20 without a lab: the reflector's session table keeps sessions that are still
probing, authenticated mode refuses replays, the Reflector Report TLV carries the reflector's
drops, and the sender keeps them (and restarts of its session) out of the path's loss. Pure
functions, then a real reflector and sender on loopback."""

from __future__ import annotations

import asyncio
import socket
import struct

import pytest
from reflector_helpers import Served
from test_stamp_auth import KEY, auth_sender_bytes, ntp_now, recv_or_none

from wanprobe.daemon.metrics import DaemonMetrics
from wanprobe.errors import UsageError
from wanprobe.mesh.peer import Peer
from wanprobe.probe import rate_guard
from wanprobe.probe import stamp_packet as sp
from wanprobe.probe.loss_split import split_loss
from wanprobe.probe.probe_summary import Reply
from wanprobe.probe.reflect_logic import build_reply
from wanprobe.probe.reflector import Reflector
from wanprobe.probe.reflector_report import (
    TLV_REFLECTOR_REPORT,
    ReportLog,
    reflector_value,
    sender_tlv,
)
from wanprobe.probe.replay_window import WINDOW, fresh
from wanprobe.probe.sender import probe_stamp
from wanprobe.probe.session_table import (
    EPOCH,
    RX,
    START,
    START_SEQS,
    SessionTable,
    new_session,
)

# -- session table: floods recycle only what is not probing (issue 19) --------------------------


def probe_as_reflector(t: SessionTable, key: tuple, now_s: float, seq: int = 1000):
    """What the reflector does per datagram: touch, mark a session's start (its probe number
    ``seq`` below START_SEQS), count it as received."""
    sess = t.touch(key, now_s)
    if sess is not None:
        if not sess[RX] and seq < START_SEQS:
            sess[START] = True
        sess[RX] += 1
    return sess


def test_a_same_source_flood_does_not_evict_a_session_that_is_probing():
    t = SessionTable(max_sessions=10_000, per_source=64, idle_s=120.0)
    prober = (7, "198.18.0.1", 40000, None)
    first = probe_as_reflector(t, prober, 0.0, seq=0)
    epochs = set()
    now, ssid = 0.0, 1000
    for step in range(1, 20):   # a probe every 50 ms; 100 one-probe flood sessions in between
        for _ in range(100):    # (the reproducer: its n-th packet is number n, SSID n)
            now += 0.0005
            probe_as_reflector(t, (ssid & 0xFFFF, "198.18.0.1", 40001, None), now, seq=ssid)
            ssid += 1
        now += 0.0005
        epochs.add(probe_as_reflector(t, prober, now, seq=step)[EPOCH])
    assert len(t) <= 64 and t.evicted > 1000
    assert epochs == {first[EPOCH]} and t.refused == 0   # one session from start to end


def test_sources_elsewhere_do_not_evict_it_through_the_global_table():
    t = SessionTable(max_sessions=256, per_source=64, idle_s=120.0)
    prober = (7, "198.18.0.1", 40000, None)
    now = 0.0
    sess = probe_as_reflector(t, prober, now, seq=0)
    probe_as_reflector(t, prober, now + 0.1, seq=1)
    ssid = 0
    for step in range(2, 30):
        for k in range(490):   # 64 sources at 4.9 k/s between two probes 100 ms apart
            now = step * 0.1 + k * 0.0002
            probe_as_reflector(t, (ssid, f"198.18.100.{k % 64 + 1}", 5000, None), now)
            ssid += 1
        assert probe_as_reflector(t, prober, step * 0.1 + 0.099, seq=step) is sess
    assert len(t) == 256 and t.refused == 0 and t.evicted > 10_000


def test_a_share_full_of_active_sessions_refuses_new_ones_until_they_go_idle():
    """A flood that looks like sessions (two probes each, or first probes numbered 0) can lock
    out new sessions of its own source address for a second or two; it cannot evict one."""
    t = SessionTable(max_sessions=1000, per_source=4, idle_s=120.0)
    for ssid in range(2):   # two probes each: active
        probe_as_reflector(t, (ssid, "a", 1, None), 0.0)
        probe_as_reflector(t, (ssid, "a", 1, None), 0.01)
    for ssid in range(2, 4):   # a session's first probe: active for PROTECT_NEW_S
        probe_as_reflector(t, (ssid, "a", 1, None), 0.0, seq=0)
    assert t.touch((99, "a", 1, None), 0.5) is None and t.refused == 1
    assert probe_as_reflector(t, (99, "b", 1, None), 0.5) is not None   # other sources are not affected
    assert probe_as_reflector(t, (99, "a", 1, None), 5.0) is not None   # idle after 1-2 s: recycled
    assert t.evicted == 1


# -- anti-replay window (RFC 4303 §3.4.3) -------------------------------------------------------


def test_replay_window_accepts_each_number_once_and_tolerates_reordering():
    sess = new_session(0.0)
    assert [fresh(sess, s) for s in (0, 1, 3, 2)] == [True] * 4           # 2 late: fine
    assert [fresh(sess, s) for s in (0, 1, 2, 3)] == [False] * 4          # replays
    assert fresh(sess, 3 + WINDOW) and not fresh(sess, 3 + WINDOW)
    assert fresh(sess, 4) and not fresh(sess, 3)                          # 3: left the window
    assert fresh(sess, 10 * WINDOW) and not fresh(sess, 5 + WINDOW)       # a jump clears it


# -- the sender's split: drops, restarts, the tail ----------------------------------------------


def _replies(rows):
    """rows: (sseq, R_RxC) of answered probes."""
    return [Reply(s, 0, None, None, None, None, None, rx) for s, rx in rows]


def test_rate_limited_probes_are_neither_forward_nor_round_trip_loss():
    # 10 sent; the reflector received all, answered the even ones, rate-limited the odd ones
    kept = _replies([(s, s + 1) for s in range(0, 10, 2)])
    log = ReportLog(by_seq={s: (77, s // 2, 0) for s in range(0, 10, 2)}, limit_pps=500)
    loss = split_loss(10, 5, 0, kept, log)
    assert (loss.forward_lost, loss.reverse_lost, loss.reflector_rate_limited) == (0, 0, 4)
    assert loss.unattributed == 1 and loss.ratio == 0.0   # probe 9: its fate is unknown
    without = split_loss(10, 5, 0, kept, None)            # a reflector that cannot say
    assert without.reverse_lost == 4 and without.ratio == 0.5


def test_a_flow_without_drops_of_its_own_shares_its_siblings_rate_limit():
    """Flows of one host to one reflector share its per-source bucket: a flow whose last two
    probes went unanswered, with no drop before them, is judged with its siblings."""
    from dataclasses import replace as copy

    from wanprobe.probe.loss_split import share_tails
    from wanprobe.probe.result import ProbeResult

    quiet = split_loss(10, 8, 0, _replies([(s, s + 1) for s in range(8)]),
                       ReportLog(by_seq={s: (3, 0, 0) for s in range(8)}))
    assert quiet.tail == 2 and quiet.ratio == 0.2        # alone: the path's, as ever
    busy = split_loss(10, 5, 0, _replies([(s, s + 1) for s in range(0, 10, 2)]),
                      ReportLog(by_seq={s: (4, s // 2, 0) for s in range(0, 10, 2)}))
    one = ProbeResult("stamp", "b", 862, "", 0.1, 0.01, 100, None, quiet, None)
    shared = share_tails([one, copy(one, loss=busy)])
    assert shared[0].loss.ratio == 0.0 and shared[0].loss.unattributed == 2
    assert share_tails([one, one])[0].loss.ratio == 0.2   # nobody dropped: still the path's


def test_a_restarted_session_is_a_reset_not_forward_loss():
    # the counter restarts at probe 10 (evicted): 1..10 then 1..10
    kept = _replies([(s, s % 10 + 1) for s in range(20)])
    log = ReportLog(by_seq={s: (1 if s < 10 else 2, 0, 0) for s in range(20)})
    loss = split_loss(20, 20, 0, kept, log)
    assert (loss.forward_lost, loss.reflector_resets, loss.unattributed) == (0, 1, 0)
    assert split_loss(20, 20, 0, kept, None).reflector_resets == 1   # by the count alone
    # gaps around a restart are nobody's: probes 8, 9 unanswered, the new count starts at 11
    kept = _replies([(s, s + 1) for s in range(8)] + [(s, s - 9) for s in range(10, 20)])
    loss = split_loss(20, 18, 0, kept, ReportLog(by_seq={s: (1 if s < 8 else 2, 0, 0)
                                                         for s in range(20)}))
    assert (loss.forward_lost, loss.unattributed, loss.forward_of) == (0, 2, 17)


def test_forward_loss_and_reordering_are_still_seen():
    kept = _replies([(0, 1), (1, 2), (2, 3), (4, 4), (5, 5)])   # probe 3 never arrived
    assert split_loss(6, 5, 0, kept, None).forward_lost == 1
    kept = _replies([(0, 1), (1, 3), (2, 2), (3, 4)])          # 1 and 2 swapped on the way
    loss = split_loss(4, 4, 0, kept, None)
    assert loss.reflector_resets == 0 and loss.forward_lost == 0


# -- the Reflector Report TLV --------------------------------------------------------------------


def test_report_tlv_is_filled_by_our_reflector_and_left_unknown_otherwise():
    tlv = sender_tlv()
    assert tlv[:4] == struct.pack("!BBH", sp.FLAG_U, TLV_REFLECTOR_REPORT, 20)
    assert reflector_value(tlv[4:], (5, 500, 2, 0)) == tlv[4:8] + struct.pack("!IIII", 5, 500, 2, 0)
    assert reflector_value(b"xx" + tlv[6:], (5, 500, 2, 0)) is None   # another magic
    req = sp.pack_sender(sp.SenderPacket(0, 0, 9)) + tlv
    kw = dict(reflector_seq=0, rx_count=3, tx_count=1, t2_ntp=1, t3_ntp=2, ttl=64,
              tos_received=0)
    ours = build_reply(req, report=(5, 500, 2, 0), **kw).data
    log = ReportLog()
    log.note(0, ours, 44, len(ours))
    assert log.by_seq == {0: (5, 2, 0)} and log.limit_pps == 500 and log.counts == "reported"
    echoed = build_reply(req, **kw).data      # no report to give: RFC 8972 §4, U stays set
    log = ReportLog()
    log.note(0, echoed, 44, len(echoed))
    assert log.counts == "not_supported" and not log.by_seq


# -- rate plan and the one-line note --------------------------------------------------------------


def test_a_rate_above_the_limit_is_paced_refused_or_sent():
    assert rate_guard.plan(16_000, 0.001, 5000, "pace", peer="b").interval_s == \
        pytest.approx(0.001 * 16_000 / 4000)
    with pytest.raises(UsageError, match=r"16,000 probes/s .* 5,000 per second"):
        rate_guard.plan(16_000, 0.001, 5000, "refuse", peer="b")
    assert not rate_guard.plan(16_000, 0.001, 5000, "send", peer="b").paced
    assert not rate_guard.plan(100, 0.01, 5000, "refuse", peer="b").paced
    third_party = rate_guard.note({"ratio": 0.3}, {"counts": "not_supported"}, 1000)
    assert "cannot report its own drops" in third_party and "256" in third_party
    assert rate_guard.note({"ratio": 0.3}, {"counts": "not_supported"}, 100) is None


def test_daemon_metrics_keep_reflector_drops_out_of_lost():
    m = DaemonMetrics()
    peer = Peer(name="b", address="198.18.0.2")
    doc = {"loss": {"sent": 100, "received": 49, "forward_lost": 0, "reverse_lost": 0,
                    "reflector_rate_limited": 50, "unattributed": 1, "reflector_resets": 1}}
    m.observe_probe(peer, "stamp", doc)
    lab = dict(peer="b", method="stamp")
    assert m.registry.get_sample_value("wanprobe_probe_packets_lost_total",
                                       {**lab, "direction": "round_trip", "src_site": "",
                                        "src_host": "", "dst_site": peer.site,
                                        "dst_host": "b"}) == 0.0   # 100 = 49 + 50 + 1
    assert m.registry.get_sample_value(
        "wanprobe_probe_reflector_drops_total",
        {**lab, "cause": "rate_limited", "src_site": "", "src_host": "", "dst_site": peer.site,
         "dst_host": "b"}) == 50


# -- on loopback: a real reflector and sender --------------------------------------------------


def test_probe_at_twice_the_limit_counts_the_reflectors_drops_apart():
    with Served(Reflector, rate_pps=200, burst=20) as r:
        res = asyncio.run(probe_stamp("127.0.0.1", port=r.address[1], count=300,
                                      interval_s=0.0025, timeout_s=0.5))
        refl_limited = r.stats().rate_limited
    loss = res.loss
    print(loss.to_json(), res.reflector, refl_limited)
    assert res.reflector.counts == "reported" and res.reflector.limit_pps == 200
    assert loss.reflector_rate_limited >= 100          # about half of 300
    # every drop the sender learnt of is one the reflector counted; the rest are the tail's
    assert loss.reflector_rate_limited <= refl_limited \
        <= loss.reflector_rate_limited + loss.unattributed
    assert loss.forward_lost == 0 and loss.reverse_lost == 0 and loss.ratio == 0.0


def test_authenticated_mode_refuses_replays_and_counts_them():
    with Served(Reflector, hmac_key=KEY) as r, socket.socket(socket.AF_INET,
                                                             socket.SOCK_DGRAM) as c:
        c.bind(("127.0.0.1", 0))
        dest = ("127.0.0.1", r.address[1])
        sent = [auth_sender_bytes(seq, ntp_now(), 31, KEY) for seq in range(50)]
        answered = 0
        for pkt in sent:
            c.sendto(pkt, dest)
            answered += recv_or_none(c, 1.0) is not None
        for pkt in sent:                                  # the capture, replayed
            c.sendto(pkt, dest)
        replayed_answers = sum(recv_or_none(c, 0.2) is not None for _ in range(5))
        # the session's next probe says, in its Reflector Report TLV, what was refused
        tlvs = (sp.Tlv(TLV_REFLECTOR_REPORT, sender_tlv()[4:], sp.FLAG_U),)
        c.sendto(sp.pack_sender_auth(sp.SenderPacket(50, ntp_now(), 31, tlvs=tlvs), KEY), dest)
        reply = sp.unpack_reflector_auth(recv_or_none(c, 1.0), KEY)
        stats, refusals = r.stats(), r.refusals()
    assert answered == 50 and replayed_answers == 0
    assert stats.replayed == 50 and refusals["stamp_replayed"] == 50
    report = sp.find_tlv(reply.tlvs, TLV_REFLECTOR_REPORT)
    assert not report.flags & sp.FLAG_U
    assert struct.unpack("!IIII", report.value[4:])[3] == 50   # refused, this session
    assert stats.sessions[0].rx == 51                          # replays never counted received


def test_an_authenticated_session_is_not_hurt_by_the_window():
    with Served(Reflector, hmac_key=KEY) as r:
        res = asyncio.run(probe_stamp("127.0.0.1", port=r.address[1], count=200,
                                      interval_s=0.002, timeout_s=0.5, hmac_key=KEY))
    assert res.loss.received == 200 and res.loss.reflector_replays_refused == 0
    assert res.reflector.counts == "reported"


def test_the_split_is_consistent_whatever_the_replies_say():
    """Arbitrary (hostile or broken) counters and reports: counts stay within what was sent and
    every ratio within [0, 1]; nothing raises."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    row = st.tuples(st.integers(0, 60), st.integers(0, 2**32 - 1),
                    st.one_of(st.none(), st.tuples(st.integers(1, 3), st.integers(0, 80),
                                                   st.integers(0, 80))))

    @settings(max_examples=300, deadline=None, derandomize=True, database=None)
    @given(st.integers(1, 60), st.lists(row, max_size=60, unique_by=lambda r: r[0]))
    def check(sent, rows):
        rows = sorted(r for r in rows if r[0] < sent)
        kept = _replies([(s, rx) for s, rx, _rep in rows])
        log = ReportLog(by_seq={s: rep for s, _rx, rep in rows if rep is not None})
        loss = split_loss(sent, len(kept), 0, kept, log)
        assert 0.0 <= loss.ratio <= 1.0 and loss.received <= loss.path_sent <= sent
        for lost, of in ((loss.forward_lost, loss.forward_of),
                         (loss.reverse_lost, loss.reverse_of)):
            assert lost is None or 0 <= lost <= of
        assert loss.unattributed >= 0 and loss.tail >= 0

    check()


def test_the_daemon_paces_a_peer_whose_reflector_is_slower_than_its_sessions(caplog):
    from wanprobe.daemon.config import ProbeSettings
    from wanprobe.daemon.reflector_limit import ReflectorPacing

    s = ProbeSettings(interval_s=2.0, count=400, packet_interval_s=0.001, timeout_s=0.3)
    pacing = ReflectorPacing()
    said = {"reflector": {"counts": "reported", "limit_pps": 500},
            "loss": {"reflector_rate_limited": 100}}
    with caplog.at_level("WARNING", logger="wanprobe.daemon"):
        pacing.observe("b", said, s)
        pacing.observe("b", said, s)
    assert pacing.settings_for("b", s).packet_interval_s == pytest.approx(1 / 400)
    assert pacing.settings_for("c", s) is s
    assert len(caplog.records) == 1 and "pacing" in caplog.records[0].getMessage()
    tight = ProbeSettings(interval_s=1.0, count=400, packet_interval_s=0.001, timeout_s=0.3)
    pacing.observe("d", said, tight)   # 400 probes at 400/s do not fit in 1 s: as configured
    assert pacing.settings_for("d", tight) is tight
    pacing.observe("b", {"reflector": {"limit_pps": 5000}}, s)   # reconfigured: no longer binds
    assert pacing.settings_for("b", s) is s
