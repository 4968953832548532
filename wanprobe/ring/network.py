"""A measured ring as the network a training plan runs on (``wanprobe impact --ring FILE``).

Two readings of one ``RingResult``:

* ``path_of``: the WAN path NCCL's collectives of ``models/impact.py`` assume — the slowest
  WAN edge's handshake RTT (a median, standing in for the p99 the model wants: noted), its
  link at the ring's rate with every edge busy (``ring_bits_per_second``, shared bottlenecks
  already counted), and one flow at the slowest WAN edge's slowest stream;
* ``GlooRingNetwork``: a ring all-reduce of any size as gloo runs it over the measured hops
  (``predict.predict_gloo``: gloo's segment schedule over each hop's rate and RTT) — what
  torch.distributed's CPU backend does, and what the lab validates a plan against.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from wanprobe.errors import UsageError
from wanprobe.models.impact import Path
from wanprobe.ring.model import RingResult
from wanprobe.ring.predict import predict_gloo


def path_of(result: RingResult) -> Path:
    """The WAN path of a measured ring (module docstring). UsageError when the ring has no WAN
    edge (one site) or an edge without a rate (it failed)."""
    wan = [e for e in result.edges if e.wan]
    if not wan:
        raise UsageError("the ring test found one site (no edge crosses between sites): there "
                         "is no WAN path to plan on")
    ring = result.ring_bits_per_second
    rtts = [result.rtt(e.src, e.dst) or result.rtt(e.dst, e.src) for e in wan]
    flows = [e.min_stream_bits_per_second for e in wan]
    if ring is None or any(r is None for r in rtts) or any(f is None for f in flows):
        raise UsageError("the ring test has an edge without a rate or an RTT (it failed): "
                         "run it again before planning on it")
    rtt_ms = max(r for r in rtts if r is not None)
    flow = min(f for f in flows if f is not None)
    return Path(rtt_s=rtt_ms / 1e3, link_bps=ring, flow_rate_bps=min(flow, ring))


@dataclass(frozen=True)
class GlooRingNetwork:
    """``strategy.Network`` for gloo's ring all-reduce over the measured hops, one rank per
    host in ``ranks`` order. The hosts are as measured: there is no tuned variant, and gloo
    has no hierarchical or all-gather plan here."""

    result: RingResult
    ranks: Sequence[str]

    def allreduce(self, size_bytes: float, topology: str, tuned: bool) -> tuple[float, float]:
        if tuned or topology != "flat":
            raise UsageError("a gloo ring measured as it is predicts only the flat ring on "
                             "the hosts as they are")
        p = predict_gloo(self.result, self.ranks, max(1, round(size_bytes)))
        return p.time_s, p.ring_bits_per_second or 0.0

    def allgather(self, bytes_per_site: float, topology: str,
                  tuned: bool) -> tuple[float, float]:
        raise UsageError("top-k compression is not predicted over a gloo ring")
