"""Scheduler and daemon wiring with injected fakes: a down peer costs one timeout, throughput tests
never overlap and respect budget and windows, results reach store, metrics and reports."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import urllib.request

import pytest

from wanprobe.daemon.config import ProbeSettings, ThroughputSettings, parse_window
from wanprobe.daemon.scheduler import Scheduler, in_windows
from wanprobe.mesh.peer import Peer


class Sink:
    def __init__(self):
        self.done, self.failed, self.tput = [], [], []

    def probe_done(self, peer, method, ts, doc):
        self.done.append((peer.name, ts))

    def probe_failed(self, peer, method, ts, error):
        self.failed.append((peer.name, ts, error))

    def throughput_done(self, peer, ts, doc, error):
        self.tput.append((peer.name, ts, doc, error))


def _doc(rtt_ms=30.0, sent=10, received=10):
    return {"rtt_ms": {"min": rtt_ms - 0.5, "p50": rtt_ms, "p90": rtt_ms + 0.5,
                       "p99": rtt_ms + 1, "max": rtt_ms + 2, "mean": rtt_ms, "stdev": 0.3},
            "loss": {"sent": sent, "received": received, "ratio": (sent - received) / sent,
                     "forward_ratio": (sent - received) / sent, "reverse_ratio": 0.0},
            "jitter_ms": 0.1}


PEERS = (Peer("up-1", "198.18.0.2"), Peer("up-2", "198.18.0.3"), Peer("down", "198.18.0.4"))


@pytest.mark.slow
def test_down_peer_costs_one_timeout_and_never_stalls_the_others():
    async def prober(peer, method, s):
        if peer.name == "down":
            await asyncio.sleep(3600)  # never answers; only the session deadline ends it
        await asyncio.sleep(0.005)
        return _doc()

    async def main():
        sink = Sink()
        settings = ProbeSettings(interval_s=0.2, jitter_s=0.02, count=2, packet_interval_s=0.01,
                                 timeout_s=0.2)
        sch = Scheduler(sink, prober, probe=settings, throughput=ThroughputSettings())
        sch.apply(PEERS, settings, ThroughputSettings())
        await asyncio.sleep(3.0)
        await sch.stop()
        return sink

    sink = asyncio.run(main())
    per_peer = {n: sum(1 for p, _ in sink.done if p == n) for n in ("up-1", "up-2")}
    # 3 s at 0.2 s: ~14 sessions each after a random start offset; a stall would give ≤ 3
    assert min(per_peer.values()) >= 9, per_peer
    down = [f for f in sink.failed if f[0] == "down"]
    assert 1 <= len(down) <= 3 and "no answer within 1.2 s" in down[0][2]
    gaps = [b[1] - a[1] for a, b in zip(down, down[1:], strict=False)]
    assert all(g >= 1.2 for g in gaps), "each failed session costs one timeout, not less"


@pytest.mark.slow
def test_throughput_tests_never_overlap_and_stay_in_budget():
    running, max_running, lock = [0], [0], threading.Lock()

    def tput(peer, s):
        with lock:
            running[0] += 1
            max_running[0] = max(max_running[0], running[0])
        time.sleep(0.4)
        with lock:
            running[0] -= 1
        return {"bits_per_second": 1e9, "bytes_sent": 100, "bytes_received": 100}

    async def main():
        sink = Sink()
        used = lambda since: sum(100 for t in sink.tput if t[1] >= since)  # noqa: E731
        ts = ThroughputSettings(enabled=True, interval_s=3600, duration_s=0.4,
                                budget_bytes_per_day=400, max_bytes_per_test=100)
        sch = Scheduler(sink, lambda *a: asyncio.sleep(0, _doc()), probe=ProbeSettings(interval_s=60),
                        throughput=ts, throughput_fn=tput, budget_used=used)
        peers = tuple(Peer(f"p{i}", f"198.18.0.{i + 2}") for i in range(6))
        sch.apply(peers, ProbeSettings(interval_s=60), ts)
        # ask for all six at once as well: the lock must still serialise them
        await asyncio.gather(*(sch.throughput_once(p) for p in peers[:3]))
        await asyncio.sleep(3.5)
        await sch.stop()
        return sink

    sink = asyncio.run(main())
    assert max_running[0] == 1, "two throughput tests ran at once"
    scheduled = sink.tput[3:]
    # budget 400 B/day, 100 B per test: 3 forced tests used 300, so the scheduler may run one more
    assert len(scheduled) == 1, [t[0] for t in sink.tput]


def test_throughput_windows():
    w = parse_window("22:00-04:00")
    lt = time.localtime()
    now_min = lt.tm_hour * 60 + lt.tm_min
    assert w.contains(23 * 60) and w.contains(0) and not w.contains(12 * 60)
    inside = parse_window(f"{now_min // 60:02d}:{now_min % 60:02d}-{(now_min + 2) // 60 % 24:02d}:{(now_min + 2) % 60:02d}")
    assert in_windows((inside,), time.time())
    outside = parse_window(f"{(now_min + 120) // 60 % 24:02d}:00-{(now_min + 180) // 60 % 24:02d}:00")
    assert not in_windows((outside,), time.time())
    sch = Scheduler(Sink(), None, probe=ProbeSettings(), throughput=ThroughputSettings(
        enabled=True, windows=(outside,)), throughput_fn=lambda p, s: {})
    sch.sessions = {}
    assert sch.throughput_due(time.time()) is None


@pytest.mark.slow
def test_daemon_wires_store_metrics_and_regression_report(tmp_path):
    """The composition root with a fake prober: probe rows land in SQLite, /metrics and /healthz
    answer, and a loss step produces one report file naming the peer and the loss figures."""
    from wanprobe.daemon.config import parse_config
    from wanprobe.daemon.main import Daemon
    from wanprobe.history.store import Store

    phase = {"lossy": False}

    async def prober(peer, method, s):
        await asyncio.sleep(0.002)
        return _doc(rtt_ms=60.0, sent=50, received=40 if phase["lossy"] else 50)

    class NoReflector:
        async def start(self, listen):
            pass

        async def close(self):
            pass

    cfg = parse_config({
        "daemon": {"state_dir": str(tmp_path), "metrics_listen": "127.0.0.1:0"},
        "probe": {"interval": "50ms", "jitter": "5ms", "count": 5, "packet_interval": "1ms",
                  "timeout": "100ms"},
        "baseline": {"min_samples": 10, "recent": 3, "loss_window": 5},
        "peers": [{"name": "tokyo-1", "address": "198.18.0.2"}]})

    async def main():
        d = Daemon(cfg, cfg.peers, prober=prober, reflector=NoReflector())
        task = asyncio.create_task(d.run())
        await asyncio.sleep(1.5)
        phase["lossy"] = True
        await asyncio.sleep(1.0)
        host, port = d.metrics_address
        get = lambda p: urllib.request.urlopen(f"http://{host}:{port}{p}", timeout=5).read().decode()  # noqa: E731
        metrics = await asyncio.to_thread(get, "/metrics")
        health = json.loads(await asyncio.to_thread(get, "/healthz"))
        d.stop_event.set()
        await task
        return metrics, health

    metrics, health = asyncio.run(main())
    assert health["ok"] and health["peers"] == 1
    from prometheus_client.parser import text_string_to_metric_families

    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(metrics) for s in fam.samples}
    d_host = socket.gethostname().split(".")[0]  # no hostname in the config: the host's own
    peer = (("dst_host", "tokyo-1"), ("dst_site", ""), ("method", "stamp"), ("peer", "tokyo-1"),
            ("src_host", d_host), ("src_site", ""))
    assert samples[("wanprobe_rtt_seconds", tuple(sorted(peer + (("stat", "p50"),))))] == 0.06
    assert samples[("wanprobe_loss_ratio", tuple(sorted(peer + (("direction", "round_trip"),))))] == 0.2
    assert samples[("wanprobe_findings", (("severity", "critical"),))] == 1.0
    reports = list((tmp_path / "reports").glob("*.json"))
    assert len(reports) == 1, reports
    doc = json.loads(reports[0].read_text())
    assert doc["schema_version"] and doc["peer"]["name"] == "tokyo-1"
    f = doc["findings"][0]
    assert f["id"] == "path.loss_regression" and "tokyo-1" in f["title"]
    # the pooled window (5 sessions) when the first 20 % session made it significant
    assert f["evidence"]["current"] > 0.03 and f["evidence"]["baseline"] == 0.0
    st = Store(cfg.db_path)
    assert st.count("probes") >= 20 and st.findings("tokyo-1")[0]["report_path"] == str(reports[0])
    st.close()


def test_a_failing_result_handler_never_ends_a_peer_loop():
    class BrokenSink(Sink):
        def probe_done(self, peer, method, ts, doc):
            super().probe_done(peer, method, ts, doc)
            raise ValueError("bug in result handling")

    async def prober(peer, method, s):
        return _doc()

    async def main():
        sink = BrokenSink()
        s = ProbeSettings(interval_s=0.05, jitter_s=0.0, count=1, timeout_s=0.1)
        sch = Scheduler(sink, prober, probe=s, throughput=ThroughputSettings())
        sch.apply(PEERS[:1], s, ThroughputSettings())
        await asyncio.sleep(0.6)
        await sch.stop()
        return sink, sch

    sink, sch = asyncio.run(main())
    assert len(sink.done) >= 5 and sch.delivery_errors == len(sink.done)


@pytest.mark.slow
def test_sessions_of_many_peers_start_on_a_shared_grid():
    """200 peers at a 1 s interval: sessions start on the 50 ms grid, so they share loop
    wake-ups (at most 20 distinct start slots per second instead of ~200)."""
    starts: list[float] = []

    async def prober(peer, method, s):
        starts.append(asyncio.get_running_loop().time())
        return _doc()

    async def main():
        settings = ProbeSettings(interval_s=1.0, jitter_s=0.1, count=1, packet_interval_s=0.01,
                                 timeout_s=0.5)
        sch = Scheduler(Sink(), prober, probe=settings, throughput=ThroughputSettings())
        sch.apply(tuple(Peer(f"p{i}", f"198.18.1.{i + 1}") for i in range(200)), settings,
                  ThroughputSettings())
        await asyncio.sleep(2.5)
        await sch.stop()

    asyncio.run(main())
    assert len(starts) >= 300, len(starts)
    # sessions that start within 2 ms of each other shared one wake-up of the loop (a loaded
    # host may run the loop late, so the grid points themselves are not asserted)
    ordered = sorted(starts)
    wakeups = 1 + sum(1 for a, b in zip(ordered, ordered[1:], strict=False) if b - a > 0.002)
    print(f"\n{len(starts)} sessions in {wakeups} wake-ups")
    assert wakeups <= 2.5 / 0.05 + 5, wakeups


class FakeStampProber:
    """Stands in for daemon/prober.py's MeshProber: records what the scheduler hands it and
    reports one result per peer through the callbacks the scheduler set."""

    def __init__(self):
        self.applied, self.closed = [], False
        self.on_done = self.on_failed = None

    def apply(self, peers, settings):
        self.applied.append(tuple(p.name for p in peers))
        for p in peers:
            (self.on_failed if p.name == "bad" else self.on_done)(
                p, 1.0, *(("send refused",) if p.name == "bad" else (_doc(),)))

    def close(self):
        self.closed = True


def test_stamp_to_numeric_peers_goes_to_the_stamp_prober_and_the_rest_to_tasks():
    peers = (Peer("num", "198.18.0.2"), Peer("bad", "198.18.0.5"),
             Peer("named", "peer.invalid"), Peer("mixed", "198.18.0.3", methods=("stamp", "tcp")))
    calls = []

    async def prober(peer, method, s):
        calls.append((peer.name, method))
        return _doc()

    async def main():
        sink, fake = Sink(), FakeStampProber()
        settings = ProbeSettings(interval_s=0.2, jitter_s=0.0, count=1, packet_interval_s=0.01,
                                 timeout_s=0.1)
        sch = Scheduler(sink, prober, probe=settings, throughput=ThroughputSettings(),
                        stamp_prober=fake)
        sch.apply(peers, settings, ThroughputSettings())
        await asyncio.sleep(0.5)
        assert {p.name for p in sch.peers} == {p.name for p in peers}  # throughput sees all
        sch.apply(peers[:1], settings, ThroughputSettings())
        await sch.stop()
        return sink, fake

    sink, fake = asyncio.run(main())
    assert fake.applied == [("num", "bad", "mixed"), ("num",)] and fake.closed
    assert {n for n, m in calls} == {"named", "mixed"}
    assert {m for n, m in calls if n == "mixed"} == {"tcp"}  # its stamp runs in the prober
    assert ("num", 1.0) in sink.done and ("mixed", 1.0) in sink.done
    assert sink.failed == [("bad", 1.0, "send refused")]
