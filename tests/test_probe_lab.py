"""Acceptance tests in the emulated WAN lab (issue 3): RTT accuracy against iputils ping measured
in the same run, directional loss, DSCP bleaching, path MTU through a black hole."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import select
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import RATE_RERUNS

from wanprobe.lab import netns
from wanprobe.probe.sender import probe_stamp
from wanprobe.probe.tcp_connect import probe_tcp

pytestmark = pytest.mark.netns
PORT = 862


@contextlib.contextmanager
def reflector(lab):
    """`wanprobe reflect` in namespace b; waits until it listens; always stopped."""
    proc = lab.b.popen([sys.executable, "-m", "wanprobe", "reflect", "--bind", lab.b.addr,
                        "--port", str(PORT)], stderr=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([proc.stderr], [], [], 30)
        line = proc.stderr.readline() if ready else ""
        assert "STAMP on udp" in line, f"reflector did not start: {line!r}"
        yield proc
    finally:
        netns.stop(proc, 10)


def ping_rtts_ms(out: str) -> tuple[np.ndarray, float]:
    """Per-reply times from iputils ping and their print resolution (ms): ping prints 3
    decimals below 1 ms... 1 decimal from 10 ms, none from 100 ms (ping_common.c)."""
    vals = np.array([float(x) for x in re.findall(r"time=([\d.]+) ms", out)])
    res = 1.0 if np.median(vals) >= 100 else 0.1 if np.median(vals) >= 10 else 0.01
    return vals, res


def _bootstrap_se(a: np.ndarray, b: np.ndarray, rounds: int = 400) -> tuple[float, float]:
    """Bootstrap standard errors of (median(a) - median(b)) and of the difference of their
    p99 - p50 spreads."""
    rng = np.random.default_rng(0)
    ia = rng.integers(0, len(a), (rounds, len(a)))
    ib = rng.integers(0, len(b), (rounds, len(b)))
    ra, rb = a[ia], b[ib]
    med_a, med_b = np.median(ra, axis=1), np.median(rb, axis=1)
    spread_a = np.percentile(ra, 99, axis=1) - med_a
    spread_b = np.percentile(rb, 99, axis=1) - med_b
    return float(np.std(med_a - med_b)), float(np.std(spread_a - spread_b))


def _with_ping(lab, count: int, interval_s: float, run, *, window_s: float | None = None):
    """``run()`` inside namespace a while iputils ping measures the same link at the same
    rate; returns (run's result, ping's per-reply RTTs, ping's print resolution). ping sends
    ``count`` probes, or with ``window_s`` runs that long (-w, whole seconds; then at least half
    of ``count`` replies are required, see _accuracy_run)."""
    limit = ["-w", str(max(1, round(window_s)))] if window_s else ["-c", str(count)]
    ping = lab.a.popen(["ping", "-n", "-i", str(interval_s), *limit, "-W", "2", lab.b.addr],
                       stdout=subprocess.PIPE, text=True)
    try:
        with lab.a.entered():
            res = run()
    finally:
        out, _ = ping.communicate(timeout=60)
    pings, resolution = ping_rtts_ms(out)
    assert len(pings) >= (0.5 if window_s else 0.95) * count, out[-300:]
    return res, pings, resolution


def _accuracy_run(lab, rtt_ms: float, n: int = 600, interval: float = 0.01) -> dict:
    """STAMP and iputils ping side by side, same rate, same time, same path. ping runs for the
    STAMP run's duration (-w, whole seconds) rather than a count: here it falls behind its -i (600 probes at
    -i 0.005 took 6 s at 60 ms RTT, 9 s at 200 ms at -i 0.01), and the two tools must sample the
    same stretch of the lab's stalls for their tails to be comparable."""
    res, pings, resolution = _with_ping(
        lab, n, interval, lambda: asyncio.run(
            probe_stamp(lab.b.addr, port=PORT, count=n, interval_s=interval)),
        window_s=n * interval + rtt_ms / 1e3)
    assert len(res.rtt_samples_ms) >= 0.95 * n
    ours = np.array(res.rtt_samples_ms)
    m = {"rtt_ms": rtt_ms, "stamp_p50": float(np.median(ours)),
         "ping_p50": float(np.median(pings)), "ping_resolution": resolution,
         "stamp_p99_p50": float(np.percentile(ours, 99) - np.median(ours)),
         "ping_p99_p50": float(np.percentile(pings, 99) - np.median(pings)),
         "stamp_n": len(ours), "ping_n": len(pings)}
    m["stamp_err"] = abs(m["stamp_p50"] - rtt_ms)
    m["ping_err"] = abs(m["ping_p50"] - rtt_ms)
    # ping prints rounded times, so its error and spread are known to within its resolution
    m["ok_abs"] = m["stamp_err"] <= max(0.2, 0.01 * rtt_ms)
    # The lab calibrates its delay line so that a ping-style measurement (clock read before
    # sendto, kernel RX stamp) reads the configured RTT: it removes 2 x offset_ns of host
    # overhead measured that way (wanprobe/lab/calibrate.py). STAMP with kernel TX stamps does
    # not pay the sender's send path, so it may read up to that much *below* the setting.
    offset_ms = 2 * (lab.stats().get("offset_ns") or 0) / 1e6
    m["lab_calibration_ms"] = offset_ms
    # "No worse than ping" is judged against the sampling noise of the two estimates (bootstrap
    # standard error of the difference, 2 sigma), not against one draw of each: both tools share
    # the same lab noise, so a single-draw comparison of two p99s is a coin flip.
    se_p50, se_spread = _bootstrap_se(ours, pings)
    m["noise_p50_ms"], m["noise_spread_ms"] = 2 * se_p50, 2 * se_spread
    m["ok_vs_ping"] = m["stamp_err"] <= m["ping_err"] + resolution / 2 + 2 * se_p50 + (
        offset_ms if m["stamp_p50"] < rtt_ms else 0.0)
    m["ok_spread"] = m["stamp_p99_p50"] <= m["ping_p99_p50"] + resolution + 2 * se_spread
    print(json.dumps(m))
    return m


