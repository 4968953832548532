"""Issue 23's acceptance: a real Prometheus loaded with a generated 14-day history (``promtool
tsdb create-blocks-from openmetrics``) and a daemon store filled with the same history, where
tpe -> usw is fast at night (UTC) and at weekends and slow in the working hours, and tpe -> osa
was only tested in the first half of each day. From both sources: the profile recovers each
hour's rate within 10 %, the best window for a transfer that fits in the fast hours starts and
stays in them, a deadline that cannot be met is said so (exit 1); a pair that does not exist,
hours without data and a Prometheus that does not answer are one line and a non-zero exit."""

from __future__ import annotations

import json
import socket
import statistics
import time

import pytest
from conftest import require_tool
from windows_history import (
    HostPair,
    Shape,
    fill_store,
    generate,
    load_prometheus,
    openmetrics,
    stop,
    weekday_nights,
)

from wanprobe.cli import main
from wanprobe.history.store import Store

FAST = Shape(weekday_nights())
HALF_DAY = frozenset(h for h in range(168) if h % 24 < 12)
USW = (HostPair("tpe", "tpe-1", "usw", "usw-1"), HostPair("tpe", "tpe-2", "usw", "usw-2"))
OSA = HostPair("tpe", "tpe-1", "osa", "osa-1")
SHAPES = {USW[0]: FAST, USW[1]: FAST, OSA: Shape(weekday_nights(), test_hours=HALF_DAY)}
FITS = 5 * 3600 * FAST.fast_bps / 8          # five hours at the fast rate: fits in a weekday night


@pytest.fixture(scope="module")
def history():
    now = time.time()
    return now, generate(SHAPES, end_ts=now)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory, history):
    """A Prometheus on loopback whose TSDB holds the history (and the recorded series)."""
    prom, promtool = require_tool("prometheus"), require_tool("promtool")
    url, proc = load_prometheus(openmetrics(history[1], recorded_eval_s=90.0),
                                tmp_path_factory.mktemp("prometheus"), prometheus=prom,
                                promtool=promtool)
    try:
        yield url
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory, history):
    """tpe-1's daemon store with its part of the same history (peers usw-1 and osa-1)."""
    d = tmp_path_factory.mktemp("state")
    store = Store(d / "history.sqlite3")
    try:
        assert fill_store(store, history[1], "tpe-1") > 10000
    finally:
        store.close()
    return d


def wanprobe(capsys, *args: str) -> tuple[int, str, list[str]]:
    with pytest.raises(SystemExit) as ex:
        main(list(args))
    out = capsys.readouterr()
    return ex.value.code, out.out, [ln for ln in out.err.splitlines() if ln.strip()]


def fleet(capsys, url: str, *args: str, src="tpe", dst="usw"):
    return wanprobe(capsys, "fleet", "windows", "--prometheus", url, "--from-site", src,
                    "--to-site", dst, *args)


def rate_errors(doc: dict) -> list[float]:
    """|p50 / true rate - 1| for each hour of the week."""
    return [abs(b["p50_bits_per_second"] / FAST.bps(b["hour_of_week"]) - 1) for b in doc["profile"]]


def check_recovered(doc: dict, min_samples: int) -> None:
    errors = rate_errors(doc)
    assert max(errors) < 0.10, (max(errors), statistics.median(errors))
    print(f"rate error per hour: max {max(errors):.3%}, median {statistics.median(errors):.3%}")
    for b in doc["profile"]:
        h = b["hour_of_week"]
        assert b["samples"] >= min_samples and b["probe_sessions"] > 0, b
        assert b["rtt_p50_seconds"] == pytest.approx(FAST.rtt_s(h), rel=0.05), b
        assert b["loss_forward_ratio"] == pytest.approx(FAST.loss_forward(h), abs=0.001), b
    assert doc["hours_without_data"] == []


def check_best_window(doc: dict) -> None:
    best = doc["windows"][0]
    start, span = best["start_hour_of_week"], best["hours_spanned"]
    assert all((start + k) % 168 in FAST.fast_hours for k in range(span)), best
    assert best["duration_s"] == pytest.approx(5 * 3600, rel=0.10), best
    slow = [w for w in doc["windows"] if w["start_hour_of_week"] not in FAST.fast_hours]
    assert not slow, "every listed window starts in a fast hour"


@pytest.mark.lab
def test_prometheus_profile_recovers_each_hour_and_the_best_window(capsys, prometheus):
    code, out, err = fleet(capsys, prometheus, "--bytes", str(int(FITS)), "--series", "raw",
                           "--json", "--top", "10")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["source"]["series"] == "raw" and len(doc["profile"]) == 168
    check_recovered(doc, min_samples=2)    # two host pairs, each week (one: where it begins)
    check_best_window(doc)


