"""Rules on the measured path: window, send buffer, loss vs congestion control, DSCP, MTU.

Each rule is pure ``(measured, host, config) -> Finding | None`` (the typed
:class:`~wanprobe.diagnose.measured.Measured` and :class:`~wanprobe.diagnose.host_inputs.Host`)
and cites its source:
tcp-tuning.md §6 (R-n), §3 (models), probe-anchors.md (STAMP CoS TLV, RFC 8972).
"""

from __future__ import annotations

from wanprobe.diagnose import inputs as I
from wanprobe.diagnose.finding import Finding, Knob
from wanprobe.diagnose.host_inputs import Host, buffer_field
from wanprobe.diagnose.inputs import DiagnoseConfig
from wanprobe.diagnose.measured import Measured
from wanprobe.diagnose.rule import mbit, rule
from wanprobe.diagnose.rules_transfer import (
    DEFAULT_TRIPLE,
    MAX_BUFFER_BYTES,
    send_buffer_limited,
    streams_needed,
    window_limited,
)
from wanprobe.models.tcp_rate import bbr_rate_bps, cc_limited_rate_bps, mathis_rate_bps
from wanprobe.units import dscp_name

LOSS_FOR_BBR = 1e-5
RTT_FOR_BBR_S = 0.020
RTT_FOR_BBR_MIN_S = 0.010    # below it, never (LAN-like paths keep their cc)
LOSS_NO_CC_HELPS = 0.15      # BBRv1 ceiling ≈ 20 %, escalate above 15 %


def buffer_knobs(host: Host | None, need_bytes: int, why: str, *,
                 names: tuple[str, ...] = ("net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem")
                 ) -> tuple[list[Knob], int]:
    """tcp_rmem/tcp_wmem knobs whose max is ``need_bytes`` clamped to 1 GiB (R-3), never
    lowering a larger max an administrator set (R-5). Returns the knobs and the clamped max."""
    target = min(int(need_bytes), MAX_BUFFER_BYTES)
    knobs = []
    for name in names:
        cur = getattr(host, buffer_field(name)) if host else None
        lo, default = (cur[0], cur[1]) if cur else DEFAULT_TRIPLE
        if cur and cur[2] >= target:
            continue
        knobs.append(Knob("sysctl", name, f"{lo} {default} {target}", why, side="both"))
    return knobs, target


def _cc_knob(host: Host | None, reason: str, *, sender_measured: bool = True
             ) -> tuple[Knob | None, str]:
    """bbr as default cc if this host can take it (R-11 available, R-12 allowed in a netns)."""
    avail = set(host.cc_available) if host else set()
    allowed = set(host.cc_allowed) if host else set()
    if avail and "bbr" not in avail:
        return None, "bbr is not in tcp_available_congestion_control: load tcp_bbr on the host"
    note = ""
    if allowed and "bbr" not in allowed:
        note = " (not in tcp_allowed_congestion_control: set it from the init namespace)"
    # cc is the sender's choice: the measured (forward) transfer was sent by this host; without
    # a transfer the judgement is of the host default, meant for both ends (engine: per host)
    if not sender_measured:
        return Knob("sysctl", "net.ipv4.tcp_congestion_control", "bbr", reason + note,
                    side="both"), ""
    return Knob("sysctl", "net.ipv4.tcp_congestion_control", "bbr", reason + note,
                side="local", host="local"), ""


