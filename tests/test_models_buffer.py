"""The buffer model against hand-computed values (issue 13's BBR / 0.1 % / 130 ms / 100 Mbit/s)."""

from __future__ import annotations

import pytest

from wanprobe.errors import UsageError
from wanprobe.models.bdp import (
    cc_inflight_gain,
    loss_in_rtt_probability,
    measured_scaling_ratio,
    per_flow_budget_bytes,
    recovery_headroom,
    tuned_buffer_bytes,
)


def test_loss_in_rtt_probability_by_hand():
    assert loss_in_rtt_probability(0.0, 1000) == 0.0
    # 1 - 0.999^1122 = 0.6746 (100 Mbit/s × 130 ms / 1448 B ≈ 1122 packets)
    assert loss_in_rtt_probability(0.001, 1122) == pytest.approx(0.6746, abs=1e-4)
    with pytest.raises(UsageError):
        loss_in_rtt_probability(1.0, 10)


def test_tuned_buffer_for_the_issue_path_by_hand():
    bdp = 100e6 * 0.130 / 8  # 1 625 000 B
    want = bdp * 2 * (1 + 0.6746) / 0.5  # BBR gain 2, recovery 1.67, ratio 1/2 ≈ 10.89 MB
    got = tuned_buffer_bytes(100e6, 0.130, cc="bbr", loss=0.001)
    assert got == pytest.approx(want, rel=1e-3)
    assert 4 <= got / bdp <= 16  # issue: 4×BDP fills the path, 16 MiB no better
    # loss-free cubic: the ESnet 2×BDP rule
    assert tuned_buffer_bytes(100e6, 0.130, cc="cubic", loss=0.0) == pytest.approx(2 * bdp, abs=1)
    # a measured scaling ratio of 2/3 needs a quarter less buffer than the assumed 1/2
    assert tuned_buffer_bytes(100e6, 0.130, cc="bbr", loss=0.001, scaling_ratio=2 / 3) == \
        pytest.approx(got * 0.75, rel=1e-3)


def test_factors_and_budget():
    assert cc_inflight_gain("bbr") == 2.0 and cc_inflight_gain("cubic") == 1.0
    assert cc_inflight_gain(None) == 1.0
    assert recovery_headroom(0.0, 1e6) == 1.0
    assert per_flow_budget_bytes(1_572_864_000, 16) == 98_304_000
    with pytest.raises(UsageError):
        per_flow_budget_bytes(1e9, 0)
    assert measured_scaling_ratio(4_000_000, 6_000_000) == pytest.approx(2 / 3)
    assert measured_scaling_ratio(8_000_000, 6_000_000) is None  # buffer was not the limit
    assert measured_scaling_ratio(None, 6_000_000) is None
