"""Rate limiting with the kernel token bucket filter (tc-tbf(8)) on each lab TUN's egress.

Packets wait in the sender's namespace before the delay line reads them, as they would in a
router queue in front of a slower link. ``burst`` must hold a whole 64 KiB GSO super-packet
(otherwise tbf segments or drops it, net/sched/sch_tbf.c) and at least ~1 ms of traffic so the
timer granularity does not cost rate; ``limit`` is one bandwidth-delay product of queue (at
least 20 ms worth), so TCP sees realistic queueing rather than unbounded bufferbloat.
"""

from __future__ import annotations

import math

GSO_MAX_BYTES = 65536 + 1600
MIN_QUEUE_S = 0.020


def tbf_burst_bytes(rate_bps: float) -> int:
    """Bucket size: a GSO super-packet or 1 ms at ``rate_bps``, whichever is larger."""
    return max(GSO_MAX_BYTES, math.ceil(rate_bps / 8 * 0.001))


def tbf_limit_bytes(rate_bps: float, rtt_ms: float) -> int:
    """Queue bytes: one BDP (RTT at least 20 ms) on top of the bucket."""
    queue_s = max(rtt_ms / 1e3, MIN_QUEUE_S)
    return tbf_burst_bytes(rate_bps) + math.ceil(rate_bps / 8 * queue_s)


def tbf_commands(ifname: str, rate_bps: float | None, rtt_ms: float) -> list[str]:
    """``ip``-free tc command lines (for ``tc -batch``) that set or clear the shaper."""
    if rate_bps is None:
        return [f"qdisc replace dev {ifname} root pfifo limit 1000"]
    return [
        f"qdisc replace dev {ifname} root tbf rate {int(rate_bps)}bit "
        f"burst {tbf_burst_bytes(rate_bps)} limit {tbf_limit_bytes(rate_bps, rtt_ms)}"
    ]
