#!/usr/bin/env python3
"""Per-host probe targets and series for a fleet: wanprobe's mesh selection against a full mesh.

Builds a mesh of N hosts in S sites (default 2,000 in 8, Pingmesh's data-centre level: full mesh
inside a site, ``representatives`` hosts of every other site; Guo et al., SIGCOMM 2015, §3.2),
runs the daemon's own peer selection (wanprobe.mesh.topology.select_peers) for every host and
prints the per-host target count (min / mean / max), how evenly the remote sites' probing
load spreads, and the series each host exports (wanprobe.daemon.metrics.series_per_host),
against the full mesh (every host probes every other).

    python bench/mesh_targets.py [--hosts 2000] [--sites 8] [--representatives 2]
"""

from __future__ import annotations

import statistics
import sys
from collections import Counter

from common import parser

from wanprobe.daemon.metrics import series_per_host
from wanprobe.mesh.topology import parse_mesh, select_peers


def build(hosts: int, sites: int, reps: int):
    per_site: dict[str, list[dict]] = {f"site{s}": [] for s in range(sites)}
    for i in range(hosts):
        per_site[f"site{i % sites}"].append({"name": f"h{i:05d}",
                                             "address": f"10.{i // 65536}.{i // 256 % 256}.{i % 256}"})
    return parse_mesh({"representatives": reps,
                       "sites": {s: {"hosts": h} for s, h in per_site.items()}})


def per_host(mesh) -> tuple[list[int], list[int]]:
    """Per host of ``mesh``: the peers it probes, and the hosts of other sites that probe it."""
    counts, inbound_remote = [], Counter()
    for me in mesh.hosts:
        peers = select_peers(mesh, me)
        counts.append(len(peers))
        inbound_remote.update(p.name for p in peers if p.site != me.site)
    return counts, [inbound_remote.get(h.name, 0) for h in mesh.hosts]


def min_mean_max(values: list[int]) -> str:
    return f"min {min(values)}, mean {statistics.mean(values):.1f}, max {max(values)}"


def main() -> int:
    args = parser(__doc__, ("--hosts", 2000), ("--sites", 8), ("--representatives", 2)).parse_args()
    counts, remote = per_host(build(args.hosts, args.sites, args.representatives))
    full, mean, site_hosts = args.hosts - 1, statistics.mean(counts), args.hosts // args.sites
    print(f"{args.hosts} hosts in {args.sites} sites, {args.representatives} representatives "
          f"per remote site (wanprobe.mesh.topology.select_peers):")
    print(f"  targets per host: {min_mean_max(counts)}   full mesh: {full}   "
          f"ratio {mean / full:.3f}")
    print(f"  directed pairs: {sum(counts):,} vs full mesh {args.hosts * full:,}")
    print(f"  cross-site probes received per host: {min_mean_max(remote)} "
          f"(rotation spreads the load)")
    print(f"  series per host (1 method): {series_per_host(max(counts)):,} vs full mesh "
          f"{series_per_host(full):,}; per site Prometheus ({site_hosts} hosts): "
          f"{site_hosts * series_per_host(round(mean)):,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
