"""The closed loop after ``tune apply --verify`` (issue 20): measure the path again, measure its
capacity in the same run, judge (``diagnose/verify.judge``, pure); below FULL_SHARE of the
capacity measure again, RETEST_FACTOR × longer with RETEST_FACTOR × the ramp-up left out, and
judge that. The tune service (``services/tune.py``) runs it after an apply.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from wanprobe.diagnose.throughput_verdict import JUDGE
from wanprobe.diagnose.verify import Verification, judge
from wanprobe.errors import WanprobeError
from wanprobe.throughput.result import ThroughputResult, after_omit_bps

RETEST_FACTOR = 2.0  # the re-measure: twice the duration, twice the ramp-up left out

Measure = Callable[[float], ThroughputResult]            # duration_s -> throughput result
Capacity = Callable[[float], tuple[float | None, str]]   # TCP rate -> (capacity, source)


def verify_loop(measure: Measure, capacity: Capacity, *, duration_s: float = 6.0,
                omit_s: float = 2.0, capacity_bps: float | None = None,
                retest: bool = True) -> Verification:
    """The loop over injected measurements: test, capacity (unless given), judge; below
    FULL_SHARE test again, RETEST_FACTOR × longer with RETEST_FACTOR × the ramp-up left out."""
    first = measure(duration_s)
    source = "operator"
    if capacity_bps is None:
        rate = after_omit_bps(first.intervals, omit_s)
        capacity_bps, source = capacity(rate or first.bits_per_second)
    v = judge(first, omit_s, capacity_bps=capacity_bps, capacity_source=source)
    if not retest or v.limit in ("full", "unknown"):
        return v
    try:
        again = measure(duration_s * RETEST_FACTOR)
    except WanprobeError as exc:  # keep the first answer; say why there is no second
        return replace(v, summary=f"{v.summary} (the longer re-measure failed: {exc})")
    return judge(again, omit_s * RETEST_FACTOR, capacity_bps=capacity_bps,
                 capacity_source=source, earlier=v.attempts)


def verify_path(peer: str, *, port: int = 862, duration_s: float = 6.0, omit_s: float = 2.0,
                max_bytes: int = 2**30, hmac_key: bytes | None = None,
                capacity_bps: float | None = None, retest: bool = True) -> Verification:
    """Measure this host → ``peer`` again (one stream, capped), measure the path's capacity
    with UDP bursts (unless ``capacity_bps`` is known) and judge."""
    from wanprobe.throughput.capacity import measure_capacity
    from wanprobe.throughput.client import run_throughput

    def measure(secs: float) -> ThroughputResult:
        return run_throughput(peer, port=port, duration_s=secs, max_bytes=max_bytes,
                              interval_s=0.5, hmac_key=hmac_key, judge=JUDGE)

    def capacity(tcp_bps: float) -> tuple[float | None, str]:
        try:  # start above what TCP reached, as diagnose does, so one burst saturates
            cap = measure_capacity(peer, port, start_bps=max(2 * tcp_bps, 20e6),
                                   max_bytes=max_bytes, hmac_key=hmac_key)
        except WanprobeError as exc:
            return None, f"not measured: {exc}"
        return cap.bits_per_second, cap.source

    return verify_loop(measure, capacity, duration_s=duration_s, omit_s=omit_s,
                       capacity_bps=capacity_bps, retest=retest)
