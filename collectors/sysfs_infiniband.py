"""RDMA devices from ``<sys_root>/class/infiniband/<dev>/ports/<p>/...``.

File formats follow ``drivers/infiniband/core/sysfs.c`` and
``Documentation/ABI/stable/sysfs-class-infiniband``: ``state`` and
``phys_state`` print ``"%d: %s"``, ``rate`` ``"%d Gb/sec (%dX%s)"``, ``counters/*`` are IB PMA
PortCounters (``port_xmit_data``/``port_rcv_data`` count 4-byte words, so bytes = value × 4;
``N/A (no PMA)`` means absent), ``hw_counters/*`` are driver counters (``lifespan`` is the cache
period in ms, not a counter). Widths: mlx5 Q-counters are read as be32 and wrap at 2^32, its
congestion counters and ``rx_icrc_encapsulated`` are 64-bit (``drivers/infiniband/hw/mlx5/
counters.c``); bnxt_re counters are u64; irdma splits 32/64 (``irdma_hw_stat_names``). IB PMA
counters saturate instead of wrapping (IB spec), so a decrease there is a reset.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from collectors.gid import GidEntry, read_gid_table, roce_v2_gid_index
from collectors.sample import CollectError, CounterSet, SourceStatus, units_json
from collectors.sysfs_read import (
    list_dir,
    natural_key,
    read_counter_dir,
    read_int,
    read_text,
    resolve_entry,
)

SOURCE = "sysfs_infiniband"

PMA_UNITS = {"port_xmit_data": "4-byte words", "port_rcv_data": "4-byte words",
             "port_xmit_data_64": "4-byte words", "port_rcv_data_64": "4-byte words",
             "port_xmit_wait": "ticks"}
PMA_SCALE = {k: 4 for k, v in PMA_UNITS.items() if v == "4-byte words"}

MLX5_64BIT = frozenset({
    "rp_cnp_ignored", "rp_cnp_handled", "np_ecn_marked_roce_packets", "np_cnp_sent",
    "rx_icrc_encapsulated", "cc_rx_ce_pkts", "cc_rx_cnp_pkts", "cc_tx_cnp_pkts",
    "rdma_tx_packets", "rdma_tx_bytes", "rdma_rx_packets", "rdma_rx_bytes",
})
MLX5_QCOUNTERS = frozenset({
    "rx_write_requests", "rx_read_requests", "rx_atomic_requests", "rx_dct_connect",
    "out_of_buffer", "out_of_sequence", "duplicate_request", "rnr_nak_retry_err",
    "packet_seq_err", "implied_nak_seq_err", "local_ack_timeout_err", "resp_local_length_error",
    "resp_cqe_error", "req_cqe_error", "req_remote_invalid_request", "req_remote_access_errors",
    "resp_remote_access_errors", "resp_cqe_flush_error", "req_cqe_flush_error",
    "req_transport_retries_exceeded", "req_rnr_retries_exceeded", "roce_adp_retrans",
    "roce_adp_retrans_to", "roce_slow_restart", "roce_slow_restart_cnps",
    "roce_slow_restart_trans",
})
IRDMA_32BIT = frozenset({
    "rxVlanErrors", "ip4InDiscards", "ip4InTruncatedPkts", "ip4OutNoRoutes", "ip6InDiscards",
    "ip6InTruncatedPkts", "ip6OutNoRoutes", "tcpRetransSegs", "tcpInOptErrors",
    "tcpInProtoErrors", "cnpHandled", "cnpIgnored", "cnpSent",
})
BNXT_RE = frozenset({
    "rx_pkts", "rx_bytes", "tx_pkts", "tx_bytes", "recoverable_errors", "rx_roce_errors",
    "rx_roce_discards", "to_retransmits", "seq_err_naks_rcvd", "max_retry_exceeded",
    "rnr_naks_rcvd", "missing_resp", "unrecoverable_err", "bad_resp_err", "dup_req",
    "oos_drop_count", "rx_out_of_buffer", "tx_cnp_pkts", "rx_cnp_pkts", "rx_ecn_marked_pkts",
    "rx_roce_good_pkts", "rx_roce_good_bytes", "np_cnp_pkts",
})
HW_GAUGES = frozenset({"lifespan", "active_pds", "active_ahs", "active_qps", "active_srqs",
                       "active_cqs", "active_mrs", "active_mws"})
HW_UNITS = {"rx_bytes": "bytes", "tx_bytes": "bytes", "rdma_tx_bytes": "bytes",
            "rdma_rx_bytes": "bytes", "rx_roce_good_bytes": "bytes", "lifespan": "ms"}


def hw_counter_width(name: str) -> int | None:
    """Wrap width in bits of an RDMA ``hw_counters`` entry, None when unknown (no wrap assumed)."""
    base = name[len("vport_"):] if name.startswith("vport_") else name
    if base in MLX5_64BIT or base in BNXT_RE:
        return 64
    if base in MLX5_QCOUNTERS or base in IRDMA_32BIT:
        return 32
    if base[:3] in ("ip4", "ip6", "tcp") or base.startswith(("iw", "Rx", "Tx")):
        return 64  # irdma's remaining named counters are the 64-bit group
    return None


def parse_state(text: str | None) -> tuple[int | None, str | None]:
    """``"4: ACTIVE"`` → ``(4, "ACTIVE")``; ``(None, None)`` when absent or unparsable."""
    m = re.fullmatch(r"\s*(\d+)\s*:\s*(.*?)\s*", text or "")
    return (int(m.group(1)), m.group(2)) if m else (None, None)


def parse_rate_gbps(text: str | None) -> float | None:
    """``"100 Gb/sec (4X EDR)"`` → 100.0 (rate = active width × speed; parsed numerically as
    newer kernels add HDR/NDR/XDR names)."""
    m = re.match(r"\s*(\d+(?:\.\d+)?)\s*Gb/sec", text or "")
    return float(m.group(1)) if m else None


@dataclass(frozen=True)
class RdmaPort:
    """One RDMA port. ``netdev`` is the Ethernet device a RoCE port is bound to (None on IB)."""

    port: int
    path: str
    state: str | None
    state_code: int | None
    phys_state: str | None
    rate_gbps: float | None
    link_layer: str | None
    counters: CounterSet | None
    hw_counters: CounterSet | None
    gids: tuple[GidEntry, ...] = ()
    netdev: str | None = None
    roce_v2_gid_index: int | None = None
    gid_index_by_netdev: dict[str, int] = field(default_factory=dict)
    active_mtu_bytes: int | None = None
    active_mtu_source: str | None = None

    @property
    def is_roce(self) -> bool:
        return (self.link_layer or "").lower() == "ethernet"

    def data_bytes(self) -> dict[str, int]:
        """xmit/rcv bytes from ``port_*_data`` (×4), preferring mlx4's ``counters_ext`` _64."""
        out = {}
        if self.counters is None:
            return out
        for way in ("xmit", "rcv"):
            v = self.counters.in_base_unit(f"port_{way}_data_64")
            if v is None:
                v = self.counters.in_base_unit(f"port_{way}_data")
            if v is not None:
                out[way] = v
        return out

    def to_json(self) -> dict:
        return {
            "state": self.state, "state_code": self.state_code, "phys_state": self.phys_state,
            "rate": self.rate_gbps, "rate_gbps": self.rate_gbps, "link_layer": self.link_layer,
            "netdev": self.netdev,
            "counters": self.counters.to_json() if self.counters else {},
            "hw_counters": self.hw_counters.to_json() if self.hw_counters else {},
            "units": {**units_json(self.counters), **units_json(self.hw_counters)},
            "data_bytes": self.data_bytes(),
            "roce_v2_gid_index": self.roce_v2_gid_index,
            "gid_index_by_netdev": dict(sorted(self.gid_index_by_netdev.items())),
            "gids": [g.to_json() for g in self.gids if g.type or g.ndev],
            "active_mtu": self.active_mtu_bytes, "active_mtu_source": self.active_mtu_source,
            "path": self.path,
        }


