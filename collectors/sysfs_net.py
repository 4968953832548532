"""Network devices from ``<sys_root>/class/net/<if>/``: MTU, state, speed, driver, and the
``statistics/*`` counters (``struct rtnl_link_stats64`` fields, printed as unsigned long by
``net/core/net-sysfs.c``, so they wrap at the native word width — 64 bits here).

``speed`` reads EINVAL (or -1) when the device has no link speed (virtual devices, link down):
that is "absent", not an error.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

from collectors.sample import CollectError, CounterSet, SourceStatus
from collectors.sysfs_read import list_dir, read_counter_dir, read_int, read_text, resolve_entry

SOURCE = "sysfs_net"
NATIVE_LONG_BITS = 8 * struct.calcsize("L")
STAT_UNITS = {"rx_bytes": "bytes", "tx_bytes": "bytes"}


@dataclass(frozen=True)
class NetdevSysfs:
    name: str
    path: str
    ifindex: int | None
    mtu: int | None
    operstate: str | None
    speed_mbps: int | None
    carrier_changes: int | None
    tx_queue_len: int | None
    driver: str | None
    qos_trust: str | None
    stats: CounterSet | None


def list_netdevs(sys_root: Path) -> list[str]:
    """Interface names under ``class/net`` (directories or links; not ``bonding_masters``)."""
    base = sys_root / "class" / "net"
    return [n for n in list_dir(base) if resolve_entry(base / n).is_dir()]


def _driver(dev_dir: Path) -> str | None:
    link = dev_dir / "device" / "driver"
    try:
        return link.resolve(strict=True).name if link.is_symlink() else None
    except OSError:
        return None


def read_netdev(sys_root: Path, name: str,
                with_stats: bool = True) -> tuple[NetdevSysfs, list[CollectError]]:
    """One netdev. Missing attributes are None; unparsable counters are listed as errors.
    ``with_stats=False`` skips ``statistics/*`` (the caller has them from rtnetlink)."""
    ddir = resolve_entry(sys_root / "class" / "net" / name)
    errors: list[CollectError] = []

    def number(attr: str) -> int | None:
        value, why = read_int(ddir / attr)
        if value is None and why not in ("missing",) and not why.startswith("unreadable: Invalid"):
            errors.append(CollectError(SOURCE, str(ddir / attr), why, counter=attr))
        return value

    speed = number("speed")
    stats = None
    values, errs, present = (read_counter_dir(ddir / "statistics", SOURCE) if with_stats
                             else ({}, [], False))
    errors.extend(errs)
    if present:
        stats = CounterSet(str(ddir / "statistics"), values, per_file=True,
                           widths={k: NATIVE_LONG_BITS for k in values},
                           units={k: u for k, u in STAT_UNITS.items() if k in values})
    trust, _ = read_text(ddir / "qos" / "trust")
    return NetdevSysfs(
        name=name, path=str(ddir), ifindex=number("ifindex"), mtu=number("mtu"),
        operstate=read_text(ddir / "operstate")[0] or None,
        speed_mbps=speed if speed is not None and speed >= 0 else None,
        carrier_changes=number("carrier_changes"), tx_queue_len=number("tx_queue_len"),
        driver=_driver(ddir), qos_trust=trust or None, stats=stats,
    ), errors


def collect_netdevs(sys_root: Path, with_stats: bool = True) -> tuple[dict[str, NetdevSysfs], list, list]:
    """Every netdev under ``sys_root``: ``(devices, errors, statuses)``."""
    names = list_netdevs(sys_root)
    base = sys_root / "class" / "net"
    if not names:
        return {}, [], [SourceStatus(SOURCE, "no_data", str(base), "no network devices")]
    devs, errors, statuses = {}, [], []
    for name in names:
        dev, errs = read_netdev(sys_root, name, with_stats)
        devs[name] = dev
        errors.extend(errs)
        statuses.append(SourceStatus(SOURCE, "error" if errs else "ok", dev.path,
                                     f"{len(errs)} unreadable values" if errs else ""))
    return devs, errors, statuses
