"""One mesh file for a whole fleet; each daemon finds itself in it and picks its peers.

Pingmesh (Guo et al., SIGCOMM 2015, §3.2) builds complete graphs inside a group and probes
between groups through a few selected hosts; here a group is a site. Each host probes every other
host of its site and ``representatives`` hosts of every other site. The representatives a host
picks are rotated by a stable hash of its own name, so the probing load of a remote site spreads
over its hosts instead of landing on the first ones. Adding a host is one line::

    representatives = 2
    [sites.taipei]
    hosts = [
      { name = "tpe-gpu-01", address = "10.1.0.11" },
      { name = "tpe-gpu-02", address = "10.1.0.12" },
    ]

Hosts may also be listed flat, each naming a site declared under ``[sites]``
(``hosts = [{ name = "tpe-gpu-03", address = "10.1.0.13", site = "taipei" }]``). A host has one
name, one site and one address; ``metrics_port`` (top level, per site or per host; default 9862)
is where Prometheus scrapes it (``wanprobe fleet targets``).

JSON with the same shape (``{"representatives": 2, "sites": {"taipei": {"hosts": [...]}}}``)
is accepted too.
"""

from __future__ import annotations

import ipaddress
import tomllib
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wanprobe.errors import ConfigError, ConfigInvalid
from wanprobe.mesh.peer import METHODS, Peer
from wanprobe.userfiles import read_json, read_text

DEFAULT_METRICS_PORT = 9862


@dataclass(frozen=True)
class MeshHost:
    name: str
    address: str
    site: str
    metrics_port: int = DEFAULT_METRICS_PORT  # where Prometheus scrapes it (fleet targets)


@dataclass(frozen=True)
class Mesh:
    hosts: tuple[MeshHost, ...]
    representatives: int = 2
    methods: tuple[str, ...] = ("stamp",)
    sites: tuple[str, ...] = ()


def load_mesh(path: Path | str) -> Mesh:
    """Read a TOML or JSON mesh file (by suffix; ``.json`` is JSON, anything else TOML)."""
    path = Path(path)
    if path.suffix == ".json":
        return parse_mesh(read_json(path, "mesh file"), source=str(path))
    text = read_text(path, "mesh file", 16 * 2**20)
    try:
        data = tomllib.loads(text)
    except RecursionError:
        raise ConfigInvalid(str(path), ["not valid TOML: nested too deeply"]) from None
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise ConfigInvalid(str(path), [f"not valid {'JSON' if path.suffix == '.json' else 'TOML'}: {exc}"]) from None
    return parse_mesh(data, source=str(path))


