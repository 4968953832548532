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
    assert not c.lower_bound and c.limit is None and "first hop" in c.reason


def counted_burst(rate: float, *, bottleneck: float = 1e12, receiver_max: float = 1e12,
                  sender_max: float = 1e12, sender_cpu: float = 0.2, loss: float = 0.0) -> Burst:
    """A burst with datagram counts, as measure_capacity builds one from a UDP result: the
    receiving host drops what arrives above ``receiver_max`` (drop events, not booked on the
    path); the path loses ``loss`` at random and ``bottleneck`` caps what it delivers."""
    sent = min(rate, sender_max)
    n = int(sent * 0.5 / 8 / 1400)
    delivered = min(sent, bottleneck) * (1 - loss)
    received = min(delivered, receiver_max)
    lost = n - int(n * received / sent)
    host = 0 if received >= delivered else max(1, lost // 46)
    return Burst(sent, received, lost, asked_bits_per_second=rate, packets_sent=n,
                 host_drop_events=host, path_lost_packets=None if host else lost,
                 sender_cpu_ratio=sender_cpu if sent < rate else 0.3, receiver="gro")


def test_a_receiving_host_that_drops_makes_a_lower_bound_and_books_no_path_loss():
    c = ladder_capacity(lambda r: counted_burst(r, bottleneck=2e9, receiver_max=700e6),
                        start_bps=50e6, max_bps=10e9)
    assert c.source == "udp_burst_receiver_limited" and c.lower_bound
    assert c.bits_per_second == 700e6 and c.limit == "the receiving host"
    assert c.reason.startswith("≥ 700.0 Mbit/s: the receiving host") and "none booked" in c.reason
    assert c.bursts[-1].path_lost_packets is None and c.to_json()["capacity_is_lower_bound"]


def test_a_sender_out_of_cpu_makes_a_lower_bound_a_busy_first_hop_does_not():
    cpu = ladder_capacity(lambda r: counted_burst(r, sender_max=900e6, sender_cpu=0.97),
                          start_bps=50e6, max_bps=10e9)
    assert (cpu.source, cpu.bits_per_second, cpu.lower_bound) == ("udp_burst_sender_cpu", 900e6,
                                                                   True)
    hop = ladder_capacity(lambda r: counted_burst(r, sender_max=900e6, sender_cpu=0.4),
                          start_bps=50e6, max_bps=10e9)
    assert (hop.source, hop.lower_bound) == ("udp_burst_sender_held", False)


def test_random_path_loss_is_not_saturation_and_a_full_path_is():
    c = ladder_capacity(lambda r: counted_burst(r, bottleneck=2e9, loss=0.01), start_bps=50e6,
                        max_bps=10e9)
    assert c.source == "udp_burst" and c.bits_per_second == pytest.approx(2e9 * 0.99)
    assert [b.asked_bits_per_second for b in c.bursts] == [50e6, 200e6, 800e6, 3200e6]


def test_a_capacity_is_never_below_what_tcp_delivered_in_the_same_run():
    c = ladder_capacity(lambda r: counted_burst(r, bottleneck=500e6), start_bps=50e6)
    assert c.at_least(400e6, 480e6).bits_per_second == c.bits_per_second == c.at_least(None).bits_per_second
    kept = c.at_least(400e6, 480e6).to_json()["tcp_cross_check"]
    assert kept == {"tcp_bits_per_second": 400e6, "bbr_bits_per_second": 480e6}
    raised = c.at_least(900e6)
    assert (raised.bits_per_second, raised.source, raised.lower_bound) == (900e6, "tcp_goodput",
                                                                           True)
    assert "500.0 Mbit/s" in raised.reason and raised.bursts == c.bursts
    agree = c.at_least(510e6)  # within the two methods' agreement: raised, still exact
    assert (agree.bits_per_second, agree.source, agree.lower_bound) == (510e6, "udp_burst", False)
    low = raised.at_least(920e6)  # a lower bound is raised as a lower bound
    assert (low.bits_per_second, low.source) == (920e6, "tcp_goodput")


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