@rule("path.lossy_loss_based_cc")
def lossy_loss_based_cc(m: Measured, host: Host | None, config: DiagnoseConfig) -> Finding | None:
    """Loss > 1e-5 on RTT > 20 ms with reno/cubic → bbr (R-9); Mathis bound (§3.1) vs BBR
    (1-p)·link (§3.2) in the evidence."""
    loss, loss_src = I.loss_ratio(m)
    rtt, rtt_src = I.rtt_s(m)
    cc, cc_src = I.cc_in_use(m, host)
    if loss is None or rtt is None or cc not in ("reno", "cubic"):
        return None
    if loss <= LOSS_FOR_BBR or rtt <= RTT_FOR_BBR_MIN_S:
        return None
    mss = m.mss_bytes
    target, target_src, assumed = I.target_rate_bps(m, host, config)
    mathis = mathis_rate_bps(mss, rtt, loss)
    cc_rate = cc_limited_rate_bps(cc, target, mss, rtt, loss)
    if rtt <= RTT_FOR_BBR_S and (assumed or cc_rate >= 0.5 * target):
        # R-9 names > 20 ms; between 10 and 20 ms only when the loss-based model, on the
        # measured capacity, carries less than half of it (a 20 ms lab at 0.1 %: reno ≈ 25 %)
        return None
    bbr = bbr_rate_bps(target, loss)
    measured = m.throughput.bits_per_second if m.throughput else None
    knob, why_not = _cc_knob(host, f"loss {loss:.2%} at {rtt * 1e3:.0f} ms RTT (R-9)",
                             sender_measured=cc_src == "throughput cc")
    severe = cc_rate < 0.5 * target  # the cc ceiling is below half the target rate
    effect = (f"Mathis bound (MSS/RTT)·1.22/√p with {mss} B, {rtt * 1e3:.0f} ms, p={loss:.2g} "
              f"≈ {mbit(mathis)} per stream ({cc} model ≈ {mbit(cc_rate)}); BBR holds ≈ "
              f"(1-p)·link = {mbit(bbr)} on a {mbit(target)}"
              f"{' (assumed)' if assumed else ''} link")
    if measured is not None:
        effect += f"; measured {mbit(measured)}"
    return Finding(
        id="path.lossy_loss_based_cc", severity="critical" if severe else "warning",
        title=f"Lossy long path with loss-based congestion control ({cc})",
        evidence={"loss_ratio": loss, "rtt_ms": rtt * 1e3, "cc": cc, "mss_bytes": mss,
                  "mathis_rate_bps": mathis, "cc_rate_bps": cc_rate, "bbr_rate_bps": bbr, "link_rate_bps": target,
                  "link_rate_assumed": assumed, "bits_per_second": measured,
                  "sources": {"loss_ratio": loss_src, "rtt_ms": rtt_src, "cc": cc_src,
                              "link_rate_bps": target_src,
                              "mathis_rate_bps": "Mathis et al. 1997 (tcp-tuning.md §3.1)",
                              "bbr_rate_bps": "Cardwell et al. 2016 (tcp-tuning.md §3.2)"}},
        recommendation=("Use bbr for the training flows (per socket with TCP_CONGESTION or as "
                        "the namespace default); " + (why_not or "loss-based cc backs off on "
                                                      "every random loss.")),
        expected_effect=effect, knobs=(knob,) if knob else (),
        impact=1 - min(cc_rate, target) / target)


@rule("path.loss_excessive")
def loss_excessive(m: Measured, host: Host | None, config: DiagnoseConfig) -> Finding | None:
    """Loss above 15 %: no congestion control fixes this (BBRv1 ceiling ≈ 20 %, R-13)."""
    loss, src = I.loss_ratio(m)
    if loss is None or loss <= LOSS_NO_CC_HELPS:
        return None
    return Finding(
        id="path.loss_excessive", severity="critical",
        title=f"Path loses {loss:.0%} of packets",
        evidence={"loss_ratio": loss, "sources": {"loss_ratio": src}},
        recommendation="Escalate to the network path owner; host tuning cannot recover this.",
        expected_effect=f"even BBR delivers at most (1-p) = {1 - loss:.0%} of the link and "
                        "stalls near 20 % loss (Cardwell, bbr-dev)",
        impact=loss)


@rule("path.dscp_bleached")
def dscp_bleached(m: Measured, host: Host | None, config: DiagnoseConfig) -> Finding | None:
    """DSCP sent differs from the one seen at the reflector (forward path) or returned
    (reverse path): STAMP Class-of-Service TLV, RFC 8972 §5.2."""
    dscp = m.path.dscp if m.path else None
    if dscp is None:
        return None
    sent, at_refl, returned = dscp.sent, dscp.at_reflector, dscp.returned
    if at_refl is not None and at_refl != sent:
        direction, seen = "forward", at_refl
    elif at_refl is not None and returned is not None and returned != sent:
        direction, seen = "reverse", returned
    else:
        return None
    bleached = seen == 0
    what = "bleached to best effort" if bleached else f"re-marked to {dscp_name(seen)} ({seen})"
    return Finding(
        id="path.dscp_bleached", severity="critical" if bleached else "warning",
        title=f"DSCP {dscp_name(sent)} ({sent}) is {what} on the {direction} path",
        evidence={"dscp_sent": sent, "dscp_at_reflector": at_refl, "dscp_returned": returned,
                  "direction": direction,
                  "sources": {"dscp_at_reflector": "STAMP Class-of-Service TLV (RFC 8972)",
                              "dscp_returned": "IP TOS of the reflected packet"}},
        recommendation=("Ask the network team to trust and carry the training DSCP across the "
                        f"{direction} path (DC edge/WAN re-marking); until then the traffic gets "
                        "no priority or lossless class, and NCCL_IB_TC/nft marks are lost."),
        expected_effect=(f"training traffic marked {dscp_name(sent)} arrives as "
                         f"{dscp_name(seen)}: queued with bulk traffic, and RoCE loses its PFC "
                         "priority; marking on the hosts cannot fix a bleaching hop"),
        knobs=())


