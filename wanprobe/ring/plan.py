"""The pure logic of ``wanprobe ring``: a ring's edges, the sites its hosts are in (by RTT), how
often it crosses between them, the order that crosses least, which slowed edges share a link,
the result, and the NCCL settings that express the best order.

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
from collections.abc import Iterable, Mapping, Sequence
from itertools import combinations, permutations
from typing import TypedDict

from wanprobe.errors import UsageError, shown
from wanprobe.models.collectives import MAX_SOCKETS, split_sockets
from wanprobe.ring.model import Edge, EdgeRun, Pair, RingResult
from wanprobe.units import format_rate

SITE_RTT_MS = 5.0      # below it two hosts are one site: metro fibre is ≤ ~1 ms per 100 km
MAX_SITES = 8          # best_order tries all (k−1)! cycles of k sites: 5040 at 8
DEGRADED_SHARE = 0.7   # two edges through one link get ≤ 1/2 each; 0.7 leaves 20 points of noise
XDC_NCCL = "2.27"      # the release NVIDIA's cross-datacenter settings came with (tuners/nccl_xdc)
_CHECK = "check that your NCCL build reads it: NCCL_DEBUG=INFO lists the variables it uses"
# A figure per host pair (RTT in ms, rate in bit/s); None: not measured (conventions §3)
Figures = Mapping[Pair, float | None]
# the best order and its run: every edge at once; None: proposed, not measured
Best = tuple[Sequence[str], Sequence[EdgeRun] | None]


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


def _degraded(together: Sequence[EdgeRun], alone: Mapping[Pair, float],
              idx: Mapping[str, int], share: float) -> dict[tuple[int, int], list[Pair]]:
    """The edges that ran below ``share`` × their rate alone with the ring busy (only those
    measured alone, and not failed), by (source site, destination site)."""
    out: dict[tuple[int, int], list[Pair]] = {}
    for run in together:
        base = alone.get(run.key)
        if run.error is None and run.bits_per_second is not None and base and base > 0 \
                and run.bits_per_second < share * base:
            out.setdefault((idx[run.src], idx[run.dst]), []).append(run.key)
    return out


def shared_bottlenecks(together: Sequence[EdgeRun], alone: Mapping[Pair, float],
                       sites: Sequence[Sequence[str]],
                       share: float = DEGRADED_SHARE) -> list[list[Pair]]:
    """Groups of ring edges that slowed down together on a link they share.

    Method: every edge runs with the whole ring, then each WAN edge alone. A link carries its
    two directions independently (full duplex), so an edge slows down with the ring busy only
    through something it shares in its own direction: the way from its site to the next
    (two edges A→B through one link get half of it each), or an end host that sends and
    receives at once. An edge is degraded when its rate together is below ``share`` × its
    rate alone (measured alone only); degraded edges crossing the same (source site →
    destination site) form a group, and a group of ≥ 2 is a shared bottleneck. A single
    degraded edge has nothing on its way to share with: its own ends, busy both ways, are the
    suspect, which ``assemble`` notes. Groups in the order of their first edge in ``together``."""
    idx = site_index([h for r in together for h in r.key], sites)
    return [edges for (a, b), edges in _degraded(together, alone, idx, share).items()
            if a != b and len(edges) >= 2]


def _site_name(sites: Sequence[Sequence[str]], i: int) -> str:
    hosts = list(sites[i])
    return f"site {i} ({', '.join(hosts[:3])}{', …' if len(hosts) > 3 else ''})"


def _degraded_notes(together: Sequence[EdgeRun], alone: Mapping[Pair, float],
                    sites: list[list[str]], share: float = DEGRADED_SHARE) -> list[str]:
    """One note per shared bottleneck and per degraded edge outside one (shared_bottlenecks)."""
    idx = site_index([h for r in together for h in r.key], sites)
    rate = {r.key: r.bits_per_second or 0.0 for r in together}
    notes = []
    for (a, b), edges in _degraded(together, alone, idx, share).items():
        if a != b and len(edges) >= 2:
            notes.append(f"{len(edges)} edges from {_site_name(sites, a)} to "
                         f"{_site_name(sites, b)} slowed at once, each below {share:.0%} of its "
                         f"rate alone: they share a link on the way ({len(edges)} edges through "
                         f"one link get 1/{len(edges)} each); order the ring by site so that "
                         "each direction crosses once")
            continue
        for src, dst in edges:
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
    notes += _summary_notes(hosts, edges, b_order, b_edges, all_sites)
    nccl = nccl_settings(all_sites, b_order, b_edges or edges)
    return RingResult(
        order=tuple(hosts), edges=tuple(edges),
        ring_bits_per_second=_slowest([e.bits_per_second for e in edges]),
        ring_nccl_bits_per_second=_slowest([e.nccl_bits_per_second for e in edges]),
        crossings=crossings(hosts, all_sites),
        shared_bottlenecks=tuple(tuple(g) for g in shared_bottlenecks(on_ring, alone_bps, all_sites)),
        sites=tuple(tuple(s) for s in all_sites), rtt_ms=_matrix(hosts, rtt_ms),
        best_order=tuple(b_order), best_crossings=crossings(b_order, all_sites),
        best_ring_bits_per_second=_slowest([e.bits_per_second for e in b_edges]) if b_edges else None,
        best_ring_nccl_bits_per_second=(_slowest([e.nccl_bits_per_second for e in b_edges])
                                        if b_edges else None),
        best_edges=tuple(b_edges), nccl=nccl["env"], nccl_why=nccl["why"],
        fabric_ids=nccl["fabric_ids"], node_ranks=nccl["node_ranks"],
        notes=tuple(notes + nccl["notes"]))


# -- NCCL -------------------------------------------------------------------------------------
class NcclSettings(TypedDict):
    """``nccl_settings``: the variables (``env``) with a one-line reason each (``why``, also for
    ``fabric_ids`` and ``node_ranks``), each host's fabric id (its site's index; {} within one
    site) and launcher node rank, and what was not set and why (``notes``)."""

    env: dict[str, str]
    why: dict[str, str]
    fabric_ids: dict[str, int]
    node_ranks: dict[str, int]
    notes: list[str]


def _xdc_settings(out: NcclSettings, order: list[str], sites: list[list[str]],
                  idx: Mapping[str, int], spanned: list[int]) -> None:
    """The cross-datacenter settings of NVIDIA's guidance (module docstring) for a ring over
    ≥ 2 sites: fabric ids, NCCL_ALLNET_ENABLE, NCCL_CROSS_NIC, and NCCL_SCATTER_XDC where a
    site has more than one host (more than one node's NICs to spread the crossings over)."""
    env, why = out["env"], out["why"]
    out["fabric_ids"] = {h: idx[h] for h in order}
    why["fabric_ids"] = (
        "NCCL_IB_HCA=dev:port:fabricID on each host, fabricID = its site's index × rails + rail "
        "(tuners/nccl_xdc.fabric_hcas; the index here, for one rail): NICs of one id share a "
        f"site, so NCCL's rings cross between the {len(spanned)} sites as few times as possible "
        f"(NCCL ≥ {XDC_NCCL}; {_CHECK})")
    env["NCCL_ALLNET_ENABLE"] = "1"
    why["NCCL_ALLNET_ENABLE"] = (
        f"the ring spans {len(spanned)} sites ({'; '.join(_site_name(sites, i) for i in spanned)}): "
        "lets NCCL use the fabric inside each site and another network between them "
        f"(NCCL ≥ {XDC_NCCL}; {_CHECK})")
    env["NCCL_CROSS_NIC"] = "2"
    why["NCCL_CROSS_NIC"] = (
        "2, NCCL's default, set because clusters often pin 0: 0 holds each ring to the same NIC "
        "on every node (rail-aligned), which crossings spread over NICs and a WAN joining all "
        "rails do not fit; 1 gives up rail alignment inside a site, where one switch per NIC "
        "makes crossing rails cost; 2 keeps the same NIC where it can and crosses where faster "
        "(NCCL environment variables documentation)")
    crowded = [(i, n) for i in spanned if (n := sum(1 for h in order if idx[h] == i)) > 1]
    if crowded:
        env["NCCL_SCATTER_XDC"] = "1"
        why["NCCL_SCATTER_XDC"] = (
            f"{_site_name(sites, crowded[0][0])} has {crowded[0][1]} hosts: spread the "
            "crossings between sites over their NICs instead of funnelling them through one NIC "
            f"(NCCL ≥ {XDC_NCCL}; {_CHECK})")


def _socket_target(edges: Sequence[Edge], target_bps: float | None) -> tuple[float, str] | None:
    """(rate to reach, what it is): ``target_bps``, else the slowest edge's rate alone where
    measured (with the ring busy a shared link lowers it; alone it is the edge's capacity),
    else with the ring busy."""
    if target_bps:
        return target_bps, "the target"
    known = [(e.alone_bits_per_second, "alone") if e.alone_bits_per_second
             else (e.bits_per_second, "with the ring busy") for e in edges]
    rates = [(r, how) for r, how in known if r]
    if not rates:
        return None
    rate, how = min(rates)
    return rate, f"the slowest edge's rate {how}"


def _socket_settings(out: NcclSettings, edges: Sequence[Edge], target_bps: float | None) -> None:
    """NCCL_SOCKET_NTHREADS × NCCL_NSOCKS_PERTHREAD: enough sockets that the slowest stream
    measured × sockets reaches the target, since NCCL moves every socket at the slowest one's
    pace (nccl-tests#83); within NCCL's 64 sockets and 16 threads (split_sockets: at most 4
    sockets per thread, under NCCL's 8)."""
    slowest = min((r for e in edges if (r := e.min_stream_bits_per_second)), default=None)
    target = _socket_target(edges, target_bps)
    if slowest is None or target is None:
        out["notes"].append("no per-stream rate or edge rate measured: NCCL's socket count "
                            "is not sized")
        return
    rate, what = target
    need = max(1, math.ceil(rate / slowest * (1 - 1e-9)))
    if need <= 1:
        out["notes"].append(f"one socket at {format_rate(slowest)} reaches {what}, "
                            f"{format_rate(rate)}: NCCL's socket count is left as it is")
        return
    threads, each = split_sockets(min(need, MAX_SOCKETS))
    total = threads * each
    why = (f"the slowest stream moved {format_rate(slowest)} and NCCL moves every socket at the "
           f"slowest one's pace (nccl-tests#83): NCCL_SOCKET_NTHREADS={threads} × "
           f"NCCL_NSOCKS_PERTHREAD={each} = {total} sockets (≤ {MAX_SOCKETS}) ")
    if need <= MAX_SOCKETS:
        why += f"give {format_rate(total * slowest)} ≥ {what}, {format_rate(rate)}"
    else:
        why += (f"(NCCL's cap) give {format_rate(total * slowest)} of {what}, "
                f"{format_rate(rate)}; {need} would be needed: raise the streams' rate "
                "(tcp_rmem/tcp_wmem max for the RTT) or mend the slow path")
        out["notes"].append(f"{need} sockets would be needed to reach {what}; NCCL allows 64")
    out["env"].update(NCCL_SOCKET_NTHREADS=str(threads), NCCL_NSOCKS_PERTHREAD=str(each))
    out["why"].update(NCCL_SOCKET_NTHREADS=why, NCCL_NSOCKS_PERTHREAD=why)


def nccl_settings(sites: Sequence[Sequence[str]], best_order: Sequence[str],
                  edges: Sequence[Edge], target_bps: float | None = None) -> NcclSettings:
    """The NCCL settings that express the ring ``best_order`` over ``sites``: the launcher's
    node rank per host (gloo and NCCL build their rings in rank order, so ranks in the best
    order give its crossings), the cross-site settings when it spans ≥ 2 sites
    (``_xdc_settings``), and the socket counts sized on ``edges`` (the WAN ones when it spans
    sites: the crossings are where one socket is window-bound) to reach ``target_bps``, else
    the slowest edge's rate alone (``_socket_settings``)."""
    order = list(best_order)
    all_sites = complete_sites(order, sites)
    idx = site_index(order, all_sites)
    spanned = list(dict.fromkeys(idx[h] for h in order))
    out = NcclSettings(env={}, why={}, fabric_ids={}, notes=[],
                       node_ranks={h: rank for rank, h in enumerate(order)})
    out["why"]["node_ranks"] = (
        "the launcher's node rank per host (torchrun --node_rank, NODE_RANK): NCCL and gloo "
        f"rings follow rank order, so this order crosses between sites {crossings(order, all_sites)} "
        "times" if len(order) >= 2 else "one host: no ring")
    if len(spanned) >= 2:
        _xdc_settings(out, order, all_sites, idx, spanned)
    wan = [e for e in edges if e.wan] if len(spanned) >= 2 else list(edges)
    _socket_settings(out, wan or list(edges), target_bps)
    return out
