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

from wanprobe.daemon.config import METHODS, ConfigInvalid, Peer
from wanprobe.errors import ConfigError
from wanprobe.userfiles import read_json, read_text


@dataclass(frozen=True)
class MeshHost:
    name: str
    address: str
    site: str


@dataclass(frozen=True)
class Mesh:
    hosts: tuple[MeshHost, ...]
    representatives: int = 2
    methods: tuple[str, ...] = ("stamp",)


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


def parse_mesh(data: Any, *, source: str = "<mesh>") -> Mesh:
    """Validate a parsed mesh document; every bad key is one problem line."""
    problems: list[str] = []
    if not isinstance(data, dict):
        raise ConfigInvalid(source, ["mesh must be a table/object"])
    for key in data:
        if key not in ("representatives", "sites", "methods"):
            problems.append(f"{key}: unknown key (known: methods, representatives, sites)")
    reps = data.get("representatives", 2)
    if isinstance(reps, bool) or not isinstance(reps, int) or reps < 1:
        problems.append(f"representatives: must be an integer ≥ 1, not {reps!r}")
        reps = 2
    methods = data.get("methods", ["stamp"])
    if not isinstance(methods, list) or not methods or any(m not in METHODS for m in methods):
        problems.append(f"methods: must be a list of {', '.join(METHODS)}")
        methods = ["stamp"]
    sites = data.get("sites", {})
    if not isinstance(sites, dict) or not sites:
        problems.append("sites: must be a table of sites, each with hosts = [...]")
        sites = {}
    hosts: list[MeshHost] = []
    seen: set[str] = set()
    for site, body in sites.items():
        entries = body.get("hosts") if isinstance(body, dict) else None
        if not isinstance(entries, list):
            problems.append(f"sites.{site}.hosts: must be an array of {{name, address}}")
            continue
        for i, h in enumerate(entries):
            key = f"sites.{site}.hosts[{i}]"
            if not isinstance(h, dict) or not isinstance(h.get("name"), str) or not h["name"]:
                problems.append(f"{key}.name: is required")
                continue
            try:
                address = str(ipaddress.ip_address(h.get("address")))
            except ValueError:
                problems.append(f"{key}.address: {h.get('address')!r} is not an IP address")
                continue
            if h["name"] in seen:
                problems.append(f"{key}.name: duplicate host {h['name']!r}")
                continue
            seen.add(h["name"])
            hosts.append(MeshHost(h["name"], address, str(site)))
    if problems:
        raise ConfigInvalid(source, problems)
    return Mesh(tuple(hosts), reps, tuple(methods))


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
