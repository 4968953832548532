"""Collective cost models against hand arithmetic (tcp-tuning.md §3.3, issue 8)."""

import math

import pytest

from wanprobe.errors import UsageError
from wanprobe.models import collectives as c


def test_ring_4gb_over_1gbit_is_tens_of_seconds():
    # 4 GB · 8 / 1 Gbit/s = 32 s, times 2(N−1)/N, plus 2(N−1)·α
    for n in (2, 4, 16):
        alpha = 0.065
        expected = 32.0 * 2 * (n - 1) / n + 2 * (n - 1) * alpha
        assert c.ring_allreduce_s(4e9, n, alpha, 1e9) == pytest.approx(expected)
    assert c.ring_allreduce_s(4e9, 2, 0.0, 1e9) == pytest.approx(32.0)


def test_whole_100b_bf16_gradient_is_far_longer():
    size = 100e9 * 2  # 200 GB
    t = c.ring_allreduce_s(size, 2, 0.065, 1e9)
    assert t == pytest.approx(1600.0 + 0.13)      # 200e9·8/1e9 = 1600 s
    assert t > 40 * c.ring_allreduce_s(4e9, 2, 0.065, 1e9)


def test_single_rank_costs_nothing():
    assert c.ring_allreduce_s(1e9, 1, 0.1, 1e9) == 0.0
    assert c.gloo_ring_allreduce_s(1e9, [0], 0.1, 1e9) == 0.0


def test_tree_and_halving_doubling():
    # binomial: 2⌈log2 8⌉(α + S/B) = 6 · (0.01 + 1) s for 125 MB over 1 Gbit/s
    assert c.tree_allreduce_s(125e6, 8, 0.01, 1e9) == pytest.approx(6 * 1.01)
    assert c.tree_allreduce_s(125e6, 5, 0.01, 1e9) == pytest.approx(6 * 1.01)   # ⌈log2 5⌉ = 3
    assert c.halving_doubling_allreduce_s(125e6, 8, 0.01, 1e9) == pytest.approx(6 * 0.01 + 2 * 7 / 8)


def test_hierarchical_hand_value():
    # S = 14 GB (7B bf16), D = 2 sites, G = 8, WAN 100 Gbit/s aggregate, local 400 Gbit/s:
    # intra: 2 · (7/8 · 14e9·8/400e9) = 0.49 s; inter: 2·1/2 · 14e9·8/100e9 = 1.12 s (§3.3)
    t = c.hierarchical_allreduce_s(14e9, 2, 8, 0.0, 100e9, 400e9)
    assert t == pytest.approx(0.49 + 1.12)
    with_latency = c.hierarchical_allreduce_s(14e9, 2, 8, 0.05, 100e9, 400e9, local_alpha_s=1e-5)
    assert with_latency - t == pytest.approx(2 * 0.05 + 2 * 7 * 1e-5)


def test_flat_ring_waits_for_the_wan_flow():
    # 16 ranks over 2 sites: 2·15/16 · S / B_flow + 30 α_wan
    t = c.flat_ring_across_sites_s(1e9, 2, 8, 0.05, 1e9, 400e9)
    assert t == pytest.approx(2 * 15 / 16 * 8.0 + 30 * 0.05)
    # hierarchical with G flows beats the flat ring when one flow is the limit
    h = c.hierarchical_allreduce_s(1e9, 2, 8, 0.05, 8 * 1e9, 400e9)
    assert h < t


def test_busbw_factors():
    assert c.busbw_factor("allreduce", 8) == pytest.approx(1.75)
    assert c.busbw_factor("all_gather", 8) == pytest.approx(0.875)
    assert c.busbw_factor("reduce_scatter", 4) == pytest.approx(0.75)
    assert c.busbw_factor("broadcast", 8) == 1.0
    # nccl-tests: 1 GB all-reduce on 8 ranks in 0.1 s: algbw 80 Gbit/s, busbw 140 Gbit/s
    assert c.bus_bandwidth_bps(1e9, 0.1, "allreduce", 8) == pytest.approx(140e9)
    with pytest.raises(UsageError):
        c.busbw_factor("scan", 4)


def test_gloo_ring_bandwidth_bound_matches_ring_formula():
    # huge message, tiny latency: every WAN hop carries 2(N−1)/N·S at the link rate
    t = c.gloo_ring_allreduce_s(256 * 2**20, [0, 0, 1, 1], 1e-6, 100e6)
    bound = 2 * 3 / 4 * 256 * 2**20 * 8 / 100e6
    assert bound <= t < 1.02 * bound


def test_gloo_ring_latency_bound_counts_handshakes():
    # tiny message, N = 4: 8 segments, 2 per rank, 6 iterations per phase, iteration i waits
    # for i−2: 3 rounds per phase, each a "recv ready" notification one way and the data the
    # other way (2 one-way delays): 2 phases × 3 rounds × 2d = 12d, i.e. 6 RTT.
    d = 0.03
    t = c.gloo_ring_allreduce_s(64, [0, 0, 1, 1], d, 1e9)
    assert t == pytest.approx(12 * d, rel=1e-3)
    # interleaving sites puts 4 WAN hops in the ring: never faster
    assert c.gloo_ring_allreduce_s(64, [0, 1, 0, 1], d, 1e9) >= t


def test_gloo_ring_segments_follow_gloo():
    # a flow cap (window-limited rate) slows the WAN hops
    free = c.gloo_ring_allreduce_s(8e6, [0, 0, 1, 1], 0.01, 200e6)
    capped = c.gloo_ring_allreduce_s(8e6, [0, 0, 1, 1], 0.01, 200e6, wan_flow_rate_bps=50e6)
    assert capped > 2 * free


@pytest.mark.parametrize("bad", [0, -5, math.nan])
def test_bad_sizes_rejected(bad):
    with pytest.raises(UsageError):
        c.ring_allreduce_s(bad, 4, 0.01, 1e9)
    with pytest.raises(UsageError):
        c.hierarchical_allreduce_s(bad, 2, 8, 0.01, 1e9, 1e11)


def test_bad_ranks_and_rates_rejected():
    with pytest.raises(UsageError):
        c.ring_allreduce_s(1e6, 0, 0.01, 1e9)
    with pytest.raises(UsageError):
        c.ring_allreduce_s(1e6, 4, 0.01, 0)
    with pytest.raises(UsageError):
        c.ring_allreduce_s(1e6, 4, -0.01, 1e9)
