"""Issue 37 without a lab: a flood of STAMP sessions from many sources cannot lock new sessions of
other probers out of the reflector's table (max-min fair shares per source group), and a session
the reflector does refuse is told to the sender, which reports a refusal (exit 8), never path
loss. Pure functions, then a real reflector, sender, CLI and daemon prober on loopback (the
namespace version with the issue's flood: test_reflector_flood_netns.py)."""

from __future__ import annotations

import asyncio
import random
import socket
import struct
import threading
import time
from contextlib import contextmanager

import pytest
from clirun import invoke, one_line_error
from reflector_helpers import KEY, Served
from test_stamp_auth import auth_sender_bytes
from test_stamp_reflector_drops import probe_as_reflector

from wanprobe.daemon.config import ProbeSettings
from wanprobe.daemon.metrics import DaemonMetrics
from wanprobe.daemon.prober import MeshProber
from wanprobe.mesh.peer import Peer
from wanprobe.probe import stamp_packet as sp
from wanprobe.probe.loss_split import split_loss
from wanprobe.probe.probe_summary import Reply
from wanprobe.probe.reflect_logic import build_reply
from wanprobe.probe.reflector import Reflector
from wanprobe.probe.reflector_report import SESSION_REFUSED, ReportLog, sender_tlv
from wanprobe.probe.sender import probe_stamp
from wanprobe.probe.session_table import RX, SessionTable

FLOOD = struct.Struct("!IQHH28x")  # the reproducer's packet: seq, timestamp, error, SSID


def _flood_round(t: SessionTable, now_s: float, seq: int, sources: int, per: int) -> None:
    """One probe of every flood session: ``sources`` addresses x ``per`` SSIDs (the issue:
    64 x 1,024, probe numbers 0, 1, ... a round apart, so every session looks active)."""
    for src in range(sources):
        for ssid in range(per):
            probe_as_reflector(t, (ssid, f"198.18.100.{src + 1}", 5000, None), now_s + src * 1e-4, seq)


def test_a_many_source_flood_that_fills_the_table_leaves_room_for_other_probers():
    """The issue's flood scaled by 1/64 (64 sources x 16 SSIDs fill a 1,024-session table,
    16 per source as 1,024 of 65,536), rounds 0.5 s apart: every session is active. Each new
    session of a prober elsewhere still gets in (a flood source loses its least recently used
    one), a running one is never taken, and the flood only ever loses its own."""
    t = SessionTable(max_sessions=1024, per_source=16, idle_s=120.0)
    _flood_round(t, 0.0, 0, 64, 16)
    _flood_round(t, 0.5, 1, 64, 16)
    assert len(t) == 1024 and t.refused == 0
    now, epochs = 0.6, []
    for session in range(10):           # the daemon: a new session per interval, 5 probes each
        key = (100 + session, "198.18.0.1", 40000, None)
        for seq in range(5):
            now += 0.02
            got = probe_as_reflector(t, key, now, seq)
            assert got is not None, (session, seq)
            epochs.append(got)
            _flood_round(t, now, 2 + session * 5 + seq, 64, 16)   # the flood goes on
    assert len(t) == 1024 and t.reclaimed >= 1 and t.refused > 0   # flood newcomers refused
    mine = [s for k, s in t.items() if k[1] == "198.18.0.1"]
    assert len(mine) >= 2 and all(s[RX] == 5 for s in mine)   # never evicted mid-session


def test_a_flood_spread_thinner_than_the_prober_cannot_take_its_session():
    """Max-min: a group holding ``n`` takes only from one holding at least ``n + 2``."""
    t = SessionTable(max_sessions=8, per_source=8, idle_s=120.0)
    prober = (1, "198.18.0.1", 40000, None)
    probe_as_reflector(t, prober, 0.0, 0)
    for src in range(7):                # seven spoofed sources, one active session each
        probe_as_reflector(t, (9, f"198.18.100.{src}", 1, None), 0.0, 0)
    assert len(t) == 8
    assert probe_as_reflector(t, (9, "198.18.200.1", 1, None), 0.1, 0) is None   # 1 each: no one to take
    assert probe_as_reflector(t, prober, 0.1, 1) is not None and t.reclaimed == 0


