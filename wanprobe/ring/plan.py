"""The pure logic of ``wanprobe ring``: a ring's edges, the sites its hosts are in (by RTT), how
often it crosses between them, the order that crosses least, which slowed edges share a link,
and the result (the NCCL settings that express the best order: ``ring/nccl.py``).

Sources:

* a ring all-reduce moves one chunk over every edge at once at each step, so it runs at its
  slowest edge with all edges busy; that rate is its bus bandwidth (nccl-tests
  doc/PERFORMANCE.md: all-reduce busbw = algbw × 2(n−1)/n);
* NCCL's bandwidth is "the minimum speed of the sockets multiplied by the number of sockets"
  (NVIDIA/nccl-tests#83), not their sum;
* NVIDIA, "NCCL Deep Dive: Cross Data Center Communication and Network Topology Awareness"
  (technical blog, 14 Jul 2025, NCCL 2.27): a fabric id per site through
  ``NCCL_IB_HCA=dev:port:fabricID`` and ``NCCL_ALLNET_ENABLE=1``; rings then cross between
  sites as few times as possible; ``NCCL_SCATTER_XDC=1`` spreads the crossings over the NICs;
  ``NCCL_NSOCKS_PERTHREAD × NCCL_SOCKET_NTHREADS ≤ 64`` (NCCL src/transport/net_socket.cc:
  MAX_SOCKETS 64, MAX_THREADS 16; ``models/collectives.split_sockets``).

Why the order matters: a ring over two sites' hosts alternating (a1, b1, a2, b2) crosses the
WAN on every edge, two edges per direction through one link, so each gets half of it; ordered
by site (a1, a2, b1, b2) it crosses twice, once each way, and each crossing has the link alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from itertools import permutations

from wanprobe.errors import UsageError
from wanprobe.ring.model import Edge, EdgeRun, Pair, RingResult
from wanprobe.ring.nccl import nccl_settings
from wanprobe.ring.sites import (
    Figures,
    complete_sites,
    crossings,
    pair_rtt_ms,
    ring_edges,
    site_index,
    site_name,
)
from wanprobe.units import format_rate

MAX_SITES = 8          # best_order tries all (k−1)! cycles of k sites: 5040 at 8
DEGRADED_SHARE = 0.7   # two edges through one link get ≤ 1/2 each; 0.7 leaves 20 points of noise
SHARED_SUM = 1.15      # k edges through one link move together about one edge's rate alone
# the best order and its run: every edge at once; None: proposed, not measured
Best = tuple[Sequence[str], Sequence[EdgeRun] | None]


def _fastest(rate_bps: Figures, srcs: Sequence[str],
             dsts: Sequence[str]) -> float | None:
    """The best rate any host of ``srcs`` reached to one of ``dsts`` (None: none measured)."""
    known = [v for a in srcs for b in dsts if (v := rate_bps.get((a, b))) is not None
             and math.isfinite(v)]
    return max(known, default=None)


def _best_cycle(groups: list[list[str]], rate_bps: Figures,
                rtt_ms: Figures) -> tuple[int, ...]:
    """The cyclic order of the sites, the first fixed, that maximises its slowest known
    inter-site rate (a ring runs at its slowest edge), then has the smallest sum of known
    inter-site RTT; ties go to the first in the given order. A site pair's rate is the best
    any of its host pairs reached in that direction, its RTT the smallest measured."""
    k = len(groups)
    rate = {(i, j): _fastest(rate_bps, groups[i], groups[j])
            for i in range(k) for j in range(k) if i != j}
    rtt = {(i, j): min((r for a in groups[i] for b in groups[j]
                        if (r := pair_rtt_ms(rtt_ms, a, b)) is not None), default=None)
           for i, j in rate}
    best: tuple[int, ...] = tuple(range(k))
    best_key: tuple[float, float] | None = None
    for rest in permutations(range(1, k)):  # both directions of every cycle: (k−1)! orders
        cycle = (0, *rest)
        steps = [(cycle[i], cycle[(i + 1) % k]) for i in range(k)]
        rates = [r for s in steps if (r := rate[s]) is not None]
        key = (min(rates, default=-math.inf), -sum(r for s in steps if (r := rtt[s]) is not None))
        if best_key is None or key > best_key:
            best, best_key = cycle, key
    return best


def best_order(hosts: Sequence[str], sites: Sequence[Sequence[str]],
               rate_bps: Figures | None = None,
               rtt_ms: Figures | None = None) -> list[str]:
    """The ring that crosses between sites least: each site's hosts adjacent (in the given
    order), so it crosses once per site when it spans ≥ 2, starting with ``hosts[0]``'s site.
    With ≥ 3 sites the cyclic order of the sites is ``_best_cycle``'s, an exact search over
    every cycle in both directions (``rate_bps``, ``rtt_ms``: keyed by host pairs)."""
    names = list(dict.fromkeys(hosts))
    idx = site_index(names, sites)
    groups: dict[int, list[str]] = {}
    for h in names:
        groups.setdefault(idx[h], []).append(h)
    ordered = list(groups.values())
    if len(ordered) > MAX_SITES:
        raise UsageError(f"the ring spans {len(ordered)} sites; the best order is searched "
                         f"exactly over at most {MAX_SITES}")
    cycle = _best_cycle(ordered, rate_bps or {}, rtt_ms or {}) if len(ordered) >= 3 \
        else range(len(ordered))
    return [h for i in cycle for h in ordered[i]]


def _directions(together: Sequence[EdgeRun], alone: Mapping[Pair, float],
                idx: Mapping[str, int]) -> dict[tuple[int, int], list[EdgeRun]]:
    """The edges measured both with the ring and alone (not failed), by (source site,
    destination site)."""
    out: dict[tuple[int, int], list[EdgeRun]] = {}
    for run in together:
        base = alone.get(run.key)
        if run.error is None and run.bits_per_second is not None and base and base > 0:
            out.setdefault((idx[run.src], idx[run.dst]), []).append(run)
    return out


def _rate(run: EdgeRun) -> float:
    return run.bits_per_second or 0.0


def _groups(together: Sequence[EdgeRun], alone: Mapping[Pair, float],
            idx: Mapping[str, int], share: float) -> tuple[list[list[Pair]], list[Pair]]:
    """``shared_bottlenecks``'s groups, and the degraded edges in none of them."""
    groups, single = [], []
    for (a, b), runs in _directions(together, alone, idx).items():
        total = sum(_rate(r) for r in runs)
        if a != b and len(runs) >= 2 and total < SHARED_SUM * max(alone[r.key] for r in runs) \
                and any(_rate(r) < share * alone[r.key] for r in runs):
            groups.append([r.key for r in runs])
            continue
        single += [r.key for r in runs if _rate(r) < share * alone[r.key]]
    return groups, single


