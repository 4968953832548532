"""How long a TCP test must run on a path: its ramp-up left out (iperf3 ``-O``), then long enough
to measure the path and not TCP's start.

Slow start doubles the congestion window every round trip from the initial window (10 segments,
RFC 6928), so it reaches the bandwidth-delay product after about log2(BDP / IW) round trips:
11 RTTs ≈ 1.4 s at 130 ms and 2 Gbit/s (BDP 32.5 MB ≈ 22,400 × 1448 B). BBR then drains the
queue it built (about one round trip, draining at gain 1/2.89; Cardwell et al., ACM Queue 14(5)
2016) and settles into PROBE_BW, whose gain cycle lasts 8 round trips — the shortest span over
which its rate averages to the bottleneck's. ESnet's advice for long paths is the same in words:
``-O`` a few seconds and ``-t`` long enough (fasterdata.es.net, iperf3 on long paths).

Pure: rates in bits per second, times in seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from wanprobe.units import format_rate

INITIAL_WINDOW_SEGMENTS = 10   # RFC 6928
DEFAULT_MSS_BYTES = 1448       # 1500-byte MTU with TCP timestamps
DRAIN_RTTS = 2                 # BBR's DRAIN and a round trip of margin
PROBE_CYCLE_RTTS = 8           # one PROBE_BW gain cycle
MAX_OMIT_S = 30.0


@dataclass(frozen=True)
class TestTime:
    """``omit_s`` left out, then ``measure_s`` measured; ``ramp_s`` the slow start estimate."""

    omit_s: float
    measure_s: float
    interval_s: float
    ramp_s: float
    rtt_s: float
    rate_bps: float

    @property
    def total_s(self) -> float:
        return self.omit_s + self.measure_s

    def said(self) -> str:
        """One line for the progress: what it will take and why."""
        return (f"{self.total_s:.1f} s: the first {self.omit_s:.1f} s left out (slow start to "
                f"{format_rate(self.rate_bps)} at {self.rtt_s * 1e3:.0f} ms takes ≈ "
                f"{self.ramp_s:.1f} s), then {self.measure_s:.1f} s measured")


def slow_start_s(rate_bps: float, rtt_s: float, mss_bytes: int = DEFAULT_MSS_BYTES) -> float:
    """Round trips slow start needs to reach the BDP, times the RTT (one more for the
    handshake)."""
    segments = rate_bps * rtt_s / 8 / mss_bytes
    return rtt_s * (max(math.log2(max(segments, 1) / INITIAL_WINDOW_SEGMENTS), 0.0) + 1)


def tcp_test_time(rate_bps: float, rtt_s: float, *, measure_min_s: float,
                  interval_s: float = 0.5, mss_bytes: int = DEFAULT_MSS_BYTES) -> TestTime:
    """The omit period (slow start and drain, rounded up to whole intervals) and the measured
    span (at least ``measure_min_s`` and one PROBE_BW cycle) for a path of ``rate_bps`` ×
    ``rtt_s``."""
    ramp = slow_start_s(rate_bps, rtt_s, mss_bytes)
    omit = min(math.ceil((ramp + DRAIN_RTTS * rtt_s) / interval_s) * interval_s, MAX_OMIT_S)
    measure = math.ceil(max(measure_min_s, PROBE_CYCLE_RTTS * rtt_s) / interval_s) * interval_s
    return TestTime(omit_s=omit, measure_s=measure, interval_s=interval_s, ramp_s=ramp,
                    rtt_s=rtt_s, rate_bps=rate_bps)
