"""BDP, window and TCP rate models against hand-computed values and tcp-tuning.md §3.1."""

import math

import pytest

from wanprobe.errors import UsageError
from wanprobe.models import bdp, tcp_rate


def test_bdp_hand_values():
    assert bdp.bdp_bytes(10e9, 0.1) == pytest.approx(125e6)          # 10 Gbit/s × 100 ms
    assert bdp.bdp_bytes(100e6, 0.06) == pytest.approx(750_000)


def test_window_limited_rate():
    # 6 MiB in flight per 130 ms round trip: 6·2^20·8 / 0.13
    assert bdp.window_limited_rate_bps(6 * 2**20, 0.13) == pytest.approx(387.1e6, rel=1e-3)
    # round trip through the BDP: the BDP window fills the link exactly
    assert bdp.window_limited_rate_bps(bdp.bdp_bytes(1e9, 0.05), 0.05) == pytest.approx(1e9)


def test_buffer_needed_is_twice_bdp_by_default():
    assert bdp.buffer_needed_bytes(10e9, 0.1) == 250_000_000
    assert bdp.buffer_needed_bytes(10e9, 0.1, scaling_ratio=1.0, headroom=1.2) == 150_000_000
    assert bdp.window_from_buffer_bytes(bdp.buffer_needed_bytes(1e9, 0.02)) == pytest.approx(2.5e6)


@pytest.mark.parametrize("bad", [0, -1, math.nan, math.inf])
def test_bdp_rejects_bad_sizes(bad):
    with pytest.raises(UsageError):
        bdp.bdp_bytes(bad, 0.1)
    with pytest.raises(UsageError):
        bdp.window_limited_rate_bps(bad, 0.1)


# tcp-tuning.md §3.1 table, RTT 100 ms, in Mbit/s (Reno/Mathis, CUBIC), MSS 1448 and 8948.
TABLE = [
    (1e-3, 4.5, 27.7, 4.5, 27.7),
    (1e-4, 14.2, 87.7, 21.7, 133.9),
    (1e-5, 44.9, 277, 122, 754),
    (1e-6, 142, 877, 687, 4242),
]


@pytest.mark.parametrize("p, reno1448, reno8948, cubic1448, cubic8948", TABLE)
def test_reference_table(p, reno1448, reno8948, cubic1448, cubic8948):
    assert tcp_rate.mathis_rate_bps(1448, 0.1, p) / 1e6 == pytest.approx(reno1448, rel=0.01)
    assert tcp_rate.mathis_rate_bps(8948, 0.1, p) / 1e6 == pytest.approx(reno8948, rel=0.01)
    assert tcp_rate.cubic_rate_bps(1448, 0.1, p) / 1e6 == pytest.approx(cubic1448, rel=0.01)
    assert tcp_rate.cubic_rate_bps(8948, 0.1, p) / 1e6 == pytest.approx(cubic8948, rel=0.01)


def test_mathis_hand_value():
    # (1448·8 / 0.1) · √1.5 / √0.001 = 115840 · 1.224745 / 0.0316228
    assert tcp_rate.mathis_rate_bps(1448, 0.1, 1e-3) == pytest.approx(4_486_480, rel=1e-4)
    assert tcp_rate.mathis_rate_bps(1448, 0.1, 0.0) == math.inf


def test_mathis_rtt_scaling_and_reno_requirement():
    # halving the RTT doubles Reno
    assert tcp_rate.mathis_rate_bps(1448, 0.05, 1e-4) == pytest.approx(
        2 * tcp_rate.mathis_rate_bps(1448, 0.1, 1e-4))
    # "to keep 10 Gb/s at 100 ms (MSS 1448) Reno needs p ≤ 2e-10"
    assert tcp_rate.mathis_rate_bps(1448, 0.1, 2e-10) == pytest.approx(10e9, rel=0.01)


def test_cubic_never_below_reno_friendly():
    for p in (1e-2, 1e-3, 3e-3):
        assert tcp_rate.cubic_rate_bps(1448, 0.1, p) == pytest.approx(
            tcp_rate.mathis_rate_bps(1448, 0.1, p))
    # in CUBIC's own region the rate goes as RTT^-1/4: ×2^(1/4) ≈ 1.19 per halving
    r1 = tcp_rate.cubic_rate_bps(1448, 0.1, 1e-6)
    r2 = tcp_rate.cubic_rate_bps(1448, 0.05, 1e-6)
    assert r2 / r1 == pytest.approx(2 ** 0.25, rel=1e-6)