@dataclass(frozen=True)
class RdmaDevice:
    name: str
    path: str
    ports: dict[int, RdmaPort]
    hw_counters: CounterSet | None = None
    info: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            **dict(sorted(self.info.items())),
            "hw_counters": self.hw_counters.to_json() if self.hw_counters else {},
            "ports": {str(p): self.ports[p].to_json() for p in sorted(self.ports)},
            "path": self.path,
        }


def _pma_counters(port_dir: Path, errors: list) -> CounterSet | None:
    values, errs, present = read_counter_dir(port_dir / "counters", SOURCE)
    ext, errs2, present2 = read_counter_dir(port_dir / "counters_ext", SOURCE)
    errors.extend(errs + errs2)
    if not present and not present2:
        return None
    locations = {}
    for k, v in ext.items():  # mlx4 counters_ext: port_xmit_data_64, port_unicast_rcv_packets...
        if k not in values:
            values[k] = v
            locations[k] = str(port_dir / "counters_ext" / k)
    return CounterSet(str(port_dir / "counters"), values, widths={}, per_file=True,
                      locations=locations,
                      units={k: u for k, u in PMA_UNITS.items() if k in values},
                      scale={k: s for k, s in PMA_SCALE.items() if k in values})


def _hw_counters(directory: Path, errors: list) -> CounterSet | None:
    values, errs, present = read_counter_dir(directory, SOURCE)
    errors.extend(errs)
    if not present:
        return None
    return CounterSet(str(directory), values, per_file=True,
                      widths={k: hw_counter_width(k) for k in values},
                      units={k: HW_UNITS[k] for k in values if k in HW_UNITS},
                      gauges=frozenset(k for k in values if k in HW_GAUGES))


