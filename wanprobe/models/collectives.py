"""Cost of collectives: Hockney α–β models, hierarchical cross-site all-reduce, nccl-tests
bus bandwidth, and a step simulation of gloo's ring all-reduce over TCP.

Sources: Thakur, Rabenseifner, Gropp, "Optimization of Collective Communication Operations in
MPICH", IJHPCA 2005 (ring, binomial tree, halving-doubling); NVIDIA/nccl-tests
doc/PERFORMANCE.md (busbw); tcp-tuning.md §3.3 (hierarchical across D sites, derived);
gloo/allreduce.cc and gloo/transport/tcp/pair.cc (ring schedule, 1 MiB segments, two in
flight, send waits for the receiver's "recv ready" notification).
Units: sizes in bytes, rates in bits/s, α (per-message latency) in seconds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from wanprobe.errors import UsageError

GLOO_MAX_SEGMENT_BYTES = 1024 * 1024   # gloo AllreduceOptionsImpl::kMaxSegmentSize
MAX_SOCKETS = 64  # NCCL MAX_SOCKETS (src/transport/net_socket.cc); NTHREADS ≤ 16

BUSBW_FACTORS = {
    "allreduce": lambda n: 2.0 * (n - 1) / n,
    "reducescatter": lambda n: (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "sendrecv": lambda n: 1.0,
}


def _size(size_bytes: float) -> float:
    if not (math.isfinite(size_bytes) and size_bytes > 0):
        raise UsageError(f"message size must be > 0 bytes, got {size_bytes!r}")
    return float(size_bytes)


def _ranks(n: int, what: str = "ranks") -> int:
    if int(n) != n or n < 1:
        raise UsageError(f"number of {what} must be a whole number ≥ 1, got {n!r}")
    return int(n)


def _rate(rate_bps: float, what: str = "rate") -> float:
    if not (rate_bps > 0):
        raise UsageError(f"{what} must be > 0 bit/s, got {rate_bps!r}")
    return float(rate_bps)


def _alpha(alpha_s: float) -> float:
    if not (math.isfinite(alpha_s) and alpha_s >= 0):
        raise UsageError(f"latency α must be ≥ 0 s, got {alpha_s!r}")
    return float(alpha_s)


def _ceil_div(a: int, b: int) -> int:
    return (a + b - 1) // b


def _round_up(a: int, multiple: int) -> int:
    return _ceil_div(a, multiple) * multiple


def _time_sent(ledger: list[tuple[float, float]], position: float) -> float:
    """When byte ``position`` of a flow left, by linear interpolation of its (time, bytes) ledger."""
    if position <= 0:
        return -math.inf
    for (t0, b0), (t1, b1) in zip(ledger, ledger[1:], strict=False):
        if b0 < position <= b1:
            if t0 == -math.inf:
                return t1
            return t0 + (t1 - t0) * (position - b0) / (b1 - b0)
    return ledger[-1][0]


def ring_allreduce_s(size_bytes: float, n_ranks: int, alpha_s: float, rate_bps: float) -> float:
    """Ring (reduce-scatter + all-gather) all-reduce: ``2(N−1)/N · S·8/B + 2(N−1)·α``.

    Thakur et al. 2005; NCCL's ring. Each of the 2(N−1) steps moves S/N bytes over every link.
    4 GB over 1 Gbit/s, N = 2: 32 s + 2α.
    """
    s, n = _size(size_bytes), _ranks(n_ranks)
    if n == 1:
        return 0.0
    return 2.0 * (n - 1) / n * s * 8.0 / _rate(rate_bps) + 2.0 * (n - 1) * _alpha(alpha_s)


def tree_allreduce_s(size_bytes: float, n_ranks: int, alpha_s: float, rate_bps: float) -> float:
    """Binomial-tree reduce + broadcast: ``2⌈log2 N⌉ · (α + S·8/B)`` (Thakur et al. 2005).

    Latency-optimal, bandwidth-poor: the whole message crosses log2 N levels twice.
    """
    s, n = _size(size_bytes), _ranks(n_ranks)
    if n == 1:
        return 0.0
    return 2.0 * math.ceil(math.log2(n)) * (_alpha(alpha_s) + s * 8.0 / _rate(rate_bps))


def halving_doubling_allreduce_s(size_bytes: float, n_ranks: int, alpha_s: float,
                                 rate_bps: float) -> float:
    """Rabenseifner recursive halving/doubling: ``2⌈log2 N⌉·α + 2(N−1)/N · S·8/B``."""
    s, n = _size(size_bytes), _ranks(n_ranks)
    if n == 1:
        return 0.0
    return 2.0 * math.ceil(math.log2(n)) * _alpha(alpha_s) + 2.0 * (n - 1) / n * s * 8.0 / _rate(rate_bps)


def flat_ring_across_sites_s(size_bytes: float, sites: int, ranks_per_site: int,
                             wan_alpha_s: float, wan_flow_rate_bps: float,
                             local_rate_bps: float) -> float:
    """One ring over all D·G ranks, ranks grouped by site (NCCL builds flat rings, nccl#471).

    Every step moves S/N over every ring link at once, so each step waits for the slowest link,
    a WAN crossing carried by ONE TCP flow: ``2(N−1)/N · S·8/min(B_wan_flow, B_local)
    + 2(N−1)·α_wan``.
    """
    n = _ranks(sites, "sites") * _ranks(ranks_per_site, "ranks per site")
    if sites == 1:
        return ring_allreduce_s(size_bytes, n, 0.0, local_rate_bps)
    slowest = min(_rate(wan_flow_rate_bps, "WAN rate"), _rate(local_rate_bps, "local rate"))
    return ring_allreduce_s(size_bytes, n, wan_alpha_s, slowest)


def hierarchical_allreduce_s(size_bytes: float, sites: int, ranks_per_site: int,
                             wan_alpha_s: float, wan_rate_bps: float, local_rate_bps: float,
                             local_alpha_s: float = 0.0) -> float:
    """Hierarchical all-reduce across D sites with G ranks each (tcp-tuning.md §3.3, derived).

    1. intra-site reduce-scatter: ``(G−1)/G · S·8/B_local + (G−1)·α_local``;
    2. inter-site all-reduce of each S/G shard, G shards at once over G parallel flows whose
       aggregate rate is ``wan_rate_bps``: ``2(D−1)/D · S·8/B_wan + 2(D−1)·α_wan``
       (WAN bytes per site each way = 2(D−1)/D·S, independent of G);
    3. intra-site all-gather: same as 1.
    """
    s = _size(size_bytes)
    d, g = _ranks(sites, "sites"), _ranks(ranks_per_site, "ranks per site")
    intra = 0.0
    if g > 1:
        intra = (g - 1) / g * s * 8.0 / _rate(local_rate_bps, "local rate") + (g - 1) * _alpha(local_alpha_s)
    inter = 0.0
    if d > 1:
        inter = 2.0 * (d - 1) / d * s * 8.0 / _rate(wan_rate_bps, "WAN rate") + 2.0 * (d - 1) * _alpha(wan_alpha_s)
    return 2.0 * intra + inter


def busbw_factor(op: str, n_ranks: int) -> float:
    """nccl-tests bus-bandwidth factor: all-reduce 2(n−1)/n; reduce-scatter, all-gather and
    all-to-all (n−1)/n; broadcast, reduce and send/recv 1 (nccl-tests doc/PERFORMANCE.md)."""
    key = op.replace("_", "").replace("-", "").lower()
    if key not in BUSBW_FACTORS:
        raise UsageError(f"unknown collective {op!r} (use {', '.join(BUSBW_FACTORS)})")
    return BUSBW_FACTORS[key](_ranks(n_ranks))


def bus_bandwidth_bps(size_bytes: float, time_s: float, op: str, n_ranks: int) -> float:
    """nccl-tests busbw: ``algbw · factor`` with ``algbw = S·8 / t``."""
    if not time_s > 0:
        raise UsageError(f"time must be > 0 s, got {time_s!r}")
    return _size(size_bytes) * 8.0 / time_s * busbw_factor(op, n_ranks)


def gloo_ring_allreduce_s(size_bytes: float, site_of_rank: Sequence[int], one_way_s: float,
                          wan_rate_bps: float, local_rate_bps: float = 20e9, *,
                          wan_flow_rate_bps: float | None = None,
                          element_bytes: int = 4,
                          max_segment_bytes: int = GLOO_MAX_SEGMENT_BYTES,
                          local_one_way_s: float = 20e-6, repeats: int = 1,
                          links: Mapping[tuple[int, int], tuple[float, float]] | None = None
                          ) -> float:
    """Simulate gloo's ring all-reduce (gloo/allreduce.cc ``ring``) step by step.

    What gloo does: rank r sends to r−1 and receives from r+1; the buffer is cut into
    ``numSegments = roundUp(max(ceil(S/1MiB), 2N), N)`` segments; reduce-scatter then
    all-gather, each ``numSegments − numSegments/N`` iterations, with two sends and two
    receives in flight (iteration i waits for the operations of i−2). Over TCP a send starts
    only when the receiver's "recv ready" notification has arrived (tcp/pair.cc), so a WAN hop
    costs a one-way delay for the notification plus one for the data.

    Links: a hop between ranks of different sites uses the directed WAN link between those
    sites (rate ``wan_rate_bps`` per direction, shared FIFO by all ring hops crossing it in
    that direction; each flow at most ``wan_flow_rate_bps``, e.g. its window-limited rate);
    hops inside a site use ``local_rate_bps`` and ``local_one_way_s``. Returns the time until
    the last rank finishes, all ranks starting together; with ``repeats`` > 1, the mean time per
    operation of that many back-to-back all-reduces, each rank starting the next one as soon as
    it finished the last (a training loop's steady state). ``links``: per directed site pair
    (a, b), its own (one-way delay s, rate bit/s), where sites differ (three sites at 35, 100
    and 130 ms, as a ring test measured them: ring/predict.py); other pairs take the scalars.
    The link and flow state lives in ``_GlooRing``, one phase at a time.
    """
    s = _size(size_bytes)
    sites = list(site_of_rank)
    n = len(sites)
    if n < 1:
        raise UsageError("need at least one rank")
    if n == 1:
        return 0.0
    _rate(wan_rate_bps, "WAN rate")
    _rate(local_rate_bps, "local rate")
    flow_cap = _rate(wan_flow_rate_bps, "WAN flow rate") if wan_flow_rate_bps else math.inf
    elements = max(1, int(math.ceil(s / element_bytes)))
    total = elements * element_bytes
    max_seg = element_bytes * max(1, max_segment_bytes // element_bytes)
    num_segments = _round_up(max(_ceil_div(total, max_seg), 2 * n), n)
    seg = _round_up(_ceil_div(total, num_segments), element_bytes)
    if int(repeats) != repeats or repeats < 1:
        raise UsageError(f"repeats must be a whole number ≥ 1, got {repeats!r}")
    ring = _GlooRing(sites, total, seg, num_segments, one_way_s=one_way_s,
                     wan_rate_bps=wan_rate_bps, local_rate_bps=local_rate_bps,
                     local_one_way_s=local_one_way_s, flow_cap=flow_cap,
                     links={k: (float(d), _rate(r, "link rate"))
                            for k, (d, r) in (links or {}).items()})
    start = [0.0] * n  # time each rank is free to run its loop
    for phase in range(2 * int(repeats)):  # reduce-scatter, then all-gather, per operation
        # segment indices sent / received at iteration i (gloo computeReduceScatterOffsets /
        # computeAllgatherOffsets): reduce-scatter starts one segment block further on
        start = ring.phase(start, send_base=1 if phase % 2 == 0 else 0)
    return max(start) / repeats


class _GlooRing:
    """The state ``gloo_ring_allreduce_s`` carries from one segment to the next: the segment
    geometry, and when each directed WAN link and each rank-to-rank TCP flow is next free."""

    def __init__(self, sites: list[int], total: int, seg: int, num_segments: int, *,
                 one_way_s: float, wan_rate_bps: float, local_rate_bps: float,
                 local_one_way_s: float, flow_cap: float,
                 links: Mapping[tuple[int, int], tuple[float, float]]) -> None:
        self.sites, self.n, self.total, self.seg = sites, len(sites), total, seg
        self.links = links
        self.one_way_s, self.wan_rate_bps, self.flow_cap = one_way_s, wan_rate_bps, flow_cap
        self.local_rate_bps, self.local_one_way_s = local_rate_bps, local_one_way_s
        self.iters = num_segments - num_segments // self.n
        self.spr = num_segments // self.n   # segments per rank
        self.span = num_segments * seg
        self.link_free: dict[tuple[int, int], float] = {}  # directed WAN link between two sites
        self.flow_free: dict[tuple[int, int], float] = {}  # one TCP connection (rank → rank)
        # per WAN flow: (time, bytes sent so far)
        self.ledgers: dict[tuple[int, int], list[tuple[float, float]]] = {}

    def hop(self, a: int, b: int) -> tuple[float, float, tuple[int, int] | None]:
        """(one-way delay, rate bit/s, shared link key) of the hop a → b."""
        if self.sites[a] == self.sites[b]:
            return self.local_one_way_s, self.local_rate_bps, None
        key = (self.sites[a], self.sites[b])
        one_way, rate = self.links.get(key, (self.one_way_s, self.wan_rate_bps))
        return one_way, rate, key

    def length(self, offset_segments: int) -> int:
        """Bytes of the segment at this index (gloo: may be short, empty or negative)."""
        return min(self.seg, self.total - (offset_segments * self.seg) % self.span)

    def phase(self, start: list[float], send_base: int) -> list[float]:
        """One reduce-scatter or all-gather: each rank's start time in, its finish time out.

        Iteration by iteration: post times depend only on completions two iterations ago;
        empty segments are neither sent nor waited for."""
        n, iters, never = self.n, self.iters, -math.inf
        post = [[0.0] * iters for _ in range(n)]
        recv_done = [[never] * iters for _ in range(n)]
        send_done = [[never] * iters for _ in range(n)]
        for i in range(iters):
            for r in range(n):
                t = start[r] if i == 0 else post[r][i - 1]
                if i >= 2:
                    t = max(t, recv_done[r][i - 2], send_done[r][i - 2])
                post[r][i] = t
            for r in range(n):
                dst = (r - 1) % n  # gloo sends to rank - 1
                nbytes = self.length((r + send_base) * self.spr + i)
                if nbytes <= 0:
                    continue
                notify_delay, _, _ = self.hop(dst, r)
                ready = max(post[r][i], post[dst][i] + notify_delay)
                begin, end = self._send(r, dst, nbytes, ready)
                send_done[r][i] = begin
                recv_done[dst][i] = end + self.hop(r, dst)[0]
        last = range(max(0, iters - 2), iters)
        return [max([post[r][iters - 1]] + [recv_done[r][i] for i in last]
                    + [send_done[r][i] for i in last]) for r in range(n)]

    def _send(self, r: int, dst: int, nbytes: int, ready: float) -> tuple[float, float]:
        """(begin, end) of sending ``nbytes`` r → dst once both ends are ready at ``ready``: after
        the flow's previous segment, FIFO on a shared WAN link, and at most a window per RTT."""
        _, rate, key = self.hop(r, dst)
        begin = max(ready, self.flow_free.get((r, dst), 0.0))
        end = begin + nbytes * 8.0 / rate
        if key is not None:
            begin = max(begin, self.link_free.get(key, 0.0))
            end = begin + nbytes * 8.0 / rate
            self.link_free[key] = end
            if self.flow_cap < math.inf:
                end = self._window_limited(self.ledgers.setdefault((r, dst), [(-math.inf, 0.0)]),
                                           nbytes, begin, end, self.hop(r, dst)[0])
        self.flow_free[(r, dst)] = end
        return begin, end

    def _window_limited(self, ledger: list[tuple[float, float]], nbytes: int, begin: float,
                        end: float, one_way_s: float) -> float:
        """When the last byte leaves on a window-limited flow (window = cap · RTT): byte x leaves
        no earlier than one RTT after byte x − window left."""
        sent = ledger[-1][1]
        window_bytes = self.flow_cap * 2.0 * one_way_s / 8.0
        # the last byte leaves k round trips after byte sent + nbytes − k·window
        flights = max(1, math.ceil(nbytes / window_bytes))
        base = sent + nbytes - flights * window_bytes
        first = max(begin, _time_sent(ledger, base) + 2.0 * one_way_s)
        end = max(end, first + (flights - 1) * 2.0 * one_way_s)
        ledger.append((end, sent + nbytes))
        return end


def split_sockets(n: int) -> tuple[int, int]:
    """NCCL's socket settings for ``n`` sockets per peer: NCCL_SOCKET_NTHREADS ≤ 16 helper
    threads × NCCL_NSOCKS_PERTHREAD sockets ≥ n, the product ≤ MAX_SOCKETS."""
    threads = min(16, max(1, math.ceil(n / 4)))
    per = min(MAX_SOCKETS // threads, math.ceil(n / threads))
    return threads, per