def test_bbr_vs_loss():
    assert tcp_rate.bbr_rate_bps(100e6, 0.0) == 100e6
    assert tcp_rate.bbr_rate_bps(100e6, 0.05) == pytest.approx(95e6)
    assert tcp_rate.bbr_rate_bps(100e6, 0.2) == pytest.approx(80e6)
    assert tcp_rate.bbr_rate_bps(100e6, 0.25) == 0.0
    # ACM Queue Fig. 10: 100 Mbit/s, 100 ms, 1 % loss: BBR ≈ link, CUBIC stalls
    assert tcp_rate.bbr_rate_bps(100e6, 0.01) / tcp_rate.cubic_rate_bps(1448, 0.1, 0.01) > 50


def test_padhye_hand_value_and_agreement_with_mathis():
    # p = 0.01, RTT 100 ms, T0 = 1 s, MSS 1448, worked by hand:
    p, rtt, t0 = 0.01, 0.1, 1.0
    # w = (2/3)(1 + √298) = 12.1751; Q̂ = 0.029701·1.08547/0.11517 = 0.27993; G = 1.0102
    # pkts/s = (99 + 12.1751 + 0.28276) / (0.1·13.1751 + 0.27993·1.0102/0.99) = 69.524
    assert tcp_rate.padhye_rate_bps(1448, rtt, p, rto_s=t0) == pytest.approx(69.524 * 11584, rel=1e-4)
    # at low loss and short RTO Padhye approaches Mathis (with b = 2 its √(3/(2bp)) is √(3/(4p)))
    ratio = tcp_rate.padhye_rate_bps(1448, 0.1, 1e-5, rto_s=0.2) / tcp_rate.mathis_rate_bps(1448, 0.1, 1e-5)
    assert 0.6 < ratio < 0.8
    # the window cap binds: at most wmax packets per RTT
    capped = tcp_rate.padhye_rate_bps(1448, 0.1, 1e-6, wmax_packets=100)
    assert capped <= 100 * 1448 * 8 / 0.1


def test_achievable_rate_is_min_of_link_window_and_cc():
    # window-limited: 1 MiB / 60 ms = 139.8 Mbit/s < 1 Gbit/s link, no loss
    r = tcp_rate.achievable_rate_bps(1e9, 0.06, 0.0, 1448, "cubic", 2**20, 1)
    assert r == pytest.approx(2**20 * 8 / 0.06)
    # 4 such flows: 559 Mbit/s, 8 flows capped by the link
    assert tcp_rate.achievable_rate_bps(1e9, 0.06, 0.0, 1448, "cubic", 2**20, 4) == pytest.approx(4 * r)
    assert tcp_rate.achievable_rate_bps(1e9, 0.06, 0.0, 1448, "cubic", 2**20, 8) == 1e9
    # loss-limited cubic vs bbr at 0.1 % loss, 100 ms
    assert tcp_rate.achievable_rate_bps(1e9, 0.1, 1e-3, cc="cubic") == pytest.approx(4.486e6, rel=1e-3)
    assert tcp_rate.achievable_rate_bps(1e9, 0.1, 1e-3, cc="bbr") == pytest.approx(0.999e9)
    assert tcp_rate.achievable_rate_bps(1e9, 0.1, 1e-3, cc="reno", mss=8948) == pytest.approx(27.72e6, rel=1e-3)


def test_achievable_rejects_bad_input():
    with pytest.raises(UsageError, match="congestion control"):
        tcp_rate.achievable_rate_bps(1e9, 0.1, 0.0, cc="vegas")
    with pytest.raises(UsageError):
        tcp_rate.achievable_rate_bps(1e9, 0.1, 0.0, streams=0)
    with pytest.raises(UsageError):
        tcp_rate.achievable_rate_bps(-1, 0.1, 0.0)
    with pytest.raises(UsageError):
        tcp_rate.mathis_rate_bps(1448, 0.1, 1.5)
