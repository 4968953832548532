"""link tuner: MTU and txqueuelen through rtnetlink (pyroute2), NIC rings through the
SIOCETHTOOL ioctl (ETHTOOL_GRINGPARAM 0x10 / ETHTOOL_SRINGPARAM 0x11, include/uapi/linux/ethtool.h).

Keys are ``<ifname>/mtu``, ``<ifname>/txqueuelen``, ``<ifname>/rx_ring``, ``<ifname>/tx_ring``.
Rings are raise-only and capped at the driver's maximum (R-18); drivers without ring support
(veth, tun) answer EOPNOTSUPP, which becomes a skip, not an error. MTU is checked against the
device's IFLA_MIN_MTU..IFLA_MAX_MTU; raising it is only recommended after a DF probe (R-19).
"""

from __future__ import annotations

import errno
import fcntl
import socket
import struct
from typing import Any

from tuners.knob import Change, Skip, same_value
from wanprobe.errors import ConfigError, TuneError, shown

SIOCETHTOOL = 0x8946
ETHTOOL_GRINGPARAM, ETHTOOL_SRINGPARAM = 0x10, 0x11
_RING = struct.Struct("=9I")  # cmd, rx_max, rx_mini_max, rx_jumbo_max, tx_max, rx, rx_mini, rx_jumbo, tx
ATTRS = {"mtu": "IFLA_MTU", "txqueuelen": "IFLA_TXQLEN"}
FIELDS = ("mtu", "txqueuelen", "rx_ring", "tx_ring")
RAISE_ONLY = ("txqueuelen", "rx_ring", "tx_ring")


def split_key(key: str) -> tuple[str, str]:
    ifname, _, field = key.rpartition("/")
    if not ifname or field not in FIELDS or len(ifname) > 15:
        raise ConfigError(f"unknown link key {shown(key)} (want <ifname>/{'|'.join(FIELDS)})")
    return ifname, field


def _ring_ioctl(ifname: str, cmd: int, values: tuple[int, ...] = (0,) * 8) -> tuple[int, ...]:
    import ctypes
    buf = bytearray(_RING.pack(cmd, *values))
    cbuf = (ctypes.c_char * len(buf)).from_buffer(buf)
    ifreq = struct.pack("16sP", ifname.encode(), ctypes.addressof(cbuf))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        fcntl.ioctl(s.fileno(), SIOCETHTOOL, ifreq)
    return _RING.unpack(bytes(buf))[1:]


def read_rings(ifname: str) -> dict[str, int] | None:
    """Ring sizes and maxima, or None when the driver does not support ETHTOOL_GRINGPARAM."""
    try:
        rx_max, _, _, tx_max, rx, _, _, tx = _ring_ioctl(ifname, ETHTOOL_GRINGPARAM)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENODEV, errno.EINVAL):
            return None
        raise
    return {"rx_ring": rx, "tx_ring": tx, "rx_ring_max": rx_max, "tx_ring_max": tx_max}


class LinkTuner:
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
            rx_max, mini_max, jumbo_max, tx_max, rx, mini, jumbo, tx = _ring_ioctl(ifname, ETHTOOL_GRINGPARAM)
            rx, tx = (int(value), tx) if field == "rx_ring" else (rx, int(value))
            _ring_ioctl(ifname, ETHTOOL_SRINGPARAM, (rx_max, mini_max, jumbo_max, tx_max, rx, mini, jumbo, tx))
        except (OSError, IndexError) as exc:
            raise TuneError(f"setting {key}={value} failed: {exc}") from None
        except Exception as exc:  # pyroute2 NetlinkError carries the errno in args
            raise TuneError(f"setting {key}={value} failed: {exc}") from None

    def apply(self, change: Change) -> None:
        self._write(change.key, change.new)

    def verify(self, key: str, wanted: str | None) -> bool:
        return same_value(self.current(key), wanted)

    def restore_command(self, change: Change) -> str:
        ifname, field = split_key(change.key)
        if field in ATTRS:
            return f"ip link set dev {ifname} {'mtu' if field == 'mtu' else 'txqueuelen'} {change.old}"
        return f"ethtool -G {ifname} {'rx' if field == 'rx_ring' else 'tx'} {change.old}"

    def rollback(self, change: Change) -> None:
        if change.old is not None:
            self._write(change.key, change.old)