def test_an_ipv6_host_cannot_take_a_share_per_address_of_its_64():
    """One host may use any address of its /64 (RFC 8981): the share is the /64's."""
    t = SessionTable(max_sessions=1000, per_source=4, idle_s=120.0)
    for i in range(8):   # eight addresses of one /64, each a session's first probe: active
        probe_as_reflector(t, (i, f"fd00:37::{i + 1}", 1, None), 0.0, 0)
    assert len(t) == 4 and t.refused == 4 and t.sources() == 1
    assert probe_as_reflector(t, (0, "fd00:38::1", 1, None), 0.0, 0) is not None   # another /64
    assert probe_as_reflector(t, (0, "::ffff:198.18.0.1", 1, None), 0.0, 0) is not None
    assert t.sources() == 3


def _replies(rows):
    return [Reply(s, 0, None, None, None, None, None, rx) for s, rx in rows]


def test_refused_probes_are_taken_out_of_the_loss():
    """The issue's figures: 600 sent, the first 541 refused, then a session counting 1..59.
    Read as a session from probe 0 that is 90.2 % forward loss; it is no loss at all."""
    kept = _replies([(s, s - 540) for s in range(541, 600)])
    said = {s: (9, 0, 0) for s in range(541, 600)}
    before = split_loss(600, 59, 0, kept, ReportLog(by_seq=said))
    assert before.forward_ratio == pytest.approx(541 / 600)          # what the issue saw
    loss = split_loss(600, 59, 0, kept, ReportLog(by_seq=said, session_refused=set(range(541))))
    assert (loss.forward_lost, loss.reverse_lost, loss.ratio) == (0, 0, 0.0)
    assert loss.reflector_session_refused == 541 and loss.path_sent == 59
    # refused between two sessions; three of the refusals' answers lost: nobody's
    kept = _replies([(s, s + 1) for s in range(10)] + [(s, s - 19) for s in range(20, 30)])
    said = {**{s: (1, 0, 0) for s in range(10)}, **{s: (2, 0, 0) for s in range(20, 30)}}
    loss = split_loss(30, 20, 0, kept, ReportLog(by_seq=said, session_refused=set(range(10, 17))))
    assert (loss.forward_lost, loss.unattributed, loss.reflector_session_refused) == (0, 3, 7)
    every = split_loss(5, 0, 0, [], ReportLog(session_refused=set(range(5))))
    assert every.path_sent == 0 and every.ratio == 0.0 and every.reflector_session_refused == 5