def _device_netdevs(dev_dir: Path) -> list[str]:
    """Netdevs of the RDMA device's PCI function (``<dev>/device/net/*``), in port order."""
    return list_dir(resolve_entry(dev_dir / "device") / "net")


def read_port(dev_dir: Path, port: int, device_netdevs: list[str], errors: list) -> RdmaPort:
    pdir = dev_dir / "ports" / str(port)
    state_code, state = parse_state(read_text(pdir / "state")[0])
    phys = parse_state(read_text(pdir / "phys_state")[0])[1]
    rate_text, _ = read_text(pdir / "rate")
    link_layer, _ = read_text(pdir / "link_layer")
    gids = read_gid_table(pdir)
    ndevs = sorted({g.ndev for g in gids if g.ndev})
    netdev = None
    if (link_layer or "").lower() == "ethernet":
        netdev = (device_netdevs[port - 1] if len(device_netdevs) >= port
                  else device_netdevs[0] if device_netdevs else None)
        if netdev is None or (ndevs and netdev not in ndevs):
            netdev = ndevs[0] if ndevs else netdev
    by_netdev = {}
    for nd in ndevs:
        idx = roce_v2_gid_index(gids, nd)
        if idx is not None:
            by_netdev[nd] = idx
    v2 = by_netdev.get(netdev) if netdev else None
    if v2 is None and not ndevs and (link_layer or "").lower() == "ethernet":
        v2 = roce_v2_gid_index(gids)
    mtu, why = read_int(pdir / "active_mtu")  # not upstream sysfs; honoured when present
    return RdmaPort(
        port=port, path=str(pdir), state=state, state_code=state_code, phys_state=phys,
        rate_gbps=parse_rate_gbps(rate_text), link_layer=link_layer,
        counters=_pma_counters(pdir, errors), hw_counters=_hw_counters(pdir / "hw_counters", errors),
        gids=tuple(gids), netdev=netdev, roce_v2_gid_index=v2, gid_index_by_netdev=by_netdev,
        active_mtu_bytes=mtu, active_mtu_source="sysfs" if mtu is not None else None,
    )


def collect_infiniband(sys_root: Path) -> tuple[dict[str, RdmaDevice], list, list]:
    """All RDMA devices under ``sys_root``: ``(devices, errors, statuses)``. A missing
    ``class/infiniband`` is ``no_data``, never an exception."""
    base = sys_root / "class" / "infiniband"
    names = list_dir(base)
    if not names:
        return {}, [], [SourceStatus(SOURCE, "no_data", str(base), "no RDMA devices")]
    devices: dict[str, RdmaDevice] = {}
    errors: list[CollectError] = []
    statuses: list[SourceStatus] = []
    for name in names:
        ddir = resolve_entry(base / name)
        ports = [p for p in list_dir(ddir / "ports") if p.isdigit()]
        dev_errors: list[CollectError] = []
        netdevs = _device_netdevs(ddir)
        info = {}
        for key in ("fw_ver", "board_id", "hca_type", "node_type", "node_guid"):
            text, _ = read_text(ddir / key)
            if text:
                info[key] = text
        devices[name] = RdmaDevice(
            name=name, path=str(ddir),
            ports={int(p): read_port(ddir, int(p), netdevs, dev_errors)
                   for p in sorted(ports, key=natural_key)},
            hw_counters=_hw_counters(ddir / "hw_counters", dev_errors), info=info,
        )
        errors.extend(dev_errors)
        statuses.append(SourceStatus(SOURCE, "error" if dev_errors else "ok", str(ddir),
                                     f"{len(dev_errors)} unreadable counters" if dev_errors else ""))
    return devices, errors, statuses


def iboe_mtu_bytes(netdev_mtu: int | None) -> int | None:
    """RoCE active MTU the kernel derives from the netdev MTU (``iboe_get_mtu`` in
    ``include/rdma/ib_addr.h``): largest IB MTU (256..4096) ≤ mtu − 96 header bytes
    (GRH 40 + UDP 8 + BTH 12 + XRC 4 + AtomicETH 28 + ICRC 4)."""
    if netdev_mtu is None:
        return None
    room = netdev_mtu - 96
    for ib_mtu in (4096, 2048, 1024, 512, 256):
        if room >= ib_mtu:
            return ib_mtu
    return None
