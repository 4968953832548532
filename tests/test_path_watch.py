"""Reroute vs queueing (issue 16): the pure tracker on synthetic sessions, the findings it
feeds, and the metrics it exports."""

from __future__ import annotations

import random

import pytest

from wanprobe.daemon.metrics import DaemonMetrics
from wanprobe.diagnose.context import Context, PathChange
from wanprobe.diagnose.engine import first
from wanprobe.diagnose.path_findings import step_impact
from wanprobe.diagnose.path_watch import PathEvent, PathWatch


def path_finding(peer, address, ev, **beside):
    """The daemon's call: the engine's first answer on a path event."""
    return first(Context(path_event=PathChange(peer, address, ev, **beside)))


def sessions(rng, floor_ms, n, *, queue_ms=0.0, jitter_ms=0.05, count=20):
    """(min, p99) of ``n`` sessions of ``count`` RTTs: floor + small noise + exponential queue."""
    out = []
    for _ in range(n):
        rtts = sorted(floor_ms + abs(rng.gauss(0, jitter_ms))
                      + (rng.expovariate(1 / queue_ms) if queue_ms else 0.0) for _ in range(count))
        out.append((rtts[0], rtts[int(0.99 * (count - 1))]))
    return out


def feed(watch, rows, peer="p"):
    events = []
    for i, (lo, p99) in enumerate(rows):
        events += [(i, e) for e in watch.observe(peer, lo, p99)]
    return events


@pytest.mark.parametrize("seed", range(5))
def test_floor_step_is_one_reroute(seed):
    rng = random.Random(seed)
    watch = PathWatch()
    # the session during the cut: replies of its first packets came back on the new route
    straddle = [(20 + 47.5 + rng.random() * 0.05, 95.2)]
    rows = sessions(rng, 40, 30) + straddle + sessions(rng, 95, 40)
    events = feed(watch, rows)
    assert [e.event for _, e in events] == ["rerouted"]
    i, ev = events[0]
    assert i == 31 + watch.s.recent - 1   # as soon as the step has held for `recent` sessions
    assert ev.old_floor_ms == pytest.approx(40, abs=0.1) and ev.new_floor_ms == pytest.approx(95, abs=0.1)
    assert watch.current("p")[0] == pytest.approx(95, abs=0.1)


@pytest.mark.parametrize("seed", range(5))
def test_spread_rise_is_queueing_not_reroute(seed):
    rng = random.Random(seed)
    watch = PathWatch()
    rows = sessions(rng, 40, 30) + sessions(rng, 40, 40, queue_ms=15) + sessions(rng, 40, 30)
    events = [e.event for _, e in feed(watch, rows)]
    assert events == ["queueing", "queueing_cleared"]


def test_single_outlier_session_and_noise_give_nothing():
    rng = random.Random(7)
    rows = sessions(rng, 40, 30)
    rows[20] = (40.1, 120.0)       # one session with a burst
    rows[25] = (70.0, 70.5)        # one session whose replies all came late
    assert feed(PathWatch(), rows + sessions(rng, 40, 30)) == []


def test_step_down_is_a_reroute_too():
    rng = random.Random(3)
    events = feed(PathWatch(), sessions(rng, 95, 20) + sessions(rng, 40, 10))
    assert [e.event for _, e in events] == ["rerouted"]
    assert events[0][1].new_floor_ms < events[0][1].old_floor_ms


def test_finding_and_impact():
    ev = PathEvent("tokyo", "rerouted", 40.0, 95.0, 0.2, 0.3, 4.0, 2.0, 5)
    f = path_finding("tokyo", "198.18.2.1", ev, hops_before=["a", "b"], hops_after=["a", "c"])
    assert f.id == "path.rerouted" and "40.00 → 95.00 ms" in f.title
    step = f.evidence["training_step"]
    # a flat ring pays the RTT per latency-bound phase: a longer RTT costs time, never saves it
    assert step["allreduce_s_after"] > step["allreduce_s_before"] > 0 and step["link_assumed"]
    assert f.evidence["hops_after"] == ["a", "c"]
    same = step_impact(40.0, 40.0, 1e9)
    assert same["increase_ratio"] == 0 and not same["link_assumed"]
    q = path_finding("tokyo", "x", PathEvent("tokyo", "queueing", 40, 40.3, 0.2, 30, 4, 2, 5))
    assert q.id == "path.queueing"


def test_metrics_names_and_labels():
    from wanprobe.mesh.peer import Peer

    m = DaemonMetrics(site="tpe", host="h1")
    peer = Peer(name="tokyo", address="198.18.2.1", site="nrt")
    m.observe_path(peer, 95.0, 0.5)
    m.path_event(peer, "rerouted")
    text = m.exposition().decode()
    assert ('wanprobe_path_rtt_floor_seconds{dst_host="tokyo",dst_site="nrt",peer="tokyo",'
            'src_host="h1",src_site="tpe"} 0.095') in text
    assert "wanprobe_path_rtt_spread_seconds{" in text
    assert 'wanprobe_path_events_total{dst_host="tokyo",dst_site="nrt",event="rerouted"' in text
    m.forget_peer("tokyo")
    assert "tokyo" not in m.exposition().decode()


def test_config_flows_default_override_and_bounds(tmp_path):
    from wanprobe.daemon.config import parse_config
    from wanprobe.errors import ConfigInvalid

    doc = {"daemon": {"state_dir": str(tmp_path)}, "probe": {"flows": 4},
           "peers": [{"name": "a", "address": "192.0.2.1"},
                     {"name": "b", "address": "192.0.2.2", "flows": 1}]}
    cfg = parse_config(doc)
    assert cfg.probe.flows == 4 and [p.flows for p in cfg.peers] == [4, 1]
    doc["peers"][1]["flows"] = 0
    with pytest.raises(ConfigInvalid, match=r"peers\[1\]\.flows"):
        parse_config(doc)


def test_fingerprint_series_are_bounded_and_follow_the_paths():
    from wanprobe.daemon.metrics import MAX_FINGERPRINTS

    m = DaemonMetrics()
    paths = [{"fingerprint": f"{i:08x}", "flows": i + 1, "loss_ratio": 0.0,
              "rtt_ms": {"p50": 40.0, "p99": 41.0}} for i in range(MAX_FINGERPRINTS + 4)]
    m.observe_fingerprints("tokyo", paths)
    text = m.exposition().decode()
    assert text.count("wanprobe_path_fingerprint_flows{") == MAX_FINGERPRINTS
    assert 'fingerprint="00000000"' not in text   # the least used are dropped
    m.observe_fingerprints("tokyo", paths[-1:])       # the route changed: one path left
    text = m.exposition().decode()
    assert text.count("wanprobe_path_fingerprint_flows{") == 1


@pytest.mark.parametrize("seed", range(5))
def test_busy_host_noise_around_a_reroute_is_not_queueing(seed):
    # seen in the lab under load: a noisy 40 ms path, the cut, a calm first few sessions on the
    # 95 ms path, then the same noise again: one reroute, no queueing
    rng = random.Random(seed)
    rows = (sessions(rng, 40, 20, queue_ms=3) + sessions(rng, 95, 6, queue_ms=1)
            + sessions(rng, 95, 30, queue_ms=3))
    assert [e.event for _, e in feed(PathWatch(), rows)] == ["rerouted"]
