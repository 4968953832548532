"""link tuner: MTU and txqueuelen through rtnetlink (pyroute2), NIC rings through the
SIOCETHTOOL ioctl (ETHTOOL_GRINGPARAM 0x10 / ETHTOOL_SRINGPARAM 0x11, include/uapi/linux/ethtool.h).

Keys are ``<ifname>/mtu``, ``<ifname>/txqueuelen``, ``<ifname>/rx_ring``, ``<ifname>/tx_ring``.
Rings are raise-only and capped at the driver's maximum (R-18); drivers without ring support
(veth, tun) answer EOPNOTSUPP, which becomes a skip, not an error. MTU is checked against the
device's IFLA_MIN_MTU..IFLA_MAX_MTU; raising it is only recommended after a DF probe (R-19).
"""

from __future__ import annotations

import errno
from typing import Any

from collectors.ethtool_ioctl import EthtoolIoctl
from tuners.knob import Change, Skip, WrittenValue, same_value
from wanprobe.errors import ConfigError, TuneError, UsageError, shown
from wanprobe.units import parse_ifname

ATTRS = {"mtu": "IFLA_MTU", "txqueuelen": "IFLA_TXQLEN"}
FIELDS = ("mtu", "txqueuelen", "rx_ring", "tx_ring")
RAISE_ONLY = ("txqueuelen", "rx_ring", "tx_ring")


def split_key(key: str) -> tuple[str, str]:
    ifname, _, field = key.rpartition("/")
    try:
        parse_ifname(ifname)  # net/core/dev.c dev_valid_name
    except UsageError:
        ifname = ""
    if not ifname or field not in FIELDS:
        raise ConfigError(f"unknown link key {shown(key)} (want <ifname>/{'|'.join(FIELDS)})")
    return ifname, field


def read_rings(ifname: str) -> dict[str, int] | None:
    """Ring sizes and maxima, or None when the driver does not support ETHTOOL_GRINGPARAM."""
    try:
        with EthtoolIoctl() as eth:
            r = eth.rings(ifname)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENODEV, errno.EINVAL):
            return None
        raise
    return {"rx_ring": r.rx_pending, "tx_ring": r.tx_pending, "rx_ring_max": r.rx_max_pending,
            "tx_ring_max": r.tx_max_pending}


class LinkTuner(WrittenValue):
    """Acts on interfaces of the network namespace this process is in."""

    name = "link"

    def _link(self, ifname: str) -> Any:
        from pyroute2 import IPRoute
        with IPRoute() as ipr:
            idx = ipr.link_lookup(ifname=ifname)
            return ipr.link("get", index=idx[0])[0] if idx else None

    def current(self, key: str) -> str | None:
        ifname, field = split_key(key)
        if field in ATTRS:
            link = self._link(ifname)
            return None if link is None else str(link.get_attr(ATTRS[field]))
        rings = read_rings(ifname)
        return None if rings is None else str(rings[field])

    def _range(self, ifname: str, field: str) -> tuple[int, int]:
        if field == "mtu":
            link = self._link(ifname)
            return int(link.get_attr("IFLA_MIN_MTU") or 68), int(link.get_attr("IFLA_MAX_MTU") or 65535)
        if field == "txqueuelen":
            return 0, 2**32 - 1
        rings = read_rings(ifname) or {}
        return 1, rings.get(f"{field}_max", 0)

    def validate(self, change: Change) -> None:
        ifname, field = split_key(change.key)
        if self.current(change.key) is None:
            raise ConfigError(f"{change.key}: no such interface or the driver has no {field} here")
        try:
            value = int(change.new)
        except ValueError:
            raise ConfigError(f"{change.key}: value {shown(change.new)} is not a number") from None
        lo, hi = self._range(ifname, field)
        if not lo <= value <= hi:
            raise ConfigError(f"{change.key}: {value} is outside the device's range {lo}..{hi}")

    def lowers_admin_value(self, key: str, value: str) -> bool:
        _, field = split_key(key)
        live = self.current(key)
        return field in RAISE_ONLY and live is not None and int(value) < int(live)

    def plan(self, key: str, value: Any, reason: str) -> Change | Skip:
        ifname, field = split_key(key)
        live = self.current(key)
        if live is None:
            return Skip(self.name, key, f"{ifname} absent here or its driver has no {field} setting")
        want = int(value)
        lo, hi = self._range(ifname, field)
        if field in ("rx_ring", "tx_ring"):
            want = min(want, hi)
        if field in RAISE_ONLY and want <= int(live):
            return Skip(self.name, key, f"live {live} ≥ {want}; never lowered")
        if not lo <= want <= hi:
            return Skip(self.name, key, f"{want} outside the device's range {lo}..{hi}")
        if same_value(live, str(want)):
            return Skip(self.name, key, f"already {live}")
        return Change(self.name, key, live, str(want), reason)

    def _write(self, key: str, value: str) -> None:
        ifname, field = split_key(key)
        try:
            if field in ATTRS:
                from pyroute2 import IPRoute
                with IPRoute() as ipr:
                    idx = ipr.link_lookup(ifname=ifname)[0]
                    ipr.link("set", index=idx, **{"mtu" if field == "mtu" else "txqlen": int(value)})
                return
            with EthtoolIoctl() as eth:
                eth.set_rings(ifname, **{"rx" if field == "rx_ring" else "tx": int(value)})
        except (OSError, IndexError) as exc:
            raise TuneError(f"setting {key}={value} failed: {exc}") from None
        except Exception as exc:  # pyroute2 NetlinkError carries the errno in args
            raise TuneError(f"setting {key}={value} failed: {exc}") from None

    def restore_command(self, change: Change) -> str:
        ifname, field = split_key(change.key)
        if field in ATTRS:
            return f"ip link set dev {ifname} {'mtu' if field == 'mtu' else 'txqueuelen'} {change.old}"
        return f"ethtool -G {ifname} {'rx' if field == 'rx_ring' else 'tx'} {change.old}"

    def rollback(self, change: Change) -> None:
        if change.old is not None:
            self._write(change.key, change.old)
