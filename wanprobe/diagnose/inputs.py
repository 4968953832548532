"""What the operator told diagnose, and the figures rules derive from the typed measurements
(:class:`~wanprobe.diagnose.measured.Measured`) and host (``host_inputs.Host``), saying where
each came from.

Pure functions. Every getter returns ``(value, source)`` or ``(None, None)`` when the figure was
not measured: absent is None, never 0 (docs/conventions.md §3).
"""

from __future__ import annotations

from dataclasses import dataclass

from wanprobe.diagnose.host_inputs import Host
from wanprobe.diagnose.measured import Measured

# ESnet tier used when the link rate is not known (tcp-tuning.md §1.2, R-2: "10G ≤100 ms").
ASSUMED_LINK_BPS = 10e9
OPERATOR_SOURCE = "operator (--link-rate)"
# Default loss SLO: 0.1 % already costs a Reno-like stream most of a long fat path (Mathis: a
# few tens of Mbit/s at 130 ms), and the subsea paths run at 0.1-1 %.
LOSS_SLO = 0.001


@dataclass(frozen=True)
class DiagnoseConfig:
    """What the operator told diagnose: the link rate they pay for, flows, RoCE priority."""

    link_rate_bps: float | None = None
    flows: int = 1
    # flows expected at once per host for the memory budget (NCCL sockets × peers; R-4)
    concurrent_flows: int = 16
    roce_prio: int = 3
    dscp: int | None = None  # the DSCP training traffic is meant to carry
    loss_slo: float = LOSS_SLO  # the loss a path may have (issue 36: a finding above it)


def rtt_s(m: Measured) -> tuple[float | None, str | None]:
    """Base RTT: probe minimum (kernel timestamps), else the TCP_INFO min_rtt of the streams."""
    path, tput = m.path, m.throughput
    if path and path.rtt_min_ms is not None and path.rtt_min_ms > 0:
        return path.rtt_min_ms / 1e3, f"probe ({path.method}) rtt_ms.min"
    if tput:
        if tput.min_rtt_ms:
            return tput.min_rtt_ms / 1e3, "throughput min_rtt_ms (TCP_INFO)"
        rtts = [s.min_rtt_ms for s in tput.streams if s.min_rtt_ms]
        if rtts:
            return min(rtts) / 1e3, "throughput streams[] TCP_INFO min_rtt"
    return None, None


def link_rate_bps(m: Measured, host: Host | None, config: DiagnoseConfig
                  ) -> tuple[float | None, str | None]:
    """The rate the path should carry: the operator's figure, else the measured path capacity
    (UDP bursts, throughput/capacity.py), else the egress NIC speed (an upper bound only)."""
    if config.link_rate_bps:
        return float(config.link_rate_bps), OPERATOR_SOURCE
    cap = m.path.capacity if m.path else None
    if cap and cap.bits_per_second and cap.source != OPERATOR_SOURCE:
        return cap.bits_per_second, f"measured path capacity ({cap.source})"
    iface = m.egress_iface
    link = host.iface(iface) if host else None
    speed = link.speed_mbps if link else None
    if speed:
        return speed * 1e6, f"/sys/class/net/{iface}/speed"
    return None, None


def target_rate_bps(m: Measured, host: Host | None, config: DiagnoseConfig
                    ) -> tuple[float, str, bool]:
    """Rate to size for: the known link rate, else the ESnet 10 Gbit/s tier (flagged assumed)."""
    rate, src = link_rate_bps(m, host, config)
    if rate:
        return rate, src or "", False
    return ASSUMED_LINK_BPS, "assumed 10 Gbit/s tier (tcp-tuning.md R-2); pass --link-rate", True


def loss_ratio(m: Measured) -> tuple[float | None, str | None]:
    """Path loss from whichever sample is larger: the probe's round-trip loss ratio, or TCP's
    bytes_retrans / bytes_sent from TCP_INFO (tcp-tuning.md R-9) counted in segments."""
    path, tput = m.path, m.throughput
    probe = (path.loss_ratio, path.loss_sent_probes or 0.0) \
        if path and path.loss_ratio is not None else None
    retrans = sent_b = 0.0
    mss = float(m.mss_bytes)
    pairs = tput.retrans_sent_bytes() if tput else []
    for r, b in pairs:
        retrans, sent_b = retrans + r, sent_b + b
    tcp = (retrans / sent_b, sent_b / mss) if pairs and sent_b > 0 else None
    if tcp is None:
        rate = tput.limited_by.retransmit_rate if tput else None
        tcp = (rate, 0.0) if rate is not None else None
    if probe and (tcp is None or probe[1] >= tcp[1]):
        return probe[0], f"probe loss.ratio over {int(probe[1])} probes"
    if tcp:
        return tcp[0], (f"throughput TCP_INFO bytes_retrans / bytes_sent over ≈{int(tcp[1])} "
                        "segments")
    return None, None


def cc_in_use(m: Measured, host: Host | None) -> tuple[str | None, str | None]:
    """Congestion control of the measured transfer, else the host default."""
    if m.throughput and m.throughput.cc:
        return m.throughput.cc, "throughput cc"
    value = host.cc_current if host else None
    return (value, "sysctl net.ipv4.tcp_congestion_control") if value else (None, None)
