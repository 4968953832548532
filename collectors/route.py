"""The route the kernel would use toward an address (``ip -j route get ADDR``): the interface,
the preferred source address and a cached path MTU (a route exception learned from ICMP
"fragmentation needed", RFC 1191). Read-only.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass


@dataclass(frozen=True)
class Route:
    """``iface`` carries traffic toward the address; ``source_address`` is what the far end sees
    as ours; ``route_mtu_bytes`` is None without a learned PMTU."""

    iface: str | None = None
    source_address: str | None = None
    route_mtu_bytes: int | None = None


def parse_route_get(text: str) -> Route | None:
    """Pure: ``ip -j route get`` output → :class:`Route`; None when it is not that output."""
    try:
        rows = json.loads(text or "[]")
    except json.JSONDecodeError:
        return None
    if not (isinstance(rows, list) and rows and isinstance(rows[0], dict)):
        return None
    row = rows[0]
    mtu = None
    for metric in row.get("metrics") or []:
        if isinstance(metric, dict) and isinstance(metric.get("mtu"), int):
            mtu = metric["mtu"]
    if isinstance(row.get("mtu"), int):
        mtu = row["mtu"]
    dev, src = row.get("dev"), row.get("prefsrc")
    return Route(iface=dev if isinstance(dev, str) else None,
                 source_address=src if isinstance(src, str) else None, route_mtu_bytes=mtu)


def route_get(address: str) -> Route | None:
    """The route toward ``address`` in the caller's network namespace; None when unknown."""
    ip = shutil.which("ip")
    if ip is None:
        return None
    try:
        res = subprocess.run([ip, "-j", "route", "get", address], capture_output=True, text=True,
                             timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_route_get(res.stdout) if res.returncode == 0 else None


def local_addresses() -> frozenset[str]:
    """Every IPv4/IPv6 address of this host in the caller's network namespace (rtnetlink
    RTM_GETADDR), without a zone or prefix length."""
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        rows = ipr.get_addr()
    # On a point-to-point link IFA_ADDRESS is the far end; IFA_LOCAL is ours (rtnetlink(7)).
    found = (a.get_attr("IFA_LOCAL") or a.get_attr("IFA_ADDRESS") for a in rows)
    return frozenset(str(x).split("%")[0] for x in found if x)
