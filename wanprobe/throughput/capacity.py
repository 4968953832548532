"""Path capacity, measured: short UDP bursts above the rate the path is expected to carry,
received and timed at the far end (the throughput server's UDP mode).

A burst sent faster than the bottleneck queues there and leaves it at the bottleneck's rate, so
the far end's received bytes over its arrival span measure that rate — the packet-train idea of
Jain & Dovrolis (pathload, IEEE/ACM ToN 2003) and of iperf3 ``-u -b`` above the link. The sender
starts at ``start_bps`` and multiplies by 4 until the far end receives clearly less than was
sent (the burst saturated the path) or the upper bound (the NIC speed) is reached. Random loss
lowers the figure by (1 - p), well inside the ±15 % asked of it below 10 % loss.

Cost: at most ``len(ladder) × burst_s`` seconds, each burst under ``max_bytes``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from wanprobe.errors import WanprobeError
from wanprobe.json_fields import Decoded, json_object, objects, required

SATURATED = 0.8        # received < 80 % of what was sent: the burst filled the bottleneck
HELD_BACK = 0.8        # sent < 80 % of the rate asked: the sender itself was held back
DEFAULT_START_BPS = 50e6
DEFAULT_MAX_BPS = 10e9
LADDER_FACTOR = 4.0


@dataclass(frozen=True)
class Burst(Decoded, json_name="capacity burst"):
    sent_bits_per_second: float
    received_bits_per_second: float
    lost_packets: int

    def to_json(self) -> dict:
        return {"sent_bits_per_second": self.sent_bits_per_second,
                "received_bits_per_second": self.received_bits_per_second,
                "lost_packets": self.lost_packets}


@dataclass(frozen=True)
class Capacity:
    """``bits_per_second`` and how it was obtained (``source``): ``udp_burst`` (saturated),
    ``udp_burst_sender_held`` (the sender could not reach the rate asked: its first hop or CPU
    was the limit), ``udp_burst_lower_bound`` (even the upper bound did not saturate the path),
    ``operator``
    (--link-rate), or ``nic_upper_bound`` (only the interface speed was known)."""

    bits_per_second: float
    source: str
    upper_bound_bits_per_second: float | None = None
    bursts: tuple[Burst, ...] = ()

    def to_json(self) -> dict:
        return {"capacity_bits_per_second": self.bits_per_second,
                "capacity_source": self.source,
                "upper_bound_bits_per_second": self.upper_bound_bits_per_second,
                "bursts": [b.to_json() for b in self.bursts]}

    @classmethod
    def from_json(cls, d: Any, what: str = "capacity") -> Capacity:
        """Inverse of :meth:`to_json`, whose keys carry the ``capacity_`` prefix of a report."""
        d = json_object(d, what)
        required(d, ("capacity_bits_per_second", "capacity_source"), what)
        return cls(d["capacity_bits_per_second"], d["capacity_source"],
                   d.get("upper_bound_bits_per_second"),
                   objects(d.get("bursts", ()), f"{what}.bursts", Burst.from_json))


BurstFn = Callable[[float], Burst]


def ladder_capacity(burst: BurstFn, *, start_bps: float = DEFAULT_START_BPS,
                    max_bps: float = DEFAULT_MAX_BPS) -> Capacity:
    """Pure control loop over ``burst(rate) -> Burst``: climb until a burst saturates."""
    rate = min(start_bps, max_bps)
    bursts: list[Burst] = []
    while True:
        b = burst(rate)
        bursts.append(b)
        if b.sent_bits_per_second > 0 and \
                b.received_bits_per_second < SATURATED * b.sent_bits_per_second:
            return Capacity(b.received_bits_per_second, "udp_burst", max_bps, tuple(bursts))
        if b.sent_bits_per_second < HELD_BACK * rate:
            # The sender could not send at the rate asked: either its first hop is the
            # bottleneck (the socket blocks while the local qdisc queue is full, as in the lab
            # where tbf shapes the sender's own interface) or its CPU is. Either way the far
            # end received all the path gave this sender. No burst can arrive faster than the
            # path carries it, so the best of all bursts is the figure: one more burst at the
            # same rate, since a CPU hiccup (sender, receiver or a software hop) only lowers it.
            bursts.append(burst(rate))
            best = max(x.received_bits_per_second for x in bursts)
            return Capacity(best, "udp_burst_sender_held", max_bps, tuple(bursts))
        if rate >= max_bps:
            return Capacity(b.received_bits_per_second, "udp_burst_lower_bound", max_bps,
                            tuple(bursts))
        rate = min(rate * LADDER_FACTOR, max_bps)


def measure_capacity(peer: str, port: int, *, start_bps: float = DEFAULT_START_BPS,
                     max_bps: float = DEFAULT_MAX_BPS, burst_s: float = 0.5,
                     max_bytes: int = 2**30, dscp: int = 0,
                     hmac_key: bytes | None = None) -> Capacity:
    """Bursts against a wanprobe throughput server at ``peer:port`` (its UDP mode; with
    ``hmac_key`` through the authenticated control channel)."""
    from wanprobe.throughput.client import run_throughput

    def burst(rate: float) -> Burst:
        cap = max(min(max_bytes, math.ceil(rate * burst_s / 8) + 1), 1)
        res = run_throughput(peer, port=port, udp=True, udp_rate_bps=rate, duration_s=burst_s,
                             interval_s=burst_s, max_bytes=cap, dscp=dscp, hmac_key=hmac_key)
        if res.udp is None:
            raise WanprobeError(f"capacity: {peer} returned no UDP result")
        return Burst(res.udp.sender_bits_per_second, res.udp.bits_per_second,
                     res.udp.lost_packets)

    return ladder_capacity(burst, start_bps=start_bps, max_bps=max_bps)
