"""What keeps a tuned transfer below the path's capacity: a pure judgement of one throughput
result (its JSON) against the capacity measured in the same run (issue 20).

"The path is full" only at ≥ FULL_SHARE of the capacity. Below it, the limit is named from the
evidence the test carries, in this order, each with the figures it rests on:

- ``host``: a data thread used ≥ 90 % of a core (the throughput verdict ``cpu``, with its side),
  the sender process left the socket without data (TCP_INFO ``delivery_rate_app_limited``, set
  by tcp_rate.c when the sender ran out of data within the last round trip, in at least half of
  the samples), or a pacing cap;
- ``window``: the receiver's window or this host's send buffer (the kernel's chrono counters
  ``rwnd_limited``/``sndbuf_limited`` as a share of busy time, tcp_chrono in net/ipv4/tcp_output.c);
- ``cross_traffic``: a standing queue at the bottleneck (smoothed RTT ≥ 1.5 × min RTT, and at
  least 1 ms) while this flow carried under FULL_SHARE of the capacity. A queue means the
  bottleneck sends all the time; if not for this flow, then for someone else's traffic;
- ``congestion_control``: loss explains the rate for a loss-based control (Mathis et al. 1997,
  the throughput verdict ``congestion``), or the congestion window or the pacing rate the control
  chose stayed below what the capacity needs (a clamped cwnd, a bandwidth estimate that never
  reached the path, e.g. BBR leaving STARTUP early);
- ``host`` / ``cpu_steal``: the hypervisor took ≥ STEAL_PERCENT of this virtual machine's CPU
  time during the test (/proc/stat steal, at either end). Checked after a CPU verdict, a window
  and a cwnd clamp (each explains the rate by itself) and before the queue, loss, sender and
  pacing evidence that steal itself causes;
- ``unexplained``: none of the above; said as such, with the figures.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from wanprobe.throughput.result import STEAL_PERCENT  # the threshold, in one place
from wanprobe.units import format_rate

FULL_SHARE = 0.9            # issue 20: "the path is full" only at >= 90 % of the capacity
APP_LIMITED_SHARE = 0.5     # samples in which the sender had run out of data
QUEUE_SHARE = 0.5           # srtt >= 1.5 x min RTT: a standing queue (as verdict.py)
QUEUE_MIN_MS = 1.0          # and at least 1 ms of it: host scheduling noise on short paths
RETRANS_EXPLAINS = 0.05     # retransmissions would eat the missing share themselves
CC_BOUND_SHARE = 0.8        # the rate reaches 80 % of what cwnd or pacing allowed

NEXT_STEP = {
    "full": "none: the path is full; what remains is the network's own capacity and loss",
    "receive_window": ("the receiver's window still limits: diagnose again and apply "
                       "`wanprobe tune plan --host peer` on the receiving host (its tcp_rmem), "
                       "or spread the transfer over parallel streams"),
    "send_buffer": ("this host's send buffer still limits: diagnose again and raise tcp_wmem "
                    "max here (`wanprobe tune plan --host local`)"),
    "cpu_steal": ("this virtual machine lost CPU time to its hypervisor (steal) during the "
                  "test: the figure is the host's, not the path's; measure again when the host "
                  "is quieter, or on dedicated cores or bare metal"),
    "cpu": ("a host's CPU set the rate (the side is named): give the test more cores "
            "(--cpus) or move other load off them, then measure again"),
    "sender_process": ("the sending process did not keep the socket full: look at its CPU "
                       "share and what else runs on this host, or use more streams"),
    "pacing": "a pacing rate below the path limits: remove or raise it",
    "cross_traffic": ("other traffic shares the bottleneck: measure again at a quieter time, "
                      "ask the path owner, or use parallel streams for a larger share"),
    "loss": ("loss on the path caps a loss-based congestion control: use bbr (with fq pacing "
             "where available) and ask the path owner about the loss"),
    "cwnd": ("the congestion window stopped short of the path's BDP: look for a cwnd clamp "
             "(`ip route show` metrics `lock cwnd`) or a congestion control that holds it"),
    "cc_rate": ("the congestion control's rate stayed below the capacity: a longer transfer "
                "gives it time to probe up; parallel streams reach the capacity sooner"),
    "unexplained": ("no host, window, queue or loss evidence explains the gap: run `wanprobe "
                    "diagnose --full` and compare with iperf3 on the same path"),
    "unknown": "the capacity could not be measured, so whether the path is full is unknown",
}


@dataclass(frozen=True)
class Limit:
    """``limit``: full | host | window | cross_traffic | congestion_control | unexplained |
    unknown; ``cause``: the NEXT_STEP key; ``evidence``: the figures the verdict rests on."""

    limit: str
    cause: str
    summary: str
    evidence: dict = field(default_factory=dict)

    @property
    def next_step(self) -> str:
        return NEXT_STEP[self.cause]


def kept_intervals(intervals: Sequence[Mapping[str, Any]], omit_s: float) -> list[Mapping]:
    """The intervals that start at or after ``omit_s`` (iperf3 --omit), partial ones left out."""
    return [iv for iv in intervals
            if iv.get("start_s", 0.0) >= omit_s - 1e-9 and not iv.get("partial")]


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _per_interval_sums(kept: list[Mapping], key: str) -> list[float]:
    out = []
    for iv in kept:
        vals = [(r.get("tcp_info") or {}).get(key) for r in iv.get("streams", [])]
        vals = [v for v in vals if v is not None]
        if vals:
            out.append(float(sum(vals)))
    return out


def evidence_of(result: Mapping[str, Any], omit_s: float) -> dict[str, Any]:
    """The figures of one throughput result (JSON) after its ramp-up: sender TCP_INFO over the
    kept intervals, the CPU samples, the verdict's own evidence (chrono shares, retransmit
    rate, queueing delay)."""
    kept = kept_intervals(result.get("intervals") or [], omit_s)
    infos = [r["tcp_info"] for iv in kept for r in iv.get("streams", []) if r.get("tcp_info")]
    cwnds = []
    for iv in kept:
        b = [(r["tcp_info"].get("cwnd_packets") or 0) * (r["tcp_info"].get("snd_mss_bytes") or 0)
             for r in iv.get("streams", []) if r.get("tcp_info")]
        if b:
            cwnds.append(sum(b))
    flags = [i["delivery_rate_app_limited"] for i in infos
             if i.get("delivery_rate_app_limited") is not None]
    lb = result.get("limited_by") or {}
    ev = lb.get("evidence") or {}
    cpu = result.get("cpu") or {}
    srtt = _median([i["rtt_ms"] for i in infos if i.get("rtt_ms")])
    return {
        "cc": result.get("cc"), "streams": len({s.get("stream_id") for s in
                                                result.get("streams") or []}) or 1,
        "throughput_verdict": lb.get("verdict"), "side": ev.get("side"),
        "throughput_summary": lb.get("summary"),
        "min_rtt_ms": result.get("min_rtt_ms") or ev.get("min_rtt_ms"),
        "srtt_ms": srtt,
        "pacing_rate_bits_per_second": _median(_per_interval_sums(
            kept, "pacing_rate_bits_per_second")),
        "delivery_rate_max_bits_per_second": max(_per_interval_sums(
            kept, "delivery_rate_bits_per_second"), default=None),
        "cwnd_max_bytes": max(cwnds, default=None),
        "app_limited_share": sum(flags) / len(flags) if flags else None,
        "rwnd_limited_share": ev.get("rwnd_limited_share"),
        "sndbuf_limited_share": ev.get("sndbuf_limited_share"),
        "retransmit_rate": ev.get("retransmit_rate"),
        "mathis_bound_bits_per_second": ev.get("mathis_bound_bits_per_second"),
        "steal_percent": max((v for v in (ev.get("sender_steal_percent"),
                                          ev.get("receiver_steal_percent"))
                              if isinstance(v, int | float)), default=None),
        "sender_thread_busy_ratio": cpu.get("sender_thread_busy_ratio"),
        "receiver_thread_busy_ratio": cpu.get("receiver_thread_busy_ratio"),
        "samples": len(infos),
    }


def _host_or_window(ev: Mapping[str, Any], base: dict) -> Limit | None:
    verdict = ev.get("throughput_verdict")
    if verdict in ("cpu", "host_cpu"):  # the throughput verdict's own words and side
        side = ev.get("side") or "sender"
        return Limit("host", "cpu", ev.get("throughput_summary") or f"a CPU on the {side} is "
                     "saturated", {**base, "side": side, "thread_busy_ratio":
                                   ev.get(f"{side}_thread_busy_ratio")})
    if verdict in ("receive_window", "send_buffer"):
        key = "rwnd_limited_share" if verdict == "receive_window" else "sndbuf_limited_share"
        share = ev.get(key)
        whose = "the receiver's window" if verdict == "receive_window" else "the send buffer"
        return Limit("window", verdict, f"{whose} stopped the sender "
                     f"{share or 0:.0%} of its busy time", {**base, key: share})
    if verdict == "pacing":
        return Limit("host", "pacing", "the requested pacing rate capped each stream", base)
    return None


def _steal(ev: Mapping[str, Any], base: dict) -> Limit | None:
    steal = ev.get("steal_percent")
    if steal is not None and steal >= STEAL_PERCENT:
        return Limit("host", "cpu_steal", f"the hypervisor took {steal:.1f} % of this host's CPU "
                     "time during the test (/proc/stat steal): the host, not the path, fell "
                     "short", {**base, "steal_percent": steal})
    return None


def _queue_or_loss(ev: Mapping[str, Any], base: dict) -> Limit | None:
    srtt, min_rtt = ev.get("srtt_ms"), ev.get("min_rtt_ms")
    retrans = ev.get("retransmit_rate")
    if srtt and min_rtt and (retrans or 0) < RETRANS_EXPLAINS:
        queue_ms = srtt - min_rtt
        if queue_ms >= max(QUEUE_SHARE * min_rtt, QUEUE_MIN_MS):
            return Limit("cross_traffic", "cross_traffic",
                         f"a standing queue of {queue_ms:.1f} ms (smoothed RTT {srtt:.1f} ms, "
                         f"min {min_rtt:.1f} ms) while this flow carried "
                         f"{base['share_of_capacity']:.0%} of the capacity: the bottleneck "
                         "was busy with other traffic", {**base, "queue_ms": round(queue_ms, 3),
                                                        "srtt_ms": srtt, "min_rtt_ms": min_rtt})
    if ev.get("throughput_verdict") == "congestion":
        return Limit("congestion_control", "loss",
                     f"retransmit rate {retrans or 0:.3%} holds {ev.get('cc') or 'the'} "
                     f"congestion control near {format_rate(ev.get('mathis_bound_bits_per_second') or 0)} "
                     "(Mathis)", {**base, "retransmit_rate": retrans,
                                  "mathis_bound_bits_per_second":
                                  ev.get("mathis_bound_bits_per_second")})
    return None


def _sender_or_cc(ev: Mapping[str, Any], base: dict, capacity_bps: float,
                  rate_bps: float) -> Limit | None:
    app = ev.get("app_limited_share")
    if app is not None and app >= APP_LIMITED_SHARE:
        return Limit("host", "sender_process", f"the sender had run out of data in {app:.0%} "
                     "of the TCP_INFO samples (delivery_rate_app_limited)",
                     {**base, "app_limited_share": round(app, 3)})
    return _pacing(ev, base, capacity_bps)  # a cwnd clamp was ruled out before the steal


def _cwnd(ev: Mapping[str, Any], base: dict, capacity_bps: float,
          rate_bps: float) -> Limit | None:
    """A congestion window that carries the rate it got (≥ 80 %): it explains the rate exactly,
    so it ranks above CPU steal."""
    cwnd, srtt = ev.get("cwnd_max_bytes"), ev.get("srtt_ms")
    cwnd_bps = cwnd * 8 / (srtt / 1e3) if cwnd and srtt else None
    if cwnd_bps and cwnd_bps < FULL_SHARE * capacity_bps and rate_bps >= CC_BOUND_SHARE * cwnd_bps:
        return Limit("congestion_control", "cwnd",
                     f"the congestion window never passed {cwnd} B, which carries "
                     f"{format_rate(cwnd_bps)} at {srtt:.1f} ms", {
                         **base, "cwnd_max_bytes": cwnd,
                         "cwnd_allows_bits_per_second": round(cwnd_bps)})
    return None


def _pacing(ev: Mapping[str, Any], base: dict, capacity_bps: float) -> Limit | None:
    pacing = ev.get("pacing_rate_bits_per_second")
    if pacing and pacing < FULL_SHARE * capacity_bps:
        return Limit("congestion_control", "cc_rate",
                     f"{ev.get('cc') or 'the congestion control'} paced at "
                     f"{format_rate(pacing)} (median), below the capacity: its estimate of the "
                     "path's rate never reached it", {
                         **base, "pacing_rate_bits_per_second": round(pacing)})
    return None


def classify(ev: Mapping[str, Any], *, rate_bps: float | None,
             capacity_bps: float | None, capacity_source: str | None = None) -> Limit:
    """Pure: the evidence of a test (evidence_of) and the capacity → what limits."""
    if not capacity_bps or capacity_bps <= 0 or rate_bps is None:
        return Limit("unknown", "unknown", "no capacity to compare with"
                     if rate_bps is not None else "no rate after the ramp-up",
                     {"capacity_source": capacity_source})
    share = rate_bps / capacity_bps
    base = {"bits_per_second": round(rate_bps), "capacity_bits_per_second": round(capacity_bps),
            "capacity_source": capacity_source, "share_of_capacity": round(share, 4),
            "cc": ev.get("cc"), "throughput_verdict": ev.get("throughput_verdict"),
            "steal_percent": ev.get("steal_percent")}
    if share >= FULL_SHARE:
        return Limit("full", "full", f"{format_rate(rate_bps)} is {share:.0%} of the measured "
                     f"capacity {format_rate(capacity_bps)}", base)
    # a CPU verdict, a window or a cwnd clamp explain the rate by themselves; then the host's
    # CPU steal (it inflates RTT, starves the sender and slows the cc's estimate, so it ranks
    # above a queue, the sender and the pacing rate it causes)
    found = (_host_or_window(ev, base) or _cwnd(ev, base, capacity_bps, rate_bps)
             or _steal(ev, base) or _queue_or_loss(ev, base)
             or _sender_or_cc(ev, base, capacity_bps, rate_bps))
    if found:
        return found
    keys = ("srtt_ms", "min_rtt_ms", "retransmit_rate", "rwnd_limited_share",
            "sndbuf_limited_share", "app_limited_share", "pacing_rate_bits_per_second",
            "cwnd_max_bytes", "sender_thread_busy_ratio", "receiver_thread_busy_ratio",
            "steal_percent")
    return Limit("unexplained", "unexplained",
                 f"{format_rate(rate_bps)} is {share:.0%} of the capacity and no host, window, "
                 "queue or loss evidence explains it", {**base, **{k: ev.get(k) for k in keys}})
