"""RoCE GID table and NCCL's GID-index choice, as pure functions over sysfs text.

NCCL ≥ 2.21 (``ncclIbGetGidIndex`` / ``ncclUpdateGidIndex`` in ``src/transport/net_ib``) starts at index 0 and scans 1..n-1, moving to a candidate when

* its address family differs from the current one, equals the wanted family (``AF_INET``:
  an IPv4-mapped ``::ffff:a.b.c.d`` GID) and it is inside ``NCCL_IB_ADDR_RANGE``; or else
* it has the wanted family, is valid (not all-zero, not ``fe80::/64``), is in range, and its
  RoCE version (``gid_attrs/types/<i>``: ``IB/RoCE v1``→1, ``RoCE v2``→2) equals the wanted
  version while the current one's differs (or the current GID is not valid).

Entries whose type cannot be read (EINVAL for unpopulated / unmapped indices; NCCL skips them)
never win on the version test. wanprobe additionally restricts candidates to one netdev via
``gid_attrs/ndevs/<i>`` (inference: NCCL does not look at ndevs).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

from collectors.sysfs_read import list_dir, natural_key, read_text

AF_INET = "AF_INET"
AF_INET6 = "AF_INET6"


@dataclass(frozen=True)
class GidEntry:
    """One row of a port's GID table; ``type``/``ndev`` are None when unreadable or empty."""

    index: int
    gid: str | None
    type: str | None = None
    ndev: str | None = None

    @property
    def roce_version(self) -> int | None:
        """1 for ``IB/RoCE v1`` / ``RoCE v1``, 2 for ``RoCE v2``, None when unknown."""
        t = (self.type or "").strip()
        if t.endswith("v2"):
            return 2
        if t.endswith("v1"):
            return 1
        return None

    def to_json(self) -> dict:
        return {"index": self.index, "gid": self.gid, "type": self.type, "ndev": self.ndev}


def _addr(gid: str | None) -> ipaddress.IPv6Address | None:
    if not gid:
        return None
    try:
        return ipaddress.IPv6Address(gid)
    except ValueError:
        return None


def gid_family(gid: str | None) -> str:
    """``AF_INET`` for an IPv4-mapped GID (``::ffff:a.b.c.d``), else ``AF_INET6``."""
    a = _addr(gid)
    return AF_INET if a is not None and a.ipv4_mapped is not None else AF_INET6


def gid_valid(gid: str | None) -> bool:
    """NCCL ``validGid``: configured (not all-zero) and not link-local ``fe80::/64``."""
    a = _addr(gid)
    if a is None or int(a) == 0:
        return False
    return not (int(a) >> 64) == 0xFE80_0000_0000_0000


def _in_range(gid: str | None, family: str, addr_range: str | None) -> bool:
    if not addr_range:
        return True
    a = _addr(gid)
    if a is None:
        return False
    try:
        net = ipaddress.ip_network(addr_range, strict=False)
    except ValueError:
        return False
    addr = a.ipv4_mapped if family == AF_INET and a.ipv4_mapped is not None else a
    return addr.version == net.version and addr in net


def nccl_gid_index(entries: list[GidEntry], *, addr_family: str = AF_INET, roce_version: int = 2,
                   addr_range: str | None = None, netdev: str | None = None) -> int:
    """The GID index NCCL ≥ 2.21 would pick on a RoCE port (module docstring), restricted to
    ``netdev`` when given. Returns 0 when nothing better is found, as NCCL does."""
    by_index = {e.index: e for e in entries}
    if not by_index:
        return 0
    current = 0
    for idx in range(1, max(by_index) + 1):
        cand = by_index.get(idx)
        if cand is None or (netdev is not None and cand.ndev != netdev):
            continue
        if cand.roce_version is None:
            continue  # type unreadable (EINVAL: unpopulated/unmapped): NCCL moves on
        cur = by_index.get(current, GidEntry(current, None))
        cur_fam, cand_fam = gid_family(cur.gid), gid_family(cand.gid)
        cand_in_range = _in_range(cand.gid, addr_family, addr_range)
        if cand_fam != cur_fam and cand_fam == addr_family and cand_in_range and gid_valid(cand.gid):
            current = idx
            continue
        if cand_fam != addr_family or not gid_valid(cand.gid) or not cand_in_range:
            continue
        if (cur.roce_version != cand.roce_version or not gid_valid(cur.gid)) \
                and cand.roce_version == roce_version:
            current = idx
    return current


def roce_v2_gid_index(entries: list[GidEntry], netdev: str | None = None, *,
                      addr_family: str = AF_INET, addr_range: str | None = None) -> int | None:
    """NCCL's pick if it really is a valid RoCE v2 GID (of ``netdev`` when given), else None."""
    idx = nccl_gid_index(entries, addr_family=addr_family, roce_version=2,
                         addr_range=addr_range, netdev=netdev)
    e = next((x for x in entries if x.index == idx), None)
    if e is None or e.roce_version != 2 or not gid_valid(e.gid):
        return None
    if netdev is not None and e.ndev != netdev:
        return None
    return idx


def read_gid_table(port_dir: Path) -> list[GidEntry]:
    """Read ``gids/<i>`` and, for configured GIDs only, ``gid_attrs/{types,ndevs}/<i>``.

    All-zero GIDs are unpopulated (their attrs read EINVAL on a real kernel) and are kept with
    type/ndev None without touching the attr files, which keeps a 256-entry table cheap.
    """
    out: list[GidEntry] = []
    for name in sorted(list_dir(port_dir / "gids"), key=natural_key):
        if not name.isdigit():
            continue
        gid, _ = read_text(port_dir / "gids" / name)
        if not gid or _addr(gid) is None or int(_addr(gid)) == 0:
            out.append(GidEntry(int(name), gid or None))
            continue
        gtype, _ = read_text(port_dir / "gid_attrs" / "types" / name)
        ndev, _ = read_text(port_dir / "gid_attrs" / "ndevs" / name)
        out.append(GidEntry(int(name), gid, gtype or None, ndev or None))
    return out