def shared_bottlenecks(together: Sequence[EdgeRun], alone: Mapping[Pair, float],
                       sites: Sequence[Sequence[str]],
                       share: float = DEGRADED_SHARE) -> list[list[Pair]]:
    """Groups of ring edges that slowed down together on a link they share.

    Method: every edge runs with the whole ring, then each WAN edge alone. A link carries its
    two directions independently (full duplex), so an edge slows down with the ring busy only
    through something it shares in its own direction: the way from its site to the next
    (k edges A→B through one link get its capacity between them), or an end host that sends
    and receives at once. The ≥ 2 edges crossing from one site to another (measured alone) are
    a shared bottleneck when one of them ran below ``share`` × its rate alone and together
    they moved about what one moves alone (below ``SHARED_SUM`` × the fastest alone): through
    one link their sum is the link, on separate ways k times it. The sum, not each edge, since
    TCP may split a link unevenly (22 against 73 Mbit/s through 100 Mbit/s, the faster edge
    above ``share``). An edge below ``share`` × its rate alone outside
    a group has nothing on its way to share with: its own ends, busy both ways, are the
    suspect, which ``assemble`` notes. Groups in the order of their first edge in ``together``."""
    idx = site_index([h for r in together for h in r.key], sites)
    return _groups(together, alone, idx, share)[0]


def _degraded_notes(together: Sequence[EdgeRun], alone: Mapping[Pair, float],
                    sites: list[list[str]], share: float = DEGRADED_SHARE) -> list[str]:
    """One note per shared bottleneck and per degraded edge outside one (shared_bottlenecks)."""
    idx = site_index([h for r in together for h in r.key], sites)
    rate = {r.key: r.bits_per_second or 0.0 for r in together}
    groups, single = _groups(together, alone, idx, share)
    notes = []
    for edges in groups:
        a, b = idx[edges[0][0]], idx[edges[0][1]]
        got = sum(rate[k] for k in edges) / sum(alone[k] for k in edges)
        notes.append(f"{len(edges)} edges from {site_name(sites, a)} to "
                     f"{site_name(sites, b)} together moved {got:.0%} of what they moved "
                     f"alone: they share a link on the way ({len(edges)} edges through one link "
                     f"get 1/{len(edges)} of it between them); order the ring by site so that "
                     "each direction crosses once")
    for src, dst in single:
        notes.append(f"{src} → {dst} ran at {format_rate(rate[(src, dst)])} with the ring, "
                     f"{rate[(src, dst)] / alone[(src, dst)]:.0%} of its "
                     f"{format_rate(alone[(src, dst)])} alone, and no other edge on its way "
                     "slowed: not a shared link (a full-duplex link carries each direction "
                     "on its own); its ends were busy both ways at once (every ring host "
                     "sends and receives): look at those hosts' CPU, NIC and buffers")
    return notes


