"""Link statistics over rtnetlink (pyroute2 ``IPRoute.get_links``, or the lean raw reader in
``collectors.rtnl_raw`` used on the sampling path): ``IFLA_STATS64``
(``struct rtnl_link_stats64``, u64 fields, the same numbers ``/sys/class/net/<if>/statistics``
prints) plus ifindex, MTU, operstate, qdisc and carrier changes, for every link in the caller's
network namespace in one dump.
"""

from __future__ import annotations

from dataclasses import dataclass
from struct import error as struct_error

from collectors.sample import CollectError, CounterSet

SOURCE = "netlink_link"


@dataclass(frozen=True)
class NetlinkLink:
    name: str
    ifindex: int
    mtu: int | None
    operstate: str | None
    qdisc: str | None
    carrier_changes: int | None
    stats: CounterSet | None

    def to_json(self) -> dict:
        return {"ifindex": self.ifindex, "mtu": self.mtu, "operstate": self.operstate,
                "qdisc": self.qdisc, "carrier_changes": self.carrier_changes,
                "stats": self.stats.to_json() if self.stats else {}}


def links_from_messages(msgs) -> dict[str, NetlinkLink]:
    """Pure conversion of pyroute2 ``ifinfmsg`` objects (anything with ``get_attr``), through
    the same rows :func:`links_from_raw` takes."""
    rows = []
    for msg in msgs:
        raw = msg.get_attr("IFLA_STATS64") or {}
        rows.append({"name": msg.get_attr("IFLA_IFNAME"), "ifindex": int(msg["index"]),
                     "mtu": msg.get_attr("IFLA_MTU"),
                     "operstate": msg.get_attr("IFLA_OPERSTATE") or None,
                     "qdisc": msg.get_attr("IFLA_QDISC"),
                     "carrier_changes": msg.get_attr("IFLA_CARRIER_CHANGES"),
                     "stats64": {k: int(v) for k, v in dict(raw).items() if isinstance(v, int)}})
    return links_from_raw(rows)


def read_links(ipr=None) -> tuple[dict[str, NetlinkLink], list[CollectError]]:
    """Dump all links; ``ipr`` is an open ``pyroute2.IPRoute`` to reuse (else one is opened)."""
    try:
        if ipr is not None:
            return links_from_messages(ipr.get_links()), []
        from pyroute2 import IPRoute

        with IPRoute() as own:
            return links_from_messages(own.get_links()), []
    except Exception as exc:  # netlink unavailable: report, never fatal
        return {}, [CollectError(SOURCE, "rtnetlink RTM_GETLINK", f"failed: {exc}")]


def links_from_raw(rows: list[dict]) -> dict[str, NetlinkLink]:
    """Pure conversion of :func:`collectors.rtnl_raw.dump_links` rows."""
    out: dict[str, NetlinkLink] = {}
    for row in rows:
        name = row.get("name")
        if not name:
            continue
        raw = row.get("stats64") or {}
        stats = None
        if raw:
            stats = CounterSet(f"rtnetlink:{name}/IFLA_STATS64", dict(raw),
                               widths={k: 64 for k in raw},
                               units={k: "bytes" for k in raw if k.endswith("_bytes")})
        out[name] = NetlinkLink(name=name, ifindex=row["ifindex"], mtu=row.get("mtu"),
                                operstate=row.get("operstate"), qdisc=row.get("qdisc"),
                                carrier_changes=row.get("carrier_changes"), stats=stats)
    return out


def read_links_raw(sock=None) -> tuple[dict[str, NetlinkLink], list[CollectError]]:
    """Same as :func:`read_links` over the lean raw-socket reader (the sampling fast path)."""
    from collectors.rtnl_raw import dump_links

    try:
        return links_from_raw(dump_links(sock)), []
    except (OSError, ValueError, struct_error) as exc:
        return {}, [CollectError(SOURCE, "rtnetlink RTM_GETLINK", f"failed: {exc}")]
