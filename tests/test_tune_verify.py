"""The closed loop's judgement: the rate after the ramp-up (iperf3 --omit) and the next step."""

from __future__ import annotations

import pytest

from wanprobe.diagnose.verify import judge, rate_after_omit_bps


def intervals(rates_mbit):
    return [{"start_s": i * 1.0, "end_s": i + 1.0, "bytes_received": int(r * 1e6 / 8)}
            for i, r in enumerate(rates_mbit)]


def test_rate_after_omit_leaves_out_the_ramp_up():
    iv = intervals([10, 40, 90, 94, 96])
    assert rate_after_omit_bps(iv, 2.0) == pytest.approx(93.33e6, rel=1e-3)
    assert rate_after_omit_bps(iv, 0.0) == pytest.approx(66e6, rel=1e-3)
    assert rate_after_omit_bps(iv, 9.0) is None


def test_still_window_limited_says_so_and_proposes_the_next_step():
    v = judge({"bits_per_second": 60e6, "intervals": intervals([30, 60, 61, 62]),
               "limited_by": {"verdict": "receive_window"}, "cc": "bbr"}, 1.0)
    assert not v.fixed and "tune plan --host peer" in v.next_step
    ok = judge({"bits_per_second": 90e6, "intervals": intervals([50, 95, 96]),
                "limited_by": {"verdict": "network"}}, 1.0)
    assert ok.fixed and ok.bits_per_second_after_omit == pytest.approx(95.5e6, rel=1e-3)
