"""A multi-path lab: client ``a`` → router ``r1`` ⇉ K delay lines ⇉ router ``r2`` → reflector ``b``.

Namespaces wp-NAME-a, -r1, -r2, -b. ``a``–``r1`` and ``r2``–``b`` are veth pairs (no impairment);
each path i is its own delay-line forwarder between TUN ``p<i>`` in r1 and in r2 (forwarder.py,
with its own LinkSettings: delay, loss, queue). Both routers forward over a Linux multipath
route (``ip route add X nexthop via A nexthop via B``) whose nexthops are the paths in ``ecmp``,
with ``net.ipv4.fib_multipath_hash_policy=1`` (L4 hash: addresses, protocol and ports, so a
flow keeps its path while its ports stay the same; Documentation/networking/ip-sysctl.rst) set
inside each router namespace. ``icmp_errors_use_inbound_ifaddr=1`` makes a router answer a
TTL-expired probe from the address of the path it arrived on, so a traceroute names the path.

``reroute(via)`` replaces both routers' routes by one over the paths ``via`` (a cable cut,
rehearsed: traffic moves to the long path live). Nothing is configured in the root namespace.
"""

from __future__ import annotations

import ipaddress
import subprocess
import time
from collections.abc import Sequence

from wanprobe.errors import LabError, UsageError
from wanprobe.lab import netns, registry
from wanprobe.lab.lab import (
    NS_PREFIX,
    control,
    down_on_error,
    forwarder_pids,
    require_root,
    start_forwarder,
    tear_down,
    validate_name,
)
from wanprobe.lab.netns import Endpoint
from wanprobe.lab.settings import LinkSettings

ADDR_A = "198.18.1.1"
ADDR_R1 = "198.18.1.2"
ADDR_B = "198.18.2.1"
ADDR_R2 = "198.18.2.2"
NET_A = "198.18.1.0/24"
NET_B = "198.18.2.0/24"
MAX_PATHS = 8
ROUTER_SYSCTLS = ("net.ipv4.ip_forward=1", "net.ipv4.fib_multipath_hash_policy=1",
                  "net.ipv4.icmp_errors_use_inbound_ifaddr=1", "net.ipv4.conf.all.rp_filter=0",
                  "net.ipv4.conf.default.rp_filter=0", "net.ipv6.conf.all.disable_ipv6=1")


def path_addrs(i: int) -> tuple[str, str]:
    """(r1 side, r2 side) addresses of path ``i``'s point-to-point link."""
    return f"198.18.{10 + i}.1", f"198.18.{10 + i}.2"


def route_command(prefix: str, gateways: Sequence[tuple[str, str]]) -> str:
    """``ip route replace`` line for ``prefix`` over (gateway, device) pairs; one pair is a plain
    route, more are an ECMP multipath route."""
    if len(gateways) == 1:
        gw, dev = gateways[0]
        return f"route replace {prefix} via {gw} dev {dev}"
    hops = " ".join(f"nexthop via {gw} dev {dev} weight 1" for gw, dev in gateways)
    return f"route replace {prefix} {hops}"


