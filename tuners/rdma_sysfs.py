"""Read RDMA ports and their GID tables from sysfs (``<sys_root>/class/infiniband``).

Formats from drivers/infiniband/core/sysfs.c (roce-nccl.md §1.1): ``gids/<i>`` is ``%pI6``;
``gid_attrs/types/<i>`` is ``IB/RoCE v1`` or ``RoCE v2`` and fails (EINVAL) for an unpopulated
entry; ``gid_attrs/ndevs/<i>`` names the netdev (VLAN devices have their own GIDs).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

from tuners import sysfs_path


@dataclass(frozen=True)
class Gid:
    index: int
    address: ipaddress.IPv6Address
    roce_version: int  # 1, 2, or -1 when the type cannot be read (NCCL treats it as no match)
    ndev: str | None

    @property
    def family(self) -> str:
        """NCCL getGidAddrFamily: IPv4-mapped (``::ffff:a.b.c.d``, or ff0e::ffff:... multicast) is AF_INET."""
        raw = self.address.packed
        mapped = raw[:10] == bytes(10) and raw[10:12] == b"\xff\xff"
        mapped_mc = raw[:4] == b"\xff\x0e\x00\x00" and raw[4:10] == bytes(6) and raw[10:12] == b"\xff\xff"
        return "AF_INET" if mapped or mapped_mc else "AF_INET6"

    @property
    def valid(self) -> bool:
        """NCCL validGid: configured (not all-zero, not bare fe80::) and not link-local fe80::/64."""
        raw = self.address.packed
        first, trailer = raw[:4], raw[4:]
        if raw == bytes(16) or (first == b"\xfe\x80\x00\x00" and trailer == bytes(12)):
            return False
        return not (first == b"\xfe\x80\x00\x00" and raw[4:8] == bytes(4))


@dataclass(frozen=True)
class RdmaPort:
    device: str
    port: int
    link_layer: str  # "Ethernet" (RoCE) or "InfiniBand"
    active: bool
    rate_gbps: float | None
    netdevs: tuple[str, ...]
    gids: tuple[Gid, ...]


def _roce_version(text: str | None) -> int:
    if not text:
        return -1
    if text.endswith("v2"):
        return 2
    return 1 if text.endswith("v1") else -1


def read_ports(sys_root: Path) -> list[RdmaPort]:
    """All RDMA ports under ``sys_root``; an absent class directory gives an empty list."""
    out = []
    for dev in sysfs_path.listdir(sys_root, "class/infiniband"):
        base = f"class/infiniband/{dev}"
        netdevs = tuple(sysfs_path.listdir(sys_root, base, "device/net"))
        for port in sysfs_path.listdir(sys_root, base, "ports"):
            if not port.isdigit():
                continue
            p = f"{base}/ports/{port}"
            gids = []
            for idx in sorted(int(i) for i in sysfs_path.listdir(sys_root, p, "gids") if i.isdigit()):
                text = sysfs_path.read(sys_root, p, "gids", str(idx))
                try:
                    addr = ipaddress.IPv6Address(text or "")
                except ValueError:
                    continue
                gids.append(Gid(idx, addr, _roce_version(sysfs_path.read(sys_root, p, "gid_attrs/types", str(idx))),
                                sysfs_path.read(sys_root, p, "gid_attrs/ndevs", str(idx)) or None))
            rate = sysfs_path.read(sys_root, p, "rate") or ""
            try:
                rate_gbps: float | None = float(rate.split()[0])
            except (ValueError, IndexError):
                rate_gbps = None
            state = sysfs_path.read(sys_root, p, "state") or ""
            out.append(RdmaPort(dev, int(port), sysfs_path.read(sys_root, p, "link_layer") or "Unknown",
                                state.endswith("ACTIVE"), rate_gbps, netdevs, tuple(gids)))
    return out


def _in_range(gid: Gid, addr_range: ipaddress.IPv4Network | ipaddress.IPv6Network | None) -> bool:
    if addr_range is None:
        return True
    if gid.family == "AF_INET" and addr_range.version == 4:
        return ipaddress.IPv4Address(gid.address.packed[12:]) in addr_range
    return addr_range.version == 6 and gid.address in addr_range


def nccl_gid_index(gids: tuple[Gid, ...] | list[Gid], *, addr_family: str = "AF_INET",
                   roce_version: int = 2, addr_range: str | None = None) -> int:
    """The GID index NCCL ≥ 2.21 picks on a RoCE port (NCCL src/transport/net_ib: ncclIbGetGidIndex
    scanning 1..n-1 with ncclUpdateGidIndex, starting from index 0), roce-nccl.md §1.5.

    A candidate replaces the current pick when it has the wanted family (and range) while the
    current one does not; or, same family and valid, when it has the wanted RoCE version while
    the current one has another version or is invalid.
    """
    net = ipaddress.ip_network(addr_range, strict=False) if addr_range else None
    table = {g.index: g for g in gids}
    if 0 not in table:
        return 0
    pick = table[0]
    for idx in sorted(table):
        if idx == 0:
            continue
        cand = table[idx]
        if cand.family != pick.family and cand.family == addr_family and _in_range(cand, net):
            pick = cand
            continue
        if cand.family != addr_family or not cand.valid or not _in_range(cand, net):
            continue
        if (pick.roce_version != cand.roce_version or not pick.valid) and cand.roce_version == roce_version:
            pick = cand
    return pick.index


def best_gid_for_netdev(gids: tuple[Gid, ...] | list[Gid], netdev: str, *,
                        addr_family: str = "AF_INET", roce_version: int = 2) -> int | None:
    """The first valid GID of the wanted family and RoCE version bound to ``netdev``."""
    for g in sorted(gids, key=lambda g: g.index):
        if g.ndev == netdev and g.valid and g.family == addr_family and g.roce_version == roce_version:
            return g.index
    return None