def test_prometheus_deadline_met_and_missed(capsys, prometheus):
    code, out, err = fleet(capsys, prometheus, "--bytes", str(int(FITS)), "--deadline", "8d",
                           "--json")
    assert code == 0, err
    d = json.loads(out)["deadline"]
    assert d["can_meet"] and d["best_start_unix_s"] is not None
    code, out, err = fleet(capsys, prometheus, "--bytes", str(int(FITS)), "--deadline", "2h")
    assert code == 1 and len(err) == 1 and "cannot move" in err[0], err
    assert "cannot be met" in out


def test_recorded_series_give_the_same_profile(capsys, prometheus):
    raw = json.loads(fleet(capsys, prometheus, "--bytes", "1TB", "--series", "raw", "--json")[1])
    code, out, err = fleet(capsys, prometheus, "--bytes", "1TB", "--json")  # auto: recorded
    assert code == 0, err
    rec = json.loads(out)
    assert rec["source"]["series"] == "recorded"
    for a, b in zip(raw["profile"], rec["profile"], strict=True):
        assert a["p50_bits_per_second"] == b["p50_bits_per_second"]
        assert b["rtt_p50_seconds"] == pytest.approx(a["rtt_p50_seconds"], rel=0.05)
        assert b["loss_forward_ratio"] == pytest.approx(a["loss_forward_ratio"], abs=0.001)
    # the same sessions behind them (the edges of the lookback differ by a partial hour)
    assert sum(b["probe_sessions"] for b in rec["profile"]) == pytest.approx(
        sum(a["probe_sessions"] for a in raw["profile"]), rel=0.02)


@pytest.fixture(scope="module")
def upgraded_prometheus(tmp_path_factory, history):
    """The same history, from daemons upgraded halfway through it from a wanprobe before issue
    36 (RTT under a ``quantile`` label, goodput in bit/s) to the names promtool accepts."""
    prom, promtool = require_tool("prometheus"), require_tool("promtool")
    now, h = history
    # An upgrade restarts the daemon, and a restarted daemon exports no goodput until its next
    # test: a test made in the hour of the restart, before it, reaches no hourly point, whatever
    # the names. So the upgrade comes a minute after a whole hour, where the generated tests
    # never are (3 to 55 minutes into an hour): both fleets then ran the same tests.
    cut = (now - 7 * 86400) // 3600 * 3600 + 60.0
    assert not [ts for _, ts, _ in h.tests if cut - 300 <= ts < cut + 120]
    url, proc = load_prometheus(openmetrics(h, upgraded_ts=cut),
                                tmp_path_factory.mktemp("upgraded"), prometheus=prom,
                                promtool=promtool)
    try:
        yield url
    finally:
        stop(proc)


@pytest.mark.lab
def test_a_fleet_upgraded_mid_lookback_keeps_its_profile(capsys, prometheus,
                                                         upgraded_prometheus):
    """Every test before and after the upgrade counts once, each hour's RTT is there: the
    profile from the raw series equals the one of a fleet that always ran this version (the
    hour of the upgrade sees a host pair's RTT twice, once per name: approximately)."""
    runs = []
    for url in (prometheus, upgraded_prometheus):
        code, out, err = fleet(capsys, url, "--bytes", str(int(FITS)), "--series", "raw",
                               "--json")
        assert code == 0, err
        runs.append(json.loads(out))
    always, upgraded = runs
    for a, b in zip(always["profile"], upgraded["profile"], strict=True):
        assert (b["samples"], b["p50_bits_per_second"], b["p10_bits_per_second"]) == (
            a["samples"], a["p50_bits_per_second"], a["p10_bits_per_second"]), (a, b)
        assert b["probe_sessions"] == a["probe_sessions"]
        assert b["rtt_p50_seconds"] == pytest.approx(a["rtt_p50_seconds"], rel=0.02), (a, b)
    check_recovered(upgraded, min_samples=2)
    assert upgraded["windows"][0] == always["windows"][0]


def test_prometheus_failures_are_one_line(capsys, prometheus):
    code, _, err = fleet(capsys, prometheus, "--bytes", "1TB", dst="nowhere")
    assert code == 1 and len(err) == 1 and "'tpe'->'usw'" in err[0], err
    # tpe -> osa has tests in the first half of each day only: 20 TB crosses the other half
    code, out, err = fleet(capsys, prometheus, "--bytes", "20TB", dst="osa")
    assert code == 1 and len(err) == 1 and "no throughput samples" in err[0], err
    code, out, err = fleet(capsys, prometheus, "--bytes", "100GB", "--json", dst="osa")
    assert code == 0, err
    assert json.loads(out)["hours_without_data"] == sorted(set(range(168)) - HALF_DAY)
    closed = f"http://127.0.0.1:{_free_port()}"
    code, _, err = fleet(capsys, closed, "--bytes", "1TB")
    assert code == 5 and len(err) == 1 and "cannot reach Prometheus" in err[0], err


