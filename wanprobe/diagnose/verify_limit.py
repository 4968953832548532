"""What keeps a tuned transfer below the path's capacity: a pure judgement of one throughput
result (the typed ``ThroughputResult``) against the capacity measured in the same run (issue 20).

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
- ``duration``: the rate was still climbing when the test ended (the last interval after the
  ramp-up RISING above the first and at the top): slow start or the control's probing had not
  reached the path within the test, which says nothing yet about the path (issue 35);
- ``unexplained``: none of the above; said as such, with the figures.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from wanprobe.diagnose.context import VerifyEvidence, VerifyRun
from wanprobe.diagnose.finding import Finding
from wanprobe.diagnose.rule import rule
from wanprobe.diagnose.rules_throughput import (  # the throughput verdict's, in one place
    STANDING_QUEUE_MIN,
    STEAL_PERCENT,
)
from wanprobe.throughput.result import IntervalResult, ThroughputResult, kept_intervals
from wanprobe.units import format_rate

FULL_SHARE = 0.9            # issue 20: "the path is full" only at >= 90 % of the capacity
APP_LIMITED_SHARE = 0.5     # samples in which the sender had run out of data
QUEUE_SHARE = STANDING_QUEUE_MIN  # srtt >= 1.5 x min RTT: a standing queue (rules_throughput's)
QUEUE_MIN_MS = 1.0          # and at least 1 ms of it: host scheduling noise on short paths
RETRANS_EXPLAINS = 0.05     # retransmissions would eat the missing share themselves
CC_BOUND_SHARE = 0.8        # the rate reaches 80 % of what cwnd or pacing allowed
RISING = 1.15               # the last interval ≥ 15 % above the first after the ramp-up ...
AT_THE_TOP = 0.95           # ... and within 5 % of the best: still climbing at the end

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
    "duration": ("the test ended while the rate was still climbing: measure longer, with more "
                 "of the start left out (`wanprobe throughput --duration 20s --omit 5s`)"),
    "unexplained": ("no host, window, queue or loss evidence explains the gap: run `wanprobe "
                    "diagnose --full` and compare with iperf3 on the same path"),
    "unknown": "the capacity could not be measured, so whether the path is full is unknown",
}


# the cause (a NEXT_STEP key, the finding's id ``verify.<cause>``) -> the limit it names
LIMIT = {"full": "full", "unknown": "unknown", "unexplained": "unexplained",
         "cpu": "host", "pacing": "host", "cpu_steal": "host", "sender_process": "host",
         "receive_window": "window", "send_buffer": "window", "cross_traffic": "cross_traffic",
         "loss": "congestion_control", "cwnd": "congestion_control",
         "cc_rate": "congestion_control", "duration": "duration"}


def limit_of(f: Finding) -> str:
    """full | host | window | cross_traffic | congestion_control | unexplained | unknown: what
    the verdict ``f`` (``verify.<cause>``) names."""
    return LIMIT[f.id.removeprefix("verify.")]


def _limit(cause: str, summary: str, evidence: Mapping[str, Any]) -> Finding:
    """The verdict as the one Finding: the summary its title, the next step its recommendation,
    the figures it rests on its evidence."""
    return Finding(f"verify.{cause}", "info" if cause in ("full", "unknown") else "warning",
                   summary, evidence, NEXT_STEP[cause], "")


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _per_interval_sums(kept: Sequence[IntervalResult], key: str) -> list[float]:
    out: list[float] = []
    for iv in kept:
        vals = [(r.get("tcp_info") or {}).get(key) for r in iv.streams]
        known = [v for v in vals if v is not None]
        if known:
            out.append(float(sum(known)))
    return out


def evidence_of(result: ThroughputResult, omit_s: float) -> VerifyEvidence:
    """The figures of one throughput result after its ramp-up: sender TCP_INFO over the kept
    intervals, the CPU samples, the verdict's own evidence (chrono shares, retransmit rate,
    queueing delay)."""
    kept = kept_intervals(result.intervals, omit_s)
    infos = [r["tcp_info"] for iv in kept for r in iv.streams if r.get("tcp_info")]
    cwnds = []
    for iv in kept:
        b = [(r["tcp_info"].get("cwnd_packets") or 0) * (r["tcp_info"].get("snd_mss_bytes") or 0)
             for r in iv.streams if r.get("tcp_info")]
        if b:
            cwnds.append(sum(b))
    flags = [i["delivery_rate_app_limited"] for i in infos
             if i.get("delivery_rate_app_limited") is not None]
    ev = result.limited_by.evidence
    srtt = _median([i["rtt_ms"] for i in infos if i.get("rtt_ms")])
    return {
        "cc": result.cc, "streams": len({s.stream_id for s in result.streams}) or 1,
        "throughput_verdict": result.limited_by.verdict, "side": ev.get("side"),
        "throughput_summary": result.limited_by.summary,
        "min_rtt_ms": result.min_rtt_ms or ev.get("min_rtt_ms"),
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
        "sender_thread_busy_ratio": result.cpu.get("sender_thread_busy_ratio"),
        "receiver_thread_busy_ratio": result.cpu.get("receiver_thread_busy_ratio"),
        "samples": len(infos),
        "kept_rates_bits_per_second": [round(float(iv.bytes_received) * 8 / span)
                                       for iv in kept if (span := iv.end_s - iv.start_s) > 0],
    }


def _below(v: VerifyRun) -> dict[str, Any] | None:
    """The figures every verdict below the capacity carries; None when the rate reached
    FULL_SHARE of it or either is unknown (another rule's answer)."""
    share, rate, capacity = v.share, v.rate_bps, v.capacity_bps
    if share is None or rate is None or capacity is None or share >= FULL_SHARE:
        return None
    return _base(v, rate, capacity, share)


def _base(v: VerifyRun, rate_bps: float, capacity_bps: float, share: float) -> dict[str, Any]:
    ev = v.evidence
    return {"bits_per_second": round(rate_bps), "capacity_bits_per_second":
            round(capacity_bps), "capacity_source": v.capacity_source,
            "share_of_capacity": round(share, 4), "cc": ev.get("cc"),
            "throughput_verdict": ev.get("throughput_verdict"),
            "steal_percent": ev.get("steal_percent")}


@rule("verify.unknown", needs=("verify",))
def unknown(v: VerifyRun) -> Finding | None:
    """No capacity, or no rate after the ramp-up: whether the path is full is unknown."""
    if v.share is not None:
        return None
    return _limit("unknown", "no capacity to compare with" if v.rate_bps is not None
                  else "no rate after the ramp-up", {"capacity_source": v.capacity_source})


@rule("verify.full", needs=("verify",))
def full(v: VerifyRun) -> Finding | None:
    """The path is full: the rate reached FULL_SHARE of the capacity."""
    share, rate, capacity = v.share, v.rate_bps, v.capacity_bps
    if share is None or rate is None or capacity is None or share < FULL_SHARE:
        return None
    return _limit("full", f"{format_rate(rate)} is {share:.0%} of the measured "
                  f"capacity {format_rate(capacity)}", _base(v, rate, capacity, share))


@rule("verify.host_or_window", needs=("verify",))
def host_or_window(v: VerifyRun) -> Finding | None:
    """The throughput verdict's own words: a saturated CPU (with its side), the receiver's
    window or the send buffer (chrono shares), a pacing cap."""
    base, ev = _below(v), v.evidence
    if base is None:
        return None
    verdict = ev.get("throughput_verdict")
    if verdict in ("cpu", "host_cpu"):  # the throughput verdict's own words and side
        side = ev.get("side") or "sender"
        return _limit("cpu", ev.get("throughput_summary") or f"a CPU on the {side} is "
                      "saturated", {**base, "side": side, "thread_busy_ratio":
                                    ev.get(f"{side}_thread_busy_ratio")})
    if verdict in ("receive_window", "send_buffer"):
        key = "rwnd_limited_share" if verdict == "receive_window" else "sndbuf_limited_share"
        share = ev.get(key)
        whose = "the receiver's window" if verdict == "receive_window" else "the send buffer"
        return _limit(verdict, f"{whose} stopped the sender {share or 0:.0%} of its busy time",
                      {**base, key: share})
    if verdict == "pacing":
        return _limit("pacing", "the requested pacing rate capped each stream", base)
    return None


@rule("verify.cwnd", needs=("verify",))
def cwnd(v: VerifyRun) -> Finding | None:
    """A congestion window that carries the rate it got (≥ 80 %): it explains the rate exactly,
    so it ranks above CPU steal."""
    base, ev, rate, capacity = _below(v), v.evidence, v.rate_bps, v.capacity_bps
    if base is None or rate is None or capacity is None:  # _below: never both known and None
        return None
    cwnd, srtt = ev.get("cwnd_max_bytes"), ev.get("srtt_ms")
    cwnd_bps = cwnd * 8 / (srtt / 1e3) if cwnd and srtt else None
    if cwnd_bps and cwnd_bps < FULL_SHARE * capacity \
            and rate >= CC_BOUND_SHARE * cwnd_bps:
        return _limit("cwnd", f"the congestion window never passed {cwnd} B, which carries "
                      f"{format_rate(cwnd_bps)} at {srtt:.1f} ms", {
                          **base, "cwnd_max_bytes": cwnd,
                          "cwnd_allows_bits_per_second": round(cwnd_bps)})
    return None


@rule("verify.cpu_steal", needs=("verify",))
def cpu_steal(v: VerifyRun) -> Finding | None:
    """The hypervisor took ≥ STEAL_PERCENT of the CPU: it inflates RTT, starves the sender and
    slows the cc's estimate, so it ranks above the queue, the sender and the pacing it causes."""
    base, steal = _below(v), v.evidence.get("steal_percent")
    if base is None or steal is None or steal < STEAL_PERCENT:
        return None
    return _limit("cpu_steal", f"the hypervisor took {steal:.1f} % of this host's CPU time "
                  "during the test (/proc/stat steal): the host, not the path, fell short",
                  {**base, "steal_percent": steal})


@rule("verify.duration", needs=("verify",))
def duration(v: VerifyRun) -> Finding | None:
    """Still climbing at the end: the last interval after the ramp-up RISING above the first and
    within AT_THE_TOP of the best one."""
    base, rates = _below(v), v.evidence.get("kept_rates_bits_per_second") or []
    if base is None or len(rates) < 2 or rates[0] <= 0:
        return None
    if rates[-1] < RISING * rates[0] or rates[-1] < AT_THE_TOP * max(rates):
        return None
    return _limit("duration", f"the rate was still climbing when the test ended "
                  f"({format_rate(rates[0])} → {format_rate(rates[-1])} after the ramp-up): "
                  "the test was too short for this path", {
                      **base, "first_rate_bits_per_second": rates[0],
                      "last_rate_bits_per_second": rates[-1], "intervals": len(rates)})


@rule("verify.cross_traffic", needs=("verify",))
def cross_traffic(v: VerifyRun) -> Finding | None:
    """A standing queue (smoothed RTT ≥ 1.5 × min RTT, ≥ 1 ms) that retransmissions do not
    explain, while this flow carried under FULL_SHARE: someone else's traffic."""
    base, ev = _below(v), v.evidence
    srtt, min_rtt = ev.get("srtt_ms"), ev.get("min_rtt_ms")
    if base is None or not (srtt and min_rtt) or (ev.get("retransmit_rate") or 0) >= RETRANS_EXPLAINS:
        return None
    queue_ms = srtt - min_rtt
    if queue_ms < max(QUEUE_SHARE * min_rtt, QUEUE_MIN_MS):
        return None
    return _limit("cross_traffic",
                  f"a standing queue of {queue_ms:.1f} ms (smoothed RTT {srtt:.1f} ms, "
                  f"min {min_rtt:.1f} ms) while this flow carried "
                  f"{base['share_of_capacity']:.0%} of the capacity: the bottleneck "
                  "was busy with other traffic", {**base, "queue_ms": round(queue_ms, 3),
                                                 "srtt_ms": srtt, "min_rtt_ms": min_rtt})


@rule("verify.loss", needs=("verify",))
def loss(v: VerifyRun) -> Finding | None:
    """Loss explains the rate for a loss-based control (the throughput verdict ``congestion``,
    Mathis et al. 1997)."""
    base, ev = _below(v), v.evidence
    if base is None or ev.get("throughput_verdict") != "congestion":
        return None
    retrans, bound = ev.get("retransmit_rate"), ev.get("mathis_bound_bits_per_second")
    return _limit("loss", f"retransmit rate {retrans or 0:.3%} holds {ev.get('cc') or 'the'} "
                  f"congestion control near {format_rate(bound or 0)} (Mathis)",
                  {**base, "retransmit_rate": retrans, "mathis_bound_bits_per_second": bound})


@rule("verify.sender_process", needs=("verify",))
def sender_process(v: VerifyRun) -> Finding | None:
    """The sender ran out of data (delivery_rate_app_limited) in ≥ APP_LIMITED_SHARE of the
    samples."""
    base, app = _below(v), v.evidence.get("app_limited_share")
    if base is None or app is None or app < APP_LIMITED_SHARE:
        return None
    return _limit("sender_process", f"the sender had run out of data in {app:.0%} of the "
                  "TCP_INFO samples (delivery_rate_app_limited)",
                  {**base, "app_limited_share": round(app, 3)})


@rule("verify.cc_rate", needs=("verify",))
def cc_rate(v: VerifyRun) -> Finding | None:
    """The pacing rate the congestion control chose stayed below FULL_SHARE of the capacity
    (its bandwidth estimate never reached the path, e.g. BBR leaving STARTUP early)."""
    base, ev, capacity = _below(v), v.evidence, v.capacity_bps
    pacing = ev.get("pacing_rate_bits_per_second")
    if base is None or capacity is None or not pacing or pacing >= FULL_SHARE * capacity:
        return None
    return _limit("cc_rate", f"{ev.get('cc') or 'the congestion control'} paced at "
                  f"{format_rate(pacing)} (median), below the capacity: its estimate of the "
                  "path's rate never reached it", {
                      **base, "pacing_rate_bits_per_second": round(pacing)})


UNEXPLAINED_KEYS = ("srtt_ms", "min_rtt_ms", "retransmit_rate", "rwnd_limited_share",
                    "sndbuf_limited_share", "app_limited_share", "pacing_rate_bits_per_second",
                    "cwnd_max_bytes", "sender_thread_busy_ratio", "receiver_thread_busy_ratio",
                    "steal_percent")


@rule("verify.unexplained", needs=("verify",))
def unexplained(v: VerifyRun) -> Finding | None:
    """Below the capacity and no rule above explains it: said as such, with the figures."""
    base, rate, share = _below(v), v.rate_bps, v.share
    if base is None or rate is None or share is None:  # _below: never both known and None
        return None
    return _limit("unexplained", f"{format_rate(rate)} is {share:.0%} of the capacity "
                  "and no host, window, queue or loss evidence explains it",
                  {**base, **{k: v.evidence.get(k) for k in UNEXPLAINED_KEYS}})


# The verdict's table: the first rule that answers names the limit (engine.judge first=True).
# A CPU verdict, a window or a cwnd clamp explain the rate by themselves; then the host's CPU
# steal; then a rate still climbing at the end; then a queue, loss, the sender and the pacing
# rate.
RULES = (unknown, full, host_or_window, cwnd, cpu_steal, duration, cross_traffic, loss,
         sender_process, cc_rate, unexplained)