def test_the_split_with_refusals_stays_consistent_whatever_the_replies_say():
    """Arbitrary answers, counts and refusals: every count within what was sent, every ratio
    within [0, 1], refused probes never in ``path_sent``; nothing raises."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    row = st.tuples(st.integers(0, 40), st.integers(0, 60), st.integers(1, 3))

    @settings(max_examples=300, deadline=None, derandomize=True, database=None)
    @given(st.integers(1, 40), st.lists(row, max_size=40, unique_by=lambda r: r[0]),
           st.sets(st.integers(-2, 45), max_size=40))
    def check(sent, rows, refused):
        rows = sorted(r for r in rows if r[0] < sent)
        kept = _replies([(s, rx) for s, rx, _e in rows])
        log = ReportLog(by_seq={s: (e, 0, 0) for s, _rx, e in rows}, session_refused=refused)
        loss = split_loss(sent, len(kept), 0, kept, log)
        told = {s for s in refused if 0 <= s < sent} - {r[0] for r in rows}
        assert loss.reflector_session_refused == len(told)
        assert 0.0 <= loss.ratio <= 1.0 and loss.received <= loss.path_sent <= sent - len(told)
        for lost, of in ((loss.forward_lost, loss.forward_of),
                         (loss.reverse_lost, loss.reverse_of)):
            assert lost is None or 0 <= lost <= of
        assert loss.unattributed >= 0 and loss.tail >= 0

    check()


def test_the_refused_flag_travels_in_the_reflector_report_tlv():
    req = sp.pack_sender(sp.SenderPacket(3, 0, 9)) + sender_tlv()
    kw = dict(reflector_seq=0, rx_count=0, tx_count=0, t2_ntp=1, t3_ntp=2, ttl=64, tos_received=0)
    refused = build_reply(req, report=(0, 500, 0, 0, SESSION_REFUSED), **kw).data
    log = ReportLog()
    log.note(3, refused, 44, len(refused))
    assert log.session_refused == {3} and not log.by_seq and log.limit_pps == 500
    plain = build_reply(req, report=(7, 500, 0, 0), **kw).data   # an ordinary answer
    log.note(4, plain, 44, len(plain))
    assert log.by_seq == {4: (7, 0, 0)} and log.session_refused == {3}


# -- on loopback: a source whose share is full of sessions that are probing -----------------


@contextmanager
def _share_held(keyed: bool, share: int = 4):
    """A reflector giving each source ``share`` sessions, all held by sessions of 127.0.0.1
    probing every 50 ms (unkeyed, or signed with the key in authenticated mode)."""
    kw = {"hmac_key": KEY} if keyed else {}
    stop = threading.Event()
    with Served(Reflector, sessions_per_source=share, **kw) as r:
        def hold() -> None:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect(("127.0.0.1", r.address[1]))
                seq = 0
                while not stop.is_set():
                    for ssid in range(1000, 1000 + share):
                        s.send(auth_sender_bytes(seq, 0, ssid, KEY) if keyed
                               else FLOOD.pack(seq, 0, 1, ssid))
                    seq += 1
                    stop.wait(0.05)

        holder = threading.Thread(target=hold, daemon=True)
        holder.start()
        try:
            while len(r.stats().sessions) < share:
                time.sleep(0.02)
            yield r
        finally:
            stop.set()
            holder.join(5)


@pytest.mark.parametrize("keyed", [False, True], ids=["unkeyed", "keyed"])
def test_a_refused_probe_reports_refusal_not_loss(keyed):
    kw = {"hmac_key": KEY} if keyed else {}
    with _share_held(keyed) as r:
        res = asyncio.run(probe_stamp("127.0.0.1", port=r.address[1], count=5, interval_s=0.05,
                                      timeout_s=0.5, **kw))
        time.sleep(0.1)   # its counters move after sendmsg, in the reflector's thread
        stats = r.stats()
    loss = res.loss
    print(loss.to_json(), stats.session_refused, stats.refusals_answered)
    assert loss.reflector_session_refused == 5 and loss.received == 0
    assert loss.forward_lost is None and loss.ratio == 0.0 and loss.path_sent == 0
    assert res.reflector.counts == "reported" and stats.refusals_answered == 5


def test_probe_cli_exits_8_naming_the_refusal():
    with _share_held(False) as r:
        out = invoke("probe", "127.0.0.1", "--port", r.address[1], "--count", "4",
                     "--interval", "50ms", "--timeout", "500ms")
    assert out.returncode == 8
    line = one_line_error(out)
    assert "refused a STAMP session to 4 of 4 probes" in line and "not counted as path loss" \
        in line
    assert "4 probes refused a session" in out.stdout   # the note under the table


def test_the_daemon_records_a_refused_session_as_a_failure_not_loss():
    settings = ProbeSettings(interval_s=0.4, jitter_s=0.0, count=4, packet_interval_s=0.05,
                             timeout_s=0.3)
    done, failed = [], []
    with _share_held(False) as r:
        async def run() -> None:
            prober = MeshProber(lambda p, ts, d: done.append(d),
                                lambda p, ts, e: failed.append(e), rng=random.Random(7))
            prober.apply([Peer("b", "127.0.0.1", port=r.address[1])], settings)
            await asyncio.sleep(1.3)
            prober.close()

        asyncio.run(run())
    assert not done and len(failed) >= 2
    assert all("refused a STAMP session" in e for e in failed), failed
    m = DaemonMetrics()   # a partly refused session: the refused are no loss either
    m.observe_probe(Peer("b", "198.18.0.2"), "stamp", {"loss": {
        "sent": 10, "received": 6, "forward_lost": 0, "reverse_lost": 0, "unattributed": 0,
        "reflector_session_refused": 4}})
    lab = {"peer": "b", "method": "stamp", "src_site": "", "src_host": "", "dst_site": "",
           "dst_host": "b"}
    assert m.registry.get_sample_value("wanprobe_probe_packets_lost_total",
                                       {**lab, "direction": "round_trip"}) in (None, 0.0)
    assert m.registry.get_sample_value("wanprobe_probe_reflector_drops_total",
                                       {**lab, "cause": "session_refused"}) == 4