def test_store_profile_recovers_each_hour_and_the_best_window(capsys, state_dir):
    code, out, err = wanprobe(capsys, "history", "usw-1", "--windows", "--bytes", str(int(FITS)),
                              "--state-dir", str(state_dir), "--json", "--top", "10")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["source"]["kind"] == "store" and doc["source"]["peer"] == "usw-1"
    check_recovered(doc, min_samples=1)   # one host pair, each week (one: where it begins)
    check_best_window(doc)
    code, out, err = wanprobe(capsys, "history", "usw-1", "--windows", "--bytes", str(int(FITS)),
                              "--deadline", "2h", "--state-dir", str(state_dir))
    assert code == 1 and len(err) == 1 and "cannot move" in err[0], err


def test_store_failures_are_one_line(capsys, state_dir):
    code, _, err = wanprobe(capsys, "history", "nobody", "--windows", "--bytes", "1TB",
                            "--state-dir", str(state_dir))
    assert code == 1 and len(err) == 1 and "'osa-1', 'usw-1'" in err[0], err
    code, _, err = wanprobe(capsys, "history", "osa-1", "--windows", "--bytes", "20TB",
                            "--state-dir", str(state_dir))
    assert code == 1 and len(err) == 1 and "no throughput samples" in err[0], err


# -- issue 40: a training plan for each hour of the week on the same capacity ------------------
# 7e9 parameters: at the slow hours' 150 Mbit/s even fp4 every 100 steps (3.5 GB) takes longer
# than 100 steps of compute; at the fast hours' 900 Mbit/s it hides under them (top-k 1 keeps
# every value: no compression, so the plan has to follow the capacity)
JOB = ("impact", "--params", "7e9", "--gpus-per-site", "8", "--sites", "2", "--compute-ms", "500",
       "--sync-every", "10", "--sync-every", "100", "--topk", "1", "--json")


def check_hour_plans(doc: dict) -> None:
    """Fast hours (900 Mbit/s) plan steps no longer than slow ones (150 Mbit/s); the worst hour
    is a slow one; a plan within the target needs no more than the hour's p10."""
    hours = {h["hour_of_week"]: h for h in doc["hours"]}
    assert len(hours) == 168 and doc["caveat"].startswith("the effect of H")
    fast = [h["best"]["step_time_s"] for k, h in hours.items() if k in FAST.fast_hours]
    slow = [h["best"]["step_time_s"] for k, h in hours.items() if k not in FAST.fast_hours]
    assert max(fast) < min(slow), (max(fast), min(slow))
    assert doc["summary"]["worst_hour"]["label"] in {hours[k]["label"] for k in hours
                                                     if k not in FAST.fast_hours}
    for h in hours.values():
        assert h["p10_bits_per_second"] <= h["p50_bits_per_second"]
        assert h["best"]["step_time_s"] >= h["best_at_p50"]["step_time_s"] * 0.999
        assert h["as_is"]["step_time_s"] >= h["best"]["step_time_s"]
        need = h["bandwidth_needed_bps"]
        if h["best"]["gpu_idle_share"] <= 0.1 - 1e-6:
            assert need is not None and need <= h["p10_bits_per_second"] * 1.001, h
        elif need is not None:
            assert need > h["p10_bits_per_second"] * 0.999, h
    assert {h["best"]["components"]["sync_every"] for h in hours.values()} <= {1, 10, 100}


def test_impact_plans_each_hour_on_the_fleet_capacity(capsys, prometheus):
    code, out, err = wanprobe(capsys, *JOB, "--prometheus", prometheus, "--from-site", "tpe",
                              "--to-site", "usw", "--rtt", "95ms")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["source"]["kind"] == "prometheus" and doc["target_utilization"] == 0.9
    check_hour_plans(doc)
    code, out, err = wanprobe(capsys, *JOB[:-1], "--prometheus", prometheus, "--from-site",
                              "tpe", "--to-site", "usw", "--rtt", "95ms")
    assert code == 0 and "Plan by hour of the week" in out and "worst hour" in out, err
    code, _, err = wanprobe(capsys, *JOB, "--prometheus", prometheus, "--from-site", "tpe",
                            "--to-site", "nowhere", "--rtt", "95ms")
    assert code == 1 and len(err) == 1 and "no wanprobe series" in err[0], err


def test_impact_plans_each_hour_on_the_daemon_history(capsys, state_dir):
    code, out, err = wanprobe(capsys, *JOB, "--state-dir", str(state_dir), "--peer", "usw-1")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["source"]["kind"] == "store"
    check_hour_plans(doc)   # no --rtt: each hour's probes give it
    for args, needle in ((("--state-dir", str(state_dir), "--peer", "nobody"), "'osa-1', 'usw-1'"),
                         (("--state-dir", str(state_dir), "--peer", "usw-1", "--prometheus",
                           "http://x"), "not both"),
                         (("--peer", "usw-1"), "--state-dir DIR and --peer")):
        code, _, err = wanprobe(capsys, *JOB, *args)
        assert code != 0 and len(err) == 1 and needle in err[0], (args, err)
