"""What limited a transfer: a pure decision from the sender's TCP_INFO and CPU samples.

Models (Mathis et al., CCR 27(3) 1997; ``struct tcp_info`` in include/uapi/linux/tcp.h):
- Mathis et al. 1997: rate ≤ (MSS/RTT)·C/√p, C = √(3/2) ≈ 1.22, p = bytes_retrans/bytes_sent.
- BDP = rate × min RTT; a single stream needs a socket buffer of about 2×BDP, because the
  kernel advertises only part of the buffer as window (tcp_adv_win_scale / scaling_ratio).
- rwnd_limited/busy_time and sndbuf_limited/busy_time are the kernel's own account of the time
  the sender was stopped by the peer's window or its own send buffer (tcp_chrono, 4.10+).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from wanprobe.json_fields import Decoded, open_object
from wanprobe.models.bdp import bdp_bytes as _bdp_bytes
from wanprobe.models.bdp import buffer_needed_bytes
from wanprobe.models.tcp_rate import mathis_rate_bps
from wanprobe.units import format_rate

WINDOW_SHARE_MIN = 0.2       # share of busy time blocked by a buffer to call it the limit
CPU_BUSY_MIN = 0.9           # a data worker on (or waiting for) a CPU ≥ 90 % of the test
CORES_BUSY_MIN = 90.0        # the side's cores ≥ 90 % busy (anyone's work) over the test ...
CORES_BUSY_DEMAND_MIN = 0.5  # ... while its workers wanted a CPU at least half the time
LOSS_EXPLAINS_FACTOR = 3.0   # steady rate ≤ 3 × Mathis: loss explains the rate (random loss
                             # is not periodic, and CUBIC sits above Reno; same order suffices)
WINDOW_REACHED = 0.7         # per-stream rate ≥ 70 % of what the peer's window allows
STANDING_QUEUE_MIN = 0.5     # srtt ≥ 1.5 × min_rtt: a saturated bottleneck holds a queue


def bdp_bytes(rate_bps: float, rtt_s: float) -> int | None:
    """Bandwidth-delay product in whole bytes (models.bdp), None when rate or RTT is unknown."""
    if not rate_bps or not rtt_s or rate_bps <= 0 or rtt_s <= 0:
        return None
    return int(round(_bdp_bytes(rate_bps, rtt_s)))


def single_stream_buffer_bytes(rate_bps: float, rtt_s: float) -> int | None:
    """Socket buffer one stream needs for ``rate_bps`` at ``rtt_s`` (about 2×BDP; models.bdp)."""
    if not rate_bps or not rtt_s or rate_bps <= 0 or rtt_s <= 0:
        return None
    return buffer_needed_bytes(rate_bps, rtt_s)


@dataclass(frozen=True)
class VerdictInput:
    """Aggregates over the run's sending sockets (sums over streams unless noted)."""

    goodput_bps: float
    streams: int
    steady_goodput_bps: float | None = None  # median over full intervals (past slow start)
    busy_time_ms: float | None = None
    rwnd_limited_ms: float | None = None
    sndbuf_limited_ms: float | None = None
    bytes_sent: int | None = None
    bytes_retrans: int | None = None
    min_rtt_ms: float | None = None          # minimum over streams
    srtt_ms: float | None = None             # mean smoothed RTT over intervals and streams
    mss_bytes: int | None = None
    delivery_rate_max_bps: float | None = None  # max over intervals of the streams' sum
    window_bytes: int | None = None          # requested --window
    snd_wnd_max_bytes: int | None = None     # largest receive window the peer advertised
    cwnd_max_bytes: int | None = None        # largest congestion window (cwnd × MSS)
    sender_thread_busy: float | None = None  # max data-worker CPU share on the sending host
    receiver_thread_busy: float | None = None
    # max over the side's data workers of (time on a CPU + time runnable but waiting for one)
    # / wall time (/proc/<pid>/schedstat): near 1 when the worker always had work and only a
    # CPU was missing, also when it shared its core with other load
    sender_cpu_demand: float | None = None
    receiver_cpu_demand: float | None = None
    # mean busy % over the test of the cores the side's workers may run on (/proc/stat)
    sender_cores_busy_percent: float | None = None
    receiver_cores_busy_percent: float | None = None
    sender_core_busy_percent: float | None = None
    receiver_core_busy_percent: float | None = None
    pacing_rate_bps: float | None = None     # requested per-stream pacing cap


