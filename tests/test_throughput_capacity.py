"""Path capacity from UDP bursts timed at the far end: the ladder logic on hand-made bursts, and
the measured figure within ±15 % of the lab's tbf rate at three rates (real kernel sockets,
real delay line)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import RATE_RERUNS

from wanprobe.throughput.capacity import Burst, ladder_capacity, measure_capacity

WP_PORT = 5210


def fake_path(bottleneck_bps: float, sender_max_bps: float = 1e12):
    asked: list[float] = []

    def burst(rate: float) -> Burst:
        asked.append(rate)
        sent = min(rate, sender_max_bps)
        return Burst(sent, min(sent, bottleneck_bps), 0)
    return burst, asked


def test_ladder_climbs_until_a_burst_saturates():
    burst, asked = fake_path(300e6)
    c = ladder_capacity(burst, start_bps=50e6, max_bps=10e9)
    assert asked == [50e6, 200e6, 800e6]
    assert (c.bits_per_second, c.source) == (300e6, "udp_burst")


def test_ladder_stops_at_the_upper_bound_and_says_lower_bound():
    burst, asked = fake_path(1e12)
    c = ladder_capacity(burst, start_bps=50e6, max_bps=100e6)
    assert asked == [50e6, 100e6] and c.source == "udp_burst_lower_bound"


def test_ladder_reports_a_held_back_sender():
    burst, asked = fake_path(1e12, sender_max_bps=120e6)
    c = ladder_capacity(burst, start_bps=50e6, max_bps=10e9)
    assert (c.bits_per_second, c.source) == (120e6, "udp_burst_sender_held")
    assert asked == [50e6, 200e6, 200e6]  # the held-back burst is repeated once


@pytest.mark.netns
@pytest.mark.parametrize("rate_bps", [
    100e6, pytest.param(20e6, marks=pytest.mark.slow), pytest.param(50e6, marks=pytest.mark.slow)])
@RATE_RERUNS
def test_capacity_within_15pct_of_the_lab_rate(lab_factory, rate_bps):
    lab = lab_factory(rtt_ms=20, rate_bps=rate_bps)
    wp = lab.b.popen([sys.executable, "-m", "wanprobe.throughput.server", "--bind", lab.b.addr,
                      "--port", str(WP_PORT)], stdout=subprocess.PIPE, text=True)
    try:
        assert "listening" in wp.stdout.readline()
        with lab.a.entered():
            c = measure_capacity(lab.b.addr, WP_PORT, start_bps=20e6, burst_s=0.5)
    finally:
        wp.kill()
        wp.wait(5)
    assert c.bits_per_second == pytest.approx(rate_bps, rel=0.15), c
    assert c.source.startswith("udp_burst")