@pytest.mark.slow
@RATE_RERUNS  # timing against ping on a 2-core VM: one CI run had 30 % CPU steal
@pytest.mark.parametrize("rtt_ms", [10, 60, 200])
def test_rtt_accuracy_against_ping(lab_factory, rtt_ms):
    lab = lab_factory(rtt_ms=rtt_ms, jitter_ms=0)
    with reflector(lab):
        m = _accuracy_run(lab, rtt_ms)
        if not (m["ok_abs"] and m["ok_vs_ping"]):
            # On a loaded 2-core host the tail is set by the userspace delay line being
            # descheduled, which hits both tools at random: measure once more, fresh.
            m = _accuracy_run(lab, rtt_ms)
    assert m["ok_abs"], m
    assert m["ok_vs_ping"], m


@pytest.mark.slow
def test_rtt_tail_no_worse_than_ping(lab_factory):
    """p99 - p50 at zero jitter no worse than ping's, judged against the two estimates' sampling
    noise. The lab stamps each packet's entry into its wire in the kernel (lab/arrivals.py), so
    a STAMP reply that must wake the delay line is charged no wake-up, just as ping's echo
    reply (made inside the delay line's own write()) is not; what remains are host stalls that
    hit both tools in the same window."""
    lab = lab_factory(rtt_ms=60, jitter_ms=0)
    with reflector(lab):
        m = _accuracy_run(lab, 60)
        if not m["ok_spread"]:
            m = _accuracy_run(lab, 60)  # one fresh measurement, as in the accuracy test
    assert m["ok_spread"], m


def _loss_run(lab):
    with lab.a.entered():
        return asyncio.run(probe_stamp(lab.b.addr, port=PORT, count=2000, interval_s=0.002,
                                       timeout_s=1.0))


def _inside(ci, p):
    return ci[0] <= p <= ci[1]


@pytest.mark.slow
def test_loss_per_direction(lab_factory):
    lab = lab_factory(rtt_ms=2, loss_ab=0.01, loss_ba=0.0)
    with reflector(lab):
        fwd = _loss_run(lab)
        if not _inside(fwd.loss.forward_ci95, 0.01):   # a 95 % interval misses 1 time in 20
            fwd = _loss_run(lab)
        lab.update(loss_ab=0.0, loss_ba=0.01)
        rev = _loss_run(lab)
        if not _inside(rev.loss.reverse_ci95, 0.01):
            rev = _loss_run(lab)
    print(json.dumps({"a_to_b": fwd.loss.to_json(), "b_to_a": rev.loss.to_json()}))
    assert _inside(fwd.loss.forward_ci95, 0.01) and fwd.loss.reverse_lost == 0
    assert _inside(rev.loss.reverse_ci95, 0.01) and rev.loss.forward_lost == 0
    assert 0.003 < fwd.loss.forward_ratio < 0.03 and 0.003 < rev.loss.reverse_ratio < 0.03