def _port(value: Any, key: str, problems: list[str], default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        problems.append(f"{key}: must be a port 1-65535, not {value!r}")
        return default
    return value


def _entries(data: dict, sites: dict, problems: list[str]) -> list[tuple[str, str, Any]]:
    """(key, site, entry) for every host: ``sites.X.hosts[i]`` and top-level ``hosts[i]``
    (which names its site, and the site must be declared under ``[sites]``)."""
    out = []
    for site, body in sites.items():
        if not isinstance(body, dict):
            problems.append(f"sites.{site}: must be a table (hosts = [...], metrics_port)")
            continue
        for key in body:
            if key not in ("hosts", "metrics_port"):
                problems.append(f"sites.{site}.{key}: unknown key (known: hosts, metrics_port)")
        entries = body.get("hosts", [])
        if not isinstance(entries, list):
            problems.append(f"sites.{site}.hosts: must be an array of {{name, address}}")
            continue
        out += [(f"sites.{site}.hosts[{i}]", str(site), h) for i, h in enumerate(entries)]
    flat = data.get("hosts", [])
    if not isinstance(flat, list):
        problems.append("hosts: must be an array of {name, address, site}")
        flat = []
    for i, h in enumerate(flat):
        site = h.get("site") if isinstance(h, dict) else None
        if not isinstance(site, str) or not site:
            problems.append(f"hosts[{i}].site: is required in the top-level hosts list")
        elif site not in sites:
            problems.append(f"hosts[{i}].site: unknown site {site!r} (declared: "
                            f"{', '.join(sorted(sites)) or 'none'}); declare it under sites")
        else:
            out.append((f"hosts[{i}]", site, h))
    return out


def _hosts(data: dict, sites: dict, default_port: int, problems: list[str]) -> list[MeshHost]:
    """Every host once: a name in one site only, an address on one host only."""
    hosts: list[MeshHost] = []
    by_name: dict[str, tuple[str, str]] = {}
    by_address: dict[str, tuple[str, str]] = {}
    for key, site, h in _entries(data, sites, problems):
        if not isinstance(h, dict) or not isinstance(h.get("name"), str) or not h["name"]:
            problems.append(f"{key}.name: is required")
            continue
        name = h["name"]
        for k in h:
            if k not in ("name", "address", "site", "metrics_port"):
                problems.append(f"{key}.{k}: unknown key (known: name, address, site, metrics_port)")
        try:
            address = str(ipaddress.ip_address(h.get("address")))
        except ValueError:
            problems.append(f"{key}.address: {h.get('address')!r} is not an IP address")
            continue
        if name in by_name:
            first_key, first_site = by_name[name]
            problems.append(f"{key}.name: duplicate host {name!r} (also {first_key})" if
                            first_site == site else f"{key}.name: host {name!r} is in two sites, "
                            f"{first_site!r} ({first_key}) and {site!r}; a host has one site")
            continue
        if address in by_address:
            problems.append(f"{key}.address: {address} is also host {by_address[address][0]!r} "
                            f"({by_address[address][1]}); an address belongs to one host")
            continue
        by_name[name], by_address[address] = (key, site), (name, key)
        site_port = sites[site].get("metrics_port") if isinstance(sites.get(site), dict) else None
        port = _port(h.get("metrics_port"), f"{key}.metrics_port", problems,
                     _port(site_port, f"sites.{site}.metrics_port", [], default_port))
        hosts.append(MeshHost(name, address, site, port))
    return hosts


def parse_mesh(data: Any, *, source: str = "<mesh>") -> Mesh:
    """Validate a parsed mesh document; every bad key is one problem line."""
    problems: list[str] = []
    if not isinstance(data, dict):
        raise ConfigInvalid(source, ["mesh must be a table/object"])
    known = ("hosts", "methods", "metrics_port", "representatives", "sites")
    for key in data:
        if key not in known:
            problems.append(f"{key}: unknown key (known: {', '.join(known)})")
    reps = data.get("representatives", 2)
    if isinstance(reps, bool) or not isinstance(reps, int) or reps < 1:
        problems.append(f"representatives: must be an integer ≥ 1, not {reps!r}")
        reps = 2
    methods = data.get("methods", ["stamp"])
    if not isinstance(methods, list) or not methods or any(m not in METHODS for m in methods):
        problems.append(f"methods: must be a list of {', '.join(METHODS)}")
        methods = ["stamp"]
    default_port = _port(data.get("metrics_port"), "metrics_port", problems, DEFAULT_METRICS_PORT)
    sites = data.get("sites", {})
    if not isinstance(sites, dict) or not sites:
        problems.append("sites: must be a table of sites, each with hosts = [...]")
        sites = {}
    hosts = _hosts(data, sites, default_port, problems)
    if problems:
        raise ConfigInvalid(source, problems)
    return Mesh(tuple(hosts), reps, tuple(methods), tuple(str(s) for s in sites))


def check_sites(mesh: Mesh, me: MeshHost, site: str, peers: Iterable[Peer], *,
                source: str = "<config>") -> None:
    """A config used with a mesh file may only name sites the mesh declares, and its own
    ``daemon.site`` must be the one the mesh puts this host in."""
    problems = []
    if site and site not in mesh.sites:
        problems.append(f"daemon.site: unknown site {site!r} (the mesh declares "
                        f"{', '.join(mesh.sites)})")
    elif site and site != me.site:
        problems.append(f"daemon.site: {site!r}, but the mesh puts host {me.name!r} in "
                        f"site {me.site!r}")
    for i, p in enumerate(peers):
        if p.site and p.site not in mesh.sites:
            problems.append(f"peers[{i}].site: unknown site {p.site!r} (the mesh declares "
                            f"{', '.join(mesh.sites)})")
    if problems:
        raise ConfigInvalid(source, problems)


def find_self(mesh: Mesh, *, hostname: str, local_addresses: Iterable[str]) -> MeshHost:
    """The mesh entry for this host: by name (short or FQDN), else by one of its addresses."""
    short = hostname.split(".")[0]
    for h in mesh.hosts:
        if h.name in (hostname, short):
            return h
    local = {str(ipaddress.ip_address(a.split("%")[0])) for a in local_addresses}
    for h in mesh.hosts:
        if h.address in local:
            return h
    raise ConfigError(f"this host ({hostname}) is not in the mesh file by name or address; "
                      "add it, or set daemon.hostname")


def select_peers(mesh: Mesh, me: MeshHost) -> tuple[Peer, ...]:
    """Full mesh inside ``me.site``, ``mesh.representatives`` hosts of each other site."""
    peers: list[Peer] = []
    by_site: dict[str, list[MeshHost]] = {}
    for h in mesh.hosts:
        by_site.setdefault(h.site, []).append(h)
    for site, members in sorted(by_site.items()):
        others = sorted((h for h in members if h.name != me.name), key=lambda h: h.name)
        if site != me.site and others:
            start = zlib.crc32(me.name.encode()) % len(others)
            k = min(mesh.representatives, len(others))
            others = [others[(start + i) % len(others)] for i in range(k)]
        peers.extend(Peer(h.name, h.address, h.site, mesh.methods) for h in others)
    return tuple(peers)


def local_addresses() -> list[str]:
    """Addresses configured on this host's interfaces (psutil, read-only)."""
    import socket

    import psutil

    out = []
    for addrs in psutil.net_if_addrs().values():
        out.extend(a.address for a in addrs if a.family in (socket.AF_INET, socket.AF_INET6))
    return out
