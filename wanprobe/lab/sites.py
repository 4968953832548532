"""A multi-site lab: 2-4 sites, each a router with 1-8 hosts, every pair of sites one delay line.

Namespaces: a router ``wp-NAME-SITE`` per site, a host ``wp-NAME-SITEj`` (j = 1, 2, ...) per host.
A host's ``lan0`` is a veth whose peer ``hj`` is on the router's bridge ``br0`` (site i's LAN
198.18.(40+i).0/24, router .254; no impairment: one site's hosts talk at LAN speed). Each pair
of sites a, b (a first in site order) is one delay-line forwarder (forwarder.py, the pair's
LinkSettings, its a→b direction a → b) between TUN ``a-b`` in the two routers (198.19.(4i+k).1
and .2 for sites i < k), with tbf on each TUN's egress for the rate (shaping.py, as lab.py).
Routers send another site's LAN over that pair's TUN, so a site's hosts SHARE its WAN link to
another site: two flows from A to B each get about half. Routers forward (multipath's
ROUTER_SYSCTLS); hosts keep the congestion control a new namespace inherits unless it is not in
the global tcp_allowed_congestion_control (a non-init namespace may only default to an allowed
one: tcp_set_default_congestion_control, net/ipv4/tcp_cong.c), then an allowed one is set. Each
delay line's own overhead is calibrated away (router to router) as lab.py does. Nothing is
configured in the root namespace. Profiles: :func:`sites_profile`; TOML: :func:`load_topology`.
"""

from __future__ import annotations

import re
import subprocess
import time
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from wanprobe.errors import ConfigError, LabError, UsageError, shown
from wanprobe.lab import calibrate, netns, registry, shaping
from wanprobe.lab import lab as lablib  # the two-namespace lab's plumbing
from wanprobe.lab.multipath import ROUTER_SYSCTLS
from wanprobe.lab.profiles import PROFILES, Profile
from wanprobe.lab.settings import LinkSettings
from wanprobe.units import parse_rate_bps, parse_ratio

KIND = "sites"
MIN_SITES, MAX_SITES = 2, 4
MAX_HOSTS = 8
DEFAULT_HOSTS = 2
# 1-6 of a-z 0-9, a letter first and last: "SITE-SITE" (a TUN) stays within IFNAMSIZ, and a
# host "SITEj" can never be another site's router (site "a1" would be host 1 of site "a")
_SITE_RE = re.compile(r"[a-z](?:[a-z0-9]{0,4}[a-z])?")
LAN_IF, BRIDGE = "lan0", "br0"
CC_FILE = Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control")  # global, read only

# Tokyo <-> US West coast: ~95-110 ms RTT. Consulted for the range, as profiles.py's sources:
# WonderNetwork's Tokyo <-> San Francisco / Los Angeles medians (https://wondernetwork.com/pings),
# Azure's Japan East <-> West US round trip (https://learn.microsoft.com/azure/networking/
# azure-network-latency), and a traceroute from AboveNet Tokyo (nrt3) reaching San Jose (sjc2) in
# ~100 ms (skymerica.com blog, 2005-08-03). Shorter than Taipei <-> US West (130 ms): the
# transpacific cables (FASTER, JUPITER, Unity) land in Japan and Taiwan reaches them via Japan.
TOKYO_USWEST = Profile("tokyo-uswest", 100.0, 1.0, 0.001, 100e6,
                       "Tokyo <-> US West coast over transpacific cables (~95-110 ms RTT)")
SITES_PROFILES: dict[str, tuple[tuple[str, ...], dict[tuple[str, str], Profile]]] = {
    "tpe-tyo": (("tpe", "tyo"), {("tpe", "tyo"): PROFILES["taipei-tokyo"]}),
    "tpe-tyo-usw": (("tpe", "tyo", "usw"), {("tpe", "tyo"): PROFILES["taipei-tokyo"],
                                            ("tpe", "usw"): PROFILES["taipei-uswest"],
                                            ("tyo", "usw"): TOKYO_USWEST}),
}


