"""The daemon's scheduled throughput tests, driven by a simulated clock through the scheduler's
own decision (Scheduler.throughput_due): spread over the 168 hours of the week so every hour has
a test within the look-back, each peer's bytes per day under its budget, only inside the allowed
windows, the spread kept across a restart, and the config refused where the far end would
refuse the tests."""

from __future__ import annotations

import pytest

from wanprobe.daemon.config import ProbeSettings, ThroughputSettings, parse_config
from wanprobe.daemon.config_fields import parse_window
from wanprobe.daemon.scheduler import Scheduler, _Session, in_windows
from wanprobe.daemon.throughput_spread import cost_per_peer_per_day, reachable_hours
from wanprobe.errors import ConfigInvalid
from wanprobe.mesh.peer import Peer
from wanprobe.windows.profile import HOUR_S, WEEK_S, hour_of_week

MONDAY = 1704067200.0   # 2024-01-01 00:00 UTC
GiB = 2**30


class _Sink:
    def throughput_done(self, *a):
        pass


def simulate(settings: ThroughputSettings, *, days: float, peers=("p1", "p2"), start=MONDAY,
             step_s=300.0, history=None, moved=GiB // 4) -> tuple[Scheduler, list[tuple[str, float]]]:
    """Run the scheduler's decision every ``step_s``; a due test 'runs' at once and moves
    ``moved`` bytes (what throughput_once would record)."""
    now = [start]
    sch = Scheduler(_Sink(), None, probe=ProbeSettings(), throughput=settings,
                    throughput_fn=lambda p, s: {}, clock=lambda: now[0], test_history=history)
    sch.sessions = {n: _Session(Peer(n, "198.18.0.2"), None) for n in peers}
    sch._seed_tests(sch.peers)
    tests = []
    while now[0] < start + days * 86400:
        peer = sch.throughput_due(now[0])
        if peer is not None:
            sch.last_throughput[peer.name] = now[0]
            sch.ledger.record(peer.name, now[0], moved, True)
            tests.append((peer.name, now[0]))
        now[0] += step_s
    return sch, tests


def test_every_hour_of_the_week_gets_a_test_within_the_lookback():
    s = ThroughputSettings(enabled=True)                  # defaults: every 2 h, 14 days
    sch, tests = simulate(s, days=14)
    end = MONDAY + 14 * 86400
    for peer in ("p1", "p2"):
        hours = {hour_of_week(t) for p, t in tests if p == peer}
        assert hours == set(range(168)), f"{peer}: {168 - len(hours)} hours never tested"
        assert min(sch.ledger.coverage(peer, end - 1)) >= 1
        per_day = [sum(1 for p, t in tests if p == peer and d * 86400 <= t - MONDAY < (d + 1) * 86400)
                   for d in range(14)]
        assert max(per_day) <= 12, per_day              # one per interval, never more
        times = [t for p, t in tests if p == peer]
        assert min(b - a for a, b in zip(times, times[1:], strict=False)) >= s.interval_s
    # what it replaces: a fixed 6 h interval tests 28 of the 168 hours, week after week
    assert len({hour_of_week(MONDAY + k * 6 * HOUR_S) for k in range(4 * 14)}) == 28


def test_per_peer_budget_bounds_bytes_per_day():
    s = ThroughputSettings(enabled=True, interval_s=HOUR_S, max_bytes_per_test=GiB,
                           budget_bytes_per_peer_per_day=3 * GiB, budget_bytes_per_day=100 * GiB)
    _, tests = simulate(s, days=3, peers=("p1",), moved=GiB)
    times = [t for _, t in tests]
    assert times, "no test ran"
    for t in times:   # any 24 h holds at most three 1 GiB tests
        assert sum(1 for u in times if t - 86400 < u <= t) <= 3
    assert cost_per_peer_per_day(HOUR_S, GiB, 3 * GiB) == 3 * GiB
    assert cost_per_peer_per_day(2 * HOUR_S, 2 * GiB, 100 * GiB) == 24 * GiB


def test_windows_limit_the_hours_and_do_not_stall_the_spread():
    w = parse_window("01:00-05:00")                        # local time of this host
    s = ThroughputSettings(enabled=True, windows=(w,))
    reach = reachable_hours(lambda ts: in_windows((w,), ts), MONDAY)
    assert len(reach) == 7 * 4
    _, tests = simulate(s, days=14, peers=("p1",))
    hours = {hour_of_week(t) for _, t in tests}
    assert all(in_windows((w,), t) for _, t in tests)
    assert hours == reach                                  # every reachable hour, none else


def test_the_spread_survives_a_restart():
    s = ThroughputSettings(enabled=True)
    first, tests = simulate(s, days=7, peers=("p1",))
    rows = [(t, GiB // 4, True) for _, t in tests]
    later = MONDAY + 7 * 86400
    second, more = simulate(s, days=7, peers=("p1",), start=later,
                            history=lambda peer, since: [r for r in rows if r[0] >= since])
    assert more[0][1] - tests[-1][1] >= s.interval_s      # no burst at start: spacing kept
    hours = {hour_of_week(t) for _, t in tests + more}
    assert hours == set(range(168))                         # week 2 filled what week 1 left
    assert second.ledger.coverage("p1", later + WEEK_S - 1) == [1] * 168


@pytest.mark.parametrize("extra,key", [
    ({"interval": "1m"}, "throughput.interval"),            # 60 tests/h > 12 per client
    ({"budget_per_peer_per_day": "60GiB"}, "throughput.budget_per_peer_per_day"),
    ({"duration": "90s"}, "throughput.duration"),
    ({"streams": 32, "max_streams": 16}, "throughput.streams"),
])
def test_config_refuses_tests_the_far_end_would_refuse(tmp_path, extra, key):
    doc = {"daemon": {"state_dir": str(tmp_path)}, "peers": [{"name": "p", "address": "198.18.0.2"}],
           "throughput": {"enabled": True, **extra}}
    with pytest.raises(ConfigInvalid) as ex:
        parse_config(doc)
    assert any(p.startswith(key) and "far end" in p for p in ex.value.problems), ex.value.problems
    doc["throughput"]["enabled"] = False                    # tests off: nothing to refuse
    parse_config(doc)


def test_first_tests_spread_over_the_first_interval():
    """Peers without history are not all due at start (a fleet restarted together would test
    in one burst, and in the same hours ever after)."""
    s = ThroughputSettings(enabled=True)
    sch, _ = simulate(s, days=0, peers=tuple(f"p{i}" for i in range(40)), history=lambda p, t: [])
    due_in = sorted(sch.last_throughput[f"p{i}"] + s.interval_s - MONDAY for i in range(40))
    assert all(0 <= d <= s.interval_s for d in due_in)
    assert due_in[-1] - due_in[0] > s.interval_s / 2, due_in
