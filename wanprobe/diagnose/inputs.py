"""Read the numbers rules need out of the plain measurement dicts (probe, throughput, counters JSON
as in issues 3-5) and the typed host (``host_inputs.Host``), saying where each number came from.

Pure functions. Every getter returns ``(value, source)`` or ``(None, None)`` when the number was
not measured: absent is None, never 0 (STYLE.md §3).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from wanprobe.diagnose.host_inputs import Host

# ESnet tier used when the link rate is not known (tcp-tuning.md §1.2, R-2: "10G ≤100 ms").
ASSUMED_LINK_BPS = 10e9
DEFAULT_MSS_BYTES = 1448  # 1500-byte MTU minus IPv4 + TCP headers with timestamps (RFC 7323)


@dataclass(frozen=True)
class DiagnoseConfig:
    """What the operator told diagnose: the link rate they pay for, flows, RoCE priority."""

    link_rate_bps: float | None = None
    flows: int = 1
    # flows expected at once per host for the memory budget (NCCL sockets × peers; R-4)
    concurrent_flows: int = 16
    roce_prio: int = 3
    dscp: int | None = None  # the DSCP training traffic is meant to carry


def num(d: Any, key: str) -> float | None:
    """``d[key]`` (a dotted path) when it is a finite number; None when absent or not one. One
    spelling per figure: the key the producer writes (report/schema, throughput/result.py)."""
    cur = d
    for part in key.split("."):
        cur = cur.get(part) if isinstance(cur, Mapping) else None
    if isinstance(cur, bool) or not isinstance(cur, (int, float)) or not math.isfinite(cur):
        return None
    return float(cur)


def section(m: Mapping[str, Any] | None, name: str) -> Mapping[str, Any] | None:
    """``m[name]`` when it is a measured (non-empty) dict."""
    part = m.get(name) if isinstance(m, Mapping) else None
    return part if isinstance(part, Mapping) and part else None


def rtt_s(m: Mapping[str, Any]) -> tuple[float | None, str | None]:
    """Base RTT: probe minimum (kernel timestamps), else the TCP_INFO min_rtt of the streams."""
    path = section(m, "path")
    v = num(path, "rtt_ms.min") if path else None
    if v is not None and v > 0:
        return v / 1e3, f"probe ({path.get('method', 'stamp')}) rtt_ms.min"
    tput = section(m, "throughput")
    if tput:
        top = num(tput, "min_rtt_ms")
        if top:
            return top / 1e3, "throughput min_rtt_ms (TCP_INFO)"
        rtts = [r for r in (num(s, "tcp_info.min_rtt_ms") for s in streams(m)) if r]
        if rtts:
            return min(rtts) / 1e3, "throughput streams[] TCP_INFO min_rtt"
    return None, None


def link_rate_bps(m: Mapping[str, Any], host: Host | None, config: DiagnoseConfig
                  ) -> tuple[float | None, str | None]:
    """The rate the path should carry: the operator's figure, else the measured path capacity
    (UDP bursts, throughput/capacity.py), else the egress NIC speed (an upper bound only)."""
    if config.link_rate_bps:
        return float(config.link_rate_bps), "operator (--link-rate)"
    path = section(m, "path") or {}
    cap = num(path, "capacity_bits_per_second")
    if cap and path.get("capacity_source") != "operator (--link-rate)":
        return cap, f"measured path capacity ({path.get('capacity_source')})"
    mtu = section(m, "mtu") or {}
    iface = mtu.get("iface")
    link = host.iface(iface) if host else None
    speed = link.speed_mbps if link else None
    if speed:
        return speed * 1e6, f"/sys/class/net/{iface}/speed"
    return None, None


def target_rate_bps(m: Mapping[str, Any], host: Host | None, config: DiagnoseConfig
                    ) -> tuple[float, str, bool]:
    """Rate to size for: the known link rate, else the ESnet 10 Gbit/s tier (flagged assumed)."""
    rate, src = link_rate_bps(m, host, config)
    if rate:
        return rate, src or "", False
    return ASSUMED_LINK_BPS, "assumed 10 Gbit/s tier (tcp-tuning.md R-2); pass --link-rate", True


def streams(m: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    tput = section(m, "throughput") or {}
    return [s for s in tput.get("streams") or [] if isinstance(s, Mapping)]


def _limited_share(m: Mapping[str, Any], field: str) -> float | None:
    """Share of busy time a stream spent limited by ``field`` (tcpi_rwnd_limited or
    tcpi_sndbuf_limited over tcpi_busy_time, include/uapi/linux/tcp.h), summed over streams."""
    lim = busy = 0.0
    seen = False
    for s in streams(m):
        li, bu = num(s, f"tcp_info.{field}_ms"), num(s, "tcp_info.busy_time_ms")
        if li is not None and bu:
            lim, busy, seen = lim + li, busy + bu, True
    return lim / busy if seen and busy > 0 else None


def rwnd_limited_share(m: Mapping[str, Any]) -> float | None:
    tput = section(m, "throughput") or {}
    ev = (tput.get("limited_by") or {}).get("evidence") or {}
    v = num(ev, "rwnd_limited_share")
    return v if v is not None else _limited_share(m, "rwnd_limited")


def sndbuf_limited_share(m: Mapping[str, Any]) -> float | None:
    tput = section(m, "throughput") or {}
    ev = (tput.get("limited_by") or {}).get("evidence") or {}
    v = num(ev, "sndbuf_limited_share")
    return v if v is not None else _limited_share(m, "sndbuf_limited")


def verdict(m: Mapping[str, Any]) -> str | None:
    tput = section(m, "throughput") or {}
    lb = tput.get("limited_by")
    v = lb.get("verdict") if isinstance(lb, Mapping) else lb
    return str(v) if v else None


def loss_ratio(m: Mapping[str, Any]) -> tuple[float | None, str | None]:
    """Path loss from whichever sample is larger: the probe's round-trip loss ratio, or TCP's
    bytes_retrans / bytes_sent from TCP_INFO (tcp-tuning.md R-9) counted in segments."""
    path = section(m, "path")
    sent = num(path, "loss.sent") if path else None
    ratio = num(path, "loss.ratio") if path else None
    probe = (ratio, sent or 0.0) if ratio is not None else None
    retrans = sent_b = 0.0
    mss = float(mss_bytes(m))
    seen = False
    for s in streams(m):
        r, b = num(s, "tcp_info.bytes_retrans"), num(s, "tcp_info.bytes_sent")
        if r is not None and b:
            retrans, sent_b, seen = retrans + r, sent_b + b, True
    tcp = (retrans / sent_b, sent_b / mss) if seen and sent_b > 0 else None
    if tcp is None:
        rate = num(section(m, "throughput") or {}, "limited_by.evidence.retransmit_rate")
        tcp = (rate, 0.0) if rate is not None else None
    if probe and (tcp is None or probe[1] >= tcp[1]):
        return probe[0], f"probe loss.ratio over {int(probe[1])} probes"
    if tcp:
        return tcp[0], (f"throughput TCP_INFO bytes_retrans / bytes_sent over ≈{int(tcp[1])} "
                        "segments")
    return None, None


def cc_in_use(m: Mapping[str, Any], host: Host | None) -> tuple[str | None, str | None]:
    """Congestion control of the measured transfer, else the host default."""
    tput = section(m, "throughput") or {}
    cc = tput.get("cc")
    if isinstance(cc, str) and cc:
        return cc, "throughput cc"
    value = host.cc_current if host else None
    return (value, "sysctl net.ipv4.tcp_congestion_control") if value else (None, None)


def mss_bytes(m: Mapping[str, Any]) -> int:
    """Sender MSS from TCP_INFO (snd_mss), else the 1500-MTU default."""
    for s in streams(m):
        v = num(s, "tcp_info.snd_mss_bytes")
        if v:
            return int(v)
    return DEFAULT_MSS_BYTES
