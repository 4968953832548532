"""Fabric rules: RoCE loss, PFC, ECN/DCQCN and RoCE MTU, judged on a counter snapshot and its
rates (the one rule set; ``wanprobe counters``, the daemon and ``diagnose`` all run them through
the engine, ``services/counters.judge``). NIC/link/TCP counter rules are in
:mod:`wanprobe.diagnose.rules_nic`.

Each rule is a pure function of the ``COUNTERS`` parts ``(snapshot, rates | None, window_s) ->
list[Finding]``. The counters and their meaning come from the drivers that register them (linux
drivers/infiniband/hw/mlx5/counters.c, bnxt_re/hw_counters.c, irdma/verbs.c; mlx5 ethtool names
in drivers/net/ethernet/mellanox/mlx5/core/en_stats.c, meanings in Documentation/networking/
device_drivers/ethernet/mellanox/mlx5/counters.rst; bnxt_en in bnxt_ethtool.c), the ECN knobs
from NVIDIA's MLNX_OFED ECN documentation, and the RoCE priority from NVIDIA's lossless RoCE
configuration guides; the thresholds are ours and each rule states its own. "Growing" means a positive delta over the rates window; a
rule that needs rates stays silent on a single sample. Evidence always names the counter, its
path, delta, rate and window.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from collectors.rates import Rates
from wanprobe.diagnose import rules_nic
from wanprobe.diagnose.context import COUNTERS
from wanprobe.diagnose.counter_names import is_kind
from wanprobe.diagnose.fabric_counters import (
    DEFAULT_ROCE_PRIO,
    Growth,
    evidence,
    growing,
    lossless,
    netdev_of,
    pfc_off,
    pfc_priorities,
    subjects,
)
from wanprobe.diagnose.finding import Finding, Knob
from wanprobe.diagnose.host_inputs import Host
from wanprobe.diagnose.inputs import DiagnoseConfig
from wanprobe.diagnose.measured import Measured
from wanprobe.diagnose.rule import RuleFn, rule

if TYPE_CHECKING:  # types only: the collectors stay unloaded until a snapshot is taken
    from collectors.snapshot import Snapshot
    from collectors.sysfs_infiniband import RdmaPort

PAUSE_STORM_SHARE = 0.10      # paused ≥ 10 % of the window: storm risk (warning)
PAUSE_STORM_CRIT_SHARE = 0.50  # ≥ 50 %: the priority is mostly stopped (critical)
ROLE_KEY = {"roce_np": "ecn_np", "roce_rp": "ecn_rp"}  # tuners/roce.py key format


def roce_knob(iface: str, what: str, value: str, reason: str) -> Knob:
    """A knob in the roce tuner's key format: ``<if>/pfc``, ``<if>/trust``,
    ``<if>/ecn_np/<prio>``, ``<if>/ecn_rp/<prio>`` (tuners/roce.py)."""
    return Knob("roce", f"{iface}/{what}", value, reason, side="local", iface=iface)


@rule("roce.drops", needs=COUNTERS)
def rule_roce_drops(snap: Snapshot, rates: Rates | None, window_s: float) -> list[Finding]:
    """RoCE transport loss: PSN gaps, NAK-sequence errors, implied NAKs, ACK timeouts growing
    (``roce_loss`` names of every driver). With PFC on behind the port the "lossless" priority
    is dropping (critical); with PFC known off on the RoCE priority the fabric is not lossless
    (critical, NCCL GH#378, with the roce-tuner knobs); PFC unknown: lossy RoCE (warning)."""
    g = growing(snap, rates, ("hw_counters",), "roce_loss")
    if not g:
        return []
    where = {x.subject for x in g}
    prio = DEFAULT_ROCE_PRIO
    off = sorted({nd.name for nd in (netdev_of(snap, s) for s in where)
                  if nd is not None and pfc_off(nd, prio)})
    if lossless(snap, where):
        fid, sev, title = "roce.lossless_drops", "critical", " (lossless priority)"
    elif off:
        fid, sev, title = "roce.drops_pfc_off", "critical", f" and PFC is off on priority {prio}"
    else:
        fid, sev, title = "roce.drops", "warning", ""
    knobs = tuple(k for n in off for k in (
        roce_knob(n, "pfc", str(prio), f"lossless RoCE priority {prio} (roce-nccl §2.6)"),
        roce_knob(n, "trust", "dscp", "map DSCP 26 → priority 3 (roce-nccl §2.6)")))
    return [Finding(
        fid, sev, f"RoCE packets lost on {subjects(g)}{title}",
        evidence(g, window_s, pfc_enabled=fid == "roce.lossless_drops", pfc_off=off),
        "check PFC on the RoCE priority end to end (host dcb/mlnx_qos and every switch port), "
        "and the switch buffer/ECN thresholds; find the dropping hop from rx/tx discards",
        "the RDMA transport saw sequence gaps / retransmission timeouts: packets are being "
        "dropped, and RoCE go-back-N throughput collapses under loss (NCCL GH#378)", knobs)]


@rule("roce.retry_exceeded", needs=COUNTERS)
def rule_roce_retry_exceeded(snap: Snapshot, rates: Rates | None, window_s: float) -> list[Finding]:
    """req_transport_retries_exceeded / bnxt max_retry_exceeded growing: a QP hit its retry
    limit and went to error (NCCL "completion with error 12")."""
    g = growing(snap, rates, ("hw_counters",), "retry_exceeded")
    if not g:
        return []
    return [Finding("roce.retry_exceeded", "critical", "RDMA QPs exceeded their transport retries",
                    evidence(g, window_s),
                    "fix the loss first; NCCL_IB_TIMEOUT / NCCL_IB_RETRY_CNT only hide it",
                    "a requester gave up retransmitting: the job sees a fatal completion error")]


def _pause_finding(subject: str, share: float, items: list[Growth], window_s: float) -> Finding:
    sev = ("critical" if share >= PAUSE_STORM_CRIT_SHARE else
           "warning" if share >= PAUSE_STORM_SHARE else "info")
    top = max(items, key=lambda g: g.delta / (window_s * 1e6))
    way = "received (the network paused us)" if top.counter.startswith(("rx", "pfc_pri")) \
        and "_tx_" not in top.counter else "sent (we paused the network)"
    storm = sev != "info"
    return Finding(
        "pfc.pause_storm" if storm else "pfc.pause_active", sev,
        f"{subject}: paused {share:.2%} of the last {window_s:.0f} s by PFC ({top.counter})",
        evidence(items, window_s, paused_share=round(share, 6)),
        "find the congested receiver/switch port; make ECN/DCQCN act before PFC (lower ECN "
        "thresholds than PFC xoff)" if storm else "",
        f"PFC pause frames {way}; a priority paused for a large share of time stalls every "
        "flow on it and can spread (PFC storm / head-of-line blocking)" if storm else
        "PFC is pausing this priority briefly: congestion absorbed without loss",
        impact=share if storm else None)


@rule("pfc.pause", needs=COUNTERS)
def rule_pfc_pause(snap: Snapshot, rates: Rates | None, window_s: float) -> list[Finding]:
    """Share of the window a priority was paused, from ``rx/tx_prio<p>_pause_duration`` (µs,
    mlx5) or ``pfc_pri<p>_{rx,tx}_duration_us`` (bnxt): Δµs / (window × 10^6). ≥ 10 % is a
    PFC-storm risk (warning), ≥ 50 % critical; any pause below that is PFC doing its job (info).
    Storm events growing (mlx5 ``tx_pause_storm_*_events``, bnxt ``continuous_*pause_events``)
    is a warning, critical for the error event (the NIC stopped honouring pause: "drop could
    have been occurred", K-MLX5DOC)."""
    if rates is None or window_s <= 0:
        return []
    out: list[Finding] = []
    g = growing(snap, rates, ("ethtool",), "pause_duration")
    for subject in sorted({x.subject for x in g}):
        items = [y for y in g if y.subject == subject]
        share = max(y.delta for y in items) / (window_s * 1e6)
        out.append(_pause_finding(subject, share, items, window_s))
    g = growing(snap, rates, ("ethtool",), "storm_events")
    if g:
        crit = any(is_kind(x.counter, "storm_errors") for x in g)
        out.append(Finding("pfc.storm_events", "critical" if crit else "warning",
                           "NIC pause-storm protection triggered", evidence(g, window_s),
                           "find the stuck receiver (host not draining: CPU, PCIe, "
                           "out_of_buffer)", "the NIC sent pause for too long; on error it "
                           "stops sending pause and packets may be dropped"))
    return out


@rule("roce.dcqcn", needs=COUNTERS)
def rule_dcqcn(snap: Snapshot, rates: Rates | None, window_s: float) -> list[Finding]:
    """CNPs sent by the notification point / handled by the reaction point growing = DCQCN is
    cutting rates because of ECN marks (info: congestion, handled). CNPs *ignored* growing means
    the reaction point is not acting on them (CC misconfiguration, warning)."""
    out: list[Finding] = []
    g = growing(snap, rates, ("hw_counters",), "cnp_sent", "cnp_handled")
    if g:
        out.append(Finding("roce.dcqcn_active", "info",
                           "DCQCN active: congestion notifications (CNPs) flowing",
                           evidence(g, window_s), "",
                           "switches mark ECN and the NICs slow down: congestion is being "
                           "controlled (not loss)"))
    g = growing(snap, rates, ("hw_counters",), "cnp_ignored")
    if g:
        out.append(Finding("roce.cnp_ignored", "warning", "CNPs ignored by the reaction point",
                           evidence(g, window_s),
                           "enable ECN/DCQCN reaction point on the RoCE priority "
                           "(ecn/roce_rp/enable/<prio>)",
                           "congestion notifications arrive but do not reduce the rate"))
    return out


@rule("roce.ecn_disabled", needs=COUNTERS)
def rule_ecn_disabled(snap: Snapshot, rates: Rates | None, window_s: float) -> list[Finding]:
    """ECN disabled on the RoCE priority in the OFED ``ecn/roce_{np,rp}/enable/<prio>`` tree.
    The RoCE priority is the PFC priority when one is known, else 3 (NVIDIA default)."""
    out: list[Finding] = []
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
             "roce_priorities": prios, "disabled": sorted({r for r, _ in off})},
            f"echo 1 > each of {', '.join(files)} (both the notification and reaction point)",
            "without ECN on the RoCE priority DCQCN cannot slow senders before queues fill, "
            "so PFC pauses (or drops) take over: congestion spreads as pause frames",
            tuple(roce_knob(name, f"{ROLE_KEY[role]}/{p}", "1",
                            "enable ECN on the RoCE priority (roce-nccl §2.6)")
                  for role, p in off)))
    return out


