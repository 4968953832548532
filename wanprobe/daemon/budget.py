"""How many peers one daemon may probe: its series budget, which also bounds its memory.

Every peer costs the daemon a fixed set of Prometheus series (``metrics.series_per_host``) and,
with them, memory: label children, the scheduler's and baseline's state, a slice of every
``/metrics`` body. A 10,000-peer mesh made 200,491 series, a 26.6 MB exposition built in 5 s and
294 MiB of RSS against the unit's ``MemoryMax=256M`` (issue 19). ``MAX_SERIES`` is the budget;
``bench/daemon_footprint.py --peers N --scrapers 5`` measures RSS and scrape time at a size, and
``tests/test_daemon_scale.py`` holds the largest accepted mesh under ``MemoryMax`` with five
scrapers that never read.

Peers named in the config are the operator's explicit choice: more than the budget is refused.
Peers a mesh file selects are sampled down to what is left, with one log line: every other
site's representatives first (the cross-site paths are what the mesh is for), then this site's
hosts that follow this one in name order, around the ring: every host of the site is still
probed by as many others as a host can afford (a ring of k successors, as the rotation of
Pingmesh's representatives spreads load, Guo et al. 2015 §3.2).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from wanprobe.daemon import owd_metrics
from wanprobe.daemon.metrics import (
    MAX_FINGERPRINTS,
    SERIES_PER_HOST,
    SERIES_PER_PEER,
    SERIES_PER_PEER_METHOD,
)
from wanprobe.errors import ConfigInvalid
from wanprobe.mesh.peer import Peer

# 1,111 peers probed with STAMP alone (45 series each at most): the 1,000 peers the daemon is
# measured at (docs/fleet.md §6) fit, one-way delay and windowed loss included
MAX_SERIES = 50_000
# beyond series_per_host: path floor and spread, two path event counters, up to four regression
# counters, and per traced path (flows > 1) flows + 2 RTT quantiles + 3 loss directions; per
# method the one-way delay gauges, exported while the session's clock bound is known
# (owd_metrics.py: two namespaces of one host, or synchronised clocks)
PATH_SERIES, EVENT_SERIES, REGRESSION_SERIES, FINGERPRINT_SERIES = 2, 2, 4, 6


def peer_series(peer: Peer) -> int:
    """The most series ``peer`` can add to this daemon's exposition."""
    fingerprints = min(peer.flows, MAX_FINGERPRINTS) if peer.flows > 1 else 0
    per_method = SERIES_PER_PEER_METHOD + owd_metrics.SERIES_PER_PEER_METHOD
    return (SERIES_PER_PEER + len(peer.methods) * per_method + PATH_SERIES
            + EVENT_SERIES + REGRESSION_SERIES + FINGERPRINT_SERIES * fingerprints)


def series_of(peers: Sequence[Peer]) -> int:
    return SERIES_PER_HOST + sum(peer_series(p) for p in peers)


def fit(configured: Sequence[Peer], selected: Sequence[Peer], *, site: str, host: str,
        source: str = "<config>", budget: int = MAX_SERIES) -> tuple[list[Peer], str | None]:
    """The peers to probe and, when the mesh's selection was sampled, the one line saying so.
    ``configured`` ([[peers]]) over the budget alone raises ConfigInvalid."""
    used = series_of(configured)
    if used > budget:
        raise ConfigInvalid(source, [f"peers: {len(configured)} peers make {used:,} series, "
                                     f"over this daemon's budget of {budget:,} (a host probes "
                                     "a few hundred; split the mesh into smaller sites)"])
    names = {p.name for p in configured}
    mesh = [p for p in selected if p.name not in names]
    if used + sum(peer_series(p) for p in mesh) <= budget:
        return [*configured, *mesh], None
    remote = [p for p in mesh if p.site != site]
    local = [p for p in mesh if p.site == site]
    local.sort(key=lambda p: p.name)
    start = bisect.bisect_right([p.name for p in local], host)
    local = local[start:] + local[:start]  # the hosts after this one, around the ring
    kept = []
    for p in remote + local:
        if used + peer_series(p) > budget:
            continue
        used += peer_series(p)
        kept.append(p)
    note = (f"the mesh selects {len(mesh)} peers, over this daemon's budget of {budget:,} "
            f"series; probing {len(kept)} of them ({sum(p.site != site for p in kept)} in other "
            "sites, then the hosts after this one in its site): split the site in the mesh "
            "file to probe all")
    return [*configured, *kept], note
