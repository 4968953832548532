"""Rank candidate sites and predict the strategies for a job: the model behind ``wanprobe impact``.

Pure: takes a :class:`~wanprobe.models.impact.Job`, the strategy :class:`Options` and either one
path (from flags) or the candidates read from diagnose reports. A synchronous step waits for its
slowest link, so a job spanning several candidates is modelled on ``slowest(candidates)``; each
candidate alone is ranked by its as-is step time (or comm time without a compute time).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from wanprobe.models import impact as model
from wanprobe.models.impact_inputs import Candidate, slowest

BASIS = "slowest link: p99 RTT and the slowest peer's achievable rate"


@dataclass(frozen=True)
class RankedSite:
    """One candidate site, its rank (1 = best) and its strategies."""

    rank: int
    candidate: Candidate
    results: tuple[model.StrategyResult, ...]

    def to_json(self) -> dict[str, Any]:
        return {"site": self.candidate.name, "inputs": self.candidate.to_json(),
                "strategies": [r.to_json() for r in self.results], "rank": self.rank}


@dataclass(frozen=True)
class Assessment:
    """What the path does to the job: the strategies on the path a step waits for, and the
    candidate sites ranked."""

    job: model.Job
    options: model.Options
    path: model.Path
    results: tuple[model.StrategyResult, ...]
    sites: tuple[RankedSite, ...] = ()

    def inputs(self) -> dict[str, Any]:
        job, path, o = self.job, self.path, self.options
        return {
            "params": job.params, "dtype": job.dtype,
            "gradient_bytes": model.gradient_bytes(job.params, job.dtype),
            "sites": job.sites, "gpus_per_site": job.gpus_per_site, "gpus": job.gpus,
            "compute_s": job.compute_s, "overlap": job.overlap, "gpu_hour_cost": job.gpu_hour_cost,
            "collective": o.collective, "rtt_p99_s": path.rtt_s, "link_bps": path.link_bps,
            "loss": path.loss, "cc": path.cc, "window_bytes": path.window_bytes,
            "flow_rate_bps": path.flow_rate(1), "topk_ratio": o.topk_ratio,
            "sync_every": o.sync_every, "basis": BASIS,
        }

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"inputs": self.inputs(),
                               "strategies": [r.to_json() for r in self.results]}
        if self.sites:
            doc["candidates"] = [s.to_json() for s in self.sites]
        return doc


def options_for(options: model.Options, candidate: Candidate | None) -> model.Options:
    """The strategy options with a candidate's own tuned window and congestion control."""
    if candidate is None:
        return options
    return replace(options, tuned_window_bytes=candidate.tuned_window_bytes,
                   tuned_cc=candidate.tuned_cc or "bbr")


def assess(job: model.Job, options: model.Options, *, path: model.Path | None = None,
           candidates: Sequence[Candidate] = ()) -> Assessment:
    """Strategies for ``job`` on ``path``, or on the candidates' slowest path with each candidate
    ranked (best first) by its as-is step time, or comm time when the job has no compute time."""
    if not candidates:
        if path is None:
            raise ValueError("assess needs a path or candidates")
        return Assessment(job, options, path, tuple(model.strategies(job, path, options)))
    key = "step_time_s" if job.compute_s is not None else "comm_time_s"
    scored = [(c, tuple(model.strategies(job, c.path, options_for(options, c))))
              for c in candidates]
    scored.sort(key=lambda cr: getattr(cr[1][0], key))
    sites = tuple(RankedSite(rank, c, res) for rank, (c, res) in enumerate(scored, 1))
    joint = slowest(candidates) if len(candidates) > 1 else candidates[0].path
    only = candidates[0] if len(candidates) == 1 else None
    results = tuple(model.strategies(job, joint, options_for(options, only)))
    return Assessment(job, options, joint, results, sites)
