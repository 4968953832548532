"""One sample of everything the collectors read: the composition of the per-source readers.

``collect(sys_root, proc_root, ethtool_root, netns)`` never raises for missing or bad data:
absent devices/files are left out, unreadable values are listed in ``errors`` (per counter) and
each source's outcome in ``sources``. The live-only sources (SIOCETHTOOL, rtnetlink links and
qdiscs, ``dcb``) run only when ``sys_root`` is the real ``/sys`` of this namespace; a fixture
tree supplies ``ethtool -S`` captures through ``ethtool_root`` (``<root>/<if>/statistics``).
With ``netns`` the whole collection runs inside that namespace via ``ip netns exec`` (which
remounts /sys for it) and the result is sent back over a pipe.
"""

from __future__ import annotations

import argparse
import os
import pickle
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from collectors.contract import Reading, Roots, run_all
from collectors.dcb import DcbConfig
from collectors.ethtool_ioctl import RingParams
from collectors.netlink_link import NetlinkLink
from collectors.sample import CollectError, CounterSet, SourceStatus, units_json
from collectors.sysfs_ecn import EcnConfig
from collectors.sysfs_infiniband import RdmaDevice, iboe_mtu_bytes
from collectors.sysfs_net import NetdevSysfs


@dataclass(frozen=True)
class Netdev(NetdevSysfs):
    """One network device: its sysfs attributes and statistics (NetdevSysfs; ``stats`` falls
    back to netlink's IFLA_STATS64 where sysfs has none), ethtool counters, rings, ECN/DCB."""

    ethtool: CounterSet | None = None
    ethtool_source: str | None = None
    rings: RingParams | None = None
    ecn: EcnConfig | None = None
    dcb: DcbConfig | None = None
    link: NetlinkLink | None = None
    rdma_ports: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {
            "ifindex": self.ifindex, "mtu": self.mtu, "operstate": self.operstate,
            "speed_mbps": self.speed_mbps, "carrier_changes": self.carrier_changes,
            "driver": self.driver, "qos_trust": self.qos_trust,
            "stats": self.stats.to_json() if self.stats else {},
            "ethtool": self.ethtool.to_json() if self.ethtool else {},
            "ethtool_source": self.ethtool_source,
            "units": {**units_json(self.stats), **units_json(self.ethtool)},
            "rings": self.rings.to_json() if self.rings else None,
            "ecn": self.ecn.to_json() if self.ecn else None,
            "dcb": self.dcb.to_json() if self.dcb else None,
            "link": self.link.to_json() if self.link else None,
            "rdma_ports": list(self.rdma_ports), "path": self.path,
        }


@dataclass(frozen=True)
class Snapshot:
    """Everything read at one instant. ``monotonic_s`` is what rates use for the interval."""

    taken_at_s: float
    monotonic_s: float
    sys_root: str
    proc_root: str
    netns: str | None
    rdma: dict[str, RdmaDevice] = field(default_factory=dict)
    netdevs: dict[str, Netdev] = field(default_factory=dict)
    tcp: CounterSet | None = None
    udp: CounterSet | None = None
    ip: CounterSet | None = None
    sysctls: dict[str, str] = field(default_factory=dict)
    qdisc: dict[str, list[dict]] = field(default_factory=dict)
    sources: tuple[SourceStatus, ...] = ()
    errors: tuple[CollectError, ...] = ()
    collect_ms: float | None = None

    def counter_sets(self) -> dict[tuple[str, ...], CounterSet]:
        """Every counter group keyed by its JSON path, e.g.
        ``("rdma", "mlx5_0", "ports", "1", "hw_counters")`` — what rates walk."""
        out: dict[tuple[str, ...], CounterSet] = {}
        for dname, dev in self.rdma.items():
            if dev.hw_counters:
                out[("rdma", dname, "hw_counters")] = dev.hw_counters
            for pnum, port in dev.ports.items():
                base = ("rdma", dname, "ports", str(pnum))
                if port.counters:
                    out[base + ("counters",)] = port.counters
                if port.hw_counters:
                    out[base + ("hw_counters",)] = port.hw_counters
                data = port.data_bytes()
                if data:
                    out[base + ("data_bytes",)] = CounterSet(
                        port.counters.path if port.counters else port.path, data,
                        units={k: "bytes" for k in data})
        for name, nd in self.netdevs.items():
            if nd.stats:
                out[("netdevs", name, "stats")] = nd.stats
            if nd.ethtool:
                out[("netdevs", name, "ethtool")] = nd.ethtool
        for key in ("tcp", "udp", "ip"):
            cs = getattr(self, key)
            if cs:
                out[(key,)] = cs
        return out

    def identity(self, key: tuple[str, ...]) -> object:
        """What must stay equal between two samples for deltas to be meaningful: a netdev's
        ifindex changes when its driver is reloaded or the device is recreated."""
        if key[0] == "netdevs" and key[1] in self.netdevs:
            return self.netdevs[key[1]].ifindex
        return None

    def to_json(self) -> dict:
        return {
            "taken_at_s": round(self.taken_at_s, 3),
            "sys_root": self.sys_root, "proc_root": self.proc_root, "netns": self.netns,
            "rdma": {n: self.rdma[n].to_json() for n in sorted(self.rdma)},
            "netdevs": {n: self.netdevs[n].to_json() for n in sorted(self.netdevs)},
            "tcp": self.tcp.to_json() if self.tcp else {},
            "udp": self.udp.to_json() if self.udp else {},
            "ip": self.ip.to_json() if self.ip else {},
            "sysctls": dict(sorted(self.sysctls.items())),
            "qdisc": {k: self.qdisc[k] for k in sorted(self.qdisc)},
            "sources": [s.to_json() for s in self.sources],
            "errors": [e.to_json() for e in self.errors],
        }


