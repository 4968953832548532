"""Rules on the host's own network configuration (tcp-tuning.md §6: R-1, R-8, R-9, R-14, R-15,
R-20, and ESnet's tcp_slow_start_after_idle=0). Pure: they read the report's host dict and, for
sizing, the measured RTT."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from wanprobe.diagnose import inputs as I
from wanprobe.diagnose.inputs import DiagnoseConfig, section
from wanprobe.diagnose.rule import mbit, mib, rule
from wanprobe.diagnose.rules_path import RTT_FOR_BBR_S, buffer_knobs
from wanprobe.diagnose.rules_transfer import host_model_buffer
from wanprobe.models.bdp import (
    bdp_bytes,
    buffer_needed_bytes,
    window_from_buffer_bytes,
    window_limited_rate_bps,
)
from wanprobe.report.document import Finding, Knob

NOTSENT_LOWAT_BYTES = 131072      # R-8 (tuned network-throughput, Cloudflare)
NOTSENT_UNLIMITED = 4294967295    # kernel default: no limit (ip-sysctl.rst)

Meas = Mapping[str, Any]
Host = Mapping[str, Any] | None


@rule("host.buffers_below_bdp")
def buffers_below_bdp(m: Meas, host: Host, config: DiagnoseConfig) -> Finding | None:
    """tcp_rmem[2] / tcp_wmem[2] below 2×BDP of the target rate over the measured RTT (R-1)."""
    rtt, rtt_src = I.rtt_s(m)
    rmem, wmem = I.triplet(host, "net.ipv4.tcp_rmem"), I.triplet(host, "net.ipv4.tcp_wmem")
    if rtt is None or (rmem is None and wmem is None):
        return None
    target, target_src, assumed = I.target_rate_bps(m, host, config)
    flows = max(1, config.flows)
    need = buffer_needed_bytes(target / flows, rtt)
    short = [(n, t) for n, t in (("net.ipv4.tcp_rmem", rmem), ("net.ipv4.tcp_wmem", wmem))
             if t is not None and t[2] < need]
    if not short:
        return None
    smallest = min(t[2] for _, t in short)
    cap = window_limited_rate_bps(window_from_buffer_bytes(smallest), rtt) * flows
    model = host_model_buffer(m, host, config)
    size, why = model if model and model[0] > need else (
        need, f"2×BDP for {mbit(target)} at {rtt * 1e3:.0f} ms (R-1)")
    knobs, clamped = buffer_knobs(host, size, why, names=tuple(n for n, _ in short))
    severity = "info" if assumed else ("warning" if cap >= 0.5 * target else "critical")
    verdict = I.verdict(m)
    if verdict is not None and verdict not in ("receive_window", "send_buffer"):
        # the measured transfer was limited elsewhere: measured evidence beats the model
        severity = "info"
    return Finding(
        id="host.buffers_below_bdp", severity=severity,
        title="TCP buffer limits are below the bandwidth-delay product",
        evidence={"tcp_rmem": I.sysctl(host, "net.ipv4.tcp_rmem"),
                  "tcp_wmem": I.sysctl(host, "net.ipv4.tcp_wmem"), "rtt_ms": rtt * 1e3,
                  "link_rate_bps": target, "link_rate_assumed": assumed, "flows": flows,
                  "bdp_bytes": bdp_bytes(target / flows, rtt), "buffer_needed_bytes": need,
                  "window_limited_rate_bps": cap, "throughput_verdict": verdict,
                  "sources": {"rtt_ms": rtt_src, "link_rate_bps": target_src,
                              "tcp_rmem": "sysctl", "tcp_wmem": "sysctl"}},
        recommendation=f"Raise {' and '.join(n for n, _ in short)} max to ≥ {mib(clamped)}.",
        expected_effect=(f"a {mib(smallest)} buffer advertises ≈ {mib(smallest / 2)} and caps "
                         f"{flows} stream(s) at ≈ {mbit(cap)} over {rtt * 1e3:.0f} ms; the link "
                         f"carries {mbit(target)}{' (assumed)' if assumed else ''}; 2×BDP = "
                         f"{mib(need)}"),
        knobs=tuple(knobs), impact=max(0.0, 1 - cap / target))


@rule("host.loss_based_default_cc")
def loss_based_default_cc(m: Meas, host: Host, config: DiagnoseConfig) -> Finding | None:
    """Default cc reno/cubic on a long path (RTT > 20 ms) where bbr is offered (R-9, R-11)."""
    cc = I.sysctl(host, "net.ipv4.tcp_congestion_control")
    rtt, rtt_src = I.rtt_s(m)
    avail = (host or {}).get("available_cc") or []
    if cc not in ("reno", "cubic") or rtt is None or rtt <= RTT_FOR_BBR_S or "bbr" not in avail:
        return None
    return Finding(
        id="host.loss_based_default_cc", severity="warning",
        title=f"Default congestion control is {cc} on a {rtt * 1e3:.0f} ms path",
        evidence={"tcp_congestion_control": cc, "available_cc": list(avail), "rtt_ms": rtt * 1e3,
                  "sources": {"rtt_ms": rtt_src,
                              "tcp_congestion_control": "sysctl net.ipv4"}},
        recommendation="Use bbr for the training flows (per socket or namespace default).",
        expected_effect=("loss-based cc falls about 10× at 0.1 % loss on long paths while bbr "
                         "holds (1-p)·link (ACM Queue 2016, Fig. 10)"),
        knobs=(Knob("sysctl", "net.ipv4.tcp_congestion_control", "bbr",
                    "long RTT, loss-insensitive cc (R-9)", side="both"),))


@rule("host.no_fq_pacing")
def no_fq_pacing(m: Meas, host: Host, config: DiagnoseConfig) -> Finding | None:
    """default_qdisc / root qdisc is not fq (R-15); recommend fq only where sch_fq exists."""
    if not host:
        return None
    default_qdisc = I.sysctl(host, "net.core.default_qdisc")
    ifaces = host.get("ifaces") or {}
    egress = (section(m, "mtu") or {}).get("iface")
    qdiscs = {n: i.get("qdisc") for n, i in ifaces.items() if n != "lo" and i.get("qdisc")}
    relevant = {egress: qdiscs[egress]} if egress in qdiscs else qdiscs
    if default_qdisc == "fq" or (relevant and all(q in ("fq", "mq") for q in relevant.values())):
        return None
    available = host.get("fq_available")
    evidence = {"default_qdisc": default_qdisc, "root_qdiscs": relevant,
                "fq_available": available,
                "sources": {"default_qdisc": "sysctl net.core.default_qdisc (absent in a netns)",
                            "root_qdiscs": "tc -j qdisc show",
                            "fq_available": "/sys/module/sch_fq, /lib/modules"}}
    if not available:
        return Finding(
            id="host.no_fq_pacing", severity="info",
            title="No fq pacing, and sch_fq is not available on this kernel",
            evidence=evidence,
            recommendation=("Use bbr, which paces in TCP itself without fq (since Linux 4.13), "
                            "or SO_MAX_PACING_RATE per socket; build/load sch_fq to get fq."),
            expected_effect="pacing avoids burst losses at a slower bottleneck (ESnet: 2–4× at "
                            "50–80 ms when a fast host sends into a slower path)")
    # default_qdisc applies to qdiscs created afterwards; existing roots need `tc qdisc replace`
    knobs = [Knob("sysctl", "net.core.default_qdisc", "fq", "pacing (R-15)", side="local")] \
        if default_qdisc is not None else []
    return Finding(
        id="host.no_fq_pacing", severity="warning", title="Interfaces do not use fq pacing",
        evidence=evidence,
        recommendation=("Set net.core.default_qdisc=fq and `tc qdisc replace dev IF root fq` on "
                        + ", ".join(sorted(relevant) or ["the egress interface"]) + "."),
        expected_effect="pacing avoids burst losses at a slower bottleneck (ESnet: 2–4× at "
                        "50–80 ms)", knobs=tuple(knobs))


@rule("host.mtu_probing_off")
def mtu_probing_off(m: Meas, host: Host, config: DiagnoseConfig) -> Finding | None:
    """tcp_mtu_probing=0: set 1 (R-20), which matters with jumbo frames or a lower path MTU."""
    value = I.sysctl_int(host, "net.ipv4.tcp_mtu_probing")
    if value != 0:
        return None
    mtus = [i.get("mtu") for n, i in ((host or {}).get("ifaces") or {}).items() if n != "lo"]
    jumbo = any(isinstance(x, int) and x > 1500 for x in mtus)
    return Finding(
        id="host.mtu_probing_off", severity="warning" if jumbo else "info",
        title="TCP MTU probing is off",
        evidence={"tcp_mtu_probing": value, "jumbo_ifaces": jumbo,
                  "sources": {"tcp_mtu_probing": "sysctl net.ipv4.tcp_mtu_probing"}},
        recommendation="Set net.ipv4.tcp_mtu_probing=1 (probe only after an ICMP black hole).",
        expected_effect="connections survive a path that drops large packets without ICMP "
                        "instead of stalling (RFC 4821)",
        knobs=(Knob("sysctl", "net.ipv4.tcp_mtu_probing", "1", "R-20", side="both"),))


@rule("host.slow_start_after_idle")
def slow_start_after_idle(m: Meas, host: Host, config: DiagnoseConfig) -> Finding | None:
    """tcp_slow_start_after_idle=1 collapses cwnd between all-reduce bursts (ESnet: set 0)."""
    if I.sysctl_int(host, "net.ipv4.tcp_slow_start_after_idle") != 1:
        return None
    rtt, src = I.rtt_s(m)
    long_path = rtt is not None and rtt > RTT_FOR_BBR_S
    return Finding(
        id="host.slow_start_after_idle", severity="warning" if long_path else "info",
        title="cwnd restarts from slow start after every idle period",
        evidence={"tcp_slow_start_after_idle": 1, "rtt_ms": rtt * 1e3 if rtt else None,
                  "sources": {"rtt_ms": src}},
        recommendation="Set net.ipv4.tcp_slow_start_after_idle=0.",
        expected_effect=("each gradient burst after an idle RTO starts again at the initial "
                         "window and needs ≈ log2(BDP/10 segments) round trips to refill the "
                         "path" + (f" ({rtt * 1e3:.0f} ms each)" if rtt else "")),
        knobs=(Knob("sysctl", "net.ipv4.tcp_slow_start_after_idle", "0",
                    "keep cwnd across idle gaps (ESnet)", side="both"),))


@rule("host.notsent_lowat_unlimited")
def notsent_lowat_unlimited(m: Meas, host: Host, config: DiagnoseConfig) -> Finding | None:
    """Unlimited tcp_notsent_lowat with large tcp_wmem queues unsent data in the kernel (R-8)."""
    value = I.sysctl_int(host, "net.ipv4.tcp_notsent_lowat")
    if value is None or value < NOTSENT_UNLIMITED:
        return None
    return Finding(
        id="host.notsent_lowat_unlimited", severity="info",
        title="tcp_notsent_lowat is unlimited",
        evidence={"tcp_notsent_lowat": value, "tcp_wmem": I.sysctl(host, "net.ipv4.tcp_wmem"),
                  "sources": {"tcp_notsent_lowat": "sysctl net.ipv4.tcp_notsent_lowat"}},
        recommendation=f"Set net.ipv4.tcp_notsent_lowat={NOTSENT_LOWAT_BYTES} with large tcp_wmem.",
        expected_effect="bounds unsent data per socket so large send buffers do not add "
                        "latency or memory pressure (tuned network-throughput)",
        knobs=(Knob("sysctl", "net.ipv4.tcp_notsent_lowat", str(NOTSENT_LOWAT_BYTES), "R-8",
                    side="both"),))


@rule("host.metrics_saved")
def metrics_saved(m: Meas, host: Host, config: DiagnoseConfig) -> Finding | None:
    """tcp_no_metrics_save=0 lets one lossy transfer's cached ssthresh cap the next (R-14)."""
    if I.sysctl_int(host, "net.ipv4.tcp_no_metrics_save") != 0:
        return None
    return Finding(
        id="host.metrics_saved", severity="info",
        title="TCP caches per-destination metrics between connections",
        evidence={"tcp_no_metrics_save": 0,
                  "sources": {"tcp_no_metrics_save": "sysctl net.ipv4.tcp_no_metrics_save"}},
        recommendation="Set net.ipv4.tcp_no_metrics_save=1.",
        expected_effect="a new connection does not inherit a small ssthresh from an earlier "
                        "lossy one (ESnet DTN templates)",
        knobs=(Knob("sysctl", "net.ipv4.tcp_no_metrics_save", "1", "R-14", side="both"),))


