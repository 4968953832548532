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
from wanprobe.models import strategy
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
    more_bandwidth: model.StrategyResult | None = None

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
            "sync_every": o.sync_every, "sync_periods": list(strategy.check_periods(
                o.sync_periods)), "basis": BASIS,
            "flow_rate_source": "measured" if path.flow_rate_bps is not None else
            "model: the hosts' window and congestion control",
            "tuned": self._tuned(),
        }

    def _tuned(self) -> dict[str, Any]:
        """What "tuned hosts" stands on: a measured rate or the model's, and from what."""
        t = strategy.network(self.job, self.path, self.options).tuned
        measured = self.options.tuned_measured_bps is not None
        return {"cc": t.cc, "window_bytes": t.window_bytes, "flow_rate_bps": t.flow_rate(1),
                "source": "measured: the report's verified tuning" if measured else
                "model: the plan's window (else the path's BDP) and congestion control"}

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"inputs": self.inputs(), "caveat": strategy.CAVEAT,
                               "strategies": [r.to_json() for r in self.results]}
        if self.more_bandwidth is not None:
            doc["more_bandwidth"] = self.more_bandwidth.to_json()
        if self.sites:
            doc["candidates"] = [s.to_json() for s in self.sites]
        return doc


def options_for(options: model.Options, candidate: Candidate | None) -> model.Options:
    """The strategy options with a candidate's own tuned window, congestion control and, when
    its report verified a tuning, the rate that tuning measured."""
    if candidate is None:
        return options
    return replace(options, tuned_window_bytes=candidate.tuned_window_bytes,
                   tuned_cc=candidate.tuned_cc or "bbr",
                   tuned_measured_bps=candidate.tuned_measured_bps)


def what_if(job: model.Job, path: model.Path, options: model.Options) -> model.StrategyResult:
    """The best combination on a faster link (``more_bandwidth_bps``, else 4× the link) with
    the same hosts: what buying bandwidth is worth next to changing the job."""
    faster = options.more_bandwidth_bps or 4.0 * path.link_bps
    bigger = replace(path, link_bps=faster)
    top = strategy.best(strategy.strategies(job, strategy.network(job, bigger, options), options))
    return replace(top, name=f"{top.name}, on a {faster / 1e9:g} Gbit/s link",
                   note=f"the best combination with the link at {faster / 1e9:g} Gbit/s")


def _strategies(job: model.Job, path: model.Path,
                options: model.Options) -> tuple[model.StrategyResult, ...]:
    return tuple(strategy.strategies(job, strategy.network(job, path, options), options))


def assess(job: model.Job, options: model.Options, *, path: model.Path | None = None,
           candidates: Sequence[Candidate] = ()) -> Assessment:
    """Strategies for ``job`` on ``path``, or on the candidates' slowest path with each candidate
    ranked (best first) by its as-is step time, or comm time when the job has no compute time."""
    if not candidates:
        if path is None:
            raise ValueError("assess needs a path or candidates")
        return Assessment(job, options, path, _strategies(job, path, options),
                          more_bandwidth=what_if(job, path, options))
    key = "step_time_s" if job.compute_s is not None else "comm_time_s"
    scored = [(c, _strategies(job, c.path, options_for(options, c))) for c in candidates]
    scored.sort(key=lambda cr: getattr(cr[1][0], key))
    sites = tuple(RankedSite(rank, c, res) for rank, (c, res) in enumerate(scored, 1))
    path, only = joint(options, candidates)
    return Assessment(job, options, path, _strategies(job, path, only), sites,
                      more_bandwidth=what_if(job, path, only))


def joint(options: model.Options,
          candidates: Sequence[Candidate]) -> tuple[model.Path, model.Options]:
    """The path a job spanning every candidate waits for (``slowest``), and the options with
    the tuning of the candidate when there is only one."""
    path = slowest(candidates) if len(candidates) > 1 else candidates[0].path
    return path, options_for(options, candidates[0] if len(candidates) == 1 else None)