def test_dscp_bleaching_is_attributed_to_the_forward_path(lab_factory):
    lab = lab_factory(rtt_ms=4, bleach_dscp=True)
    with reflector(lab):
        with lab.a.entered():
            res = asyncio.run(probe_stamp(lab.b.addr, port=PORT, count=20, interval_s=0.01,
                                          dscp=26))
        cli = lab.a.run([sys.executable, "-m", "wanprobe", "probe", lab.b.addr, "--count", "5",
                         "--interval", "10ms", "--dscp", "AF31", "--json"],
                        capture_output=True, text=True, timeout=60)
    assert res.dscp.sent == 26 and res.dscp.at_reflector == 0
    assert res.dscp.bleached in ("forward", "both")
    doc = json.loads(cli.stdout)
    assert doc["dscp"]["sent"] == 26 and doc["dscp"]["at_reflector"] == 0
    assert doc["dscp"]["bleached"] in ("forward", "both")


def test_no_bleaching_without_remarking(lab_factory):
    lab = lab_factory(rtt_ms=4)
    with reflector(lab), lab.a.entered():
        res = asyncio.run(probe_stamp(lab.b.addr, port=PORT, count=10, interval_s=0.01, dscp=46))
    assert (res.dscp.at_reflector, res.dscp.returned, res.dscp.bleached) == (46, 46, "none")


@pytest.mark.parametrize("settings, expected", [({"mtu": 1400}, 1400),
                                                ({"black_hole_mtu": 1380}, 1380)])
def test_path_mtu(lab_factory, settings, expected):
    lab = lab_factory(rtt_ms=4, **settings)
    with reflector(lab):
        t = time.monotonic()
        cli = lab.a.run([sys.executable, "-m", "wanprobe", "mtu", lab.b.addr, "--json"],
                        capture_output=True, text=True, timeout=120)
        took = time.monotonic() - t
    assert cli.returncode == 0, cli.stderr
    doc = json.loads(cli.stdout)
    print(json.dumps({"expected": expected, "path_mtu": doc["path_mtu"],
                      "found_by": doc["found_by"], "sizes": len(doc["steps"]), "s": took}))
    assert doc["path_mtu"] == expected
    if "black_hole_mtu" in settings:
        assert doc["local_mtu"] == 1500 and "binary search" in doc["found_by"]
        assert any(not s["passed"] and s["size_bytes"] == expected + 1 for s in doc["steps"])


def test_icmp_and_tcp_methods_in_lab(lab_factory):
    """The raw-socket echo and the TCP handshake probes read what iputils ping reads on the same
    link at the same time (an absolute check would test the lab's stalls, not the probe)."""
    from wanprobe.probe.icmp import probe_icmp
    lab = lab_factory(rtt_ms=20)
    icmp, ping_a, res_a = _with_ping(lab, 200, 0.01, lambda: asyncio.run(
        probe_icmp(lab.b.addr, count=200, interval_s=0.01)))
    srv = lab.b.popen([sys.executable, "-c", "import socket,time;s=socket.socket();"
                       f"s.bind(('{lab.b.addr}',8622));s.listen(128);time.sleep(60)"])
    try:
        time.sleep(1.0)  # the listener starts
        tcp, ping_b, res_b = _with_ping(lab, 100, 0.01, lambda: asyncio.run(
            probe_tcp(lab.b.addr, port=8622, count=100, interval_s=0.01)))
    finally:
        srv.kill()
        srv.wait()
    se_icmp, _ = _bootstrap_se(np.array(icmp.rtt_samples_ms), ping_a)
    se_tcp, _ = _bootstrap_se(np.array(tcp.rtt_samples_ms), ping_b)
    m = {"icmp_p50": icmp.rtt.p50, "ping_p50": float(np.median(ping_a)), "se_icmp": se_icmp,
         "tcp_p50": tcp.rtt.p50, "ping_p50_tcp_run": float(np.median(ping_b)), "se_tcp": se_tcp}
    print(json.dumps(m))
    assert icmp.loss.received == 200 and tcp.loss.received == 100
    assert abs(icmp.rtt.p50 - np.median(ping_a)) <= res_a / 2 + 0.1 + 2 * se_icmp, m
    # connect() returns when the SYN-ACK is in: one RTT plus the kernel's handshake work
    assert abs(tcp.rtt.p50 - np.median(ping_b)) <= res_b / 2 + 0.3 + 2 * se_tcp, m
    assert abs(icmp.rtt.p50 - 20) < 2.0 and abs(tcp.rtt.p50 - 20) < 2.0, m
