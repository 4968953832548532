"""Closed loop after ``tune apply``: measure the path again, compare the rate with the path's
capacity measured in the same run, and say whether the path is full or what still limits it
(issue 20) — instead of declaring success.

The rate leaves out the ramp-up like ``iperf3 --omit``: only intervals that start at or after
``omit_s`` count (slow start on a 130 ms path takes seconds to reach the link rate; that is
TCP's start, not the tuning's result), and a final partial interval never counts.

"The path is full" only at ≥ 90 % of the capacity (UDP bursts, throughput/capacity.py). Below
it the test is repeated, twice as long with twice the ramp-up left out; if the rate stays below,
the verdict rules (verify_limit.py, first match in the engine) name what limits it (host,
window, cross traffic, congestion control) from the test's own evidence: TCP_INFO chrono
counters, CPU samples, retransmits, RTT.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from wanprobe.diagnose.context import Context, VerifyRun
from wanprobe.diagnose.engine import RULE_ERROR
from wanprobe.diagnose.engine import judge as run_engine
from wanprobe.diagnose.verify_limit import (
    FULL_SHARE,
    NEXT_STEP,
    evidence_of,
    kept_intervals,
    limit_of,
)
from wanprobe.errors import WanprobeError
from wanprobe.json_fields import Decoded, objects, open_object

RETEST_FACTOR = 2.0  # the re-measure: twice the duration, twice the ramp-up left out


@dataclass(frozen=True)
class Attempt(Decoded, json_name="verify attempt"):
    """One TCP test of the loop."""

    duration_s: float
    omit_s: float
    bits_per_second: float
    bits_per_second_after_omit: float | None
    throughput_verdict: str | None

    def to_json(self) -> dict[str, Any]:
        return {"duration_s": self.duration_s, "omit_s": self.omit_s,
                "bits_per_second": self.bits_per_second,
                "bits_per_second_after_omit": self.bits_per_second_after_omit,
                "throughput_verdict": self.throughput_verdict}


@dataclass(frozen=True)
class Verification(Decoded, json_name="verify", json_parts={
        "evidence": open_object, "attempts": lambda v, at: objects(v, at, Attempt.from_json)}):
    """The loop's answer. ``limit``: full | host | window | cross_traffic | congestion_control
    | unexplained | unknown (verify_limit); ``verdict``: the last test's own throughput
    verdict; the figures are the last test's. ``from_json`` (json_fields.Decoded) recomputes
    the derived keys (fixed, path_full, share_of_capacity, full_share) rather than read them."""

    bits_per_second: float
    bits_per_second_after_omit: float | None
    omit_s: float
    verdict: str | None
    next_step: str
    cc: str | None = None
    limit: str = "unknown"
    summary: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)
    capacity_bits_per_second: float | None = None
    capacity_source: str | None = None
    attempts: tuple[Attempt, ...] = ()

    @property
    def path_full(self) -> bool:
        return self.limit == "full"

    @property
    def fixed(self) -> bool:
        """The tuning reached the path: it is full (≥ 90 % of its capacity)."""
        return self.path_full

    @property
    def share_of_capacity(self) -> float | None:
        rate = self.bits_per_second_after_omit
        if rate is None or not self.capacity_bits_per_second:
            return None
        return rate / self.capacity_bits_per_second

    def to_json(self) -> dict[str, Any]:
        share = self.share_of_capacity
        return {"bits_per_second": self.bits_per_second,
                "bits_per_second_after_omit": self.bits_per_second_after_omit,
                "omit_s": self.omit_s, "verdict": self.verdict, "fixed": self.fixed,
                "path_full": self.path_full, "limit": self.limit, "summary": self.summary,
                "next_step": self.next_step, "cc": self.cc, "evidence": self.evidence,
                "capacity_bits_per_second": self.capacity_bits_per_second,
                "capacity_source": self.capacity_source,
                "share_of_capacity": None if share is None else round(share, 4),
                "full_share": FULL_SHARE,
                "attempts": [a.to_json() for a in self.attempts]}


def rate_after_omit_bps(intervals: Sequence[Mapping[str, Any]], omit_s: float) -> float | None:
    """Received bits per second over the intervals that start at or after ``omit_s``, a final
    partial interval left out."""
    kept = kept_intervals(intervals, omit_s)
    secs = sum(i["end_s"] - i["start_s"] for i in kept)
    if not kept or secs <= 0:
        return None
    return float(sum(i["bytes_received"] for i in kept) * 8 / secs)


def attempt_of(result: Mapping[str, Any], omit_s: float) -> Attempt:
    return Attempt(duration_s=float(result.get("requested_duration_s") or 0.0), omit_s=omit_s,
                   bits_per_second=float(result.get("bits_per_second") or 0.0),
                   bits_per_second_after_omit=rate_after_omit_bps(result.get("intervals") or [],
                                                                   omit_s),
                   throughput_verdict=(result.get("limited_by") or {}).get("verdict"))


def judge(result: Mapping[str, Any], omit_s: float, *, capacity_bps: float | None = None,
          capacity_source: str | None = None,
          earlier: Sequence[Attempt] = ()) -> Verification:
    """Pure: a throughput result JSON (and the capacity) → what the tuning achieved and the
    next step. ``earlier``: the attempts before this one (kept in the answer)."""
    this = attempt_of(result, omit_s)
    found = run_engine(Context(verify=VerifyRun(
        evidence_of(result, omit_s), rate_bps=this.bits_per_second_after_omit,
        capacity_bps=capacity_bps, capacity_source=capacity_source)), first=True)
    verdict = next((f for f in found if f.id != RULE_ERROR), None)
    if verdict is None:  # every verdict rule raised: say so instead of a traceback
        limit, summary, step = "unknown", "the verdict could not be evaluated", NEXT_STEP["unknown"]
        evidence: dict[str, Any] = {}
    else:
        limit, summary, step = limit_of(verdict), verdict.title, verdict.recommendation
        evidence = dict(verdict.evidence)
    errors = [dict(f.evidence) for f in found if f.id == RULE_ERROR]
    if errors:
        evidence["rule_errors"] = errors
    return Verification(
        bits_per_second=this.bits_per_second,
        bits_per_second_after_omit=this.bits_per_second_after_omit, omit_s=omit_s,
        verdict=this.throughput_verdict, next_step=step, cc=result.get("cc"),
        limit=limit, summary=summary, evidence=evidence,
        capacity_bits_per_second=capacity_bps, capacity_source=capacity_source,
        attempts=(*earlier, this))


Measure = Callable[[float], Mapping[str, Any]]           # duration_s -> throughput result JSON
Capacity = Callable[[float], tuple[float | None, str]]   # TCP rate -> (capacity, source)


def verify_loop(measure: Measure, capacity: Capacity, *, duration_s: float = 6.0,
                omit_s: float = 2.0, capacity_bps: float | None = None,
                retest: bool = True) -> Verification:
    """The loop over injected measurements: test, capacity (unless given), judge; below
    FULL_SHARE test again, RETEST_FACTOR × longer with RETEST_FACTOR × the ramp-up left out."""
    first = measure(duration_s)
    source = "operator"
    if capacity_bps is None:
        rate = rate_after_omit_bps(first.get("intervals") or [], omit_s)
        capacity_bps, source = capacity(rate or float(first.get("bits_per_second") or 0.0))
    v = judge(first, omit_s, capacity_bps=capacity_bps, capacity_source=source)
    if not retest or v.limit in ("full", "unknown"):
        return v
    try:
        again = measure(duration_s * RETEST_FACTOR)
    except WanprobeError as exc:  # keep the first answer; say why there is no second
        return replace(v, summary=f"{v.summary} (the longer re-measure failed: {exc})")
    return judge(again, omit_s * RETEST_FACTOR, capacity_bps=capacity_bps,
                 capacity_source=source, earlier=v.attempts)


def verify_path(peer: str, *, port: int = 862, duration_s: float = 6.0, omit_s: float = 2.0,
                max_bytes: int = 2**30, hmac_key: bytes | None = None,
                capacity_bps: float | None = None, retest: bool = True) -> Verification:
    """Measure this host → ``peer`` again (one stream, capped), measure the path's capacity
    with UDP bursts (unless ``capacity_bps`` is known) and judge."""
    from wanprobe.throughput.capacity import measure_capacity
    from wanprobe.throughput.client import run_throughput

    def measure(secs: float) -> Mapping[str, Any]:
        return run_throughput(peer, port=port, duration_s=secs, max_bytes=max_bytes,
                              interval_s=0.5, hmac_key=hmac_key).to_json()

    def capacity(tcp_bps: float) -> tuple[float | None, str]:
        try:  # start above what TCP reached, as diagnose does, so one burst saturates
            cap = measure_capacity(peer, port, start_bps=max(2 * tcp_bps, 20e6),
                                   max_bytes=max_bytes, hmac_key=hmac_key)
        except WanprobeError as exc:
            return None, f"not measured: {exc}"
        return cap.bits_per_second, cap.source

    return verify_loop(measure, capacity, duration_s=duration_s, omit_s=omit_s,
                       capacity_bps=capacity_bps, retest=retest)
