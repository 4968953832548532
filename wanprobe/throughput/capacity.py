"""Path capacity, measured: short UDP bursts above the rate the path is expected to carry,
received and timed at the far end (the throughput server's UDP mode, udp_sink.py).

A burst sent faster than the bottleneck queues there and leaves it at the bottleneck's rate, so
the far end's received bytes over its arrival span (kernel timestamps) measure that rate — the
packet-train idea of Jain & Dovrolis (pathload, IEEE/ACM ToN 2003) and of iperf3 ``-u -b`` above
the link. The sender (UDP GSO) starts at ``start_bps`` and multiplies by 4 until the far end
receives clearly less than was sent (the burst saturated the path), the sender is held back by
its first hop, or the upper bound (the NIC speed) is reached. Random loss lowers the figure by
(1 - p), well inside the ±15 % asked of it below 10 % loss.

The measuring hosts are never the limit of the figure (issue 35). What a host dropped itself
(the far end's socket, input backlog or NIC; udp_sink.py) is not path loss, and a burst in which
the receiving host dropped datagrams, or whose sender ran out of CPU, says only that the path
carries *at least* what arrived: ``lower_bound`` is then True, ``limit`` names the host, and
the figure is never called the path's capacity.

Which estimate is used, and why (issue 35, bench/capacity_vs_rate.py): the bursts measure the
bottleneck directly, whatever the hosts' TCP settings; a TCP test measures it only when nothing
else limits the stream (buffers, cc, loss), and BBR's own estimate (TCP_CC_INFO, a windowed
maximum of delivery-rate samples) only under BBR. So the bursts' figure is the capacity; the TCP
test's rate and BBR's estimate in the same run are kept beside it (``tcp_cross_check``), and
the figure is never below the TCP rate (:meth:`Capacity.at_least`). On the lab at 50 and 130 ms
× 0.1-5 Gbit/s the bursts read 1.01-1.06 × iperf3's goodput, the TCP test with bbr and big
buffers 1.00-1.03 and BBR's estimate 1.01-1.08.

Cost: at most ``len(ladder) × burst_s`` seconds of bursts, each under ``max_bytes``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from wanprobe.errors import WanprobeError
from wanprobe.json_fields import Decoded, json_object, objects, required
from wanprobe.units import format_rate

SATURATED = 0.8        # the path delivered < 80 % of what was sent: the burst filled it
HELD_BACK = 0.8        # sent < 80 % of the rate asked: the sender itself was held back
SENDER_CPU_BOUND = 0.9  # ... while its thread was on a CPU ≥ 90 % of the burst: its CPU
HOST_DROP_SHARE = 0.001  # the receiving host dropped, and ≥ 0.1 % of the burst was lost
DEFAULT_START_BPS = 50e6
DEFAULT_MAX_BPS = 10e9
LADDER_FACTOR = 4.0
AGREE = 0.03           # UDP bursts and a TCP test of one path agree within 3 % (headers, timing)

# The lower bounds, each with what held it (the exact sources: udp_burst, udp_burst_sender_held).
LIMITS = {"udp_burst_receiver_limited": "the receiving host",
          "udp_burst_sender_cpu": "the sending host's CPU",
          "udp_burst_lower_bound": "the ladder's upper bound (the NIC speed)",
          "tcp_goodput": "the TCP test (the bursts measured less than it delivered)"}


@dataclass(frozen=True)
class Burst(Decoded, json_name="capacity burst"):
    """One burst: what was sent and received, and whose loss it was: ``host_drop_events`` the
    buffers the receiving host dropped itself, ``path_lost_packets`` what the path lost (None
    when the host dropped some: not told apart, never booked on the path; None too from a
    server that cannot tell)."""

    sent_bits_per_second: float
    received_bits_per_second: float
    lost_packets: int
    asked_bits_per_second: float | None = None
    packets_sent: int | None = None
    host_drop_events: int | None = None
    path_lost_packets: int | None = None
    sender_cpu_ratio: float | None = None
    receiver: str | None = None
    receiver_rcvbuf_bytes: int | None = None

    def to_json(self) -> dict:
        return {"sent_bits_per_second": self.sent_bits_per_second,
                "received_bits_per_second": self.received_bits_per_second,
                "lost_packets": self.lost_packets,
                "asked_bits_per_second": self.asked_bits_per_second,
                "packets_sent": self.packets_sent,
                "host_drop_events": self.host_drop_events,
                "path_lost_packets": self.path_lost_packets,
                "sender_cpu_ratio": self.sender_cpu_ratio, "receiver": self.receiver,
                "receiver_rcvbuf_bytes": self.receiver_rcvbuf_bytes}

    @property
    def receiver_dropped(self) -> bool:
        """The receiving host, not the path, dropped part of this burst: some drop events, and
        enough lost (HOST_DROP_SHARE) that the received rate may be short of the path's."""
        return bool(self.host_drop_events) and \
            self.lost_packets >= HOST_DROP_SHARE * (self.packets_sent or 0)

    @property
    def path_delivered_share(self) -> float | None:
        """What the path delivered of what was sent (None: unknown, or nothing sent)."""
        if not self.packets_sent:
            return None
        path_lost = (self.path_lost_packets if self.path_lost_packets is not None
                     else self.lost_packets)
        return 1.0 - path_lost / self.packets_sent


