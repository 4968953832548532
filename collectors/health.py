"""Health rules over a snapshot and its rates → findings with evidence.

Each rule is a small pure function ``(snapshot, rates | None, window_s) -> list[Finding]``; the
counters, their meaning and the thresholds' rationale come from reference/roce-nccl.md (§1.3
mlx5 hw_counters, §1.4 bnxt_re/irdma, §2.1 mlx5 ethtool, §2.2 bnxt_en, §2.4 ECN, §2.7 diagnosis
heuristics) and tcp-tuning.md. "Growing" means a positive delta over the rates window; a rule
that needs rates stays silent on a single sample. Evidence always names the counter, its path,
delta, rate and window.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from collectors.rates import Rates

SEVERITIES = ("critical", "warning", "info")
PAUSE_STORM_SHARE = 0.10      # paused ≥ 10 % of the window: storm risk (warning)
PAUSE_STORM_CRIT_SHARE = 0.50  # ≥ 50 %: the priority is mostly stopped (critical)
TCP_RETRANS_WARN = 0.01        # ≥ 1 % of segments retransmitted
TCP_RETRANS_INFO = 0.001
TCP_MIN_SEGMENTS = 100         # below this many OutSegs in the window the ratio is noise
DEFAULT_ROCE_PRIO = 3          # NVIDIA/Cumulus default RoCE priority (reference §2.6)


@dataclass(frozen=True)
class Finding:
    id: str
    severity: str
    title: str
    evidence: dict
    meaning: str
    recommendation: str = ""
    knobs: tuple[dict, ...] = ()

    def to_json(self) -> dict:
        return {"id": self.id, "severity": self.severity, "title": self.title,
                "evidence": self.evidence, "meaning": self.meaning,
                "recommendation": self.recommendation, "expected_effect": "",
                "knobs": list(self.knobs)}


@dataclass(frozen=True)
class Growth:
    """One counter that moved over the window."""

    subject: str
    counter: str
    path: str
    delta: int
    rate_per_s: float
    value: int | None = None

    def to_json(self) -> dict:
        return {"subject": self.subject, "counter": self.counter, "path": self.path,
                "delta": self.delta, "rate_per_s": round(self.rate_per_s, 6), "value": self.value}


@dataclass
class _Ctx:
    snap: object
    rates: Rates | None
    window_s: float
    cache: dict = field(default_factory=dict)


def _evidence(items: list[Growth], window_s: float, **extra) -> dict:
    top = max(items, key=lambda g: g.delta)
    return {"subject": top.subject, "counter": top.counter, "path": top.path, "delta": top.delta,
            "rate_per_s": round(top.rate_per_s, 6), "window_s": round(window_s, 3),
            "counters": [g.to_json() for g in items], **extra}


def _groups(snap, kinds: tuple[str, ...]) -> Iterable[tuple[tuple[str, ...], str, object]]:
    """(key, subject, CounterSet) for counter groups whose last key part is in ``kinds``."""
    for key, cs in snap.counter_sets().items():
        if key[-1] in kinds:
            if key[0] == "rdma":
                subject = f"{key[1]}/{key[3]}" if len(key) > 3 else key[1]
            elif key[0] == "netdevs":
                subject = key[1]
            else:
                subject = key[0]
            yield key, subject, cs


def growing(snap, rates: Rates | None, kinds: tuple[str, ...],
            match: Callable[[str], bool]) -> list[Growth]:
    """Counters in groups ``kinds`` whose name satisfies ``match`` and grew over the window."""
    if rates is None:
        return []
    out = []
    for key, subject, cs in _groups(snap, kinds):
        for name in cs.values:
            if not match(name):
                continue
            r = rates.get(key, name)
            if r is not None and r.delta:
                out.append(Growth(subject, name, cs.counter_path(name), r.delta, r.per_s,
                                  cs.values.get(name)))
    return out


def _names(*names: str) -> Callable[[str], bool]:
    s = frozenset(names)
    return lambda n: n.removeprefix("vport_") in s


def pfc_priorities(netdev) -> set[int]:
    """Priorities with PFC on: from ``dcb`` when read, else inferred from ethtool names —
    mlx5 emits ``rx_prio<p>_pause`` only for PFC-enabled priorities (K-MLX5EN); bnxt/ice
    counters exist for all priorities, so a non-zero PFC frame count marks the priority."""
    if netdev.dcb and netdev.dcb.pfc_enabled:
        return {p for p, on in netdev.dcb.pfc_enabled.items() if on}
    prios: set[int] = set()
    if netdev.ethtool:
        for name, value in netdev.ethtool.values.items():
            m = re.fullmatch(r"[rt]x_prio(\d)_pause", name)
            if m:
                prios.add(int(m.group(1)))
            m = re.fullmatch(r"[rt]x_pfc_ena_frames_pri(\d)|[rt]x_priority_(\d)_xoff\.nic", name)
            if m and value:
                prios.add(int(m.group(1) or m.group(2)))
    return prios


def _lossless(snap, subjects: Iterable[str] | None = None) -> bool:
    """PFC is on for the netdevs behind ``subjects`` (``"mlx5_0/1"`` RDMA ports or netdev
    names); with no subjects, for any netdev of the host."""
    if subjects is None:
        return any(pfc_priorities(nd) for nd in snap.netdevs.values())
    for subject in subjects:
        name = subject
        if "/" in subject:
            dev, _, port = subject.partition("/")
            p = snap.rdma.get(dev).ports.get(int(port)) if dev in snap.rdma else None
            name = p.netdev if p is not None else None
        nd = snap.netdevs.get(name) if name else None
        if nd is not None and pfc_priorities(nd):
            return True
    return False


# ---- rules ---------------------------------------------------------------------------------

ROCE_LOSS = ("out_of_sequence", "packet_seq_err", "implied_nak_seq_err", "local_ack_timeout_err",
             # bnxt_re upstream names of the same events (BNXT-PATCH maps them 1:1)
             "oos_drop_count", "seq_err_naks_rcvd", "missing_resp", "to_retransmits")


def rule_roce_drops(snap, rates, window_s) -> list[Finding]:
    """RoCE transport loss: PSN gaps (out_of_sequence), NAK-sequence errors (packet_seq_err),
    implied NAKs and ACK timeouts growing (mlx5 names, and bnxt_re's oos_drop_count /
    seq_err_naks_rcvd / missing_resp / to_retransmits). On a fabric with PFC this means the
    "lossless" priority is dropping (critical); without PFC it is lossy RoCE (warning)."""
    g = growing(snap, rates, ("hw_counters",), _names(*ROCE_LOSS))
    if not g:
        return []
    lossless = _lossless(snap, {x.subject for x in g})
    return [Finding(
        "roce.lossless_drops" if lossless else "roce.drops",
        "critical" if lossless else "warning",
        f"RoCE packets lost on {', '.join(sorted({x.subject for x in g}))}"
        + (" (lossless priority)" if lossless else ""),
        _evidence(g, window_s, pfc_enabled=lossless),
        "the RDMA transport saw sequence gaps / retransmission timeouts: packets are being "
        "dropped, and RoCE throughput collapses under loss (NCCL GH#378)",
        "check PFC on the RoCE priority end to end (host dcb/mlnx_qos and every switch port), "
        "and the switch buffer/ECN thresholds; find the dropping hop from rx/tx discards")]


def rule_roce_retry_exceeded(snap, rates, window_s) -> list[Finding]:
    """req_transport_retries_exceeded / bnxt max_retry_exceeded growing: a QP hit its retry
    limit and went to error (NCCL "completion with error 12")."""
    g = growing(snap, rates, ("hw_counters",),
                _names("req_transport_retries_exceeded", "max_retry_exceeded"))
    if not g:
        return []
    return [Finding("roce.retry_exceeded", "critical", "RDMA QPs exceeded their transport retries",
                    _evidence(g, window_s),
                    "a requester gave up retransmitting: the job sees a fatal completion error",
                    "fix the loss first; NCCL_IB_TIMEOUT / NCCL_IB_RETRY_CNT only hide it")]


PAUSE_DURATION = re.compile(r"(rx|tx)_(?:prio(\d)|global)_pause_duration|pfc_pri(\d)_(rx|tx)_duration_us")


def rule_pfc_pause(snap, rates, window_s) -> list[Finding]:
    """Share of the window a priority was paused, from ``rx/tx_prio<p>_pause_duration`` (µs,
    mlx5) or ``pfc_pri<p>_{rx,tx}_duration_us`` (bnxt): Δµs / (window × 10^6). ≥ 10 % is a
    PFC-storm risk (warning), ≥ 50 % critical; any pause below that is PFC doing its job (info).
    ``tx_pause_storm_{warning,error}_events`` growing is critical (the NIC stopped honouring
    pause: "drop could have been occurred", K-MLX5DOC)."""
    if rates is None or window_s <= 0:
        return []
    out = []
    g = growing(snap, rates, ("ethtool",), lambda n: PAUSE_DURATION.fullmatch(n) is not None)
    worst = {}
    for x in g:
        share = x.delta / (window_s * 1e6)
        if x.subject not in worst or share > worst[x.subject][0]:
            worst[x.subject] = (share, x)
    for subject, (share, x) in sorted(worst.items()):
        items = [y for y in g if y.subject == subject]
        sev = ("critical" if share >= PAUSE_STORM_CRIT_SHARE else
               "warning" if share >= PAUSE_STORM_SHARE else "info")
        way = "received (the network paused us)" if x.counter.startswith(("rx", "pfc_pri") ) \
            and "_tx_" not in x.counter else "sent (we paused the network)"
        out.append(Finding(
            "pfc.pause_storm" if sev != "info" else "pfc.pause_active", sev,
            f"{subject}: paused {share:.2%} of the last {window_s:.0f} s by PFC ({x.counter})",
            _evidence(items, window_s, paused_share=round(share, 6)),
            f"PFC pause frames {way}; a priority paused for a large share of time stalls every "
            "flow on it and can spread (PFC storm / head-of-line blocking)" if sev != "info" else
            "PFC is pausing this priority briefly: congestion absorbed without loss",
            "find the congested receiver/switch port; make ECN/DCQCN act before PFC (lower ECN "
            "thresholds than PFC xoff)" if sev != "info" else ""))
    g = growing(snap, rates, ("ethtool",),
                _names("tx_pause_storm_warning_events", "tx_pause_storm_error_events"))
    if g:
        crit = any(x.counter.endswith("error_events") for x in g)
        out.append(Finding("pfc.storm_events", "critical" if crit else "warning",
                           "NIC pause-storm protection triggered", _evidence(g, window_s),
                           "the NIC sent pause for too long; on error it stops sending pause "
                           "and packets may be dropped", "find the stuck receiver (host not "
                           "draining: CPU, PCIe, out_of_buffer)"))
    return out


CNP_SENT = ("np_cnp_sent", "np_cnp_pkts", "tx_cnp_pkts", "cnpSent")
CNP_HANDLED = ("rp_cnp_handled", "rx_cnp_pkts", "cnpHandled")
CNP_IGNORED = ("rp_cnp_ignored", "cnpIgnored")


def rule_dcqcn(snap, rates, window_s) -> list[Finding]:
    """CNPs sent by the notification point / handled by the reaction point growing = DCQCN is
    cutting rates because of ECN marks (info: congestion, handled). CNPs *ignored* growing means
    the reaction point is not acting on them (CC misconfiguration, warning)."""
    out = []
    g = growing(snap, rates, ("hw_counters",), _names(*CNP_SENT, *CNP_HANDLED))
    if g:
        out.append(Finding("roce.dcqcn_active", "info",
                           "DCQCN active: congestion notifications (CNPs) flowing",
                           _evidence(g, window_s),
                           "switches mark ECN and the NICs slow down: congestion is being "
                           "controlled (not loss)"))
    g = growing(snap, rates, ("hw_counters",), _names(*CNP_IGNORED))
    if g:
        out.append(Finding("roce.cnp_ignored", "warning", "CNPs ignored by the reaction point",
                           _evidence(g, window_s),
                           "congestion notifications arrive but do not reduce the rate",
                           "enable ECN/DCQCN reaction point on the RoCE priority "
                           "(ecn/roce_rp/enable/<prio>)"))
    return out


ROLE_KEY = {"roce_np": "ecn_np", "roce_rp": "ecn_rp"}  # tuners/roce.py key format


def rule_ecn_disabled(snap, rates, window_s) -> list[Finding]:
    """ECN disabled on the RoCE priority in the OFED ``ecn/roce_{np,rp}/enable/<prio>`` tree.
    The RoCE priority is the PFC priority when one is known, else 3 (NVIDIA default)."""
    out = []
    for name, nd in sorted(snap.netdevs.items()):
        if nd.ecn is None:
            continue
        prios = sorted(pfc_priorities(nd)) or [DEFAULT_ROCE_PRIO]
        off = [(role, p) for p in prios for role in ("roce_np", "roce_rp")
               if nd.ecn.enabled_on(role, p) is False]
        if not off:
            continue
        files = [f"{nd.ecn.path}/{role}/enable/{p}" for role, p in off]
        out.append(Finding(
            "roce.ecn_disabled", "warning",
            f"{name}: ECN/DCQCN off on RoCE priority {', '.join(str(p) for p in prios)} "
            f"({', '.join(sorted({r for r, _ in off}))})",
            {"subject": name, "counter": "enable", "path": files[0], "delta": None,
             "rate_per_s": None, "window_s": window_s, "files": files, "value": 0,
             "roce_priorities": prios},
            "without ECN on the RoCE priority DCQCN cannot slow senders before queues fill, "
            "so PFC pauses (or drops) take over",
            f"echo 1 > each of {', '.join(files)}",
            tuple({"tuner": "roce", "key": f"{name}/{ROLE_KEY[role]}/{p}", "value": "1",
                   "reason": "enable ECN on the RoCE priority", "iface": name, "side": "local"}
                  for role, p in off)))
    return out


def rule_roce_mtu(snap, rates, window_s) -> list[Finding]:
    """RoCE active MTU (IB MTU, 256..4096) below what the netdev MTU allows, below 4096 because
    the netdev MTU is small (< 4096 + 96 header bytes, ``iboe_get_mtu``), or different across
    RoCE ports (the connection runs at the smaller one)."""
    from collectors.sysfs_infiniband import iboe_mtu_bytes

    out = []
    ports = []
    for dname, dev in sorted(snap.rdma.items()):
        for pnum, port in sorted(dev.ports.items()):
            if not port.is_roce or port.active_mtu_bytes is None:
                continue
            subject = f"{dname}/{pnum}"
            ports.append((subject, port))
            nd = snap.netdevs.get(port.netdev)
            allowed = iboe_mtu_bytes(nd.mtu) if nd else None
            ev = {"subject": subject, "counter": "active_mtu", "path": port.path,
                  "delta": None, "rate_per_s": None, "window_s": window_s,
                  "value": port.active_mtu_bytes, "netdev": port.netdev,
                  "netdev_mtu": nd.mtu if nd else None, "allowed_active_mtu": allowed,
                  "active_mtu_source": port.active_mtu_source}
            if allowed is not None and port.active_mtu_bytes < allowed:
                out.append(Finding("roce.active_mtu_low", "warning",
                                   f"{subject}: RoCE active MTU {port.active_mtu_bytes} below the "
                                   f"{allowed} that {port.netdev} MTU {nd.mtu} allows", ev,
                                   "RDMA messages are cut into smaller packets than the link "
                                   "carries: more per-packet overhead",
                                   "check the port's configured max MTU (ibv_devinfo)"))
            elif port.active_mtu_bytes < 4096 and nd is not None and nd.mtu is not None:
                out.append(Finding("roce.active_mtu_low", "warning",
                                   f"{subject}: RoCE MTU {port.active_mtu_bytes} limited by "
                                   f"{port.netdev} MTU {nd.mtu}", ev,
                                   "RoCE payload MTU is the largest IB MTU ≤ netdev MTU − 96; "
                                   "with a small netdev MTU RDMA runs at 1024/2048 B packets",
                                   f"set {port.netdev} MTU ≥ 4200 (and the fabric) for 4096 B",
                                   ({"tuner": "link", "key": f"{port.netdev}/mtu",
                                     "value": "4200", "reason": "RoCE active MTU 4096",
                                     "iface": port.netdev, "side": "both"},)))
    mtus = {p.active_mtu_bytes for _, p in ports}
    if len(mtus) > 1:
        out.append(Finding("roce.mtu_mismatch", "warning",
                           "RoCE active MTU differs across ports: "
                           + ", ".join(f"{s}={p.active_mtu_bytes}" for s, p in ports),
                           {"subject": ",".join(s for s, _ in ports), "counter": "active_mtu",
                            "path": ports[0][1].path, "delta": None, "rate_per_s": None,
                            "window_s": window_s,
                            "values": {s: p.active_mtu_bytes for s, p in ports}},
                           "connections between these ports run at the smaller MTU",
                           "use one MTU on every RoCE netdev and switch port"))
    return out


def rule_link_downed(snap, rates, window_s) -> list[Finding]:
    """Link went down during the window: IB PMA ``link_downed``, mlx5 ``link_down_events_phy``,
    bnxt ``link_down_events``."""
    g = growing(snap, rates, ("counters", "ethtool"),
                _names("link_downed", "link_down_events_phy", "link_down_events"))
    if not g:
        return []
    return [Finding("link.downed", "critical", "link went down during the window",
                    _evidence(g, window_s), "a link flap drops every in-flight packet and "
                    "stalls collectives until retransmission", "check cable/optic and switch "
                    "port logs")]


PHY_ERRORS = ("symbol_error", "port_rcv_errors", "port_rcv_remote_physical_errors",
              "local_link_integrity_errors", "rx_crc_errors_phy", "rx_symbol_err_phy",
              "rx_pcs_symbol_err_phy", "rx_fcs_err_frames", "rx_pcs_symbol_err", "rx_crc_errors",
              "rx_frame_errors", "rx_crc_errors.nic", "rx_icrc_encapsulated", "tx_errors_phy",
              "rx_in_range_len_errors_phy", "rx_jabbers_phy", "rx_fragments_phy")


def rule_phy_errors(snap, rates, window_s) -> list[Finding]:
    """Symbol / CRC / uncorrectable-FEC / PHY errors growing: a bad cable, optic or port
    (K-MLX5DOC: ``rx_pcs_symbol_err_phy`` = symbol errors FEC could not correct, "traffic is
    lost"). FEC-corrected bits are not counted here: correction is the FEC doing its job."""
    g = growing(snap, rates, ("counters", "hw_counters", "ethtool", "stats"), _names(*PHY_ERRORS))
    if not g:
        return []
    crit = any(x.counter in ("rx_pcs_symbol_err_phy", "rx_pcs_symbol_err") for x in g)
    return [Finding("link.phy_errors", "critical" if crit else "warning",
                    f"symbol/CRC/PHY errors growing on {', '.join(sorted({x.subject for x in g}))}",
                    _evidence(g, window_s), "corrupted frames are dropped at the receiver: "
                    "a physical-layer problem (cable, optic, dirty connector, bad port)",
                    "check optics DOM (ethtool -m), reseat/replace the cable, check the peer port")]


OUT_OF_BUFFER = ("rx_out_of_buffer", "rx_missed_errors", "rx_fifo_errors", "rx_over_errors",
                 "out_of_buffer", "rx_drops")


def rule_rx_out_of_buffer(snap, rates, window_s) -> list[Finding]:
    """Receive drops for lack of host buffers: mlx5 ethtool ``rx_out_of_buffer`` (RQ had no
    software buffers), netdev ``rx_missed_errors``/``rx_fifo_errors``/``rx_over_errors``,
    virtio ``rx_drops``, RDMA ``out_of_buffer`` (no receive WQE posted). Ring too small or the
    CPU not draining it."""
    g = growing(snap, rates, ("ethtool", "stats", "hw_counters"), _names(*OUT_OF_BUFFER))
    if not g:
        return []
    rings = {}
    knobs = []
    for x in g:
        nd = snap.netdevs.get(x.subject)
        if nd is not None and nd.rings is not None:
            rings[x.subject] = nd.rings.to_json()
            if nd.rings.rx_pending < nd.rings.rx_max_pending:
                knobs.append({"tuner": "link", "key": f"{x.subject}/rx_ring",
                              "value": str(nd.rings.rx_max_pending),
                              "reason": "rx ring overflowing", "iface": x.subject,
                              "side": "local"})
    return [Finding("nic.rx_out_of_buffer", "warning",
                    f"receive buffers exhausted on {', '.join(sorted({x.subject for x in g}))}",
                    _evidence(g, window_s, rings=rings),
                    "packets arrived while the receive ring/queue had no free buffer: dropped "
                    "in the host, not the network",
                    "enlarge the RX ring (ethtool -G <if> rx <max>), spread IRQs/RSS, check CPU "
                    "load; for RDMA out_of_buffer the application is not posting receives fast "
                    "enough", tuple(knobs))]


NIC_DISCARDS = re.compile(r"rx_discards_phy|tx_discards_phy|rx_prio\d_(discards|buf_discard|"
                          r"cong_discard)|rx_discard_packets_cos\d|rx_total_discard_pkts|"
                          r"tx_total_discard_pkts|rx_dropped\.nic|tx_dropped_link_down\.nic")


def rule_nic_discards(snap, rates, window_s) -> list[Finding]:
    """NIC-level discards (port buffer full, per-priority buffer/congestion discards): loss at
    the adapter (K-MLX5DOC rx_discards_phy: "adapter is congested")."""
    g = growing(snap, rates, ("ethtool",), lambda n: NIC_DISCARDS.fullmatch(n) is not None)
    if not g:
        return []
    return [Finding("nic.discards",
                    "critical" if _lossless(snap, {x.subject for x in g}) else "warning",
                    f"NIC discarding packets on {', '.join(sorted({x.subject for x in g}))}",
                    _evidence(g, window_s), "the adapter dropped packets for lack of port/"
                    "priority buffers: loss before the host sees them",
                    "enable PFC on the lossless priority or reduce incast; check the PFC/buffer "
                    "configuration (dcb buffer, mlnx_qos)")]


def rule_tcp_retrans(snap, rates, window_s) -> list[Finding]:
    """TCP retransmission rate = ΔRetransSegs / ΔOutSegs (``/proc/net/snmp`` Tcp:). ≥ 1 %
    warning, ≥ 0.1 % info; below 100 segments in the window the ratio is not judged."""
    if rates is None:
        return []
    rs, out = rates.get(("tcp",), "RetransSegs"), rates.get(("tcp",), "OutSegs")
    if not rs or not out or rs.delta is None or out.delta is None or out.delta < TCP_MIN_SEGMENTS:
        return []
    ratio = rs.delta / out.delta
    if ratio < TCP_RETRANS_INFO:
        return []
    tcp = snap.tcp
    where = tcp.counter_path if tcp is not None else (lambda n: n)
    items = [Growth("tcp", "RetransSegs", where("RetransSegs"), rs.delta, rs.per_s),
             Growth("tcp", "OutSegs", where("OutSegs"), out.delta, out.per_s)]
    for extra in ("TCPTimeouts", "TCPLostRetransmit", "TCPSynRetrans"):
        r = rates.get(("tcp",), extra)
        if r and r.delta:
            items.append(Growth("tcp", extra, where(extra), r.delta, r.per_s))
    ev = _evidence(items, window_s, retrans_ratio=round(ratio, 6))
    ev.update(counter="RetransSegs", path=items[0].path, delta=rs.delta,
              rate_per_s=round(rs.per_s, 6))
    return [Finding("tcp.retrans_rate", "warning" if ratio >= TCP_RETRANS_WARN else "info",
                    f"TCP retransmitted {ratio:.2%} of segments in the last {window_s:.0f} s", ev,
                    "loss or reordering on TCP paths; loss-based congestion control cuts its "
                    "window on each loss (Mathis: rate ∝ 1/√p)",
                    "find the lossy hop (wanprobe probe); consider BBR and larger buffers for "
                    "long paths")]


RULES: tuple[Callable, ...] = (
    rule_roce_drops, rule_roce_retry_exceeded, rule_pfc_pause, rule_dcqcn, rule_ecn_disabled,
    rule_roce_mtu, rule_link_downed, rule_phy_errors, rule_rx_out_of_buffer, rule_nic_discards,
    rule_tcp_retrans,
)


def evaluate(snapshot, rates: Rates | None = None, window_s: float | None = None) -> list[Finding]:
    """Run every rule; findings sorted critical → warning → info, then by id."""
    if window_s is None:
        window_s = rates.interval_s if rates is not None else 0.0
    findings: list[Finding] = []
    for rule in RULES:
        findings.extend(rule(snapshot, rates, window_s))
    return sorted(findings, key=lambda f: (SEVERITIES.index(f.severity), f.id, f.title))
