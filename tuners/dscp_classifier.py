"""The DSCP tuner's classifier in its canonical form (``tuners.dscp.canonical``): what a plan
carries as JSON and what the nftables rules, the iptables rules and the scope check are made
from. A TypedDict, not a dataclass: plans and journals hold it as this very JSON object."""

from __future__ import annotations

from typing import TypedDict


class Classifier(TypedDict):
    """One classifier: packets to ``daddr`` (no prefixes: any address) with ``proto`` and
    ``dport`` (``"lo-hi"``), from ``uid`` or cgroup v2 path ``cgroup``, get ``dscp``."""

    dscp: int
    daddr: list[str]      # canonical prefixes, sorted; [] matches every address
    proto: str | None     # "tcp" | "udp" | None (both, or any protocol without a dport)
    dport: str | None     # "lo-hi"
    uid: int | None
    cgroup: str | None    # relative to the cgroup v2 root, no leading or trailing slash