@dataclass(frozen=True)
class Verdict(Decoded, json_name="limited_by", json_parts={"evidence": open_object}):
    verdict: str
    evidence: dict = field(default_factory=dict)
    summary: str = ""

    def to_json(self) -> dict:
        return {"verdict": self.verdict, "summary": self.summary, "evidence": self.evidence}


def _share(part: float | None, whole: float | None) -> float | None:
    if part is None or not whole:
        return None
    return min(part / whole, 1.0)


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None or not math.isfinite(x) else round(x, nd)


def _host_cpu(v: VerdictInput, common: dict) -> Verdict | None:
    """``host_cpu`` when the sending or receiving side's data path was near 100 % of its cores:
    a worker on a CPU or runnable and waiting for one (a core shared with other load) for
    CPU_BUSY_MIN of the test; or the side's cores busy CORES_BUSY_MIN % over the test while its
    workers wanted a CPU half the time (the kernel's softirq work for them, run in ksoftirqd
    under load, counts on the cores but not in the workers). The tool, not the path, set the
    rate then: never ``network``."""
    def own(busy, demand):
        return max(busy or 0.0, demand or 0.0)

    def bound(share, cores):
        return share >= CPU_BUSY_MIN or ((cores or 0.0) >= CORES_BUSY_MIN
                                         and share >= CORES_BUSY_DEMAND_MIN)

    shares = {"sender": own(v.sender_thread_busy, v.sender_cpu_demand),
              "receiver": own(v.receiver_thread_busy, v.receiver_cpu_demand)}
    cores = {"sender": v.sender_cores_busy_percent, "receiver": v.receiver_cores_busy_percent}
    bound_sides = [k for k in shares if bound(shares[k], cores[k])]
    if not bound_sides:
        return None
    side = max(bound_sides, key=lambda k: shares[k])
    return Verdict("host_cpu", {
        **common, "side": side,
        "sender_thread_busy_ratio": _r(v.sender_thread_busy, 3),
        "receiver_thread_busy_ratio": _r(v.receiver_thread_busy, 3),
        "sender_cpu_demand_ratio": _r(v.sender_cpu_demand, 3),
        "receiver_cpu_demand_ratio": _r(v.receiver_cpu_demand, 3),
        "sender_cores_busy_percent": _r(v.sender_cores_busy_percent, 1),
        "receiver_cores_busy_percent": _r(v.receiver_cores_busy_percent, 1),
        "sender_core_busy_max_percent": v.sender_core_busy_percent,
        "receiver_core_busy_max_percent": v.receiver_core_busy_percent},
        f"the {side}'s data path was CPU-bound (its workers on or waiting for a CPU, its "
        "cores busy): the host, not the path, set the rate")


def decide(v: VerdictInput) -> Verdict:
    """Pick the limit with the strongest kernel evidence, in this order: host_cpu, receive window
    (rwnd-limited share, or the rate reaches snd_wnd/RTT with cwnd above it), send buffer,
    pacing, congestion (loss explains the rate: Mathis), network (none of the above)."""
    rtt_s = (v.min_rtt_ms or 0) / 1000.0
    bottleneck_bps = max(v.goodput_bps, v.delivery_rate_max_bps or 0.0)
    bdp = bdp_bytes(bottleneck_bps, rtt_s)
    per_stream_bps = v.goodput_bps / max(v.streams, 1)
    common = {
        "goodput_bits_per_second": _r(v.goodput_bps, 0),
        "min_rtt_ms": _r(v.min_rtt_ms, 3), "srtt_ms": _r(v.srtt_ms, 3),
        "delivery_rate_max_bits_per_second": _r(v.delivery_rate_max_bps, 0),
        "bdp_bytes": bdp,
    }
    return (_host_cpu(v, common) or _window(v, common, bdp, per_stream_bps)
            or _pacing(v, common, per_stream_bps)
            or _loss_or_network(v, common, rtt_s, per_stream_bps))


