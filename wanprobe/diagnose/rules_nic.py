"""NIC, link and TCP counter rules (the rest of the fabric rule set in
:mod:`wanprobe.diagnose.rules_fabric`, same parts ``(snapshot, rates, window_s)``).

Sources: linux Documentation/networking/device_drivers/ethernet/mellanox/mlx5/counters.rst
(``rx_discards_phy``, ``rx_out_of_buffer``, ``rx_pcs_symbol_err_phy``), bnxt_ethtool.c (bnxt_en),
ice_ethtool.c (ice); Mathis et al. 1997 (rate ∝ 1/√p).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from collectors.rates import Rates
from wanprobe.diagnose.context import COUNTERS
from wanprobe.diagnose.counter_names import is_kind
from wanprobe.diagnose.fabric_counters import Growth, evidence, growing, lossless, subjects
from wanprobe.diagnose.finding import Finding, Knob
from wanprobe.diagnose.rule import RuleFn, rule

if TYPE_CHECKING:  # types only: the collectors stay unloaded until a snapshot is taken
    from collectors.snapshot import Snapshot

TCP_RETRANS_WARN = 0.01        # ≥ 1 % of segments retransmitted
TCP_RETRANS_INFO = 0.001
TCP_MIN_SEGMENTS = 100         # below this many OutSegs in the window the ratio is noise


@rule("link.downed", needs=COUNTERS)
def rule_link_downed(snap: Snapshot, rates: Rates | None, window_s: float) -> list[Finding]:
    """Link went down during the window: IB PMA ``link_downed``, mlx5 ``link_down_events_phy``,
    bnxt ``link_down_events``."""
    g = growing(snap, rates, ("counters", "ethtool"), "link_down")
    if not g:
        return []
    return [Finding("link.downed", "critical", "link went down during the window",
                    evidence(g, window_s), "check cable/optic and switch port logs",
                    "a link flap drops every in-flight packet and stalls collectives until "
                    "retransmission")]


@rule("link.phy_errors", needs=COUNTERS)
def rule_phy_errors(snap: Snapshot, rates: Rates | None, window_s: float) -> list[Finding]:
    """Symbol / CRC / uncorrectable-FEC / PHY errors growing: a bad cable, optic or port
    (K-MLX5DOC: ``rx_pcs_symbol_err_phy`` = symbol errors FEC could not correct, "traffic is
    lost", critical). FEC-corrected bits are not counted: correction is FEC doing its job."""
    g = growing(snap, rates, ("counters", "hw_counters", "ethtool", "stats"), "phy_errors")
    if not g:
        return []
    crit = any(is_kind(x.counter, "phy_uncorrectable") for x in g)
    return [Finding("link.phy_errors", "critical" if crit else "warning",
                    f"symbol/CRC/PHY errors growing on {subjects(g)}", evidence(g, window_s),
                    "check optics DOM (ethtool -m), reseat/replace the cable, check the peer port",
                    "corrupted frames are dropped at the receiver: a physical-layer problem "
                    "(cable, optic, dirty connector, bad port)")]


@rule("nic.rx_out_of_buffer", needs=COUNTERS)
def rule_rx_out_of_buffer(snap: Snapshot, rates: Rates | None, window_s: float) -> list[Finding]:
    """Receive drops for lack of host buffers: mlx5 ethtool ``rx_out_of_buffer`` (RQ had no
    software buffers), netdev ``rx_missed_errors``/``rx_fifo_errors``/``rx_over_errors``,
    virtio ``rx_drops``, RDMA ``out_of_buffer`` (no receive WQE posted). Ring too small or the
    CPU not draining it."""
    g = growing(snap, rates, ("ethtool", "stats", "hw_counters"), "out_of_buffer")
    if not g:
        return []
    rings: dict[str, dict[str, Any]] = {}
    knobs: list[Knob] = []
    for x in g:
        nd = snap.netdevs.get(x.subject)
        if nd is not None and nd.rings is not None:
            rings[x.subject] = nd.rings.to_json()
            if nd.rings.rx_pending < nd.rings.rx_max_pending:
                knobs.append(Knob("link", f"{x.subject}/rx_ring", str(nd.rings.rx_max_pending),
                                  "rx ring overflowing", side="local", iface=x.subject))
    return [Finding("nic.rx_out_of_buffer", "warning", f"receive buffers exhausted on {subjects(g)}",
                    evidence(g, window_s, rings=rings),
                    "enlarge the RX ring (ethtool -G <if> rx <max>), spread IRQs/RSS, check CPU "
                    "load; for RDMA out_of_buffer the application is not posting receives fast "
                    "enough", "packets arrived while the receive ring/queue had no free buffer: "
                    "dropped in the host, not the network", tuple(knobs))]


@rule("nic.discards", needs=COUNTERS)
def rule_nic_discards(snap: Snapshot, rates: Rates | None, window_s: float) -> list[Finding]:
    """NIC-level discards (port buffer full, per-priority buffer/congestion discards, IB
    ``port_xmit_discards``): loss at the adapter (K-MLX5DOC rx_discards_phy: "adapter is
    congested"); critical on a lossless (PFC) port."""
    g = (growing(snap, rates, ("ethtool",), "nic_discards")
         + growing(snap, rates, ("counters",), "port_discards"))
    if not g:
        return []
    return [Finding("nic.discards", "critical" if lossless(snap, {x.subject for x in g})
                    else "warning", f"NIC discarding packets on {subjects(g)}",
                    evidence(g, window_s),
                    "enable PFC on the lossless priority or reduce incast; check the PFC/buffer "
                    "configuration (dcb buffer, mlnx_qos)", "the adapter dropped packets for "
                    "lack of port/priority buffers: loss before the host sees them")]


@rule("tcp.retrans_rate", needs=COUNTERS)
def rule_tcp_retrans(snap: Snapshot, rates: Rates | None, window_s: float) -> list[Finding]:
    """TCP retransmission rate = ΔRetransSegs / ΔOutSegs (``/proc/net/snmp`` Tcp:). ≥ 1 %
    warning, ≥ 0.1 % info; below 100 segments in the window the ratio is not judged."""
    if rates is None:
        return []
    rs, out = rates.get(("tcp",), "RetransSegs"), rates.get(("tcp",), "OutSegs")
    if not rs or not out or rs.delta is None or out.delta is None or out.delta < TCP_MIN_SEGMENTS:
        return []
    if rs.per_s is None or out.per_s is None:  # never with a delta (collectors/rates.py)
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
        if r and r.delta and r.per_s is not None:
            items.append(Growth("tcp", extra, where(extra), r.delta, r.per_s))
    ev = evidence(items, window_s, retrans_ratio=round(ratio, 6))
    ev.update(counter="RetransSegs", path=items[0].path, delta=rs.delta,
              rate_per_s=round(rs.per_s, 6))
    return [Finding("tcp.retrans_rate", "warning" if ratio >= TCP_RETRANS_WARN else "info",
                    f"TCP retransmitted {ratio:.2%} of segments in the last {window_s:.0f} s", ev,
                    "find the lossy hop (wanprobe probe); consider BBR and larger buffers for "
                    "long paths", "loss or reordering on TCP paths; loss-based congestion "
                    "control cuts its window on each loss (Mathis: rate ∝ 1/√p)")]


COUNTER_RULES: tuple[RuleFn, ...] = (
    rule_link_downed, rule_phy_errors, rule_rx_out_of_buffer, rule_nic_discards, rule_tcp_retrans,
)
