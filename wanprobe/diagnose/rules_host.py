"""Rules on the host's own network configuration (tcp-tuning.md §6: R-1, R-8, R-9, R-14, R-15,
R-20, and ESnet's tcp_slow_start_after_idle=0). Pure: they read the typed :class:`Host` (built
once from the report's host dict) and, for sizing, the measured RTT (:class:`Measured`)."""

from __future__ import annotations

from typing import Any

from wanprobe.diagnose import inputs as I
from wanprobe.diagnose.finding import Finding, Knob
from wanprobe.diagnose.host_inputs import Host, triple_text
from wanprobe.diagnose.inputs import DiagnoseConfig
from wanprobe.diagnose.measured import Measured
from wanprobe.diagnose.rule import mbit, mib, rule
from wanprobe.diagnose.rules_path import RTT_FOR_BBR_S, buffer_knobs
from wanprobe.diagnose.rules_transfer import host_model_buffer
from wanprobe.models.bdp import (
    bdp_bytes,
    buffer_needed_bytes,
    window_from_buffer_bytes,
    window_limited_rate_bps,
)

NOTSENT_LOWAT_BYTES = 131072      # R-8 (tuned network-throughput, Cloudflare)
NOTSENT_UNLIMITED = 4294967295    # kernel default: no limit (ip-sysctl.rst)


