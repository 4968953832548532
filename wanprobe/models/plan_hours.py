"""The best training plan for each hour of the week, on the capacity the fleet measured in it.

Input: per hour of the week (0 = Monday 00:00 UTC) the goodput the daemons' scheduled
throughput tests measured (p10 and p50: the data behind ``fleet windows``), with the hour's
median RTT and loss when the probes saw them. Each hour's path is the base path (a report, a
ring test or flags) with the link at the hour's p10 goodput — a plan must hold in the hour's
bad tests, not its typical one — and the hosts' per-flow limits of the base path; the best
combination (``strategy.strategies``) is chosen there and shown beside its figures at the p50.
``bandwidth_needed_bps`` is what that plan needs for the target utilisation
(``impact_inverse.rate_needed``). An hour without a throughput test has no plan (conventions
§3: a gap is not filled).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from wanprobe.errors import UsageError
from wanprobe.models import impact as model
from wanprobe.models import strategy
from wanprobe.models.impact_inverse import rate_needed


@dataclass(frozen=True)
class HourCapacity:
    """One hour of the week as measured: goodput p10 / p50 (bit/s), the tests behind them, and
    the probes' median RTT (s) and forward loss ratio (None: not measured)."""

    hour_of_week: int
    label: str
    samples: int
    p10_bits_per_second: float | None
    p50_bits_per_second: float | None
    rtt_p50_s: float | None = None
    loss: float | None = None


@dataclass(frozen=True)
class HourPlan:
    """The best plan of one hour at its p10 goodput, the same plan at the p50, and the WAN rate
    the plan needs for the target utilisation."""

    hour: HourCapacity
    best: model.StrategyResult
    at_p50: model.StrategyResult
    baseline: model.StrategyResult
    bandwidth_needed_bps: float | None

    def to_json(self) -> dict[str, Any]:
        h = self.hour
        return {"hour_of_week": h.hour_of_week, "label": h.label, "samples": h.samples,
                "p10_bits_per_second": h.p10_bits_per_second,
                "p50_bits_per_second": h.p50_bits_per_second, "rtt_p50_s": h.rtt_p50_s,
                "loss": h.loss, "best": self.best.to_json(),
                "best_at_p50": self.at_p50.to_json(), "as_is": self.baseline.to_json(),
                "bandwidth_needed_bps": self.bandwidth_needed_bps}


def hour_path(base: model.Path, hour: HourCapacity, rate_bps: float) -> model.Path:
    """The base path in this hour: the link at ``rate_bps``; the hour's RTT when the probes saw
    it and it is worse than the base's; its loss when measured; a measured per-flow rate
    capped at the link."""
    rtt = max(base.rtt_s, hour.rtt_p50_s) if hour.rtt_p50_s else base.rtt_s
    flow = None if base.flow_rate_bps is None else min(base.flow_rate_bps, rate_bps)
    return replace(base, link_bps=rate_bps, rtt_s=rtt,
                   loss=base.loss if hour.loss is None else hour.loss, flow_rate_bps=flow)


def _at(job: model.Job, path: model.Path, options: model.Options,
        plan: model.StrategyResult) -> model.StrategyResult:
    """``plan`` evaluated again on ``path``."""
    c = strategy.Components.from_json(plan.components or {})
    return strategy.evaluate(job, strategy.network(job, path, options), c,
                             strategy.baseline(job, options))


def plan_hours(job: model.Job, options: model.Options, base: model.Path,
               hours: Sequence[HourCapacity], utilization: float = 0.9) -> list[HourPlan]:
    """The best plan of every hour with goodput (see module docstring)."""
    if job.compute_s is None:
        raise UsageError("a plan per hour needs --compute-ms (the best plan is the shortest step)")
    out = []
    for h in hours:
        if h.p10_bits_per_second is None or not h.p10_bits_per_second > 0:
            continue
        path = hour_path(base, h, h.p10_bits_per_second)
        results = strategy.strategies(job, strategy.network(job, path, options), options)
        top = strategy.best(results)
        p50 = h.p50_bits_per_second or h.p10_bits_per_second
        at_p50 = _at(job, hour_path(base, h, p50), options, top)
        needed = rate_needed(job, path.rtt_s, strategy.Components.from_json(top.components or {}),
                             utilization)
        out.append(HourPlan(h, top, at_p50, results[0], needed))
    if not out:
        raise UsageError("no hour of the week has a throughput test behind it: nothing to plan on")
    return out


def summary(plans: Sequence[HourPlan]) -> dict[str, Any]:
    """The plan best in most hours, the hours it is not, and the worst hour's figures (the
    longest step; among equals the least capacity)."""
    counts = Counter(p.best.name for p in plans)
    name, hours = counts.most_common(1)[0]
    worst = max(plans, key=lambda p: (p.best.step_time_s or 0.0,
                                      -(p.hour.p10_bits_per_second or 0.0)))
    return {"hours_planned": len(plans), "most_hours": {"name": name, "hours": hours},
            "other_hours": [{"label": p.hour.label, "name": p.best.name}
                            for p in plans if p.best.name != name],
            "worst_hour": {"label": worst.hour.label, "name": worst.best.name,
                           "step_time_s": worst.best.step_time_s,
                           "gpu_idle_share": worst.best.gpu_idle_share,
                           "p10_bits_per_second": worst.hour.p10_bits_per_second}}