@dataclass(frozen=True)
class Capacity:
    """``bits_per_second`` and how it was obtained (``source``): ``udp_burst`` (saturated),
    ``udp_burst_sender_held`` (the sender's first hop took no more: the path's rate at this
    host), or a lower bound — ``udp_burst_receiver_limited``, ``udp_burst_sender_cpu``,
    ``udp_burst_lower_bound`` (even the upper bound did not saturate the path), ``tcp_goodput``
    (the TCP test in the same run delivered more) — with ``lower_bound`` True and ``limit``
    naming what held it; ``reason`` says it in one line."""

    bits_per_second: float
    source: str
    upper_bound_bits_per_second: float | None = None
    bursts: tuple[Burst, ...] = ()
    reason: str = ""
    # the TCP test in the same run: its rate after the ramp-up, and BBR's own estimate
    tcp_bits_per_second: float | None = None
    bbr_bits_per_second: float | None = None

    @property
    def lower_bound(self) -> bool:
        """The figure is a lower bound of the path (a host or the ladder held the bursts, or
        the TCP test passed them); the operator's rate and the exact sources are not."""
        return self.source in LIMITS

    @property
    def limit(self) -> str | None:
        return LIMITS.get(self.source)

    def to_json(self) -> dict:
        return {"capacity_bits_per_second": self.bits_per_second,
                "capacity_source": self.source,
                "capacity_is_lower_bound": self.lower_bound, "capacity_limit": self.limit,
                "capacity_reason": self.reason,
                "upper_bound_bits_per_second": self.upper_bound_bits_per_second,
                "bursts": [b.to_json() for b in self.bursts],
                "tcp_cross_check": {"tcp_bits_per_second": self.tcp_bits_per_second,
                                    "bbr_bits_per_second": self.bbr_bits_per_second}}

    @classmethod
    def from_json(cls, d: Any, what: str = "capacity") -> Capacity:
        """Inverse of :meth:`to_json`, whose keys carry the ``capacity_`` prefix of a report."""
        d = json_object(d, what)
        required(d, ("capacity_bits_per_second", "capacity_source"), what)
        reason = d.get("capacity_reason")
        cross = d.get("tcp_cross_check") if isinstance(d.get("tcp_cross_check"), dict) else {}
        return cls(d["capacity_bits_per_second"], d["capacity_source"],
                   d.get("upper_bound_bits_per_second"),
                   objects(d.get("bursts", ()), f"{what}.bursts", Burst.from_json),
                   reason if isinstance(reason, str) else "", cross.get("tcp_bits_per_second"),
                   cross.get("bbr_bits_per_second"))

    def at_least(self, tcp_bps: float | None, bbr_bps: float | None = None) -> Capacity:
        """Never below a rate the path delivered to TCP in the same run: an exact figure that
        TCP passed by less than AGREE (the two methods' agreement) is raised to it; any other
        figure under it is replaced by that rate, as a lower bound named so. Both TCP figures
        are kept beside it (``tcp_cross_check``)."""
        cap = replace(self, tcp_bits_per_second=tcp_bps, bbr_bits_per_second=bbr_bps)
        if not tcp_bps or tcp_bps <= cap.bits_per_second:
            return cap
        if not cap.lower_bound and tcp_bps <= (1 + AGREE) * cap.bits_per_second:
            return replace(cap, bits_per_second=tcp_bps, reason=(
                f"{cap.reason}; raised to the TCP test's {format_rate(tcp_bps)} (the two "
                f"methods agree within {AGREE:.0%})"))
        return replace(cap, bits_per_second=tcp_bps, source="tcp_goodput", reason=(
            f"≥ {format_rate(tcp_bps)}: the TCP test delivered more than the UDP bursts "
            f"measured ({format_rate(cap.bits_per_second)}, {cap.source}"
            + (f": {cap.limit}" if cap.limit else "") + ")"))