@dataclass(frozen=True)
class SiteSpec:
    """A site: its short name and how many hosts it has (1-8)."""

    name: str
    hosts: int = DEFAULT_HOSTS

    def validated(self) -> SiteSpec:
        if not isinstance(self.name, str) or not _SITE_RE.fullmatch(self.name):
            raise UsageError(f"bad site name {shown(self.name)}: use 1-6 of a-z 0-9, "
                             "starting and ending with a letter")
        if isinstance(self.hosts, bool) or not isinstance(self.hosts, int) \
                or not 1 <= self.hosts <= MAX_HOSTS:
            raise UsageError(f"site {self.name}: hosts must be 1-{MAX_HOSTS}, "
                             f"got {shown(self.hosts)}")
        return self


@dataclass(frozen=True)
class SiteHost(netns.RunsInside):
    """One host of a site: name (``tpe1``), site, namespace and LAN address; ``.argv``,
    ``.run`` and ``.popen`` run inside its namespace."""

    name: str
    site: str
    ns: str
    addr: str

    @property
    def netns_name(self) -> str:
        return self.ns


# -- the address plan (all inside 198.18.0.0/15, RFC 2544's benchmarking block) --------------
def lan_prefix(i: int) -> str:
    return f"198.18.{40 + i}.0/24"


def host_addr(i: int, j: int) -> str:
    return f"198.18.{40 + i}.{j}"


def router_addr(i: int) -> str:
    return f"198.18.{40 + i}.254"


def pair_addrs(i: int, k: int) -> tuple[str, str]:
    """(site i side, site k side) of the point-to-point link of sites i < k."""
    return f"198.19.{4 * i + k}.1", f"198.19.{4 * i + k}.2"


def flipped(s: LinkSettings) -> LinkSettings:
    """The same link seen from its other end (a→b and b→a swapped)."""
    return replace(s, loss_ab=s.loss_ba, loss_ba=s.loss_ab, delay_ab_ms=s.delay_ba_ms,
                   delay_ba_ms=s.delay_ab_ms, queue_ab_ms=s.queue_ba_ms, queue_ba_ms=s.queue_ab_ms)


def sites_profile(name: str, hosts: int = DEFAULT_HOSTS
                  ) -> tuple[list[SiteSpec], dict[tuple[str, str], LinkSettings]]:
    """The sites and links of profile ``name`` (``tpe-tyo``, ``tpe-tyo-usw``), ``hosts`` each."""
    if name not in SITES_PROFILES:
        raise UsageError(f"unknown sites profile {name!r} (known: {', '.join(SITES_PROFILES)})")
    names, links = SITES_PROFILES[name]
    return ([SiteSpec(s, hosts).validated() for s in names],
            {pair: LinkSettings(rtt_ms=p.rtt_ms, jitter_ms=p.jitter_ms, loss_ab=p.loss,
                                loss_ba=p.loss, rate_bps=p.rate_bps).validated()
             for pair, p in links.items()})


