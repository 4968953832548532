"""What one end of a path knows about itself, for the rules and for the far end: congestion
control, TCP buffer sysctls, the MTU/qdisc/drop counters of the interface toward the other end
and the TCP retransmit counters — read from the same collectors as ``wanprobe counters``
(``procfs_sysctl``, ``procfs_netstat``, rtnetlink links via ``rtnl_raw``, ``route``).

``HostFacts`` is served to a peer over the throughput control channel (``host_facts`` op), so
``from_json`` treats its input as hostile: every field is type- and range-checked and anything
else is refused with one line. Absent is None (docs/conventions.md §3).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from collectors.clock_state import read_boot_id
from collectors.procfs_netstat import collect_netstat
from collectors.procfs_sysctl import read_sysctls
from collectors.route import route_get

FACTS_VERSION = 1
_NAME = re.compile(r"^[A-Za-z0-9_.:@-]{1,32}$")  # cc, qdisc and interface names
_BOOT_ID = re.compile(r"^[0-9a-fA-F-]{8,64}$")
_MAX_INT = 2**63 - 1
FACT_SYSCTLS = ("net.ipv4.tcp_congestion_control", "net.ipv4.tcp_allowed_congestion_control",
                "net.ipv4.tcp_available_congestion_control", "net.ipv4.tcp_rmem",
                "net.ipv4.tcp_wmem", "net.ipv4.tcp_mem", "net.core.rmem_max", "net.core.wmem_max")


class FactsError(ValueError):
    """A host-facts document that does not hold what it must (one line)."""


@dataclass(frozen=True)
class HostFacts:
    """One host as its own collectors read it. Sizes in bytes, ``tcp_mem`` in pages (as the
    kernel counts it, net/ipv4/tcp.c ``sysctl_tcp_mem``) with ``page_size_bytes`` beside it."""

    cc_current: str | None
    cc_allowed: tuple[str, ...]
    cc_available: tuple[str, ...]
    tcp_rmem_bytes: tuple[int, int, int] | None
    tcp_wmem_bytes: tuple[int, int, int] | None
    tcp_mem_pages: tuple[int, int, int] | None
    page_size_bytes: int | None
    rmem_max_bytes: int | None
    wmem_max_bytes: int | None
    iface: str | None = None
    iface_mtu_bytes: int | None = None
    iface_qdisc: str | None = None
    iface_rx_dropped_packets: int | None = None
    iface_tx_dropped_packets: int | None = None
    tcp_retrans_segs_total: int | None = None
    tcp_out_segs_total: int | None = None
    # /proc/sys/kernel/random/boot_id: two ends with the same one read one kernel clock (two
    # namespaces of one host), so their one-way delays carry no clock offset (probe/owd.py)
    boot_id: str | None = None
    version: int = FACTS_VERSION

    @property
    def tcp_mem_max_bytes(self) -> int | None:
        """``tcp_mem[2]`` in bytes: above it the kernel refuses socket memory to every TCP
        socket of the host (net/core/sock.c ``__sk_mem_raise_allocated``)."""
        if self.tcp_mem_pages is None or not self.page_size_bytes:
            return None
        return self.tcp_mem_pages[2] * self.page_size_bytes

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        for k, v in d.items():
            if isinstance(v, tuple):
                d[k] = list(v)
        return d

    @classmethod
    def from_json(cls, d: Any) -> HostFacts:
        """Validate a document from anywhere (a peer, a report); FactsError names the field."""
        if not isinstance(d, Mapping):
            raise FactsError("host facts must be a JSON object")
        if d.get("version") != FACTS_VERSION:
            raise FactsError(f"host facts version {d.get('version')!r} is not {FACTS_VERSION}")
        return cls(
            cc_current=_name(d, "cc_current"), cc_allowed=_names(d, "cc_allowed"),
            cc_available=_names(d, "cc_available"),
            tcp_rmem_bytes=_triple(d, "tcp_rmem_bytes"), tcp_wmem_bytes=_triple(d, "tcp_wmem_bytes"),
            tcp_mem_pages=_triple(d, "tcp_mem_pages"), page_size_bytes=_int(d, "page_size_bytes"),
            rmem_max_bytes=_int(d, "rmem_max_bytes"), wmem_max_bytes=_int(d, "wmem_max_bytes"),
            iface=_name(d, "iface"), iface_mtu_bytes=_int(d, "iface_mtu_bytes"),
            iface_qdisc=_name(d, "iface_qdisc"),
            iface_rx_dropped_packets=_int(d, "iface_rx_dropped_packets"),
            iface_tx_dropped_packets=_int(d, "iface_tx_dropped_packets"),
            tcp_retrans_segs_total=_int(d, "tcp_retrans_segs_total"),
            tcp_out_segs_total=_int(d, "tcp_out_segs_total"), boot_id=_boot_id(d))


def _boot_id(d: Mapping[str, Any]) -> str | None:
    v = d.get("boot_id")
    if v is None:
        return None
    if not isinstance(v, str) or not _BOOT_ID.match(v):
        raise FactsError("host facts: boot_id must be a boot id (hex and dashes) or null")
    return v


def _int(d: Mapping[str, Any], key: str) -> int | None:
    v = d.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= _MAX_INT:
        raise FactsError(f"host facts: {key} must be a non-negative integer or null")
    return v


def _name(d: Mapping[str, Any], key: str) -> str | None:
    v = d.get(key)
    if v is None:
        return None
    if not isinstance(v, str) or not _NAME.match(v):
        raise FactsError(f"host facts: {key} must be a short name or null")
    return v


def _names(d: Mapping[str, Any], key: str) -> tuple[str, ...]:
    v = d.get(key) or []
    if not isinstance(v, list) or len(v) > 64:
        raise FactsError(f"host facts: {key} must be a list of names")
    return tuple(_name({"x": x}, "x") or "" for x in v)


def _triple(d: Mapping[str, Any], key: str) -> tuple[int, int, int] | None:
    v = d.get(key)
    if v is None:
        return None
    if not isinstance(v, list) or len(v) != 3:
        raise FactsError(f"host facts: {key} must be three integers or null")
    a, b, c = (_int({"x": x}, "x") for x in v)
    if a is None or b is None or c is None:
        raise FactsError(f"host facts: {key} must be three integers or null")
    return a, b, c


def parse_triple(text: str | None) -> tuple[int, int, int] | None:
    """``"4096 131072 6291456"`` → (4096, 131072, 6291456); None when absent or malformed."""
    try:
        a, b, c = (int(x) for x in (text or "").split())
    except ValueError:
        return None
    return a, b, c


def parse_int(text: str | None) -> int | None:
    """``"212992"`` → 212992; None when absent or not an integer."""
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def facts_from(sysctls: Mapping[str, str], tcp_counters: Mapping[str, int],
               link: Mapping[str, Any] | None, *, iface: str | None,
               page_size_bytes: int | None, boot_id: str | None = None) -> HostFacts:
    """Pure: the collectors' outputs (sysctl values, Tcp/TcpExt counters, one rtnetlink link
    row as ``rtnl_raw.parse_link`` returns it) → :class:`HostFacts`."""
    stats = (link or {}).get("stats64") or {}
    return HostFacts(
        cc_current=sysctls.get("net.ipv4.tcp_congestion_control") or None,
        cc_allowed=tuple((sysctls.get("net.ipv4.tcp_allowed_congestion_control") or "").split()),
        cc_available=tuple(
            (sysctls.get("net.ipv4.tcp_available_congestion_control") or "").split()),
        tcp_rmem_bytes=parse_triple(sysctls.get("net.ipv4.tcp_rmem")),
        tcp_wmem_bytes=parse_triple(sysctls.get("net.ipv4.tcp_wmem")),
        tcp_mem_pages=parse_triple(sysctls.get("net.ipv4.tcp_mem")),
        page_size_bytes=page_size_bytes,
        rmem_max_bytes=parse_int(sysctls.get("net.core.rmem_max")),
        wmem_max_bytes=parse_int(sysctls.get("net.core.wmem_max")),
        iface=iface, iface_mtu_bytes=(link or {}).get("mtu"),
        iface_qdisc=(link or {}).get("qdisc"),
        iface_rx_dropped_packets=stats.get("rx_dropped"),
        iface_tx_dropped_packets=stats.get("tx_dropped"),
        tcp_retrans_segs_total=tcp_counters.get("RetransSegs"),
        tcp_out_segs_total=tcp_counters.get("OutSegs"), boot_id=boot_id)


def read_host_facts(toward: str | None, *, proc_root: Path = Path("/proc")) -> HostFacts:
    """This host's facts in the caller's network namespace; the interface is the one the kernel
    routes ``toward`` the other end over (None: no interface facts)."""
    from collectors.rtnl_raw import dump_links

    sysctls, _ = read_sysctls(Path(proc_root), FACT_SYSCTLS)
    groups, _, _ = collect_netstat(Path(proc_root))
    tcp = dict(groups["tcp"].values) if "tcp" in groups else {}
    route = route_get(toward) if toward else None
    iface = route.iface if route else None
    link = None
    if iface:
        try:
            link = next((row for row in dump_links() if row.get("name") == iface), None)
        except (OSError, ValueError):
            link = None
    return facts_from(sysctls, tcp, link, iface=iface,
                      page_size_bytes=os.sysconf("SC_PAGE_SIZE"),
                      boot_id=read_boot_id(Path(proc_root)))