def _mtu_finding(subject: str, port: RdmaPort, mtu: int, netdev_mtu: int | None,
                 allowed: int | None, ev: dict[str, Any]) -> Finding | None:
    """``mtu``: the port's active MTU; ``netdev_mtu``: its netdev's (None: unknown or no
    netdev); ``allowed``: the active MTU that netdev MTU gives (``iboe_mtu_bytes``)."""
    if allowed is not None and mtu < allowed:
        return Finding("roce.active_mtu_low", "warning",
                       f"{subject}: RoCE active MTU {mtu} below the "
                       f"{allowed} that {port.netdev} MTU {netdev_mtu} allows", ev,
                       "check the port's configured max MTU (ibv_devinfo)",
                       "RDMA messages are cut into smaller packets than the link carries: "
                       "more per-packet overhead")
    if mtu < 4096 and netdev_mtu is not None:
        return Finding("roce.active_mtu_low", "warning",
                       f"{subject}: RoCE MTU {mtu} limited by "
                       f"{port.netdev} MTU {netdev_mtu}", ev,
                       f"set {port.netdev} MTU ≥ 4200 (and the fabric) for 4096 B",
                       "RoCE payload MTU is the largest IB MTU ≤ netdev MTU − 96; with a small "
                       "netdev MTU RDMA runs at 1024/2048 B packets",
                       (Knob("link", f"{port.netdev}/mtu", "4200", "RoCE active MTU 4096",
                             side="both", iface=port.netdev),))
    return None


