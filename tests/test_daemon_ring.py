"""The daemon's scheduled ring test (issue 39): the ``[ring]`` table and its one-line errors,
the schedule (interval, jitter, windows) and its exclusivity with scheduled throughput tests,
a failing ring recorded as a failure while the daemon runs on, shutdown cancelling a running
ring, the history's ``ring_runs`` and the ring metrics under ``promtool check metrics``.
Fakes and injected clocks only: no network (tests/test_ring_lab.py runs real rings)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import replace

import pytest

from wanprobe.daemon import ring_schedule
from wanprobe.daemon.config import ProbeSettings, ThroughputSettings, parse_config, parse_window
from wanprobe.daemon.config_ring import RingSettings
from wanprobe.daemon.metrics import DaemonMetrics
from wanprobe.daemon.ring_metrics import RingMetrics
from wanprobe.daemon.ring_schedule import RingSchedule
from wanprobe.daemon.scheduler import Scheduler
from wanprobe.errors import ConfigInvalid, ProbeError
from wanprobe.history.store import SCHEMA_VERSION, Store
from wanprobe.mesh.peer import Peer
from wanprobe.ring.model import Edge, RingResult

KEY = "0123456789abcdef0123"
HOSTS = ["198.18.0.1", "198.18.0.2", "tokyo-1.example"]


def config(ring: dict, *, key: bool = True, **daemon):
    d = {"state_dir": "/var/lib/wanprobe", **({"hmac_key": KEY} if key else {}), **daemon}
    return parse_config({"daemon": d, "ring": ring,
                         "peers": [{"name": "t1", "address": "198.18.0.2"}]})


def problems(ring: dict, **kw) -> list[str]:
    with pytest.raises(ConfigInvalid) as info:
        config(ring, **kw)
    return info.value.problems


# -- config ------------------------------------------------------------------------------------

def test_ring_is_off_by_default_with_the_documented_defaults():
    s = config({}, key=False).ring
    assert s == RingSettings() and not s.enabled and s.hosts == ()
    assert (s.interval_s, s.duration_s, s.omit_s, s.streams, s.site_rtt_ms, s.measure_best,
            s.port, s.windows) == (86400.0, 5.0, 1.0, 4, 5.0, True, 862, ())


def test_full_ring_table_parses_units_and_windows():
    s = config({"enabled": True, "hosts": HOSTS, "interval": "6h", "duration": "3s",
                "omit": "500ms", "streams": 8, "site_rtt": "2ms", "measure_best": False,
                "port": 8620, "windows": ["01:00-05:00", "22:00-23:00"]}).ring
    assert s.enabled and s.hosts == tuple(HOSTS) and s.interval_s == 6 * 3600
    assert (s.duration_s, s.omit_s, s.streams, s.site_rtt_ms, s.measure_best, s.port) == (
        3.0, 0.5, 8, 2.0, False, 8620)
    assert s.windows == (parse_window("01:00-05:00"), parse_window("22:00-23:00"))
    # off, a ring needs neither a key nor two hosts yet
    assert config({"hosts": ["198.18.0.1"]}, key=False).ring.hosts == ("198.18.0.1",)


@pytest.mark.parametrize(("ring", "key", "want"), [
    ({"enabled": True, "hosts": HOSTS}, False, "ring.enabled: needs daemon.hmac_key_file"),
    ({"enabled": True, "hosts": ["198.18.0.1"]}, True, "ring.hosts: a ring needs at least two"),
    ({"enabled": True}, True, "ring.hosts: a ring needs at least two hosts"),
    ({"hosts": ["198.18.0.1", "198.18.0.01"]}, True, "ring.hosts[1]: '198.18.0.01' is not an"),
    ({"hosts": ["2001:db8::1", "2001:DB8:0::1"]}, True,
     "ring.hosts[1]: '2001:DB8:0::1' is listed twice (also ring.hosts[0])"),
    ({"hosts": ["Tokyo-1", "tokyo-1."]}, True, "ring.hosts[1]: 'tokyo-1.' is listed twice"),
    ({"hosts": ["a b", "c"]}, True, "ring.hosts[0]: 'a b' is not an IP address or a host name"),
    ({"hosts": "198.18.0.1,198.18.0.2"}, True, "ring.hosts[0]: '198.18.0.1,198.18.0.2' is not"),
    ({"hosts": [1, 2]}, True, "ring.hosts: must be a list of strings"),
    ({"hosts": [f"198.18.1.{i}" for i in range(65)]}, True, "ring.hosts: a ring of at most 64"),
    ({"interval": "30m"}, True, "ring.interval: 1800 s is too often: at least 1h"),
    ({"interval": "soon"}, True, "ring.interval: "),
    ({"omit": "11s"}, True, "ring.omit: 11 s is over the 10 s a reflector accepts"),
    ({"enabled": True, "hosts": HOSTS, "duration": "60s"}, True,
     "ring.duration: with ring.omit, 61 s exceeds what a far end with this config accepts"),
    ({"enabled": True, "hosts": HOSTS, "streams": 65}, True, "ring.streams: 65 out of range"),
    ({"windows": ["1-5"]}, True, "ring.windows[0]: time window '1-5'"),
    ({"measure_best": "yes"}, True, "ring.measure_best: must be true or false"),
    ({"host": ["a", "b"]}, True, "ring.host: unknown key (known: duration, enabled, hosts,"),
])
def test_each_bad_ring_key_is_one_line_naming_it(ring, key, want):
    got = problems(ring, key=key)
    assert len(got) == 1 and got[0].startswith(want), got
    assert "\n" not in got[0]


def test_a_bad_key_file_is_not_also_blamed_on_the_ring(tmp_path):
    got = problems({"enabled": True, "hosts": HOSTS}, key=False,
                   hmac_key_file=str(tmp_path / "missing.key"))
    assert [p.split(":")[0] for p in got] == ["daemon.hmac_key_file"], got


def test_cli_check_refuses_a_ring_without_a_key_in_one_line_exit_2(tmp_path):
    path = tmp_path / "wanprobe.toml"
    path.write_text('[daemon]\nstate_dir = "/var/lib/wanprobe"\n[[peers]]\nname = "t1"\n'
                    'address = "198.18.0.2"\n[ring]\nenabled = true\n'
                    'hosts = ["198.18.0.1", "198.18.0.1"]\n')
    r = subprocess.run([sys.executable, "-m", "wanprobe", "daemon", "--config", str(path),
                        "--check"], capture_output=True, text=True, timeout=60)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert len(lines) == 2, lines   # the duplicate (not again as "fewer than two"), the key
    assert "ring.hosts[1]" in lines[0] and "ring.enabled" in lines[1]


# -- a result to record ------------------------------------------------------------------------

def result(rate: float = 2e9) -> RingResult:
    def edge(a, b, bps, alone, wan):
        return Edge(a, b, bps, alone, bps / 4, 4, bps, wan, 0.0)
    h1, h2, h3 = HOSTS
    return RingResult(
        order=tuple(HOSTS), edges=(edge(h1, h2, 8e9, None, False), edge(h2, h3, rate, 4e9, True),
                                   edge(h3, h1, rate, 5e9, True)),
        ring_bits_per_second=rate, ring_nccl_bits_per_second=rate, crossings=2,
        shared_bottlenecks=(((h2, h3), (h3, h1)),), sites=((h1, h2), (h3,)),
        rtt_ms=((None, 1.0, 30.0), (1.0, None, 30.0), (30.0, 30.0, None)),
        best_order=tuple(HOSTS), best_crossings=2, best_ring_bits_per_second=rate,
        best_ring_nccl_bits_per_second=rate, notes=("n",))


# -- history -----------------------------------------------------------------------------------

def test_ring_runs_round_trip_through_the_history_and_expire_with_it(tmp_path):
    st = Store(tmp_path / "h.sqlite3")
    st.add_ring(1000.0, tuple(HOSTS), result().to_json(), None, 31.5)
    st.add_ring(2000.0, tuple(HOSTS), None, "edge 198.18.0.2 -> tokyo-1.example: refused", 2.0)
    st.flush()
    rows = st.rings()
    assert [(r["ts"], r["ok"], r["hosts"], r["error"]) for r in rows] == [
        (1000.0, True, HOSTS, None),
        (2000.0, False, HOSTS, "edge 198.18.0.2 -> tokyo-1.example: refused")]
    assert RingResult.from_json(rows[0]["doc"]) == result()
    assert rows[0]["ring_bits_per_second"] == 2e9 and rows[0]["duration_s"] == 31.5
    assert rows[1]["doc"] is None and rows[1]["ring_bits_per_second"] is None
    assert [r["ts"] for r in st.rings(limit=1)] == [2000.0]
    assert [r["ts"] for r in st.rings(since=1500.0)] == [2000.0]
    # kept as long as throughput tests: downsampled_s, not raw_s
    assert st.expire(now=2500.0, raw_s=100.0, downsampled_s=1000.0) == 1
    assert st.count("ring_runs") == 1
    st.close()


def test_a_version_2_history_gains_the_ring_table(tmp_path):
    path = tmp_path / "h.sqlite3"
    Store(path).close()
    db = sqlite3.connect(path)
    db.executescript("DROP TABLE ring_runs; UPDATE meta SET value = '2' "
                     "WHERE key = 'schema_version';")
    db.close()
    st = Store(path)
    st.add_ring(1.0, ("a", "b"), None, "x")
    st.flush()
    assert st.count("ring_runs") == 1 and SCHEMA_VERSION == 3
    st.close()
    db = sqlite3.connect(path)
    assert db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("3",)
    db.close()


# -- the schedule ------------------------------------------------------------------------------

class Sink:
    def __init__(self):
        self.tput = []

    def probe_done(self, *args):
        pass

    probe_failed = probe_done

    def throughput_done(self, peer, ts, doc, error):
        self.tput.append((peer.name, ts, error))


async def wait_for(cond, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def scheduler(tput_fn=None, interval_s=3600.0):
    async def prober(peer, method, s):
        return {}
    ts = ThroughputSettings(enabled=tput_fn is not None, interval_s=interval_s, duration_s=0.3)
    return Scheduler(Sink(), prober, probe=ProbeSettings(interval_s=600), throughput=ts,
                     throughput_fn=tput_fn), ts


def ring_on(**kw) -> RingSettings:
    return RingSettings(**{"enabled": True, "hosts": tuple(HOSTS), **kw})


def test_plan_jitter_and_windows_on_an_injected_clock():
    import random

    t0 = time.mktime((2024, 6, 3, 3, 0, 0, 0, 0, -1))   # 03:00 local time, no DST change near
    day = 86400.0
    s = ring_on(interval_s=day, windows=(parse_window("01:00-05:00"),))
    sch, _ = scheduler()
    ring = RingSchedule(lambda: s, lambda: b"k" * 20, sch, lambda *a: None, clock=lambda: t0,
                        rng=random.Random(7))
    assert ring.due(t0) is None, "the first run waits for a random point of the first interval"
    assert t0 <= ring.next_at <= t0 + day
    ring.next_at = t0
    assert ring.due(t0) == s
    assert ring.due(t0 + 3 * 3600) is None, "06:00 is outside the window"
    assert ring.due(t0 + 22 * 3600) == s, "01:00 the next day is inside it"
    ring.last_run = t0
    plans = [ring.plan(s, t0) for _ in range(200)]
    assert all(t0 + 0.95 * day <= p <= t0 + day for p in plans)
    assert max(plans) - min(plans) > 0.03 * day, "jitter: not the same instant every day"
    for off in (ring_on(enabled=False), ring_on(hosts=("198.18.0.1",))):
        assert RingSchedule(lambda o=off: o, lambda: None, sch, lambda *a: None).due(t0) is None


def test_a_ring_waits_for_a_running_throughput_test():
    calls, cancelled_at_start = [], []   # stopping the daemon sets the event later

    async def main():
        sch, _ = scheduler()
        ring = RingSchedule(ring_on, lambda: b"k" * 20, sch, lambda *a: None, run_fn=lambda o: (
            cancelled_at_start.append(o.cancel is None or o.cancel.is_set()), calls.append(o),
            result())[-1])
        ring.next_at = 0.0
        task = asyncio.create_task(ring.loop(tick_s=0.02))
        async with sch.heavy_lock:       # what throughput_once holds for its test
            await asyncio.sleep(0.3)
            assert calls == [] and ring.due(time.time()) is None
        await wait_for(lambda: calls)
        task.cancel()
        return calls

    calls = asyncio.run(main())
    assert len(calls) == 1 and calls[0].hosts == tuple(HOSTS) and calls[0].hmac_key == b"k" * 20
    assert cancelled_at_start == [False]


def test_ring_and_scheduled_throughput_tests_never_overlap():
    """A ring holds the heavy-test lock for its whole run: the throughput loop starts nothing
    (and queues nothing) meanwhile, then runs its due test once the ring is over."""
    spans, release, seen = [], threading.Event(), {}

    def tput(peer, s):
        t = time.monotonic()
        time.sleep(0.2)
        spans.append(("tput", t, time.monotonic()))
        return {"bits_per_second": 1e9, "bytes_sent": 10, "bytes_received": 10}

    async def main():
        sch, ts = scheduler(tput)
        sch.apply((Peer("p1", "198.18.0.2"),), ProbeSettings(interval_s=600), ts)

        def ring_fn(opts):
            t = time.monotonic()
            seen["ring_running"] = sch.ring_running
            release.wait(10)
            spans.append(("ring", t, time.monotonic()))
            return result()

        ring = RingSchedule(ring_on, lambda: b"k" * 20, sch, lambda *a: None, run_fn=ring_fn)
        ring.next_at = 0.0
        task = asyncio.create_task(ring.loop(tick_s=0.01))
        await asyncio.sleep(1.4)          # the throughput loop's first tick (1 s) found it busy
        assert sch.heavy_lock.locked() and sch.ring_running and sch.sink.tput == []
        release.set()
        await wait_for(lambda: sch.sink.tput)
        task.cancel()
        await sch.stop()
        return sch

    sch = asyncio.run(main())
    assert seen["ring_running"] and not sch.ring_running
    assert [k for k, *_ in sorted(spans, key=lambda s: s[1])] == ["ring", "tput"], spans
    (_, _, ring_end), (_, tput_start, _) = sorted(spans, key=lambda s: s[1])
    assert tput_start >= ring_end, "a throughput test started while the ring ran"


def test_a_failing_ring_is_recorded_and_the_loop_goes_on():
    recorded = []

    def record(ts, s, res, error, took_s):
        recorded.append((res, error))
        if len(recorded) == 2:
            raise RuntimeError("bug in recording")    # logged; the loop goes on

    def refused(opts):
        raise ProbeError("edge 198.18.0.2 -> tokyo-1.example: refused: busy\nsecond line")

    async def main():
        sch, _ = scheduler()
        ring = RingSchedule(lambda: ring_on(interval_s=0.05), lambda: b"k" * 20, sch, record,
                            run_fn=refused)
        ring.next_at = 0.0
        task = asyncio.create_task(ring.loop(tick_s=0.01))
        await wait_for(lambda: len(recorded) >= 3)
        alive = not task.done()
        task.cancel()
        return alive, ring

    alive, ring = asyncio.run(main())
    assert alive and len(recorded) >= 3 and ring.runs >= 3
    assert all(r is None for r, _ in recorded)
    assert recorded[0][1] == "edge 198.18.0.2 -> tokyo-1.example: refused: busy second line"


def test_cancelling_a_running_ring_sets_its_cancel_event_at_once():
    got = {}

    def blocking(opts):
        got["set"] = opts.cancel.wait(10)
        got["at"] = time.monotonic()
        raise ProbeError("ring test cancelled")

    async def main():
        sch, _ = scheduler()
        ring = RingSchedule(ring_on, lambda: b"k" * 20, sch, lambda *a: None, run_fn=blocking)
        task = asyncio.create_task(ring.run_once(ring_on()))
        await asyncio.sleep(0.1)
        assert ring.running and sch.heavy_lock.locked()
        t = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not sch.heavy_lock.locked() and not sch.ring_running
        await wait_for(lambda: "at" in got)
        return t

    t = asyncio.run(main())
    assert got["set"] and got["at"] - t < 0.5


def test_services_ring_calls_close_when_cancel_is_set(monkeypatch):
    """services/ring._at_once: ``RingOptions.cancel`` closes every call of a run, as Ctrl-C."""
    from wanprobe.services import ring as service

    closed = []

    class Hanging:
        def __init__(self, addr, port, key):
            self.addr, self.gone = addr, threading.Event()

        def request(self, op, body, within):
            self.gone.wait(10)
            raise ConnectionError("closed")

        def close(self):
            closed.append(self.addr)
            self.gone.set()

    monkeypatch.setattr(service, "RingCall", Hanging)
    cancel = threading.Event()
    opts = service.RingOptions(hosts=("a", "b"), cancel=cancel)
    threading.Timer(0.2, cancel.set).start()
    t = time.monotonic()
    with pytest.raises(ProbeError, match="ring test cancelled"):
        service._at_once(opts, [("198.18.0.1", "op", {}, 30.0), ("198.18.0.2", "op", {}, 30.0)])
    assert time.monotonic() - t < 1.0 and sorted(closed) == ["198.18.0.1", "198.18.0.2"]
    with pytest.raises(ProbeError, match="cancelled"):   # a run asked after the cancel: none
        service._at_once(opts, [("198.18.0.1", "op", {}, 30.0)])
    assert service.RingOptions(hosts=("a",), cancel=threading.Event()) == service.RingOptions(
        hosts=("a",))


# -- metrics -----------------------------------------------------------------------------------

def samples(text: str) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_ring_metrics_pass_promtool_and_show_only_what_was_measured():
    from test_daemon_promtool import promtool_check

    m = DaemonMetrics(site="taipei", host="tpe-1")
    on = [False]
    ring = RingMetrics(lambda: on[0])
    m.registry.register(ring)
    assert "wanprobe_ring" not in m.exposition().decode(), "no ring configured: no series"
    on[0] = True
    got = samples(m.exposition().decode())
    assert {k: v for k, v in got.items() if k[0].startswith("wanprobe_ring")} == {
        ("wanprobe_ring_runs_total", (("result", "ok"),)): 0.0,
        ("wanprobe_ring_runs_total", (("result", "failed"),)): 0.0}
    ring.failed()
    ring.observe(1.7e9, result())
    text = m.exposition().decode()
    got = samples(text)
    h1, h2, h3 = HOSTS

    def edge(a, b, run):
        return got.get(("wanprobe_ring_edge_bytes_per_second",
                        (("from", a), ("run", run), ("to", b))))
    assert got[("wanprobe_ring_bytes_per_second", ())] == 2e9 / 8
    assert got[("wanprobe_ring_best_bytes_per_second", ())] == 2e9 / 8
    assert (edge(h1, h2, "together"), edge(h2, h3, "together"), edge(h2, h3, "alone"),
            edge(h3, h1, "alone")) == (1e9, 2.5e8, 5e8, 6.25e8)
    assert edge(h1, h2, "alone") is None, "an edge inside a site is not run alone"
    assert got[("wanprobe_ring_shared_bottlenecks", ())] == 1
    assert got[("wanprobe_ring_last_run_timestamp_seconds", ())] == 1.7e9
    assert got[("wanprobe_ring_runs_total", (("result", "failed"),))] == 1
    assert got[("wanprobe_ring_runs_total", (("result", "ok"),))] == 1
    rc, said = promtool_check(text)
    assert rc == 0 and said == "", said
    # a run whose ring rate nobody measured (an edge failed): no series, not a stale one
    ring.observe(1.8e9, replace(result(), ring_bits_per_second=None,
                                best_ring_bits_per_second=None))
    got = samples(m.exposition().decode())
    assert ("wanprobe_ring_bytes_per_second", ()) not in got
    assert ("wanprobe_ring_best_bytes_per_second", ()) not in got


# -- the daemon --------------------------------------------------------------------------------

class NoReflector:
    async def start(self, listen):
        pass

    async def close(self):
        pass


def test_daemon_records_a_failing_ring_runs_on_and_cancels_a_ring_when_stopping(
        tmp_path, monkeypatch):
    """A ring refused by a host is one failure in the history and the metrics, the daemon
    stays healthy and runs the next ring; stopping it mid-ring sets the ring's cancel at
    once and the daemon exits 0 within its stop budget."""
    from wanprobe.daemon.main import STOP_BUDGET_S, Daemon

    monkeypatch.setattr(ring_schedule, "TICK_S", 0.02)
    cfg = parse_config({
        "daemon": {"state_dir": str(tmp_path), "metrics_listen": "127.0.0.1:0", "hmac_key": KEY},
        "probe": {"interval": "200ms", "jitter": "10ms", "count": 2, "packet_interval": "1ms",
                  "timeout": "100ms"},
        "counters": {"enabled": False},
        "ring": {"enabled": True, "hosts": HOSTS},
        "peers": [{"name": "tokyo-1", "address": "198.18.0.2"}]})
    cancelled = {}

    def refused(opts):
        raise ProbeError("edge 198.18.0.2 -> tokyo-1.example: refused: busy")

    def hangs(opts):
        cancelled["set"] = opts.cancel.wait(10)
        cancelled["at"] = time.monotonic()
        raise ProbeError("ring test cancelled")

    async def prober(peer, method, s):
        return {"rtt_ms": {"min": 30.0, "p50": 30.0}, "loss": {"sent": 2, "received": 2}}

    async def main():
        d = Daemon(cfg, cfg.peers, prober=prober, reflector=NoReflector())
        task = asyncio.create_task(d.run())
        await wait_for(lambda: getattr(d, "ring", None) is not None)
        for fn, runs in ((refused, 1), (lambda opts: result(), 2)):
            d.ring.run_fn, d.ring.next_at = fn, 0.0
            await wait_for(lambda r=runs: d.ring.runs == r)
        assert not task.done()
        host, port = d.metrics_address

        def get(path):
            return urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=5).read()
        metrics = (await asyncio.to_thread(get, "/metrics")).decode()
        health = json.loads(await asyncio.to_thread(get, "/healthz"))
        d.ring.run_fn, d.ring.next_at = hangs, 0.0
        await wait_for(lambda: d.ring.running)
        t = time.monotonic()
        d.stop_event.set()
        rc = await task
        await wait_for(lambda: "at" in cancelled)
        return rc, time.monotonic() - t, metrics, health

    rc, stop_s, metrics, health = asyncio.run(main())
    assert rc == 0 and health["ok"] and stop_s < STOP_BUDGET_S + 1.0
    assert cancelled["set"]
    got = samples(metrics)
    assert got[("wanprobe_ring_runs_total", (("result", "failed"),))] == 1
    assert got[("wanprobe_ring_runs_total", (("result", "ok"),))] == 1
    assert got[("wanprobe_ring_bytes_per_second", ())] == 2e9 / 8
    st = Store(cfg.db_path)
    rows = st.rings()
    st.close()
    assert [(r["ok"], r["error"]) for r in rows] == [
        (False, "edge 198.18.0.2 -> tokyo-1.example: refused: busy"), (True, None)]
    assert RingResult.from_json(rows[1]["doc"]) == result()