def _is_live(sys_root: Path) -> bool:
    try:
        return sys_root.resolve() == Path("/sys").resolve()
    except OSError:
        return False


class Collector:
    """Repeated sampling with the live handles (ethtool socket, rtnetlink socket) kept open,
    as the daemon and ``counters --watch`` do. Use as a context manager or call :meth:`close`.

    Each sample runs every collector of :mod:`collectors.contract` once and assembles their
    readings into a :class:`Snapshot`. On the live host (``sys_root`` is this namespace's /sys)
    netdev ``stats`` come from the rtnetlink dump (``IFLA_STATS64``, the same u64 fields sysfs
    prints; one syscall instead of ~24 file reads per device); on a fixture tree they come from
    ``statistics/*`` files.
    """

    def __init__(self, sys_root: Path = Path("/sys"), proc_root: Path = Path("/proc"),
                 ethtool_root: Path | None = None, dcb: bool | None = None) -> None:
        sys_root = Path(sys_root)
        self.roots = Roots(sys_root, Path(proc_root),
                           Path(ethtool_root) if ethtool_root is not None else None,
                           _is_live(sys_root), dcb)
        self.sys_root, self.proc_root = self.roots.sys_root, self.roots.proc_root
        self.live = self.roots.live
        self.readings: dict[str, Reading] = {}

    def __enter__(self) -> Collector:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.roots.handles.close()

    def sample(self) -> Snapshot:
        """Take one :class:`Snapshot`; ``readings`` keeps each collector's outcome."""
        t0 = time.perf_counter()
        taken_at, mono = time.time(), time.monotonic()
        got = self.readings = run_all(self.roots)
        rdma = got["rdma"].value
        links, qdisc = got["netlink_link"].value
        source, ethtool_stats, rings = got["ethtool"].value
        netdevs = _netdevs(got["sysfs_net"].value, rdma, links, source, ethtool_stats, rings,
                           got["sysfs_ecn"].value, got["dcb"].value)
        _derive_roce_mtu(rdma, netdevs)
        groups = got["procfs_netstat"].value
        return Snapshot(
            taken_at_s=taken_at, monotonic_s=mono, sys_root=str(self.sys_root),
            proc_root=str(self.proc_root), netns=None, rdma=rdma, netdevs=netdevs,
            tcp=groups.get("tcp"), udp=groups.get("udp"), ip=groups.get("ip"),
            sysctls=got["procfs_sysctl"].value, qdisc=qdisc,
            sources=tuple(s for r in got.values() for s in r.statuses),
            errors=tuple(e for r in got.values() for e in r.errors),
            collect_ms=(time.perf_counter() - t0) * 1e3)