class SitesLab:
    """Sites of hosts behind routers, every site pair one delay line; see the module docstring."""

    def __init__(self, name: str, sites: Sequence[SiteSpec],
                 links: Mapping[tuple[str, str], LinkSettings], persistent: bool = False, *,
                 calibrate: bool = True) -> None:
        self.name = lablib.validate_name(name)
        if not MIN_SITES <= len(sites) <= MAX_SITES:
            raise UsageError(f"a sites lab has {MIN_SITES}-{MAX_SITES} sites, got {len(sites)}")
        self.sites = [s.validated() for s in sites]
        self.index = {s.name: i for i, s in enumerate(self.sites)}
        if len(self.index) != len(self.sites):
            raise UsageError(f"site names repeat: {', '.join(s.name for s in self.sites)}")
        self.links = self._oriented(links)
        self.persistent = persistent
        self.calibrate = calibrate
        self.routers = {s.name: f"{lablib.NS_PREFIX}{name}-{s.name}" for s in self.sites}
        self.hosts = [SiteHost(f"{s.name}{j}", s.name, f"{self.routers[s.name]}{j}", host_addr(i, j))
                      for i, s in enumerate(self.sites) for j in range(1, s.hosts + 1)]
        self.offsets_ns: dict[str, int] = {}
        self._procs: list[subprocess.Popen] = []

    def _oriented(self, links: Mapping[tuple[str, str], LinkSettings]
                  ) -> dict[tuple[str, str], LinkSettings]:
        """Links keyed (first, second) in site order, each pair exactly once."""
        out: dict[tuple[str, str], LinkSettings] = {}
        for (a, b), s in links.items():
            for site in (a, b):
                if site not in self.index:
                    raise UsageError(f"link {a}-{b}: unknown site {shown(site)} "
                                     f"(sites: {', '.join(self.index)})")
            if a == b:
                raise UsageError(f"link {a}-{b}: a link joins two different sites")
            key, s = ((a, b), s) if self.index[a] < self.index[b] else ((b, a), flipped(s))
            if key in out:
                raise UsageError(f"two links between {key[0]} and {key[1]}")
            out[key] = s.validated()
        for pair in self.pairs():
            if pair not in out:
                raise UsageError(f"no link between {pair[0]} and {pair[1]}: every pair of "
                                 "sites needs one")
        return out

    @classmethod
    def attach(cls, name: str) -> SitesLab:
        """A handle on sites lab ``name`` that is up (e.g. from ``wanprobe lab sites``)."""
        state = registry.read(lablib.validate_name(name))
        if not state or state.get("kind") != KIND:
            raise LabError(f"no sites lab {name!r} is up; start one with "
                           f"`wanprobe lab sites {name}`")
        try:
            sites = [SiteSpec(s["name"], s["hosts"]) for s in state["sites"]]
            links = {tuple(x["between"]): LinkSettings.from_json(x["settings"])
                     for x in state["links"]}
        except (KeyError, TypeError, ValueError) as exc:
            raise LabError(f"lab {name!r}: its registry entry is damaged ({exc!r})") from None
        lab = cls(name, sites, links, persistent=state.get("persistent", True))
        lab.offsets_ns = dict(state.get("calibration_offset_ns", {}))
        return lab

    # -- naming --------------------------------------------------------------------------------
    def pairs(self) -> list[tuple[str, str]]:
        """Every unordered pair of sites, (first, second) in site order."""
        names = [s.name for s in self.sites]
        return [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]

    def forwarder_name(self, a: str, b: str) -> str:
        return f"{self.name}-{a}-{b}"

    @staticmethod
    def tun_name(a: str, b: str) -> str:
        return f"{a}-{b}"

    def namespaces(self) -> list[str]:
        return [*self.routers.values(), *(h.ns for h in self.hosts)]

    def interfaces(self) -> dict[str, list[str]]:
        """Namespace -> the interfaces the lab makes there (each name ≤ 15 characters)."""
        out = {ns: [BRIDGE] for ns in self.routers.values()}
        for h in self.hosts:
            out[h.ns] = [LAN_IF]
            out[self.routers[h.site]].append(f"h{h.name[len(h.site):]}")
        for a, b in self.pairs():
            for site in (a, b):
                out[self.routers[site]].append(self.tun_name(a, b))
        return out

    def host(self, name: str) -> SiteHost:
        for h in self.hosts:
            if h.name == name:
                return h
        raise UsageError(f"no host {name!r} in lab {self.name} "
                         f"(hosts: {', '.join(h.name for h in self.hosts)})")

    def _key(self, a: str, b: str) -> tuple[tuple[str, str], bool]:
        """The pair's key and whether (a, b) is its reverse."""
        if (a, b) in self.links:
            return (a, b), False
        if (b, a) in self.links:
            return (b, a), True
        raise UsageError(f"no link between {a!r} and {b!r} (sites: {', '.join(self.index)})")

    def link(self, a: str, b: str) -> LinkSettings:
        """The settings of the link between sites ``a`` and ``b``, its a→b direction a → b."""
        key, reverse = self._key(a, b)
        return flipped(self.links[key]) if reverse else self.links[key]

    def stats(self, a: str, b: str) -> dict:
        """Forwarder counters of the link between ``a`` and ``b`` (``ab`` = a → b)."""
        key, reverse = self._key(a, b)
        out = lablib.control(self.forwarder_name(*key), {"op": "stats"})["stats"]
        if reverse and "ab" in out and "ba" in out:
            out = {**out, "ab": out["ba"], "ba": out["ab"]}
        return out

    # -- lifecycle -----------------------------------------------------------------------------
    def __enter__(self) -> SitesLab:
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    def up(self) -> SitesLab:
        """Namespaces, LANs, delay lines, addresses and routes; all or nothing."""
        lablib.require_root()
        if any(lablib.forwarder_pids(self.forwarder_name(*p)) for p in self.pairs()):
            raise LabError(f"lab {self.name!r} is already up; run `wanprobe lab down {self.name}`")
        if (registry.read(self.name) or {"kind": KIND}).get("kind") != KIND:
            raise LabError(f"lab {self.name!r} exists as another kind of lab; run "
                           f"`wanprobe lab down {self.name}` first")
        self.down()  # stale leftovers of a crashed run
        with lablib.down_on_error(self.down):
            for ns in self.namespaces():
                netns.create(ns)
            for i, site in enumerate(self.sites):
                netns.sysctl(self.routers[site.name], ROUTER_SYSCTLS)
                self._lan(i)
            self._host_congestion_control()
            for a, b in self.pairs():
                self._wan(a, b)
            if self.calibrate:
                for a, b in self.pairs():
                    self._calibrate(a, b)
            registry.write(self.name, self.state())
        return self

    def down(self) -> None:
        """Stop the delay lines, delete the namespaces and the registry entries. Idempotent."""
        names = [self.forwarder_name(*p) for p in self.pairs()]
        procs, self._procs = self._procs, []
        lablib.tear_down(names, procs, self.namespaces(), [*names, self.name])

    def state(self) -> dict:
        return {"name": self.name, "kind": KIND, "persistent": self.persistent,
                "sites": [asdict(s) for s in self.sites], "routers": self.routers,
                "hosts": [asdict(h) for h in self.hosts],
                "links": [{"between": list(p), "settings": s.to_json(),
                           "forwarder": self.forwarder_name(*p)} for p, s in self.links.items()],
                "calibration_offset_ns": self.offsets_ns, "updated_unix": time.time()}

    # -- internals -----------------------------------------------------------------------------
    def _lan(self, i: int) -> None:
        site = self.sites[i]
        router = self.routers[site.name]
        netns.batch(router, [f"link add {BRIDGE} type bridge", f"addr add {router_addr(i)}/24 "
                             f"dev {BRIDGE}", f"link set {BRIDGE} up"])
        for j in range(1, site.hosts + 1):
            h = self.host(f"{site.name}{j}")
            netns.batch(h.ns, [f"link add {LAN_IF} type veth peer name h{j} netns {router}",
                               f"addr add {h.addr}/24 dev {LAN_IF}", f"link set {LAN_IF} up",
                               f"route add default via {router_addr(i)} dev {LAN_IF}"])
            netns.batch(router, [f"link set h{j} master {BRIDGE}", f"link set h{j} up"])

    def _wan(self, a: str, b: str) -> None:
        s, dev = self.links[(a, b)], self.tun_name(a, b)
        i, k = self.index[a], self.index[b]
        self._procs.append(lablib.start_forwarder(self.forwarder_name(a, b), self.routers[a],
                                                  self.routers[b], dev, s,
                                                  persistent=self.persistent))
        for me, peer, mine, theirs in ((i, k, *pair_addrs(i, k)), (k, i, *pair_addrs(i, k)[::-1])):
            ns = self.routers[self.sites[me].name]
            netns.batch(ns, [f"addr add {mine} peer {theirs}/32 dev {dev}",
                             f"link set {dev} mtu {s.mtu} txqueuelen 1000 up",
                             f"route replace {lan_prefix(peer)} via {theirs} dev {dev}"])
            netns.tc_batch(ns, shaping.tbf_commands(dev, s.rate_bps, s.rtt_ms))

    def _calibrate(self, a: str, b: str) -> None:
        """Measure this delay line's own RTT overhead and subtract it (calibrate.py, lab.py)."""
        s, name = self.links[(a, b)], self.forwarder_name(a, b)
        if s.rtt_ms <= 0 or (s.rate_bps is not None and s.rate_bps < 1e6):
            return
        clean = replace(s, loss_ab=0.0, loss_ba=0.0, reorder=0.0, jitter_ms=0.0)
        if clean != s:
            lablib.control(name, {"op": "update", "settings": clean.to_json()})
        try:
            peer = pair_addrs(self.index[a], self.index[b])[1]
            rtts = calibrate.measure_rtts_ns(self.routers[a], peer, timeout_s=s.rtt_ms / 1e3
                                             + 4 * s.jitter_ms / 1e3 + 0.3)
        finally:
            if clean != s:
                lablib.control(name, {"op": "update", "settings": s.to_json()})
        if len(rtts) >= 8:
            offset = calibrate.offset_ns(rtts, s.rtt_ms)
            lablib.control(name, {"op": "offset", "offset_ns": offset})
            self.offsets_ns[f"{a}-{b}"] = offset

    def _host_congestion_control(self) -> None:
        """New namespaces all start with the same default; keep it if it is allowed."""
        r = subprocess.run(self.hosts[0].argv(["sysctl", "-n", "net.ipv4.tcp_congestion_control"]),
                           capture_output=True, text=True)
        try:
            allowed = CC_FILE.read_text().split()
        except OSError:
            return
        if r.returncode != 0 or not allowed or r.stdout.strip() in allowed:
            return
        cc = next((c for c in ("cubic", "bbr") if c in allowed), allowed[0])
        for h in self.hosts:
            netns.sysctl(h.ns, [f"net.ipv4.tcp_congestion_control={cc}"])


