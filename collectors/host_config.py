"""Read the host's network configuration (sysctls, per-interface MTU/txqueuelen/qdisc/rings, cc,
netns inode) through ``proc_root`` / ``sys_root`` so it runs on the live host or a fixture tree:
the report's ``host`` part, which diagnose's host rules (rules_host.py, over host_inputs.Host)
judge.

Read-only. Sysctl values are whitespace-normalised (``tcp_rmem`` is tab-separated in procfs,
tcp-tuning.md §4.7); a sysctl that does not exist in this namespace (e.g. ``net.core.default_qdisc``
inside a netns, §4.1) is simply absent from the result, never "0".
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# One key list, the collectors' (issue 12): diagnose reads what `wanprobe counters` reads.
from collectors.host_facts import HostFacts, parse_int
from collectors.procfs_sysctl import SYSCTLS
from collectors.procfs_sysctl import read_sysctls as collect_sysctls


@dataclass(frozen=True)
class HostConfig:
    """The host part of a report (keys as in the report schema's ``host``)."""

    hostname: str
    kernel: str
    sysctls: dict[str, str]
    available_cc: tuple[str, ...]
    allowed_cc: tuple[str, ...]
    ifaces: dict[str, dict[str, Any]]
    machine_id: str | None = None
    netns_inode: int | None = None
    fq_available: bool | None = None
    # what `diagnose` adds: the source address of the route to the peer, and this host's facts
    # as a peer would send them (host_facts.HostFacts: the same record as measurements.peer_facts)
    address: str | None = None
    facts: HostFacts | None = None

    @classmethod
    def unreadable(cls) -> HostConfig:
        """This host by name and kernel alone, when its configuration cannot be read."""
        return cls(hostname=socket.gethostname(), kernel=os.uname().release, sysctls={},
                   available_cc=(), allowed_cc=(), ifaces={})

    def to_json(self) -> dict[str, Any]:
        return {"hostname": self.hostname, "machine_id": self.machine_id, "kernel": self.kernel,
                "netns_inode": self.netns_inode, "sysctls": dict(self.sysctls),
                "available_cc": list(self.available_cc), "allowed_cc": list(self.allowed_cc),
                "fq_available": self.fq_available,
                "ifaces": {k: dict(v) for k, v in self.ifaces.items()},
                "address": self.address, "facts": self.facts.to_json() if self.facts else None}


def _read(path: Path) -> str | None:
    try:
        return " ".join(path.read_text(encoding="utf-8", errors="replace").split())
    except OSError:
        return None


def _read_int(path: Path) -> int | None:
    return parse_int(_read(path))


def read_sysctls(proc_root: Path, names: tuple[str, ...] = SYSCTLS) -> dict[str, str]:
    """Dotted sysctl name -> normalised value, for those present under ``proc_root/sys``
    (procfs_sysctl reads them; unreadable ones are left out here)."""
    return collect_sysctls(Path(proc_root), names)[0]


def parse_tc_qdisc_json(text: str) -> dict[str, str]:
    """``tc -j qdisc show`` output -> {dev: root qdisc kind} (pure; mq children are ignored).
    Not used to read the host (rtnetlink is): the independent view tests compare against."""
    try:
        rows = json.loads(text or "[]")
    except json.JSONDecodeError:
        return {}
    out: dict[str, str] = {}
    for row in rows if isinstance(rows, list) else []:
        if isinstance(row, dict) and row.get("root") and "dev" in row and "kind" in row:
            out[str(row["dev"])] = str(row["kind"])
    return out


def read_root_qdiscs() -> dict[str, str]:
    """Root qdisc per device in the current network namespace, over rtnetlink (the collectors'
    reader, qdisc.py); {} if unknown."""
    from collectors.qdisc import read_qdiscs_raw
    from collectors.rtnl_raw import dump_links

    try:
        names = {row["ifindex"]: row["name"] for row in dump_links()}
    except (OSError, ValueError):
        return {}
    qdiscs, _ = read_qdiscs_raw(names)
    return {dev: q["kind"] for dev, rows in qdiscs.items() for q in rows
            if q["parent"] == "root" and q.get("kind")}


def read_rings(ifname: str) -> dict[str, int]:
    """NIC ring sizes (``ethtool -g``) through the SIOCETHTOOL reader (ethtool_ioctl.py); {} where the
    driver has none (veth, TUN, lo answer EOPNOTSUPP) or the ioctl is not permitted."""
    from collectors.ethtool_ioctl import EthtoolIoctl

    try:
        with EthtoolIoctl() as eth:
            rings = eth.rings(ifname)
    except Exception:  # unsupported driver, vanished device, no permission: not measured
        return {}
    return {"rx_ring": rings.rx_pending, "tx_ring": rings.tx_pending,
            "rx_ring_max": rings.rx_max_pending, "tx_ring_max": rings.tx_max_pending}


def read_ifaces(sys_root: Path, qdiscs: dict[str, str], *, rings: bool = False
                ) -> dict[str, dict[str, Any]]:
    """Per interface under ``sys_root/class/net``: mtu, txqueuelen, speed and root qdisc."""
    out: dict[str, dict[str, Any]] = {}
    base = Path(sys_root, "class", "net")
    try:
        names = sorted(p.name for p in base.iterdir() if p.is_dir())
    except OSError:
        return out
    for name in names:
        d = base / name
        speed = _read_int(d / "speed")
        info: dict[str, Any] = {"mtu": _read_int(d / "mtu"),
                                "txqueuelen": _read_int(d / "tx_queue_len"),
                                "qdisc": qdiscs.get(name),
                                "speed_mbps": speed if speed is not None and speed > 0 else None}
        if rings and name != "lo":
            info.update(read_rings(name))
        out[name] = info
    return out


def fq_available(sys_root: Path, kernel: str, modules_root: Path = Path("/lib/modules")
                 ) -> bool | None:
    """Whether sch_fq can be used: loaded (/sys/module), built in, or a module file exists.

    None when there is no module directory to tell (the CI kernel has none, and no sch_fq:
    tcp-tuning.md §4.7 [verified]).
    """
    if Path(sys_root, "module", "sch_fq").exists():
        return True
    mod_dir = Path(modules_root, kernel)
    if not mod_dir.is_dir():
        return None
    builtin = _read(mod_dir / "modules.builtin") or ""
    if "sch_fq.ko" in builtin.replace("sch_fq_codel.ko", ""):
        return True
    sched = mod_dir / "kernel" / "net" / "sched"
    return any(sched.glob("sch_fq.ko*"))


def read_host_config(proc_root: Path = Path("/proc"), sys_root: Path = Path("/sys"),
                     etc_root: Path = Path("/etc"), *, live: bool | None = None) -> HostConfig:
    """Everything the host rules look at. ``live`` (default: roots are the real ones) also reads
    qdiscs with ``tc`` and rings with the ethtool ioctl, which only make sense on this host."""
    proc_root, sys_root = Path(proc_root), Path(sys_root)
    if live is None:
        live = str(proc_root) == "/proc" and str(sys_root) == "/sys"
    sysctls = read_sysctls(proc_root)
    kernel = _read(proc_root / "sys" / "kernel" / "osrelease") or os.uname().release
    hostname = _read(proc_root / "sys" / "kernel" / "hostname") or socket.gethostname()
    try:
        inode = os.stat(proc_root / "self" / "ns" / "net").st_ino
    except OSError:
        inode = None
    avail = _read(proc_root / "sys/net/ipv4/tcp_available_congestion_control") or ""
    allowed = _read(proc_root / "sys/net/ipv4/tcp_allowed_congestion_control") or ""
    qdiscs = read_root_qdiscs() if live else {}
    return HostConfig(
        hostname=hostname, kernel=kernel, sysctls=sysctls,
        available_cc=tuple(avail.split()), allowed_cc=tuple(allowed.split()),
        ifaces=read_ifaces(sys_root, qdiscs, rings=live), machine_id=_read(etc_root / "machine-id"),
        netns_inode=inode, fq_available=fq_available(sys_root, kernel))