class MultipathLab:
    """K emulated paths between two routers; see the module docstring."""

    def __init__(self, name: str, paths: Sequence[LinkSettings], *, ecmp: Sequence[int] | None = None,
                 persistent: bool = False) -> None:
        self.name = validate_name(name)
        if not 1 <= len(paths) <= MAX_PATHS:
            raise UsageError(f"a multipath lab has 1-{MAX_PATHS} paths, got {len(paths)}")
        self.paths = [p.validated() for p in paths]
        self.ecmp = self._check_via(range(len(paths)) if ecmp is None else ecmp)
        self.persistent = persistent
        p = NS_PREFIX + name
        self.ns = {k: f"{p}-{k}" for k in ("a", "r1", "r2", "b")}
        self.a = Endpoint(self.ns["a"], "wan0", ADDR_A, ADDR_B)
        self.b = Endpoint(self.ns["b"], "wan0", ADDR_B, ADDR_A)
        self._procs: list[subprocess.Popen] = []

    @classmethod
    def attach(cls, name: str) -> MultipathLab:
        """A handle on multipath lab ``name`` that is up (e.g. from ``wanprobe lab multipath``)."""
        state = registry.read(validate_name(name))
        if not state or state.get("kind") != "multipath":
            raise LabError(f"no multipath lab {name!r} is up; start one with "
                           f"`wanprobe lab multipath {name}`")
        lab = cls(name, [LinkSettings.from_json(p) for p in state["paths"]],
                  ecmp=state["active"], persistent=state.get("persistent", True))
        return lab

    def forwarder_name(self, i: int) -> str:
        return f"{self.name}-p{i}"

    def _check_via(self, via: Sequence[int]) -> list[int]:
        out = sorted({int(i) for i in via})
        if not out or any(not 0 <= i < len(self.paths) for i in out):
            raise UsageError(f"paths must be among 0-{len(self.paths) - 1}, got {list(via)}")
        return out

    # -- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> MultipathLab:
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    def up(self) -> MultipathLab:
        """Create namespaces, veths, forwarders, addresses and routes; all or nothing."""
        require_root()
        if any(forwarder_pids(self.forwarder_name(i)) for i in range(len(self.paths))):
            raise LabError(f"lab {self.name!r} is already up; run `wanprobe lab down {self.name}`")
        self.down()  # stale leftovers of a crashed run
        with down_on_error(self.down):
            for ns in self.ns.values():
                netns.create(ns)
            for ns in (self.ns["r1"], self.ns["r2"]):
                netns.sysctl(ns, ROUTER_SYSCTLS)
            self._veths()
            for i, s in enumerate(self.paths):
                self._procs.append(start_forwarder(
                    self.forwarder_name(i), self.ns["r1"], self.ns["r2"], f"p{i}", s,
                    persistent=self.persistent))
            self._links()
            self.reroute(self.ecmp)
        return self

    def down(self) -> None:
        """Stop the forwarders, delete the namespaces and the registry entry. Idempotent."""
        names = [self.forwarder_name(i) for i in range(MAX_PATHS)]
        procs, self._procs = self._procs, []
        tear_down(names, procs, self.ns.values(), [*names, self.name])

    # -- live changes ----------------------------------------------------------------------
    def reroute(self, via: Sequence[int]) -> list[int]:
        """Carry all traffic (both directions) over the paths ``via`` from now on."""
        via = self._check_via(via)
        fwd = [(path_addrs(i)[1], f"p{i}") for i in via]
        rev = [(path_addrs(i)[0], f"p{i}") for i in via]
        netns.batch(self.ns["r1"], [route_command(NET_B, fwd)])
        netns.batch(self.ns["r2"], [route_command(NET_A, rev)])
        self.ecmp = via
        registry.write(self.name, self.state())
        return via

    def update_path(self, i: int, **changes) -> LinkSettings:
        """Change path ``i``'s impairments live (LinkSettings fields; ``loss`` = both ways)."""
        self._check_via([i])
        fixed = {"mtu", "rate_bps"} & set(changes)
        if fixed:
            raise UsageError(f"cannot change path setting(s): {', '.join(sorted(fixed))}")
        new = self.paths[i].changed(**changes)
        control(self.forwarder_name(i), {"op": "update", "settings": new.to_json()})
        self.paths[i] = new
        registry.write(self.name, self.state())
        return new

    def pin(self, addr: str, path: int) -> Endpoint:
        """A second address of ``b`` whose traffic takes path ``path`` both ways, whatever the
        ECMP route: one lab then holds several peers behind paths of different health (a
        daemon's peers at 0, 0.5 and 3 % loss, issue 36). ``addr`` is added to b's ``wan0``
        (inside 198.18.2.0/24), r1 routes it over the path, and r2 sends what comes from it back
        over the same path (a source rule, table 100 + path). Returns the peer's endpoint."""
        self._check_via([path])
        if ipaddress.ip_address(addr) not in ipaddress.ip_network(NET_B) or addr in (ADDR_B, ADDR_R2):
            raise UsageError(f"a pinned address is a free one in {NET_B}, got {addr}")
        left, right = path_addrs(path)
        netns.batch(self.ns["b"], [f"addr add {addr}/24 dev wan0"])
        netns.batch(self.ns["r1"], [f"route replace {addr}/32 via {right} dev p{path}"])
        netns.batch(self.ns["r2"], [f"route replace {NET_A} via {left} dev p{path} table {100 + path}",
                                    f"rule add from {addr} table {100 + path}"])
        return Endpoint(self.ns["b"], "wan0", addr, ADDR_A)

    def stats(self, i: int) -> dict:
        """Forwarder counters of path ``i`` (ab = r1→r2, the forward direction)."""
        return control(self.forwarder_name(i), {"op": "stats"})["stats"]

    def state(self) -> dict:
        return {"name": self.name, "kind": "multipath", "namespaces": self.ns,
                "addr_a": ADDR_A, "addr_b": ADDR_B, "paths": [p.to_json() for p in self.paths],
                "active": self.ecmp, "persistent": self.persistent, "updated_unix": time.time()}

    # -- internals -------------------------------------------------------------------------
    def _veths(self) -> None:
        ns = self.ns
        for end, router, addr, raddr in (("a", "r1", ADDR_A, ADDR_R1),
                                         ("b", "r2", ADDR_B, ADDR_R2)):
            netns.batch(ns[end], [f"link add wan0 type veth peer name lan0 netns {ns[router]}",
                                  f"addr add {addr}/24 dev wan0", "link set wan0 up",
                                  f"route add default via {raddr} dev wan0"])
            netns.batch(ns[router], [f"addr add {raddr}/24 dev lan0", "link set lan0 up"])

    def _links(self) -> None:
        for i in range(len(self.paths)):
            left, right = path_addrs(i)
            for ns, mine, peer in ((self.ns["r1"], left, right), (self.ns["r2"], right, left)):
                netns.batch(ns, [f"addr add {mine} peer {peer}/32 dev p{i}",
                                 f"link set p{i} mtu 1500 txqueuelen 1000 up"])



