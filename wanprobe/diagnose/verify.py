"""The answer of the closed loop after ``tune apply`` (issue 20), built from measured figures:
a throughput result's rate after its ramp-up against the path's capacity measured in the same
run says whether the path is full or what still limits it — instead of declaring success. Pure:
the loop that measures (the test, the capacity, the longer re-measure) is
``services/verify.py``.

The rate leaves out the ramp-up like ``iperf3 --omit``: only intervals that start at or after
``omit_s`` count (slow start on a 130 ms path takes seconds to reach the link rate; that is
TCP's start, not the tuning's result), and a final partial interval never counts.

"The path is full" only at ≥ 90 % of the capacity (UDP bursts, throughput/capacity.py). Below
it the service repeats the test, twice as long with twice the ramp-up left out; if the rate
stays below, the verdict rules (verify_limit.py, first match in the engine) name what limits it
(host, window, cross traffic, congestion control) from the test's own evidence: TCP_INFO chrono
counters, CPU samples, retransmits, RTT.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from wanprobe.diagnose.context import Context, VerifyRun
from wanprobe.diagnose.engine import RULE_ERROR
from wanprobe.diagnose.engine import judge as run_engine
from wanprobe.diagnose.verify_limit import (
    FULL_SHARE,
    NEXT_STEP,
    evidence_of,
    limit_of,
)
from wanprobe.json_fields import Decoded, objects, open_object
from wanprobe.throughput.result import ThroughputResult, after_omit_bps


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


def _finite(x: float) -> float:
    """A rate as its JSON would carry it: a figure that could not be computed counts as 0."""
    return x if math.isfinite(x) else 0.0


def attempt_of(result: ThroughputResult, omit_s: float) -> Attempt:
    return Attempt(duration_s=result.requested_duration_s, omit_s=omit_s,
                   bits_per_second=_finite(result.bits_per_second),
                   bits_per_second_after_omit=after_omit_bps(result.intervals, omit_s),
                   throughput_verdict=result.limited_by.verdict)


def judge(result: ThroughputResult, omit_s: float, *, capacity_bps: float | None = None,
          capacity_source: str | None = None,
          earlier: Sequence[Attempt] = ()) -> Verification:
    """Pure: a throughput result (and the capacity) → what the tuning achieved and the
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
        verdict=this.throughput_verdict, next_step=step, cc=result.cc,
        limit=limit, summary=summary, evidence=evidence,
        capacity_bits_per_second=capacity_bps, capacity_source=capacity_source,
        attempts=(*earlier, this))
