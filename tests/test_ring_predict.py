"""What a measured ring predicts for gloo (wanprobe/ring/predict.py): gloo's hops are rank
r → r−1, each simulated at its own measured rate and RTT; the real run across three lab sites is
tests/test_ring_gloo.py."""

from __future__ import annotations

import itertools

import pytest

from wanprobe.errors import UsageError
from wanprobe.models.collectives import gloo_ring_allreduce_s
from wanprobe.ring import plan
from wanprobe.ring import sites as ring_sites
from wanprobe.ring.model import EdgeRun
from wanprobe.ring.predict import gloo_order, predict_gloo

RANKS = ["tpe", "tyo", "usw"]
RTT = {("tpe", "tyo"): 35.0, ("tpe", "usw"): 130.0, ("tyo", "usw"): 100.0}
MIB = 2**20


def measured(order, rates):
    """A ring test of ``order`` whose edges ran at ``rates`` (src, dst) -> bit/s, one stream."""
    rtt = {(a, b): RTT.get((a, b)) or RTT[(b, a)] for a, b in itertools.permutations(RANKS, 2)}
    runs = [EdgeRun(a, b, rates[(a, b)], (rates[(a, b)],)) for a, b in ring_sites.ring_edges(order)]
    return plan.assemble(order, runs, {}, [[h] for h in RANKS], rtt, None)


def test_gloo_order_is_the_ranks_reversed_after_rank_0():
    assert gloo_order(RANKS) == ["tpe", "usw", "tyo"]
    assert ring_sites.ring_edges(gloo_order(RANKS)) == [("tpe", "usw"), ("usw", "tyo"), ("tyo", "tpe")]


def test_uniform_hops_predict_what_the_uniform_model_does():
    order = gloo_order(RANKS)
    uniform = {("tpe", "tyo"): 100.0, ("tpe", "usw"): 100.0, ("tyo", "usw"): 100.0}
    ring = plan.assemble(order, [EdgeRun(a, b, 100e6, (100e6,)) for a, b in ring_sites.ring_edges(order)],
                         {}, [[h] for h in RANKS],
                         {(a, b): uniform.get((a, b)) or uniform[(b, a)]
                          for a, b in itertools.permutations(RANKS, 2)}, None)
    p = predict_gloo(ring, RANKS, 64 * MIB)
    assert p.time_s == pytest.approx(gloo_ring_allreduce_s(64 * MIB, [0, 1, 2], 0.05, 100e6))
    assert p.ring_bits_per_second == 100e6 and 0 < p.gloo_share < 1


def test_the_slow_long_hop_sets_the_time_and_a_faster_one_elsewhere_changes_little():
    order = gloo_order(RANKS)
    base = {("tpe", "usw"): 100e6, ("usw", "tyo"): 100e6, ("tyo", "tpe"): 200e6}
    p = predict_gloo(measured(order, base), RANKS, 64 * MIB)
    faster = predict_gloo(measured(order, {**base, ("tyo", "tpe"): 2e9}), RANKS, 64 * MIB)
    slower = predict_gloo(measured(order, {**base, ("tpe", "usw"): 50e6}), RANKS, 64 * MIB)
    assert faster.time_s == pytest.approx(p.time_s, rel=0.05)
    assert slower.time_s > 1.5 * p.time_s
    # busbw = S·8·2(n−1)/n / t (nccl-tests)
    assert p.busbw_bits_per_second == pytest.approx(64 * MIB * 8 * 4 / 3 / p.time_s)


def test_a_ring_measured_the_other_way_round_is_refused_naming_the_order():
    ring = measured(RANKS, {e: 100e6 for e in ring_sites.ring_edges(RANKS)})
    with pytest.raises(UsageError, match="run it in the order tpe usw tyo"):
        predict_gloo(ring, RANKS, 64 * MIB)
    with pytest.raises(UsageError, match="two or more distinct ranks"):
        predict_gloo(ring, ["tpe", "tpe"], 64 * MIB)
