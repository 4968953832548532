"""Issue 13 "must show" (3): on the same lab link in the same test, wanprobe's tuning of both
ends reaches ≥ 0.9 of the oracle (iperf3, bbr, 64 MiB buffers) at two RTT × loss points, and the
tcp_rmem max it applied stays ≤ 16 × the BDP it measured."""

from __future__ import annotations

import pytest
from conftest import RATE_RERUNS, new_lab_name, require_tool

from wanprobe.lab.tune_check import LINE_RATE_ORACLE_BUFFER, run_point

pytestmark = [pytest.mark.netns, pytest.mark.slow]


@RATE_RERUNS
@pytest.mark.parametrize(("rtt_ms", "loss"), [(130, 0.001), (60, 0.005)])
def test_tuned_reaches_the_oracle(rtt_ms, loss):
    require_tool("iperf3")
    p = run_point(new_lab_name(), rtt_ms=rtt_ms, loss=loss, rate_bps=100e6, seconds=4.0)
    assert p.tuned_to_oracle >= 0.9, p.to_json()
    assert p.tcp_rmem_max_bytes and p.measured_bdp_bytes, p.to_json()
    assert p.buffer_to_bdp <= 16, p.to_json()
    assert p.tuned_bits_per_second > 3 * p.before_bits_per_second, p.to_json()
    assert p.rollback_exact, p.to_json()


@pytest.mark.alone
@RATE_RERUNS
def test_tuned_single_stream_reaches_the_oracle_at_line_rate():
    """Issue 35: 2 Gbit/s × 130 ms × 0.01 % loss, both ends untuned (reno, 256 KiB): one tuned
    stream ≥ 0.9 × iperf3 with bbr and 512 MiB buffers; buffers ≤ 16 × BDP; rollback exact."""
    require_tool("iperf3")
    p = run_point(new_lab_name(), rtt_ms=130, loss=0.0001, rate_bps=2e9, seconds=6.0,
                  omit_s=3.0, oracle_buffer=LINE_RATE_ORACLE_BUFFER)
    assert p.tuned_to_oracle >= 0.9, p.to_json()
    assert p.tcp_rmem_max_bytes and p.measured_bdp_bytes and p.buffer_to_bdp <= 16, p.to_json()
    assert p.rollback_exact, p.to_json()
    assert p.tuned_bits_per_second > 3 * p.before_bits_per_second, p.to_json()