@rule("host.rings_below_max")
def rings_below_max(m: Meas, host: Host, config: DiagnoseConfig) -> Finding | None:
    """NIC rings smaller than the driver allows (R-18: rings to max on transfer hosts), so a
    burst overflows the RX ring (rx_out_of_buffer / rx_missed_errors) before NAPI drains it."""
    short: dict[str, dict[str, int]] = {}
    for name, info in ((host or {}).get("ifaces") or {}).items():
        for d in ("rx", "tx"):
            cur, top = info.get(f"{d}_ring"), info.get(f"{d}_ring_max")
            if isinstance(cur, int) and isinstance(top, int) and cur < top:
                short.setdefault(name, {})[f"{d}_ring"] = top
    if not short:
        return None
    ifaces = (host or {}).get("ifaces") or {}
    return Finding(
        id="host.rings_below_max", severity="info",
        title=f"NIC rings below their maximum on {', '.join(sorted(short))}",
        evidence={n: {k: ifaces[n].get(k) for k in ("rx_ring", "rx_ring_max", "tx_ring",
                                                    "tx_ring_max")} for n in short}
        | {"sources": {n: "SIOCETHTOOL ETHTOOL_GRINGPARAM" for n in short}},
        recommendation="Raise the RX/TX rings to the driver maximum (`ethtool -G`).",
        expected_effect="more descriptors absorb line-rate bursts without rx_out_of_buffer drops "
                        "(ESnet/OSG host tuning)",
        knobs=tuple(Knob("link", f"{n}/{k}", str(v), "ring to driver max (R-18)", side="local",
                         iface=n) for n, ks in sorted(short.items()) for k, v in ks.items()))


RULES = (buffers_below_bdp, loss_based_default_cc, no_fq_pacing, mtu_probing_off,
         slow_start_after_idle, notsent_lowat_unlimited, metrics_saved, rings_below_max)
