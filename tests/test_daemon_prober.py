"""The daemon's STAMP prober (daemon/prober.py): every peer's sessions on one timer give the same
results as ``probe_stamp`` sessions, keep the schedule, honour the HMAC key, stop for removed
peers and turn a send error into one failure line. Real reflector on loopback (its own loop
thread), real sockets."""

from __future__ import annotations

import asyncio
import random
import time

import pytest
from reflector_helpers import KEY, Served

from wanprobe.daemon.config import ProbeSettings
from wanprobe.daemon.prober import MeshProber, numeric_family
from wanprobe.mesh.peer import Peer
from wanprobe.probe.reflector import Reflector
from wanprobe.probe.sender import probe_stamp

FAST = ProbeSettings(interval_s=0.4, jitter_s=0.04, count=4, packet_interval_s=0.05,
                     timeout_s=0.2)


class Results:
    def __init__(self) -> None:
        self.done: list[tuple[str, float, dict]] = []
        self.failed: list[tuple[str, float, str]] = []

    def on_done(self, peer: Peer, ts: float, doc: dict) -> None:
        self.done.append((peer.name, ts, doc))

    def on_failed(self, peer: Peer, ts: float, error: str) -> None:
        self.failed.append((peer.name, ts, error))


async def _probe_for(peers, seconds: float, *, hmac_key=None, settings=FAST, after=None):
    res = Results()
    prober = MeshProber(res.on_done, res.on_failed, hmac_key=hmac_key, rng=random.Random(7))
    try:
        prober.apply(peers, settings)
        await asyncio.sleep(seconds)
        if after is not None:
            await after(prober, res)
        open_sessions = sum(len(r.open) for r in prober.runs.values())
    finally:
        prober.close()
    return res, open_sessions


@pytest.mark.slow
def test_sessions_match_probe_stamp_and_keep_the_schedule():
    with Served(Reflector) as r:
        port = r.address[1]
        peers = [Peer(f"p{i}", "127.0.0.1", port=port) for i in range(5)]

        async def run():
            single = await probe_stamp("127.0.0.1", port=port, count=4, interval_s=0.05,
                                       timeout_s=0.2)
            res, open_sessions = await _probe_for(peers, 1.9)
            return single.to_json(), res, open_sessions

        single, res, open_sessions = asyncio.run(run())
    assert not res.failed
    assert open_sessions <= len(peers)  # at most the one in flight per peer
    for p in peers:
        docs = [(ts, d) for name, ts, d in res.done if name == p.name]
        # first session inside the first interval, then one every 0.4 ± 0.04 s: the timer
        # keeps the schedule (a start the loop ran late does not push the next ones back)
        assert 3 <= len(docs) <= 5, (p.name, len(docs))
        starts = [ts for ts, _ in docs]
        assert 0.3 < (starts[-1] - starts[0]) / (len(starts) - 1) < 0.5, starts
        assert all(0 < b - a < 0.7 for a, b in zip(starts, starts[1:], strict=False)), starts
        for _ts, d in docs:
            assert d.keys() == single.keys()
            assert d["loss"]["sent"] == 4 and d["loss"]["received"] == 4
            assert d["loss"]["forward_ratio"] == 0.0 and d["loss"]["reverse_ratio"] == 0.0
            assert 0 < d["rtt_ms"]["p50"] < 50 and d["peer"] == "127.0.0.1"
            # the mesh stamps TX from the clock just before sendto (no error-queue read)
            assert d["tx_timestamp"] == "user" and single["tx_timestamp"] == "kernel"


@pytest.mark.slow
def test_hmac_key_authenticates_and_a_wrong_key_counts_as_loss():
    with Served(Reflector, hmac_key=KEY) as r:
        port = r.address[1]
        peers = [Peer("a", "127.0.0.1", port=port)]
        good, _ = asyncio.run(_probe_for(peers, 1.0, hmac_key=KEY))
        bad, _ = asyncio.run(_probe_for(peers, 1.0, hmac_key=b"another key, not the reflector's"))
        none, _ = asyncio.run(_probe_for(peers, 1.0))
    assert good.done and all(d["loss"]["received"] == 4 for _n, _t, d in good.done)
    for res in (bad, none):  # the reflector drops what it cannot verify: every probe lost
        assert res.done and not res.failed
        assert all(d["loss"]["received"] == 0 for _n, _t, d in res.done)


def test_removed_peers_stop_and_changed_settings_restart():
    with Served(Reflector) as r:
        port = r.address[1]
        peers = [Peer(f"p{i}", "127.0.0.1", port=port) for i in range(3)]
        marks: dict[str, float] = {}

        async def shrink(prober, res):
            marks["removed"] = time.time()
            prober.apply(peers[:1], FAST)
            await asyncio.sleep(1.0)

        res, open_sessions = asyncio.run(_probe_for(peers, 0.9, after=shrink))
    late = [(n, ts) for n, ts, _d in res.done if n != "p0" and ts > marks["removed"]]
    assert not late
    assert sum(1 for n, ts, _d in res.done if n == "p0" and ts > marks["removed"]) >= 1
    assert open_sessions <= 1


def test_a_send_the_kernel_refuses_is_one_failure_line_and_probing_goes_on():
    # the limited broadcast address without SO_BROADCAST: sendto fails with EACCES
    peers = [Peer("bcast", "255.255.255.255", port=9), Peer("lo", "127.0.0.1", port=9)]
    res, _ = asyncio.run(_probe_for(peers, 1.0))
    fails = [e for n, _t, e in res.failed if n == "bcast"]
    assert len(fails) >= 2 and all("\n" not in e and "255.255.255.255" in e for e in fails)
    # the other peer is still probed (no reflector on port 9: every probe lost)
    assert any(n == "lo" and d["loss"]["sent"] == 4 for n, _t, d in res.done)


def test_numeric_family_only_for_literal_addresses():
    assert numeric_family("198.18.0.1") is not None and numeric_family("[2001:db8::1]") is not None
    assert numeric_family("peer.example") is None


def test_ipv6_peers_share_a_v6_socket_and_keep_the_configured_address():
    async def run():
        r = Reflector()
        await r.start("::1", 0)
        try:
            peers = [Peer("v6", "::1", port=r.address[1]), Peer("v6b", "[::1]", port=r.address[1])]
            return await _probe_for(peers, 1.0)
        finally:
            await r.close()

    res, _ = asyncio.run(run())
    assert not res.failed
    by_name = {n: d for n, _t, d in res.done}
    assert by_name["v6"]["peer"] == "::1" and by_name["v6b"]["peer"] == "[::1]"
    assert all(d["loss"]["received"] == 4 for _n, _t, d in res.done)


def test_a_socket_that_cannot_open_fails_sessions_not_apply(monkeypatch):
    """apply() opens the sockets to size the coalescing window; when the kernel refuses one,
    apply still succeeds and each session reports the error, one line, as it always did."""
    from wanprobe.errors import ProbeError
    from wanprobe.probe.sender import StampSender

    def refuse(self):
        raise ProbeError("cannot open a UDP socket for STAMP: Address family not supported")

    monkeypatch.setattr(StampSender, "open", refuse)
    peers = [Peer(f"p{i}", "127.0.0.1", port=9) for i in range(12)]   # > COALESCE_SESSIONS
    res, open_sessions = asyncio.run(_probe_for(peers, 0.6))
    assert not res.done and open_sessions == 0
    assert {name for name, _ts, _e in res.failed} == {p.name for p in peers}
    assert all("cannot open a UDP socket" in e and "\n" not in e for _n, _t, e in res.failed)