def lab_status(state: dict) -> str:
    """``up`` when every delay line of a registered sites lab runs, else ``stale``."""
    names = [x.get("forwarder", "") for x in state.get("links", []) if isinstance(x, dict)]
    return "up" if names and all(lablib.forwarder_pids(n) for n in names) else "stale"




# -- topology files ----------------------------------------------------------------------------
LINK_KEYS = ("between", "profile", "rtt_ms", "jitter_ms", "loss", "loss_ab", "loss_ba", "rate")


def load_topology(path: str | Path) -> tuple[list[SiteSpec], dict[tuple[str, str], LinkSettings]]:
    """Sites and links from a TOML topology file (see ``wanprobe lab sites --help``); every
    problem is one UsageError line naming the file and the key."""
    from wanprobe.userfiles import read_text

    try:
        text = read_text(path, "topology file", 2**20)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    try:
        data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError, ValueError) as exc:
        raise UsageError(f"topology file {path}: not valid TOML: {exc}") from None
    return parse_topology(data, source=f"topology file {path}")


def parse_topology(data: object, source: str = "topology"
                   ) -> tuple[list[SiteSpec], dict[tuple[str, str], LinkSettings]]:
    """``{"sites": {NAME: {"hosts": N}}, "links": [{"between": [A, B], ...}]}`` checked; the
    links come back keyed (first, second) in site order, as SitesLab.links."""
    try:
        if not isinstance(data, dict):
            raise UsageError("must be a table of sites and links")
        for key in data:
            if key not in ("sites", "links"):
                raise UsageError(f"{key}: unknown key (known: sites, links)")
        sites = _topology_sites(data.get("sites"))
        raw = data.get("links")
        if not isinstance(raw, list) or not raw:
            raise UsageError("links: give one [[links]] table per pair of sites")
        links: dict[tuple[str, str], LinkSettings] = {}
        for i, entry in enumerate(raw):
            pair, settings = _topology_link(entry, f"links[{i}]")
            if pair in links or pair[::-1] in links:
                raise UsageError(f"links[{i}]: a second link between {pair[0]} and {pair[1]}")
            links[pair] = settings
        checked = SitesLab("check", sites, links)  # the lab's checks: every pair linked, ...
    except UsageError as exc:
        raise UsageError(f"{source}: {exc}") from None
    return checked.sites, checked.links