@rule("roce.mtu", needs=COUNTERS)
def rule_roce_mtu(snap: Snapshot, rates: Rates | None, window_s: float) -> list[Finding]:
    """RoCE active MTU (IB MTU, 256..4096) below what the netdev MTU allows, below 4096 because
    the netdev MTU is small (< 4096 + 96 header bytes, ``iboe_get_mtu``), or different across
    RoCE ports (the connection runs at the smaller one)."""
    from collectors.sysfs_infiniband import iboe_mtu_bytes

    out: list[Finding] = []
    ports: list[tuple[str, RdmaPort]] = []
    for dname, dev in sorted(snap.rdma.items()):
        for pnum, port in sorted(dev.ports.items()):
            mtu = port.active_mtu_bytes
            if not port.is_roce or mtu is None:
                continue
            subject = f"{dname}/{pnum}"
            ports.append((subject, port))
            nd = snap.netdevs.get(port.netdev) if port.netdev is not None else None
            netdev_mtu = nd.mtu if nd else None
            allowed = iboe_mtu_bytes(netdev_mtu)
            ev = {"subject": subject, "counter": "active_mtu", "path": port.path,
                  "delta": None, "rate_per_s": None, "window_s": window_s,
                  "value": port.active_mtu_bytes, "netdev": port.netdev,
                  "netdev_mtu": netdev_mtu, "allowed_active_mtu": allowed,
                  "active_mtu_source": port.active_mtu_source}
            f = _mtu_finding(subject, port, mtu, netdev_mtu, allowed, ev)
            if f is not None:
                out.append(f)
    if len({p.active_mtu_bytes for _, p in ports}) > 1:
        out.append(Finding("roce.mtu_mismatch", "warning",
                           "RoCE active MTU differs across ports: "
                           + ", ".join(f"{s}={p.active_mtu_bytes}" for s, p in ports),
                           {"subject": ",".join(s for s, _ in ports), "counter": "active_mtu",
                            "path": ports[0][1].path, "delta": None, "rate_per_s": None,
                            "window_s": window_s,
                            "values": {s: p.active_mtu_bytes for s, p in ports}},
                           "use one MTU on every RoCE netdev and switch port",
                           "connections between these ports run at the smaller MTU"))
    return out


# The counter rules, in table order (engine.RULES); ``RULES`` below is the report's view.
COUNTER_RULES: tuple[RuleFn, ...] = (
    rule_roce_drops, rule_roce_retry_exceeded, rule_pfc_pause, rule_dcqcn, rule_ecn_disabled,
    rule_roce_mtu, *rules_nic.COUNTER_RULES,
)


@rule("fabric")
def counter_findings(m: Measured, host: Host | None, config: DiagnoseConfig) -> list[Finding]:
    """The diagnose engine's view of the fabric: the findings the counter rules gave on the
    counters measurement (``services/counters.judge``) when the snapshots were taken."""
    return list(m.counter_findings)


RULES = (counter_findings,)
