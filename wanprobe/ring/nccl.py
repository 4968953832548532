"""The NCCL settings that express a ring's best order (``wanprobe ring``): fabric ids per site,
the cross-site variables, node ranks, and socket counts from the slowest flow.

Sources: NVIDIA, "NCCL Deep Dive: Cross Data Center Communication and Network Topology
Awareness" (technical blog, 14 Jul 2025, NCCL 2.27): a fabric id per site through
``NCCL_IB_HCA=dev:port:fabricID`` and ``NCCL_ALLNET_ENABLE=1``; rings then cross between sites
as few times as possible; ``NCCL_SCATTER_XDC=1`` spreads the crossings over the NICs;
``NCCL_NSOCKS_PERTHREAD × NCCL_SOCKET_NTHREADS ≤ 64`` (NCCL src/transport/net_socket.cc:
MAX_SOCKETS 64, MAX_THREADS 16; ``models/collectives.split_sockets``); NCCL's bandwidth is "the
minimum speed of the sockets multiplied by the number of sockets" (NVIDIA/nccl-tests#83).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TypedDict

from wanprobe.models.collectives import MAX_SOCKETS, split_sockets
from wanprobe.ring.model import Edge
from wanprobe.ring.sites import complete_sites, crossings, site_index, site_name
from wanprobe.units import format_rate

XDC_NCCL = "2.27"      # the release NVIDIA's cross-datacenter settings came with (tuners/nccl_xdc)
_CHECK = "check that your NCCL build reads it: NCCL_DEBUG=INFO lists the variables it uses"


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
        f"the ring spans {len(spanned)} sites ({'; '.join(site_name(sites, i) for i in spanned)}): "
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
            f"{site_name(sites, crowded[0][0])} has {crowded[0][1]} hosts: spread the "
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