# -- the result -------------------------------------------------------------------------------
def _alone_rates(alone: Mapping[Pair, EdgeRun], notes: list[str]) -> dict[Pair, float]:
    """The rate of each edge measured alone; a failed one is noted and left out."""
    out: dict[Pair, float] = {}
    for (src, dst), run in alone.items():
        if run.error is not None:
            notes.append(f"{src} → {dst} alone: {run.error}")
        elif run.bits_per_second is not None:
            out[(src, dst)] = run.bits_per_second
    return out


def _edges_of(ring: list[Pair], runs: Sequence[EdgeRun], alone: Mapping[Pair, float],
              idx: Mapping[str, int], where: str, notes: list[str]) -> list[Edge]:
    """The ring's edges from a run of all of them at once, in ring order: an edge without a
    run is not measured, a failed one's figures are None; both noted with the error."""
    by_key = {r.key: r for r in runs}
    stray = [k for k in by_key if k not in set(ring)]
    if stray:
        notes.append(f"{where}: {len(stray)} run(s) not on the ring left out "
                     f"({stray[0][0]} → {stray[0][1]}{', …' if len(stray) > 1 else ''})")
    out = []
    for src, dst in ring:
        run = by_key.get((src, dst)) or EdgeRun(src, dst, None, (), "not measured")
        if run.error is not None:
            notes.append(f"{src} → {dst} {where}: {run.error}; the ring's rate is unknown")
        out.append(Edge.of(run, alone.get((src, dst)), idx[src] != idx[dst]))
    return out


def _slowest(values: Sequence[float | None]) -> float | None:
    """A ring's rate: its slowest edge's; None when an edge's is unknown (failed)."""
    known = [v for v in values if v is not None]
    return min(known) if known and len(known) == len(values) else None


def ring_rates(edges: Sequence[Edge], groups: Sequence[Sequence[Pair]],
               figure: Callable[[Edge], float | None]) -> list[float | None]:
    """Each edge's rate in a ring collective: its own ``figure`` together, except for edges
    that share a bottleneck (``groups``), which get the group's total over its size.

    Why: a ring all-reduce moves the same bytes over every edge at each step, so an edge that
    won more than its share of a shared link from TCP waits for its slower neighbour; the link's
    capacity, not TCP's (often uneven: 22 against 73 Mbit/s through one 100 Mbit/s link in a
    5 s test) split, bounds the ring. Free-running flows' slowest edge understates the ring."""
    rate: dict[Pair, float | None] = {(e.src, e.dst): figure(e) for e in edges}
    for group in groups:
        got = [rate.get(k) for k in group]
        if all(v is not None for v in got):
            share = sum(v for v in got if v is not None) / len(got)
            rate.update({k: share for k in group})
    return [rate[(e.src, e.dst)] for e in edges]


def _site_cycle(order: Sequence[str], idx: Mapping[str, int]) -> list[int]:
    """The sites in the order a ring visits them, consecutive repeats folded (cyclically)."""
    seq = [idx[h] for h in order]
    out = [s for i, s in enumerate(seq) if i == 0 or s != seq[i - 1]]
    return out[:-1] if len(out) > 1 and out[-1] == out[0] else out


def _best_part(hosts: list[str], sites: list[list[str]], edges: list[Edge],
               alone: Mapping[Pair, float], rtt_ms: Figures, best: Best | None,
               notes: list[str]) -> tuple[list[str], list[Edge]]:
    """(best order, its edges as measured; [] when it was not). Without a run of it: the ring
    as given when it already visits the sites in the best cycle, else the best order given (or
    planned: ``best_order``), not measured."""
    if best is not None and best[1] is not None:
        order = list(best[0])
        return order, _edges_of(ring_edges(order), best[1], alone, site_index(order, sites),
                                "in the best order", notes)
    planned = list(best[0]) if best is not None else best_order(hosts, sites, alone, rtt_ms)
    ring_edges(planned)
    idx = site_index([*hosts, *planned], sites)
    if _site_cycle(hosts, idx) == _site_cycle(planned, idx):
        return hosts, edges
    notes.append(f"the best order {' → '.join(planned)} was not measured: run `wanprobe ring` "
                 "over it to see its rate")
    return planned, []