@rule("path.mtu_black_hole")
def mtu_black_hole(m: Measured, host: Host | None, config: DiagnoseConfig) -> Finding | None:
    """Path MTU below the interface MTU with no ICMP "fragmentation needed" back: full-size
    TCP segments vanish (RFC 4821 §1; tcp-tuning.md §4.6, R-19/R-20)."""
    mtu = m.mtu
    path_mtu = mtu.path_mtu_bytes if mtu else None
    if mtu is None or path_mtu is None:
        return None
    iface = mtu.iface
    if_mtu = mtu.iface_mtu_bytes   # services/diagnose.py: the MTU of the interface toward the peer
    link = host.iface(iface) if host else None
    if if_mtu is None and link and link.mtu_bytes is not None:
        if_mtu = float(link.mtu_bytes)
    if if_mtu is None or path_mtu >= if_mtu:
        return None
    search_max = mtu.search_max_bytes
    if search_max is not None and path_mtu >= search_max:
        return None  # everything the search could send passed (the reflector caps datagrams)
    icmp = mtu.icmp_seen
    probing = host.tcp_mtu_probing if host else None
    if icmp is True:
        return None  # classic PMTUD works: the kernel lowers the route MTU itself
    knobs = [Knob("sysctl", "net.ipv4.tcp_mtu_probing", "1",
                  "recover from ICMP black holes (RFC 4821, R-20)", side="both")] \
        if not probing else []
    if iface:
        knobs.append(Knob("link", f"{iface}/mtu", str(int(path_mtu)),
                          f"largest packet the path carries is {int(path_mtu)} B", side="local",
                          iface=iface))
    stalls = not probing
    tcp_bps = m.throughput.bits_per_second if m.throughput else None
    return Finding(
        id="path.mtu_black_hole", severity="critical" if stalls else "warning",
        title=f"MTU black hole: path carries {int(path_mtu)} B, interface sends {int(if_mtu)} B",
        evidence={"path_mtu": int(path_mtu), "iface_mtu": int(if_mtu), "iface": iface,
                  "icmp_seen": icmp, "method": mtu.method, "tcp_mtu_probing": probing,
                  "tcp_bits_per_second": tcp_bps,
                  "sources": {"path_mtu": "DF-bit search (IP_PMTUDISC_PROBE)",
                              "iface_mtu": f"/sys/class/net/{iface}/mtu" if iface else "mtu probe",
                              "tcp_mtu_probing": "sysctl net.ipv4.tcp_mtu_probing",
                              "tcp_bits_per_second": "throughput test through the same path"}},
        recommendation=(f"Set the interface MTU to {int(path_mtu)} (or fix the hop that drops "
                        "without ICMP) and enable net.ipv4.tcp_mtu_probing=1."),
        expected_effect=("with tcp_mtu_probing=0 TCP segments above the path MTU are dropped "
                         "silently and connections stall after the handshake; probing or a "
                         f"{int(path_mtu)} B MTU restores them"
                         + (f" (the TCP test delivered {mbit(tcp_bps)})" if tcp_bps is not None
                            else "") if stalls else
                         "tcp_mtu_probing recovers, but each new connection first waits for "
                         "retransmission timeouts"),
        knobs=tuple(knobs), impact=1.0 if stalls else None)


# Order breaks ties in the ranking: a black hole or an unusable path makes the TCP figures
# measured through it meaningless, so those come first.
RULES = (mtu_black_hole, loss_excessive, window_limited, send_buffer_limited, streams_needed,
         lossy_loss_based_cc, dscp_bleached)
