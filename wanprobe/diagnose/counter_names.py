"""The one table of fabric counter names, by driver, that the fabric rules judge.

Each driver lists, per kind of event, the names its counters carry (``{p}`` stands for a
priority 0-7). A rule asks for a kind and gets the union over every driver, so adding a driver's
name for an event is one line here and no rule changes. Sources (linux tree):
drivers/infiniband/hw/mlx5/counters.c (mlx5 hw_counters), bnxt_re/hw_counters.c and
irdma/verbs.c, drivers/net/ethernet/mellanox/mlx5/core/en_stats.c with
Documentation/networking/device_drivers/ethernet/mellanox/mlx5/counters.rst (mlx5 ethtool),
broadcom/bnxt/bnxt_ethtool.c (bnxt_en), intel/ice/ice_ethtool.c (ice); the IB PMA port counters
(Documentation/ABI/stable/sysfs-class-infiniband) are the generic ``ib`` row.
A name that an mlx5 port shows with a ``vport_`` prefix matches without it.
"""

from __future__ import annotations

from functools import cache

PRIORITIES = range(8)

DRIVERS: dict[str, dict[str, tuple[str, ...]]] = {
    "ib": {  # IB PMA port counters (sysfs ports/<n>/counters), every RDMA driver
        "link_down": ("link_downed",),
        "phy_errors": ("symbol_error", "port_rcv_errors", "port_rcv_remote_physical_errors",
                       "local_link_integrity_errors"),
        "port_discards": ("port_xmit_discards",),
    },
    "netdev": {  # /sys/class/net/<if>/statistics, any driver
        "phy_errors": ("rx_crc_errors", "rx_frame_errors"),
        "out_of_buffer": ("rx_missed_errors", "rx_fifo_errors", "rx_over_errors"),
    },
    "mlx5": {  # mlx5_ib hw_counters and mlx5_core ethtool -S
        "roce_loss": ("out_of_sequence", "packet_seq_err", "implied_nak_seq_err",
                      "local_ack_timeout_err", "duplicate_request", "roce_adp_retrans"),
        "retry_exceeded": ("req_transport_retries_exceeded",),
        "pause_duration": ("rx_prio{p}_pause_duration", "tx_prio{p}_pause_duration",
                           "rx_global_pause_duration", "tx_global_pause_duration"),
        # emitted only for priorities with PFC on (K-MLX5EN): presence marks the priority
        "pfc_present": ("rx_prio{p}_pause", "tx_prio{p}_pause"),
        # emitted for every priority: with no pause counter beside them, PFC is off there
        "prio_traffic": ("rx_prio{p}_bytes", "rx_prio{p}_packets"),
        "storm_events": ("tx_pause_storm_warning_events", "tx_pause_storm_error_events"),
        "storm_errors": ("tx_pause_storm_error_events",),
        "cnp_sent": ("np_cnp_sent",),
        "cnp_handled": ("rp_cnp_handled",),
        "cnp_ignored": ("rp_cnp_ignored",),
        "link_down": ("link_down_events_phy",),
        "phy_errors": ("rx_crc_errors_phy", "rx_symbol_err_phy", "rx_pcs_symbol_err_phy",
                       "tx_errors_phy", "rx_in_range_len_errors_phy", "rx_jabbers_phy",
                       "rx_fragments_phy", "rx_icrc_encapsulated"),
        "phy_uncorrectable": ("rx_pcs_symbol_err_phy",),
        "out_of_buffer": ("rx_out_of_buffer", "out_of_buffer"),
        "nic_discards": ("rx_discards_phy", "tx_discards_phy", "rx_prio{p}_discards",
                         "rx_prio{p}_buf_discard", "rx_prio{p}_cong_discard"),
    },
    "bnxt_re": {  # bnxt_re hw_counters and bnxt_en ethtool -S (BNXT-PATCH maps them 1:1)
        "roce_loss": ("oos_drop_count", "seq_err_naks_rcvd", "missing_resp", "to_retransmits"),
        "retry_exceeded": ("max_retry_exceeded",),
        "pause_duration": ("pfc_pri{p}_rx_duration_us", "pfc_pri{p}_tx_duration_us"),
        "pfc_frames": ("rx_pfc_ena_frames_pri{p}", "tx_pfc_ena_frames_pri{p}"),
        "storm_events": ("continuous_pause_events", "continuous_roce_pause_events"),
        "cnp_sent": ("np_cnp_pkts", "tx_cnp_pkts"),
        "cnp_handled": ("rx_cnp_pkts",),
        "link_down": ("link_down_events",),
        "phy_errors": ("rx_fcs_err_frames", "rx_pcs_symbol_err"),
        "phy_uncorrectable": ("rx_pcs_symbol_err",),
        "nic_discards": ("rx_discard_packets_cos{p}", "rx_total_discard_pkts",
                         "tx_total_discard_pkts"),
    },
    "irdma/ice": {  # irdma hw_counters and ice ethtool -S
        "pfc_frames": ("rx_priority_{p}_xoff.nic", "tx_priority_{p}_xoff.nic"),
        "cnp_sent": ("cnpSent",),
        "cnp_handled": ("cnpHandled",),
        "cnp_ignored": ("cnpIgnored",),
        "phy_errors": ("rx_crc_errors.nic",),
        "nic_discards": ("rx_dropped.nic", "tx_dropped_link_down.nic"),
    },
    "virtio_net": {
        "out_of_buffer": ("rx_drops",),
    },
}


@cache
def by_prio(kind: str) -> dict[str, int | None]:
    """Every name of ``kind`` across drivers → its priority (None for a per-port name)."""
    out: dict[str, int | None] = {}
    for kinds in DRIVERS.values():
        for template in kinds.get(kind, ()):
            if "{p}" in template:
                out.update({template.format(p=p): p for p in PRIORITIES})
            else:
                out[template] = None
    return out


def names(kind: str) -> frozenset[str]:
    """Every counter name of ``kind`` across drivers, priorities expanded."""
    return frozenset(by_prio(kind))


def is_kind(name: str, *kinds: str) -> bool:
    """``name`` (``vport_`` prefix ignored) is a counter of one of ``kinds``."""
    bare = name.removeprefix("vport_")
    return any(bare in by_prio(k) for k in kinds)


def prio_of(name: str, kind: str) -> int | None:
    """The priority a per-priority counter name of ``kind`` is about (None otherwise)."""
    return by_prio(kind).get(name.removeprefix("vport_"))
