"""What a measured ring predicts for a real collective run over it: gloo's ring all-reduce
(torch.distributed's CPU backend), from the edges' rates and RTTs a ring test measured.

A ring all-reduce over a network that carries R on its slowest edge has a bus bandwidth of at
most R (nccl-tests doc/PERFORMANCE.md: busbw = algbw × 2(n−1)/n). gloo gets less on long paths:
it cuts the buffer into segments of at most 1 MiB, keeps two sends and two receives in flight,
and over TCP a send waits for the receiver's "ready" notification (gloo/allreduce.cc ``ring``,
tcp/pair.cc), so each WAN hop carries about 2 MiB per RTT plus the transfer. The prediction runs
wanprobe's step-by-step simulation of that schedule (models/collectives.gloo_ring_allreduce_s)
with each hop's own measured rate and one-way delay (half its handshake RTT).

gloo sends from rank r to rank r−1: the ring test must have measured those edges, i.e. been run
in the ranks' order reversed (``gloo_order``). The model sends each segment at once, as a
loss-based congestion control does (bench/validate_impact.py runs its hosts on reno): with bbr
the hosts pace gloo's application-limited bursts at a lagging bandwidth estimate, and the lab
measured gloo at 0.80 of this prediction (tests/test_ring_gloo.py's setting, bbr in the hosts).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from wanprobe.errors import UsageError
from wanprobe.models.collectives import bus_bandwidth_bps, gloo_ring_allreduce_s
from wanprobe.ring.model import RingResult
from wanprobe.ring.plan import ring_rates


def gloo_order(ranks: Sequence[str]) -> list[str]:
    """The ring-test order whose edges are gloo's hops (rank r → r−1) for ``ranks`` in rank
    order: rank 0, then n−1, n−2, ..., 1."""
    return [ranks[0], *reversed(ranks[1:])] if ranks else []


@dataclass(frozen=True)
class GlooPrediction:
    """A gloo all-reduce of ``size_bytes`` over the measured ring."""

    size_bytes: int
    ranks: tuple[str, ...]
    time_s: float
    busbw_bits_per_second: float
    ring_bits_per_second: float | None   # the network's bound: the slowest hop's rate
    notes: tuple[str, ...] = ()

    @property
    def gloo_share(self) -> float | None:
        """The share of the ring's rate gloo's schedule gets (1: the network is the limit)."""
        r = self.ring_bits_per_second
        return self.busbw_bits_per_second / r if r else None

    def to_json(self) -> dict[str, Any]:
        return {"size_bytes": self.size_bytes, "ranks": list(self.ranks), "time_s": self.time_s,
                "busbw_bits_per_second": self.busbw_bits_per_second,
                "ring_bits_per_second": self.ring_bits_per_second,
                "gloo_share": self.gloo_share, "notes": list(self.notes)}


def predict_gloo(result: RingResult, ranks: Sequence[str], size_bytes: int) -> GlooPrediction:
    """gloo's all-reduce time and bus bandwidth over the hops ``result`` measured together.

    Each host is its own site in the simulation: a hop's measured rate already holds whatever
    it shared with the ring's other edges (hops through one shared bottleneck get its total
    over their number, ``plan.ring_rates``). UsageError when a hop was not measured (the test ran
    in another order) or failed."""
    n = len(ranks)
    if n < 2 or len(set(ranks)) != n:
        raise UsageError("a gloo prediction needs two or more distinct ranks")
    edges = {(e.src, e.dst): e for e in result.edges}
    # a shared link's total split evenly among its edges, as the collective paces them
    shared = dict(zip(edges, ring_rates(result.edges, result.shared_bottlenecks,
                                        lambda e: e.bits_per_second), strict=True))
    links: dict[tuple[int, int], tuple[float, float]] = {}
    notes = []
    for r in range(n):
        src, dst = ranks[r], ranks[(r - 1) % n]
        edge = edges.get((src, dst))
        if edge is None:
            raise UsageError(f"the ring test did not measure {src} -> {dst}, a gloo hop: run it "
                             f"in the order {' '.join(gloo_order(ranks))}")
        rtt = result.rtt(src, dst) or result.rtt(dst, src)
        if edge.bits_per_second is None or not edge.bits_per_second > 0 or rtt is None:
            raise UsageError(f"the ring test has no rate or RTT for {src} -> {dst}")
        if edge.streams > 1:
            notes.append(f"{src} -> {dst} was measured with {edge.streams} streams; gloo's one "
                         "connection per hop may get less")
        links[(r, (r - 1) % n)] = (rtt / 2e3, shared[(src, dst)] or edge.bits_per_second)
    one_way, rate = next(iter(links.values()))
    time_s = gloo_ring_allreduce_s(size_bytes, list(range(n)), one_way, rate, links=links)
    ring = min(rate for _, rate in links.values())
    return GlooPrediction(int(size_bytes), tuple(ranks), time_s,
                          bus_bandwidth_bps(size_bytes, time_s, "all_reduce", n), ring, tuple(notes))
