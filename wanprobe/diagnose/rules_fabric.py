"""Rules on RoCE / PFC / ECN counters (the ``counters`` JSON of issue 5: ``rdma``, ``netdevs``,
per-second ``rates`` of the same shape, ``findings[]`` from ``collectors.health``).

Heuristics from roce-nccl.md §2.7: a lossless fabric that loses (sequence errors, ack timeouts,
discards rising), PFC absent on the RoCE priority (mlx5 emits ``rx_prioN_pause`` only for
PFC-enabled priorities, §2.1), ECN/DCQCN disabled on it (§2.4), and a PFC storm (pause duration
in µs per second of wall time = the share of time the port was paused).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from wanprobe.diagnose.inputs import DiagnoseConfig, section
from wanprobe.diagnose.rule import rule
from wanprobe.report.document import Finding, Knob

# Counters that must not grow on a lossless RoCE priority (roce-nccl.md §2.7).
RDMA_LOSS = ("out_of_sequence", "packet_seq_err", "implied_nak_seq_err", "local_ack_timeout_err",
             "duplicate_request", "roce_adp_retrans", "rx_icrc_encapsulated", "port_rcv_errors",
             "port_xmit_discards")
ETH_LOSS = ("rx_discards_phy", "tx_discards_phy", "rx_prio{p}_discards", "rx_prio{p}_buf_discard",
            "rx_prio{p}_cong_discard", "tx_pause_storm_error_events", "rx_discard_packets_cos{p}")
STORM_EVENTS = ("tx_pause_storm_warning_events", "tx_pause_storm_error_events",
                "continuous_pause_events", "continuous_roce_pause_events")
PAUSE_DURATION = ("rx_prio{p}_pause_duration", "tx_prio{p}_pause_duration",
                  "pfc_pri{p}_rx_duration_us", "pfc_pri{p}_tx_duration_us",
                  "rx_global_pause_duration", "tx_global_pause_duration")
STORM_SHARE = 0.2  # paused ≥ 20 % of the window: the priority is mostly stalled

Meas = Mapping[str, Any]
Host = Mapping[str, Any] | None


def _names(templates: tuple[str, ...], prio: int) -> tuple[str, ...]:
    return tuple(t.format(p=prio) for t in templates)


def _dig(d: Any, *path: str) -> Any:
    for p in path:
        d = d.get(p) if isinstance(d, Mapping) else None
    return d


def rdma_rates(counters: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """``{"mlx5_0/1": {counter: per-second rate}}`` over counters and hw_counters."""
    out: dict[str, dict[str, float]] = {}
    for dev, info in (_dig(counters, "rates", "rdma") or {}).items():
        for port, pinfo in (_dig(info, "ports") or {}).items():
            merged: dict[str, float] = {}
            for group in ("counters", "hw_counters"):
                for k, v in (_dig(pinfo, group) or {}).items():
                    if isinstance(v, (int, float)) and not isinstance(v, bool):
                        merged[k] = float(v)
            out[f"{dev}/{port}"] = merged
    return out


def netdev_rates(counters: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """``{ifname: {ethtool or stats name: per-second rate}}``."""
    out: dict[str, dict[str, float]] = {}
    for name, info in (_dig(counters, "rates", "netdevs") or {}).items():
        merged: dict[str, float] = {}
        for group in ("stats", "ethtool"):
            for k, v in (_dig(info, group) or {}).items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    merged[k] = float(v)
        out[name] = merged
    return out


def pfc_enabled(netdev: Mapping[str, Any], prio: int) -> bool | None:
    """PFC on ``prio``: from dcb config when collected, else inferred from mlx5 ethtool names
    (``rx_prio{p}_pause`` exists only for PFC-enabled priorities). None when unknown."""
    for path in (("dcb", "pfc_enabled"), ("dcb", "pfc", "prio_pfc"), ("pfc", "enabled")):
        cfg = _dig(netdev, *path)
        if isinstance(cfg, Mapping):
            v = cfg.get(str(prio), cfg.get(prio))
            if v is not None:
                return v in (True, 1, "on", "1")
        if isinstance(cfg, list) and len(cfg) > prio:
            return cfg[prio] in (True, 1, "on", "1")
    eth = netdev.get("ethtool") or {}
    if f"rx_prio{prio}_pause" in eth or f"tx_prio{prio}_pause" in eth:
        return True
    if f"rx_prio{prio}_bytes" in eth or f"rx_prio{prio}_packets" in eth:
        return False
    return None


def ecn_enabled(netdev: Mapping[str, Any], prio: int) -> dict[str, bool]:
    """ECN/DCQCN enable per role (``roce_np``, ``roce_rp``) on ``prio`` where exposed (MLNX_OFED
    ``/sys/class/net/<if>/ecn/<role>/enable/<prio>``, roce-nccl.md §2.4)."""
    ecn = netdev.get("ecn")
    out: dict[str, bool] = {}
    if not isinstance(ecn, Mapping):
        return out
    for role in ("roce_np", "roce_rp"):
        node = ecn.get(role)
        enable = node.get("enable", node) if isinstance(node, Mapping) else None
        if isinstance(enable, Mapping):
            v = enable.get(str(prio), enable.get(prio))
            if isinstance(v, (bool, int)) or (isinstance(v, str) and v.strip().isdigit()):
                out[role] = int(v) != 0
    return out


def _loss_growth(c: Mapping[str, Any], prio: int) -> dict[str, float]:
    grow: dict[str, float] = {}
    for port, rates in rdma_rates(c).items():
        for name in RDMA_LOSS:
            if rates.get(name, 0) > 0:
                grow[f"{port}:{name}"] = rates[name]
    for ifname, rates in netdev_rates(c).items():
        for name in _names(ETH_LOSS, prio):
            if rates.get(name, 0) > 0:
                grow[f"{ifname}:{name}"] = rates[name]
    return grow


def _roce_netdevs(c: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """Netdevs that carry RoCE: those backing an RDMA port (``rdma_ports`` in the collectors'
    netdev JSON, or the port's ``netdev``), else those with ethtool stats."""
    netdevs = c.get("netdevs") or {}
    named = {n for n, i in netdevs.items() if isinstance(i, Mapping) and i.get("rdma_ports")}
    for info in (c.get("rdma") or {}).values():
        for pinfo in (_dig(info, "ports") or {}).values():
            for key in ("netdev", "ndev"):
                if isinstance(_dig(pinfo, key), str):
                    named.add(pinfo[key])
    pick = named & set(netdevs) or {n for n, i in netdevs.items()
                                   if isinstance(i, Mapping) and i.get("ethtool")}
    return {n: netdevs[n] for n in sorted(pick)}


def _roce_knob(what: str, value: str, iface: str, reason: str) -> Knob:
    """A knob in the roce tuner's key format: ``<if>/pfc``, ``<if>/trust``,
    ``<if>/ecn_np/<prio>``, ``<if>/ecn_rp/<prio>`` (tuners/roce.py)."""
    return Knob("roce", f"{iface}/{what}", value, reason, side="local", iface=iface)


def _ecn_knobs(iface: str, roles, prio: int, reason: str) -> list[Knob]:
    short = {"roce_np": "ecn_np", "roce_rp": "ecn_rp"}
    return [_roce_knob(f"{short[r]}/{prio}", "1", iface, reason) for r in roles]


def _drops(m: Meas, config: DiagnoseConfig) -> tuple[dict[str, Any], list[str]] | None:
    """Loss counters growing on the RoCE fabric: (evidence, netdevs with PFC off)."""
    c = section(m, "counters")
    if not c:
        return None
    prio = config.roce_prio
    grow = _loss_growth(c, prio)
    if not grow:
        return None
    pfc = {n: pfc_enabled(i, prio) for n, i in _roce_netdevs(c).items()}
    evidence = {"growing_per_s": grow, "roce_prio": prio, "pfc_enabled": pfc,
                "sources": {"growing_per_s": "counters rates (per second)",
                            "pfc_enabled": "dcb config, else mlx5 ethtool rx_prioN_pause presence"}}
    return evidence, [n for n, v in pfc.items() if v is False]


@rule("fabric.roce_drops_pfc_off")
def roce_drops_pfc_off(m: Meas, host: Host, config: DiagnoseConfig) -> Finding | None:
    """Loss counters rise and PFC is off on the RoCE priority: the fabric is not lossless
    (NCCL issue #378: "RoCE fabric not having proper flow control")."""
    found = _drops(m, config)
    if not found or not found[1]:
        return None
    evidence, off = found
    prio = config.roce_prio
    knobs = [k for n in off for k in (
        _roce_knob("pfc", str(prio), n, f"lossless RoCE priority {prio} (roce-nccl §2.6)"),
        _roce_knob("trust", "dscp", n, "map DSCP 26 → priority 3 (roce-nccl §2.6)"))]
    return Finding(
        id="fabric.roce_drops_pfc_off", severity="critical",
        title=f"RoCE is losing packets and PFC is off on priority {prio} ({', '.join(off)})",
        evidence=evidence,
        recommendation=(f"Enable PFC on priority {prio} on the host (`dcb pfc set dev IF "
                        f"prio-pfc all:off {prio}:on`) and the switch ports, trust DSCP, and "
                        "enable ECN on the same priority."),
        expected_effect=("RoCE go-back-N retransmission collapses bandwidth to a fraction "
                         "(NCCL #378: 0.x GB/s) on every drop; a lossless priority stops "
                         "the drops"),
        knobs=tuple(knobs))


@rule("fabric.roce_drops")
def roce_drops(m: Meas, host: Host, config: DiagnoseConfig) -> Finding | None:
    """Loss counters rise although PFC is on (or unknown) on the RoCE priority (§2.7)."""
    found = _drops(m, config)
    if not found or found[1]:
        return None
    return Finding(
        id="fabric.roce_drops", severity="critical",
        title="RoCE fabric is losing packets on a lossless priority", evidence=found[0],
        recommendation=("Look for buffer discards (headroom), CRC/symbol errors (cable/optic) "
                        "and a switch port without PFC on the path."),
        expected_effect="each RoCE drop costs a go-back-N retransmission and a timeout stall")


@rule("fabric.ecn_disabled")
def ecn_disabled(m: Meas, host: Host, config: DiagnoseConfig) -> Finding | None:
    """ECN (DCQCN notification/reaction point) disabled on the RoCE priority (§2.4, §2.6)."""
    c = section(m, "counters")
    if not c:
        return None
    prio = config.roce_prio
    off: dict[str, list[str]] = {}
    for name, info in (c.get("netdevs") or {}).items():
        if isinstance(info, Mapping):
            roles = [r for r, on in ecn_enabled(info, prio).items() if not on]
            if roles:
                off[name] = roles
    if not off:
        return None
    knobs = [k for n, roles in off.items()
             for k in _ecn_knobs(n, roles, prio, f"DCQCN on priority {prio} (§2.6)")]
    return Finding(
        id="fabric.ecn_disabled", severity="warning",
        title=f"ECN/DCQCN is disabled on RoCE priority {prio} ({', '.join(off)})",
        evidence={"roce_prio": prio, "disabled": off,
                  "sources": {"disabled": "/sys/class/net/<if>/ecn/<role>/enable/<prio>"}},
        recommendation=(f"Enable ECN on priority {prio} for both the notification point "
                        "(roce_np) and reaction point (roce_rp)."),
        expected_effect=("without DCQCN the fabric relies on PFC alone: congestion spreads as "
                         "pause frames (head-of-line blocking, storm risk) instead of senders "
                         "slowing down"),
        knobs=tuple(knobs))


@rule("fabric.pfc_storm")
def pfc_storm(m: Meas, host: Host, config: DiagnoseConfig) -> Finding | None:
    """A priority paused for ≥ 20 % of the sample window, or storm events counted
    (mlx5 tx_pause_storm_*_events, bnxt continuous_pause_events)."""
    c = section(m, "counters")
    if not c:
        return None
    share: dict[str, float] = {}
    events: dict[str, float] = {}
    for ifname, rates in netdev_rates(c).items():
        for prio in range(8):
            for name in _names(PAUSE_DURATION, prio):
                if rates.get(name, 0) > 0:
                    share[f"{ifname}:{name}"] = rates[name] / 1e6  # µs per s → fraction
        for name in STORM_EVENTS:
            if rates.get(name, 0) > 0:
                events[f"{ifname}:{name}"] = rates[name]
    worst = max(share.values(), default=0.0)
    if worst < STORM_SHARE and not events:
        return None
    ifaces = sorted({k.split(":")[0] for k in (*share, *events)})
    netdevs = c.get("netdevs") or {}
    knobs = [k for n in ifaces for k in _ecn_knobs(
        n, [r for r, on in ecn_enabled(netdevs.get(n) or {}, config.roce_prio).items() if not on],
        config.roce_prio, "let DCQCN slow senders before PFC pauses the link")]
    return Finding(
        id="fabric.pfc_storm", severity="critical",
        title=f"PFC storm: a priority is paused {worst:.0%} of the time on {', '.join(ifaces)}",
        evidence={"pause_share": share, "storm_events_per_s": events,
                  "threshold_share": STORM_SHARE,
                  "sources": {"pause_share": "Δ pause_duration (µs) / Δt (µs), counters rates"}},
        recommendation=("Find the slow receiver or stuck queue emitting pauses (tx_prioN_pause "
                        "on the peer), enable the NIC pause-storm watchdog, and make sure ECN "
                        "reacts before PFC (ECN threshold below the PFC XOFF threshold)."),
        expected_effect=(f"traffic on the paused priority gets at most {1 - worst:.0%} of the "
                         "link, and pauses spread to upstream switches (head-of-line blocking)"),
        knobs=tuple(knobs), impact=worst)


_HEALTH_MAP = (  # collectors.health id fragment -> the fabric/path finding that covers it
    (re.compile(r"drop|seq|ack_timeout|discard|loss"), "fabric.roce_drops"),
    (re.compile(r"ecn"), "fabric.ecn_disabled"),
    (re.compile(r"pause|pfc|storm"), "fabric.pfc_storm"),
)


@rule("health")
def health_findings(m: Meas, host: Host, config: DiagnoseConfig) -> list[Finding]:
    """collectors.health findings as report findings (the engine drops those a fabric rule
    already explains). Returns a list: one per health finding."""
    c = section(m, "counters") or {}
    out = []
    for h in c.get("findings") or []:
        if not isinstance(h, Mapping) or not h.get("id"):
            continue
        hid = re.sub(r"[^a-z0-9_]+", "_", str(h["id"]).lower()).strip("_") or "unknown"
        sev = h.get("severity") if h.get("severity") in ("critical", "warning", "info") else "info"
        covered = next((fid for rx, fid in _HEALTH_MAP if rx.search(hid)), None)
        ev = h.get("evidence") if isinstance(h.get("evidence"), Mapping) else {}
        knobs: tuple[Knob, ...] = ()
        iface = ev.get("subject") or ev.get("netdev") or ev.get("iface")
        if covered == "fabric.ecn_disabled" and isinstance(iface, str):
            knobs = tuple(_ecn_knobs(iface, ("roce_np", "roce_rp"), config.roce_prio,
                                     "collectors.health: ECN off"))
        out.append(Finding(
            id=f"health.{hid}", severity=sev, title=str(h.get("title") or hid),
            evidence={**dict(ev), "covered_by": covered,
                      "sources": {"finding": "collectors.health"}},
            recommendation=str(h.get("meaning") or h.get("recommendation") or
                               "See the counters named in the evidence."),
            expected_effect=str(h.get("expected_effect") or ""), knobs=knobs))
    return out


RULES = (roce_drops_pfc_off, roce_drops, ecn_disabled, pfc_storm)
