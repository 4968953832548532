"""The sites of a ring (``wanprobe ring``): its edges in rank order, its hosts clustered into
sites by measured RTT, and how often an order crosses between sites.

NCCL and gloo rings follow rank order (edge i: rank i → rank i+1 mod n); hosts closer than
``SITE_RTT_MS`` are one site (metro fibre is ≤ ~1 ms per 100 km, NVIDIA's cross-datacenter
guidance groups a site's NICs by fabric id).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from itertools import combinations

from wanprobe.errors import UsageError, shown
from wanprobe.ring.model import Pair

SITE_RTT_MS = 5.0      # below it two hosts are one site: metro fibre is ≤ ~1 ms per 100 km
# A figure per host pair (RTT in ms, rate in bit/s); None: not measured (conventions §3)
Figures = Mapping[Pair, float | None]


def ring_edges(order: Sequence[str]) -> list[Pair]:
    """Edge i of a ring in ``order`` is order[i] → order[(i+1) mod n] (NCCL and gloo rings
    follow rank order); n ≥ 2, each host once. Two hosts give both directions, a→b and b→a."""
    hosts = list(order)
    if len(hosts) < 2:
        raise UsageError(f"a ring needs at least 2 hosts, got {len(hosts)}")
    twice = next((h for i, h in enumerate(hosts) if h in hosts[:i]), None)
    if twice is not None:
        raise UsageError(f"host {shown(twice)} is twice in the ring")
    return [(h, hosts[(i + 1) % len(hosts)]) for i, h in enumerate(hosts)]


def pair_rtt_ms(rtt_ms: Figures, a: str, b: str) -> float | None:
    """The RTT between ``a`` and ``b``: either direction's measurement, the smaller when both
    are known (a round trip covers both directions; the smaller holds less queueing)."""
    known = [v for k in ((a, b), (b, a)) if (v := rtt_ms.get(k)) is not None
             and math.isfinite(v) and v >= 0]
    return min(known, default=None)


def sites_by_rtt(hosts: Sequence[str], rtt_ms: Figures,
                 site_rtt_ms: float = SITE_RTT_MS) -> list[list[str]]:
    """Single-linkage clustering: hosts whose RTT (``pair_rtt_ms``) is below ``site_rtt_ms``
    are one site, and so, transitively, are their sites. A pair not measured joins nothing.
    Sites in the order of their first host in ``hosts``, hosts in the given order."""
    names = list(dict.fromkeys(hosts))
    parent = {h: h for h in names}

    def root(h: str) -> str:
        while parent[h] != h:
            parent[h] = parent[parent[h]]
            h = parent[h]
        return h

    for a, b in combinations(names, 2):
        rtt = pair_rtt_ms(rtt_ms, a, b)
        if rtt is not None and rtt < site_rtt_ms:
            parent[root(b)] = root(a)
    groups: dict[str, list[str]] = {}
    for h in names:
        groups.setdefault(root(h), []).append(h)
    return list(groups.values())


def complete_sites(hosts: Iterable[str], sites: Sequence[Sequence[str]]) -> list[list[str]]:
    """``sites`` with each host they leave out as a site of its own, after them: a site's
    index is its fabric id (``nccl_settings``)."""
    out = [list(s) for s in sites]
    listed = {h for s in out for h in s}
    out += [[h] for h in dict.fromkeys(hosts) if h not in listed]
    return out


def site_index(hosts: Iterable[str], sites: Sequence[Sequence[str]]) -> dict[str, int]:
    """Host → the index of its site in ``complete_sites`` (the first, if listed twice)."""
    out: dict[str, int] = {}
    for i, site in enumerate(complete_sites(hosts, sites)):
        for h in site:
            out.setdefault(h, i)
    return out


def crossings(order: Sequence[str], sites: Sequence[Sequence[str]]) -> int:
    """How many ring edges join hosts of different sites; at least the number of sites the
    ring spans when that is ≥ 2 (each site entered once and left once)."""
    idx = site_index(order, sites)
    return sum(1 for a, b in ring_edges(order) if idx[a] != idx[b])


def site_name(sites: Sequence[Sequence[str]], i: int) -> str:
    hosts = list(sites[i])
    return f"site {i} ({', '.join(hosts[:3])}{', …' if len(hosts) > 3 else ''})"