def _window(v: VerdictInput, common: dict, bdp: int | None,
            per_stream_bps: float) -> Verdict | None:
    """receive_window or send_buffer, from the limited-time shares and the peer's window."""
    rwnd_share = _share(v.rwnd_limited_ms, v.busy_time_ms)
    sndbuf_share = _share(v.sndbuf_limited_ms, v.busy_time_ms)
    # One window per round trip: rate ≤ snd_wnd·8/srtt. When the stream reaches that and cwnd
    # is larger, the peer's window (not congestion control) sets the rate.
    rtt_now_s = (v.srtt_ms or v.min_rtt_ms or 0) / 1000.0
    window_allows = (v.snd_wnd_max_bytes * 8.0 / rtt_now_s
                     if v.snd_wnd_max_bytes and rtt_now_s else None)
    reaches_window = (window_allows is not None and per_stream_bps >= WINDOW_REACHED * window_allows
                      and (v.cwnd_max_bytes or 0) >= v.snd_wnd_max_bytes)
    window_evidence = {
        "rwnd_limited_share": _r(rwnd_share), "sndbuf_limited_share": _r(sndbuf_share),
        "window_bytes": v.window_bytes, "peer_window_max_bytes": v.snd_wnd_max_bytes,
        "cwnd_max_bytes": v.cwnd_max_bytes,
        "window_allows_per_stream_bits_per_second": _r(window_allows, 0),
        "per_stream_bits_per_second": _r(per_stream_bps, 0),
        "window_to_bdp_ratio": _r(v.snd_wnd_max_bytes / bdp
                                  if v.snd_wnd_max_bytes and bdp else None)}
    if (((rwnd_share or 0) >= WINDOW_SHARE_MIN and (rwnd_share or 0) >= (sndbuf_share or 0))
            or (reaches_window and (sndbuf_share or 0) < WINDOW_SHARE_MIN + (rwnd_share or 0))):
        return Verdict("receive_window", {**common, **window_evidence},
                       f"the peer's window ({v.snd_wnd_max_bytes} B) allows "
                       f"{format_rate(window_allows or 0)} per stream at the measured RTT; "
                       f"rwnd-limited {rwnd_share or 0:.0%} of busy time")
    if (sndbuf_share or 0) >= WINDOW_SHARE_MIN:
        return Verdict("send_buffer", {**common, **window_evidence},
                       f"the send buffer ran dry {sndbuf_share:.0%} of the sender's busy time")
    return None


def _pacing(v: VerdictInput, common: dict, per_stream_bps: float) -> Verdict | None:
    if v.pacing_rate_bps and per_stream_bps >= 0.85 * v.pacing_rate_bps:
        return Verdict("pacing", {**common, "pacing_rate_bits_per_second": v.pacing_rate_bps,
                                  "per_stream_bits_per_second": _r(per_stream_bps, 0)},
                       "the requested pacing rate capped each stream")
    return None


def _loss_or_network(v: VerdictInput, common: dict, rtt_s: float,
                     per_stream_bps: float) -> Verdict:
    """congestion when the loss bound (Mathis) explains the steady rate and no standing queue
    does; else network."""
    loss = (v.bytes_retrans / v.bytes_sent) if v.bytes_sent and v.bytes_retrans is not None else None
    mathis = (mathis_rate_bps(v.mss_bytes, rtt_s, loss)
              if v.mss_bytes and rtt_s and loss else None)
    queue = ((v.srtt_ms / v.min_rtt_ms - 1.0)
             if v.srtt_ms and v.min_rtt_ms else None)
    loss_evidence = {
        "retransmit_rate": _r(loss, 6), "bytes_retrans": v.bytes_retrans,
        "bytes_sent": v.bytes_sent, "mss_bytes": v.mss_bytes,
        "mathis_bound_bits_per_second": _r(mathis, 0),
        "mathis_formula": "rate <= MSS*8/min_rtt * 1.22/sqrt(p)",
        "per_stream_bits_per_second": _r(per_stream_bps, 0),
        "queueing_delay_share": _r(queue),
    }
    # Judge loss against the steady rate: the slow start before the first loss lets a short
    # test's average beat the steady-state bound.
    steady_per_stream = (v.steady_goodput_bps / max(v.streams, 1)
                         if v.steady_goodput_bps else per_stream_bps)
    loss_evidence["steady_per_stream_bits_per_second"] = _r(steady_per_stream, 0)
    if (mathis is not None and steady_per_stream <= LOSS_EXPLAINS_FACTOR * mathis
            and (queue is None or queue < STANDING_QUEUE_MIN)):
        return Verdict("congestion", {**common, **loss_evidence},
                       f"retransmit rate {loss:.3%} caps a Reno-like stream near "
                       f"{format_rate(mathis)} at {v.min_rtt_ms:.1f} ms (Mathis)")
    ratio = (v.goodput_bps / v.delivery_rate_max_bps) if v.delivery_rate_max_bps else None
    return Verdict("network", {**common, **loss_evidence,
                               "rwnd_limited_share": _r(_share(v.rwnd_limited_ms, v.busy_time_ms)),
                               "sndbuf_limited_share": _r(_share(v.sndbuf_limited_ms,
                                                                 v.busy_time_ms)),
                               "goodput_to_delivery_rate_ratio": _r(ratio)},
                   "no host limit found: the path's bottleneck set the rate")