def _matrix(hosts: list[str], rtt_ms: Figures) -> tuple[tuple[float | None, ...], ...]:
    """``rtt_ms[(a, b)]`` as rows in ring order (None where not measured, or not finite)."""
    def cell(a: str, b: str) -> float | None:
        v = rtt_ms.get((a, b)) if a != b else None
        return v if v is not None and math.isfinite(v) and v >= 0 else None

    return tuple(tuple(cell(a, b) for b in hosts) for a in hosts)


def _summary_notes(hosts: list[str], edges: list[Edge], b_order: list[str],
                   b_edges: list[Edge], sites: list[list[str]]) -> list[str]:
    """What NCCL would see of the ring when its streams are uneven; the gain of the best order."""
    notes = []
    ring, nccl = _slowest([e.bits_per_second for e in edges]), _slowest([e.nccl_bits_per_second for e in edges])
    if ring and nccl is not None and nccl < 0.9 * ring:
        worst = min(edges, key=lambda e: e.nccl_bits_per_second or 0.0)
        notes.append(f"NCCL moves every socket at the slowest one's pace (nccl-tests#83): on "
                     f"{worst.src} → {worst.dst} the fastest stream moved "
                     f"{(worst.stream_spread or 0.0):.0%} more than the slowest, so NCCL would "
                     f"see {format_rate(nccl)} of the ring's {format_rate(ring)}")
    best = _slowest([e.bits_per_second for e in b_edges]) if b_edges else None
    if ring and best and b_order != hosts:
        notes.append(f"ordered by site the ring crosses between sites "
                     f"{crossings(b_order, sites)} times instead of {crossings(hosts, sites)}: "
                     f"{format_rate(best)} instead of {format_rate(ring)}")
    return notes


def assemble(order: Sequence[str], together: Sequence[EdgeRun], alone: Mapping[Pair, EdgeRun],
             sites: Sequence[Sequence[str]], rtt_ms: Figures,
             best: Best | None = None) -> RingResult:
    """The ring's result: ``together`` (every edge of ``order``'s ring at once), ``alone``
    (each WAN edge alone, keyed by (src, dst)), the ``sites`` (``sites_by_rtt``), the RTTs,
    and ``best`` (the best order and its run; the run None, or ``best`` None, when not
    measured: then the order given, or ``best_order``'s, is proposed). The ring's rate is its
    slowest edge's together rate, its NCCL view the slowest edge's NCCL figure; both None when
    an edge failed, with the error in notes. The NCCL settings are ``nccl_settings``'s for the
    best order (its edges as measured, else the ring's)."""
    hosts = list(order)
    ring = ring_edges(hosts)
    all_sites = complete_sites([*hosts, *(best[0] if best else ())], sites)
    notes: list[str] = []
    alone_bps = _alone_rates(alone, notes)
    edges = _edges_of(ring, together, alone_bps, site_index(hosts, all_sites), "in the ring", notes)
    b_order, b_edges = _best_part(hosts, all_sites, edges, alone_bps, rtt_ms, best, notes)
    on_ring = [r for r in together if r.key in set(ring)]
    notes += _degraded_notes(on_ring, alone_bps, all_sites)
    groups = shared_bottlenecks(on_ring, alone_bps, all_sites)
    notes += _summary_notes(hosts, edges, b_order, b_edges, all_sites)
    nccl = nccl_settings(all_sites, b_order, b_edges or edges)
    return RingResult(
        order=tuple(hosts), edges=tuple(edges),
        ring_bits_per_second=_slowest(ring_rates(edges, groups, lambda e: e.bits_per_second)),
        ring_nccl_bits_per_second=_slowest(ring_rates(edges, groups,
                                                      lambda e: e.nccl_bits_per_second)),
        crossings=crossings(hosts, all_sites),
        shared_bottlenecks=tuple(tuple(g) for g in groups),
        sites=tuple(tuple(s) for s in all_sites), rtt_ms=_matrix(hosts, rtt_ms),
        best_order=tuple(b_order), best_crossings=crossings(b_order, all_sites),
        best_ring_bits_per_second=_slowest([e.bits_per_second for e in b_edges]) if b_edges else None,
        best_ring_nccl_bits_per_second=(_slowest([e.nccl_bits_per_second for e in b_edges])
                                        if b_edges else None),
        best_edges=tuple(b_edges), nccl=nccl["env"], nccl_why=nccl["why"],
        fabric_ids=nccl["fabric_ids"], node_ranks=nccl["node_ranks"],
        notes=tuple(notes + nccl["notes"]))