def _topology_sites(raw: object) -> list[SiteSpec]:
    if not isinstance(raw, dict) or not raw:
        raise UsageError("sites: give a [sites.NAME] table per site (hosts = N)")
    out = []
    for name, body in raw.items():
        if not isinstance(body, dict):
            raise UsageError(f"sites.{name}: must be a table (hosts = N)")
        for key in body:
            if key != "hosts":
                raise UsageError(f"sites.{name}.{key}: unknown key (known: hosts)")
        out.append(SiteSpec(name, body.get("hosts", DEFAULT_HOSTS)).validated())
    return out


def _number(entry: dict, key: str) -> float | None:
    value = entry.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise UsageError(f"{key}: must be a number, got {shown(value)}")
    return value


def _ratio(entry: dict, key: str) -> float | None:
    value = entry.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise UsageError(f"{key}: must be a ratio such as 0.001 or \"0.1%\", got {shown(value)}")
    try:
        return parse_ratio(str(value))
    except UsageError as exc:
        raise UsageError(f"{key}: {exc}") from None


def _topology_link(entry: object, where: str) -> tuple[tuple[str, str], LinkSettings]:
    try:
        if not isinstance(entry, dict):
            raise UsageError("must be a table (between = [A, B], rtt_ms = ...)")
        for key in entry:
            if key not in LINK_KEYS:
                raise UsageError(f"{key}: unknown key (known: {', '.join(LINK_KEYS)})")
        between = entry.get("between")
        if not (isinstance(between, list) and len(between) == 2
                and all(isinstance(s, str) for s in between)):
            raise UsageError(f"between: must name two sites, e.g. [\"tpe\", \"tyo\"], "
                             f"got {shown(between)}")
        profile, rate = entry.get("profile"), entry.get("rate")
        if profile is not None and not isinstance(profile, str):
            raise UsageError(f"profile: must be a profile name, got {shown(profile)}")
        if profile is None and entry.get("rtt_ms") is None:
            raise UsageError("rtt_ms: is required (or a profile)")
        if rate is not None and not isinstance(rate, str):
            raise UsageError(f"rate: must be a rate with its unit such as \"200Mbit\", "
                             f"got {shown(rate)}")
        given = {k: v for k, v in (("rtt_ms", _number(entry, "rtt_ms")),
                                   ("jitter_ms", _number(entry, "jitter_ms")),
                                   ("loss", _ratio(entry, "loss")),
                                   ("rate_bps", None if rate is None else parse_rate_bps(rate)))
                 if v is not None}
        settings = lablib.resolve_settings(profile, loss_ab=_ratio(entry, "loss_ab"),
                                    loss_ba=_ratio(entry, "loss_ba"), **given)
    except UsageError as exc:
        raise UsageError(f"{where}: {exc}") from None
    return (between[0], between[1]), settings
