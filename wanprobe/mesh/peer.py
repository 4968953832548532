"""A peer the daemon probes: from its config's ``[[peers]]`` or picked from the mesh file
(``topology.select_peers``), with the probe methods a config or a mesh file may name."""

from __future__ import annotations

from dataclasses import dataclass

METHODS = ("stamp", "icmp", "tcp")


@dataclass(frozen=True)
class Peer:
    """One peer to probe; ``port`` is its STAMP reflector port (IANA 862)."""

    name: str
    address: str
    site: str = ""
    methods: tuple[str, ...] = ("stamp",)
    port: int = 862
    flows: int = 1          # STAMP source ports (ECMP flows) each session is spread over