BurstFn = Callable[[float], Burst]


def _bound(bursts: list[Burst], source: str, max_bps: float, why: str) -> Capacity:
    best = max(b.received_bits_per_second for b in bursts)
    return Capacity(best, source, max_bps, tuple(bursts),
                    f"≥ {format_rate(best)}: {LIMITS[source]} — {why}")


def ladder_capacity(burst: BurstFn, *, start_bps: float = DEFAULT_START_BPS,
                    max_bps: float = DEFAULT_MAX_BPS) -> Capacity:
    """Pure control loop over ``burst(rate) -> Burst``: climb until a burst saturates the path,
    the sender is held back, a host is the limit or ``max_bps`` is reached."""
    rate = min(start_bps, max_bps)
    bursts: list[Burst] = []
    while True:
        b = burst(rate)
        bursts.append(b)
        if b.receiver_dropped:
            return _bound(bursts, "udp_burst_receiver_limited", max_bps, (
                f"it dropped datagrams itself ({b.host_drop_events} drop events; "
                f"{b.lost_packets} of {b.packets_sent} lost in all, none booked on the path) at "
                f"{format_rate(b.sent_bits_per_second)}, receive buffer "
                f"{b.receiver_rcvbuf_bytes or '?'} B"))
        delivered = b.path_delivered_share
        if delivered is None and b.sent_bits_per_second > 0:
            delivered = b.received_bits_per_second / b.sent_bits_per_second
        if b.sent_bits_per_second > 0 and delivered is not None and delivered < SATURATED:
            return Capacity(b.received_bits_per_second, "udp_burst", max_bps, tuple(bursts),
                            f"a burst at {format_rate(b.sent_bits_per_second)} saturated the "
                            f"path: {delivered:.0%} delivered")
        if b.sent_bits_per_second < HELD_BACK * rate:
            if (b.sender_cpu_ratio or 0.0) >= SENDER_CPU_BOUND:
                return _bound(bursts, "udp_burst_sender_cpu", max_bps, (
                    f"its sending thread was on a CPU {b.sender_cpu_ratio:.0%} of the burst "
                    f"and sent {format_rate(b.sent_bits_per_second)} of "
                    f"{format_rate(rate)} asked"))
            # The sender could not send at the rate asked while its CPU had time to spare:
            # its first hop took no more (the socket blocks while the local queue is full, as
            # in the lab where tbf shapes the sender's own interface). The far end received all
            # the path gave this sender; no burst arrives faster than the path carries it, so
            # the best of all bursts is the figure: one more burst at the same rate, since a
            # CPU hiccup (sender, receiver or a software hop) only lowers it.
            bursts.append(burst(rate))
            best = max(x.received_bits_per_second for x in bursts)
            return Capacity(best, "udp_burst_sender_held", max_bps, tuple(bursts),
                            f"the sender's first hop took {format_rate(best)} of "
                            f"{format_rate(rate)} asked, all of it delivered")
        if rate >= max_bps:
            return _bound(bursts, "udp_burst_lower_bound", max_bps,
                          f"a burst at {format_rate(rate)} did not saturate the path")
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
        u = res.udp
        if u is None:
            raise WanprobeError(f"capacity: {peer} returned no UDP result")
        return Burst(u.sender_bits_per_second, u.bits_per_second, u.lost_packets,
                     asked_bits_per_second=rate, packets_sent=u.packets_sent,
                     host_drop_events=u.host_drop_events,
                     path_lost_packets=u.path_lost_packets, sender_cpu_ratio=u.sender_cpu_ratio,
                     receiver=u.receiver, receiver_rcvbuf_bytes=u.receiver_rcvbuf_bytes)

    return ladder_capacity(burst, start_bps=start_bps, max_bps=max_bps)