@rule("host.buffers_below_bdp")
def buffers_below_bdp(m: Measured, host: Host | None, config: DiagnoseConfig) -> Finding | None:
    """tcp_rmem[2] / tcp_wmem[2] below 2×BDP of the target rate over the measured RTT (R-1)."""
    rtt, rtt_src = I.rtt_s(m)
    rmem, wmem = (host.tcp_rmem_bytes, host.tcp_wmem_bytes) if host else (None, None)
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
    verdict = m.throughput.verdict if m.throughput else None
    if verdict is not None and verdict not in ("receive_window", "send_buffer"):
        # the measured transfer was limited elsewhere: measured evidence beats the model
        severity = "info"
    return Finding(
        id="host.buffers_below_bdp", severity=severity,
        title="TCP buffer limits are below the bandwidth-delay product",
        evidence={"tcp_rmem": triple_text(rmem), "tcp_wmem": triple_text(wmem),
                  "rtt_ms": rtt * 1e3,
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
def loss_based_default_cc(m: Measured, host: Host | None, config: DiagnoseConfig) -> Finding | None:
    """Default cc reno/cubic on a long path (RTT > 20 ms) where bbr is offered (R-9, R-11).
    Judges the peer too, from the cc it reported in its host facts (a finding for ``peer``)."""
    if host is None:
        return None
    cc, avail = host.cc_current, host.cc_available
    rtt, rtt_src = I.rtt_s(m)
    if cc not in ("reno", "cubic") or rtt is None or rtt <= RTT_FOR_BBR_S or "bbr" not in avail:
        return None
    peer = host.which == "peer"
    return Finding(
        id="host.loss_based_default_cc", severity="warning",
        title=(f"Default congestion control{' of the peer host' if peer else ''} is {cc} on a "
               f"{rtt * 1e3:.0f} ms path"),
        evidence={"tcp_congestion_control": cc, "available_cc": list(avail), "rtt_ms": rtt * 1e3,
                  "sources": {"rtt_ms": rtt_src,
                              "tcp_congestion_control": "peer host facts cc_current" if peer
                              else "sysctl net.ipv4"}},
        recommendation="Use bbr for the training flows (per socket or namespace default).",
        expected_effect=("loss-based cc falls about 10× at 0.1 % loss on long paths while bbr "
                         "holds (1-p)·link (ACM Queue 2016, Fig. 10)"),
        knobs=(Knob("sysctl", "net.ipv4.tcp_congestion_control", "bbr",
                    "long RTT, loss-insensitive cc (R-9)", side="peer" if peer else "both"),),
        host="peer" if peer else None)


@rule("host.no_fq_pacing")
def no_fq_pacing(m: Measured, host: Host | None, config: DiagnoseConfig) -> Finding | None:
    """default_qdisc / root qdisc is not fq (R-15); recommend fq only where sch_fq exists."""
    if host is None:
        return None
    default_qdisc = host.default_qdisc
    egress = m.egress_iface
    qdiscs = {i.name: i.qdisc for i in host.ifaces if i.name != "lo" and i.qdisc}
    relevant = {egress: qdiscs[egress]} if egress in qdiscs else qdiscs
    if default_qdisc == "fq" or (relevant and all(q in ("fq", "mq") for q in relevant.values())):
        return None
    available = host.fq_available
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


def _set_sysctl(rule_id: str, key: str, value: str, reason: str, *, severity: str, title: str,
                evidence: dict[str, Any], effect: str, note: str = "") -> Finding:
    """A finding one sysctl fixes on both ends: recommends ``Set key=value`` (+ ``note``) and
    carries that setting as its one knob."""
    return Finding(id=rule_id, severity=severity, title=title, evidence=evidence,
                   recommendation=f"Set {key}={value}{note}.", expected_effect=effect,
                   knobs=(Knob("sysctl", key, value, reason, side="both"),))


@rule("host.mtu_probing_off")
def mtu_probing_off(m: Measured, host: Host | None, config: DiagnoseConfig) -> Finding | None:
    """tcp_mtu_probing=0: set 1 (R-20), which matters with jumbo frames or a lower path MTU."""
    if host is None or host.tcp_mtu_probing != 0:
        return None
    jumbo = any(i.mtu_bytes is not None and i.mtu_bytes > 1500 for i in host.ifaces
                if i.name != "lo")
    return _set_sysctl(
        "host.mtu_probing_off", "net.ipv4.tcp_mtu_probing", "1", "R-20",
        severity="warning" if jumbo else "info", title="TCP MTU probing is off",
        evidence={"tcp_mtu_probing": 0, "jumbo_ifaces": jumbo,
                  "sources": {"tcp_mtu_probing": "sysctl net.ipv4.tcp_mtu_probing"}},
        note=" (probe only after an ICMP black hole)",
        effect="connections survive a path that drops large packets without ICMP instead of "
               "stalling (RFC 4821)")


@rule("host.slow_start_after_idle")
def slow_start_after_idle(m: Measured, host: Host | None, config: DiagnoseConfig) -> Finding | None:
    """tcp_slow_start_after_idle=1 collapses cwnd between all-reduce bursts (ESnet: set 0)."""
    if host is None or host.tcp_slow_start_after_idle != 1:
        return None
    rtt, src = I.rtt_s(m)
    long_path = rtt is not None and rtt > RTT_FOR_BBR_S
    return _set_sysctl(
        "host.slow_start_after_idle", "net.ipv4.tcp_slow_start_after_idle", "0",
        "keep cwnd across idle gaps (ESnet)", severity="warning" if long_path else "info",
        title="cwnd restarts from slow start after every idle period",
        evidence={"tcp_slow_start_after_idle": 1, "rtt_ms": rtt * 1e3 if rtt else None,
                  "sources": {"rtt_ms": src}},
        effect=("each gradient burst after an idle RTO starts again at the initial window and "
                "needs ≈ log2(BDP/10 segments) round trips to refill the path"
                + (f" ({rtt * 1e3:.0f} ms each)" if rtt else "")))


@rule("host.notsent_lowat_unlimited")
def notsent_lowat_unlimited(m: Measured, host: Host | None, config: DiagnoseConfig
                            ) -> Finding | None:
    """Unlimited tcp_notsent_lowat with large tcp_wmem queues unsent data in the kernel (R-8)."""
    if host is None or host.tcp_notsent_lowat_bytes is None \
            or host.tcp_notsent_lowat_bytes < NOTSENT_UNLIMITED:
        return None
    return _set_sysctl(
        "host.notsent_lowat_unlimited", "net.ipv4.tcp_notsent_lowat", str(NOTSENT_LOWAT_BYTES),
        "R-8", severity="info", title="tcp_notsent_lowat is unlimited",
        evidence={"tcp_notsent_lowat": host.tcp_notsent_lowat_bytes,
                  "tcp_wmem": triple_text(host.tcp_wmem_bytes),
                  "sources": {"tcp_notsent_lowat": "sysctl net.ipv4.tcp_notsent_lowat"}},
        note=" with large tcp_wmem",
        effect="bounds unsent data per socket so large send buffers do not add latency or "
               "memory pressure (tuned network-throughput)")


@rule("host.metrics_saved")
def metrics_saved(m: Measured, host: Host | None, config: DiagnoseConfig) -> Finding | None:
    """tcp_no_metrics_save=0 lets one lossy transfer's cached ssthresh cap the next (R-14)."""
    if host is None or host.tcp_no_metrics_save != 0:
        return None
    return _set_sysctl(
        "host.metrics_saved", "net.ipv4.tcp_no_metrics_save", "1", "R-14", severity="info",
        title="TCP caches per-destination metrics between connections",
        evidence={"tcp_no_metrics_save": 0,
                  "sources": {"tcp_no_metrics_save": "sysctl net.ipv4.tcp_no_metrics_save"}},
        effect="a new connection does not inherit a small ssthresh from an earlier lossy one "
               "(ESnet DTN templates)")


@rule("host.rings_below_max")
def rings_below_max(m: Measured, host: Host | None, config: DiagnoseConfig) -> Finding | None:
    """NIC rings smaller than the driver allows (R-18: rings to max on transfer hosts), so a
    burst overflows the RX ring (rx_out_of_buffer / rx_missed_errors) before NAPI drains it."""
    short: dict[str, dict[str, int]] = {}
    rings = {i.name: i.rings for i in host.ifaces if i.rings} if host else {}
    for name, r in rings.items():
        for d, cur, top in (("rx", r.rx_pending, r.rx_max_pending),
                            ("tx", r.tx_pending, r.tx_max_pending)):
            if cur < top:
                short.setdefault(name, {})[f"{d}_ring"] = top
    if not short:
        return None
    return Finding(
        id="host.rings_below_max", severity="info",
        title=f"NIC rings below their maximum on {', '.join(sorted(short))}",
        evidence={n: {"rx_ring": rings[n].rx_pending, "rx_ring_max": rings[n].rx_max_pending,
                      "tx_ring": rings[n].tx_pending, "tx_ring_max": rings[n].tx_max_pending}
                  for n in short}
        | {"sources": {n: "SIOCETHTOOL ETHTOOL_GRINGPARAM" for n in short}},
        recommendation="Raise the RX/TX rings to the driver maximum (`ethtool -G`).",
        expected_effect="more descriptors absorb line-rate bursts without rx_out_of_buffer drops "
                        "(ESnet/OSG host tuning)",
        knobs=tuple(Knob("link", f"{n}/{k}", str(v), "ring to driver max (R-18)", side="local",
                         iface=n) for n, ks in sorted(short.items()) for k, v in ks.items()))


# The rules that also judge the far end, on the HostFacts it sent: its default cc. Not
# no_fq_pacing: the facts carry one interface's root qdisc but neither net.core.default_qdisc nor
# whether sch_fq exists, so the rule would claim what is not known. Not the buffer and flag
# rules: the path rules size the peer's buffers from the transfers, and the facts carry no flags.
PEER_RULES = (loss_based_default_cc,)
RULES = (buffers_below_bdp, loss_based_default_cc, no_fq_pacing, mtu_probing_off,
         slow_start_after_idle, notsent_lowat_unlimited, metrics_saved, rings_below_max)
