"""The one collector contract (node_exporter's ``Collector.Update`` + ``execute``): every source
is one function ``collect_x(roots, got) -> Reading`` and :func:`run_all` loops over them.

``roots`` says where to read (``sys_root`` / ``proc_root`` / ``ethtool_root``, whether this is
the live host) and holds the live handles; ``got`` is what the collectors before it returned
(netdev names for the ethtool reader, RDMA ports for dcb). A :class:`Reading` is frozen: the
typed value, one :class:`SourceStatus` per object read (``ok`` / ``no_data`` / ``error`` with
the path) and the per-counter errors. A collector that raises is reported as ``error`` with the
exception and the loop carries on: a failing collector is never fatal.

The readers these wrap keep their own signatures (``read_sysctls(proc_root)``, ...), so
``diagnose`` and the tuners can call one reader without running the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collectors import sysfs_ecn, sysfs_infiniband, sysfs_net
from collectors.dcb import read_dcb
from collectors.ethtool_ioctl import EthtoolError, EthtoolIoctl
from collectors.ethtool_text import counterset_from_pairs, read_ethtool_capture
from collectors.netlink_link import read_links, read_links_raw
from collectors.procfs_netstat import collect_netstat
from collectors.procfs_sysctl import SYSCTLS, read_sysctls
from collectors.qdisc import read_qdiscs, read_qdiscs_raw
from collectors.sample import CollectError, SourceStatus


@dataclass
class Handles:
    """Live sockets kept open across samples (the daemon, ``counters --watch``)."""

    ethtool: EthtoolIoctl | None = None
    ipr: Any = None

    def close(self) -> None:
        if self.ethtool is not None:
            self.ethtool.close()
            self.ethtool = None
        if self.ipr is not None:
            try:
                self.ipr.close()
            except Exception:  # a half-open pyroute2 socket must not stop the shutdown
                pass
            self.ipr = None


@dataclass(frozen=True)
class Roots:
    """Where every collector reads: roots are arguments, never globals (docs/conventions.md §1)."""

    sys_root: Path
    proc_root: Path
    ethtool_root: Path | None = None
    live: bool = False          # sys_root is this namespace's /sys: the netlink/ioctl readers run
    dcb: bool | None = None     # None: only for RDMA-backed netdevs
    handles: Handles = field(default_factory=Handles, compare=False)


@dataclass(frozen=True)
class Reading:
    """What one collector returns."""

    name: str
    value: Any
    statuses: tuple[SourceStatus, ...] = ()
    errors: tuple[CollectError, ...] = ()
    path: str = ""

    @property
    def status(self) -> str:
        """``error`` when anything failed, ``no_data`` when nothing was there, else ``ok``."""
        if self.errors or any(s.status == "error" for s in self.statuses):
            return "error"
        return "ok" if _has_data(self.value) else "no_data"

    def to_json(self) -> dict:
        return {"collector": self.name, "status": self.status, "path": self.path,
                "errors": len(self.errors)}


def _has_data(value: Any) -> bool:
    if isinstance(value, tuple):
        return any(_has_data(v) for v in value if v is not None and not isinstance(v, str))
    return bool(value)


def collect_rdma(roots: Roots, got: Mapping[str, Reading]) -> Reading:
    """``/sys/class/infiniband``: devices, ports, PMA and hw counters, GID tables."""
    rdma, errs, stats = sysfs_infiniband.collect_infiniband(roots.sys_root)
    return Reading("rdma", rdma, tuple(stats), tuple(errs),
                   str(roots.sys_root / "class" / "infiniband"))


def collect_netlink(roots: Roots, got: Mapping[str, Reading]) -> Reading:
    """rtnetlink links (IFLA_STATS64) and qdiscs: the raw reader, pyroute2 if that fails.
    Live host only; value ``(links, qdisc)``."""
    if not roots.live:
        return Reading("netlink_link", ({}, {}))
    links, errs = read_links_raw()
    if not errs:
        qdisc, qerrs = read_qdiscs_raw({lk.ifindex: n for n, lk in links.items()})
        status = SourceStatus("netlink_link", "error" if qerrs else "ok", "rtnetlink (raw)")
        return Reading("netlink_link", (links, qdisc), (status,), tuple(qerrs), "rtnetlink")
    h = roots.handles
    if h.ipr is None:
        from pyroute2 import IPRoute

        h.ipr = IPRoute()
    links, errs = read_links(h.ipr)
    qdisc, qerrs = read_qdiscs({lk.ifindex: n for n, lk in links.items()}, h.ipr)
    errs = [*errs, *qerrs]
    status = SourceStatus("netlink_link", "error" if errs else "ok", "rtnetlink (pyroute2)")
    return Reading("netlink_link", (links, qdisc), (status,), tuple(errs), "rtnetlink")


def collect_netdevs(roots: Roots, got: Mapping[str, Reading]) -> Reading:
    """``/sys/class/net``: attributes, and ``statistics/*`` where netlink gave no stats."""
    links, _ = got["netlink_link"].value
    sysnet, errs, stats = sysfs_net.collect_netdevs(roots.sys_root, with_stats=not links)
    return Reading("sysfs_net", sysnet, tuple(stats), tuple(errs),
                   str(roots.sys_root / "class" / "net"))


def _ethtool_text(roots: Roots, names) -> Reading:
    stats, statuses, errors = {}, [], []
    for name in names:
        cs, errs = read_ethtool_capture(roots.ethtool_root, name)
        errors += errs
        if cs is not None:
            stats[name] = cs
        status = "error" if errs else "ok" if cs is not None else "no_data"
        statuses.append(SourceStatus("ethtool_text", status,
                                     str(roots.ethtool_root / name / "statistics"),
                                     errs[0].reason if errs else ""))
    return Reading("ethtool", ("text", stats, {}), tuple(statuses), tuple(errors),
                   str(roots.ethtool_root))


def _ethtool_ioctl(roots: Roots, names) -> Reading:
    h = roots.handles
    if h.ethtool is None:
        h.ethtool = EthtoolIoctl()
    stats, rings, statuses, errors = {}, {}, [], []
    for name in sorted(names):
        where = f"SIOCETHTOOL:{name}"
        try:
            stats[name] = counterset_from_pairs(h.ethtool.statistics(name),
                                                f"{where}/ETH_SS_STATS")
            statuses.append(SourceStatus("ethtool_ioctl", "ok", where))
        except EthtoolError as exc:
            if exc.absent:
                statuses.append(SourceStatus("ethtool_ioctl", "no_data", where, "no statistics"))
            else:
                errors.append(CollectError("ethtool_ioctl", where, str(exc)))
                statuses.append(SourceStatus("ethtool_ioctl", "error", where, str(exc)))
        try:
            rings[name] = h.ethtool.rings(name)
        except EthtoolError:
            pass  # no ring parameters (virtual devices): absent
    return Reading("ethtool", ("ioctl", stats, rings), tuple(statuses), tuple(errors),
                   "SIOCETHTOOL")


def collect_ethtool(roots: Roots, got: Mapping[str, Reading]) -> Reading:
    """``ethtool -S`` / ``-g``: captured texts under ``ethtool_root``, else SIOCETHTOOL on the
    live host. Value ``(source, {if: CounterSet}, {if: RingParams})``."""
    names = got["sysfs_net"].value
    if roots.ethtool_root is not None:
        return _ethtool_text(roots, names)
    if roots.live:
        return _ethtool_ioctl(roots, names)
    return Reading("ethtool", (None, {}, {}))


def collect_ecn(roots: Roots, got: Mapping[str, Reading]) -> Reading:
    """MLNX_OFED ``/sys/class/net/<if>/ecn/<role>/enable/<prio>`` per netdev."""
    out, errors = {}, []
    for name in got["sysfs_net"].value:
        ecn, errs = sysfs_ecn.read_ecn(roots.sys_root, name)
        errors += errs
        out[name] = ecn
    return Reading("sysfs_ecn", {n: e for n, e in out.items() if e is not None}, (),
                   tuple(errors), str(roots.sys_root / "class" / "net" / "*" / "ecn"))


def collect_dcb(roots: Roots, got: Mapping[str, Reading]) -> Reading:
    """PFC per netdev from ``dcb -j pfc show`` (live host; by default RDMA-backed netdevs)."""
    if not roots.live or roots.dcb is False:
        return Reading("dcb", {})
    backed = {p.netdev for dev in got["rdma"].value.values() for p in dev.ports.values()}
    out, errors = {}, []
    for name in got["sysfs_net"].value:
        if roots.dcb or name in backed:
            out[name], errs = read_dcb(name)
            errors += errs
    return Reading("dcb", out, (), tuple(errors), "dcb -j pfc show")


def collect_netstat_groups(roots: Roots, got: Mapping[str, Reading]) -> Reading:
    """``/proc/net/snmp`` and ``/proc/net/netstat``: Tcp, Udp, Ip counter groups."""
    groups, errs, stats = collect_netstat(roots.proc_root)
    return Reading("procfs_netstat", groups, tuple(stats), tuple(errs),
                   str(roots.proc_root / "net"))


def collect_sysctls(roots: Roots, got: Mapping[str, Reading]) -> Reading:
    """The TCP/buffer sysctls under ``/proc/sys`` (procfs_sysctl.SYSCTLS)."""
    sysctls, errs = read_sysctls(roots.proc_root, SYSCTLS)
    return Reading("procfs_sysctl", sysctls, (), tuple(errs), str(roots.proc_root / "sys"))


Collect = Callable[[Roots, Mapping[str, Reading]], Reading]

# In dependency order: a collector may read what the ones before it returned.
COLLECTORS: tuple[tuple[str, Collect], ...] = (
    ("rdma", collect_rdma), ("netlink_link", collect_netlink), ("sysfs_net", collect_netdevs),
    ("ethtool", collect_ethtool), ("sysfs_ecn", collect_ecn), ("dcb", collect_dcb),
    ("procfs_netstat", collect_netstat_groups), ("procfs_sysctl", collect_sysctls),
)
EMPTY: dict[str, Any] = {"netlink_link": ({}, {}), "ethtool": (None, {}, {})}


def run_all(roots: Roots) -> dict[str, Reading]:
    """Every collector once, in order; one that raises becomes an ``error`` reading."""
    got: dict[str, Reading] = {}
    for name, fn in COLLECTORS:
        try:
            got[name] = fn(roots, got)
        except Exception as exc:  # reported per collector, never fatal (node_exporter execute)
            where = str(roots.sys_root if name not in ("procfs_netstat", "procfs_sysctl")
                        else roots.proc_root)
            reason = f"{type(exc).__name__}: {exc}"
            got[name] = Reading(name, EMPTY.get(name, {}),
                                (SourceStatus(name, "error", where, reason),),
                                (CollectError(name, where, reason),))
    return got