def _netdevs(sysnet, rdma, links, source, ethtool_stats, rings, ecn, dcb) -> dict[str, Netdev]:
    """One :class:`Netdev` per sysfs netdev from the readings of every netdev collector."""
    rdma_ports: dict[str, list[str]] = {}
    for dname, dev in rdma.items():
        for pnum, port in dev.ports.items():
            if port.netdev:
                rdma_ports.setdefault(port.netdev, []).append(f"{dname}/{pnum}")
    out: dict[str, Netdev] = {}
    for name, sd in sysnet.items():
        link = links.get(name)
        out[name] = Netdev(
            **{**vars(sd), "name": name,
               "stats": sd.stats if sd.stats else (link.stats if link else None)},
            ethtool=ethtool_stats.get(name),
            ethtool_source=source if name in ethtool_stats else None,
            rings=rings.get(name), ecn=ecn.get(name), dcb=dcb.get(name), link=link,
            rdma_ports=tuple(rdma_ports.get(name, ())))
    return out


def _derive_roce_mtu(rdma, netdevs) -> None:
    """RoCE active MTU as the kernel derives it from the netdev MTU (``iboe_get_mtu``)."""
    for dev in rdma.values():
        for pnum, port in list(dev.ports.items()):
            if port.active_mtu_bytes is None and port.is_roce and port.netdev in netdevs:
                mtu = iboe_mtu_bytes(netdevs[port.netdev].mtu)
                if mtu is not None:
                    dev.ports[pnum] = replace(
                        port, active_mtu_bytes=mtu,
                        active_mtu_source=f"iboe_get_mtu({port.netdev} mtu)")


def collect(sys_root: Path = Path("/sys"), proc_root: Path = Path("/proc"),
            ethtool_root: Path | None = None, netns: str | None = None,
            dcb: bool | None = None) -> Snapshot:
    """Collect one :class:`Snapshot`. ``dcb``: None = only for RDMA-backed netdevs, True = all
    devices, False = never. With ``netns`` (a name under /run/netns) the collection runs in
    that namespace; failing to enter it raises :class:`~wanprobe.errors.WanprobeError`."""
    sys_root, proc_root = Path(sys_root), Path(proc_root)
    ethtool_root = Path(ethtool_root) if ethtool_root is not None else None
    if netns is None:
        with Collector(sys_root, proc_root, ethtool_root, dcb) as c:
            return c.sample()
    return _collect_in_netns(netns, sys_root, proc_root, ethtool_root, dcb)


def _collect_in_netns(netns, sys_root, proc_root, ethtool_root, dcb) -> Snapshot:
    from wanprobe.errors import PermissionRequired, WanprobeError

    argv = ["ip", "netns", "exec", netns, sys.executable, "-m", "collectors.snapshot",
            "--pickle", "--sys-root", str(sys_root), "--proc-root", str(proc_root)]
    if ethtool_root is not None:
        argv += ["--ethtool-root", str(ethtool_root)]
    if dcb is not None:
        argv += ["--dcb" if dcb else "--no-dcb"]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parent.parent),
                                         env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    try:
        r = subprocess.run(argv, capture_output=True, timeout=30, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise WanprobeError(f"cannot collect in namespace {netns!r}: {exc}") from None
    if r.returncode != 0:
        msg = (r.stderr.decode(errors="replace").strip().splitlines() or ["failed"])[-1]
        cls = PermissionRequired if "ermission" in msg else WanprobeError
        raise cls(f"cannot collect in namespace {netns!r}: {msg}")
    snap = pickle.loads(r.stdout)
    return replace(snap, netns=netns)


def main(argv: list[str] | None = None) -> int:
    """Child entry point for :func:`collect` with ``netns``: writes the pickled Snapshot."""
    p = argparse.ArgumentParser(prog="collectors.snapshot")
    p.add_argument("--pickle", action="store_true")
    p.add_argument("--sys-root", default="/sys")
    p.add_argument("--proc-root", default="/proc")
    p.add_argument("--ethtool-root")
    p.add_argument("--dcb", dest="dcb", action="store_true", default=None)
    p.add_argument("--no-dcb", dest="dcb", action="store_false")
    a = p.parse_args(argv)
    snap = collect(Path(a.sys_root), Path(a.proc_root),
                   Path(a.ethtool_root) if a.ethtool_root else None, None, a.dcb)
    if a.pickle:
        sys.stdout.buffer.write(pickle.dumps(snap))
    else:
        import json

        print(json.dumps(snap.to_json(), indent=2))
    return 0


if __name__ == "__main__":
    # Run the imported module's main so pickled classes are ``collectors.snapshot.*``,
    # not ``__main__.*`` (which the parent could not unpickle).
    from collectors.snapshot import main as _main

    sys.exit(_main())
