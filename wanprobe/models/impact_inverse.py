"""The inverse of the impact model: the WAN rate a path must give a job for a target GPU
utilisation, per sync strategy (``wanprobe impact --target-utilization 90%``).

Utilisation is ``compute / step`` (1 − the GPU idle share of impact.py). With
``step = compute + comm − min(overlap·comm, compute)`` the longest communication a step may
take for utilisation U is, solving ``step = compute / U``:

* ``comm = compute·(1 − U) / (U·(1 − overlap))`` while ``overlap·comm ≤ compute`` (the hidden
  part fits under compute);
* otherwise ``comm = compute / U`` (the step is all communication: ``step = comm``).

Each strategy's communication time falls as the WAN rate B rises, towards a floor set by
latency (α = RTT/2 per step of the collective) and the local fabric; the needed rate is the B at
which it meets that budget (bisection on the model itself, so every collective of
collectives.py is inverted the same way), or none when even an infinite rate leaves the floor
above it. A local-SGD / DiLoCo sync every H steps may take H steps' budget (``sync_budget_s``;
streamed, H steps of compute): that is the bulk transfer a ``fleet windows --bytes`` answer can
be judged against.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from wanprobe.errors import UsageError
from wanprobe.models import impact as model
from wanprobe.models.strategy import Components, PathNetwork, combinations, sync_s

MAX_RATE_BPS = 1e15      # 1 Pbit/s: "infinite" for the floor


def max_comm_s(compute_s: float, overlap: float, utilization: float) -> float:
    """Longest communication per step that keeps ``compute / step`` at ``utilization``."""
    if not 0 < utilization < 1:
        raise UsageError(f"target utilisation must lie strictly between 0 and 100%, not "
                         f"{utilization!r}")
    model.step_time_s(compute_s, 0.0, overlap)   # validates compute and overlap
    whole = compute_s / utilization
    if overlap >= 1:
        return whole
    hidden_fits = compute_s * (1 - utilization) / (utilization * (1 - overlap))
    return hidden_fits if overlap * hidden_fits <= compute_s else whole


def rate_for(comm_of_rate: Callable[[float], float], budget_s: float) -> float | None:
    """The least WAN rate at which ``comm_of_rate`` (falling in the rate) fits in ``budget_s``;
    None when it does not even at MAX_RATE_BPS."""
    if comm_of_rate(MAX_RATE_BPS) > budget_s:
        return None
    lo, hi = 1.0, MAX_RATE_BPS
    if comm_of_rate(lo) <= budget_s:
        return lo
    for _ in range(200):                       # geometric bisection: relative precision 1e-9
        mid = math.sqrt(lo * hi)
        if comm_of_rate(mid) <= budget_s:
            hi = mid
        else:
            lo = mid
        if hi / lo < 1 + 1e-9:
            break
    return hi


def sync_budget_s(job: model.Job, utilization: float, c: Components) -> float:
    """The longest one sync of ``c`` may take for ``utilization`` (strategy.step_of inverted):
    every step ``max_comm_s``; every H steps blocking ``H·compute·(1 − U)/U``; streamed
    ``H·compute/U`` (the step is ``max(compute, sync/H)``)."""
    if job.compute_s is None:
        raise UsageError("--target-utilization needs --compute-ms (utilisation is compute / step)")
    per_step = max_comm_s(job.compute_s, job.overlap, utilization)
    h = c.sync_every
    if h == 1:
        return per_step
    return h * job.compute_s * (1.0 if c.streaming else 1 - utilization) / utilization


def rate_needed(job: model.Job, rtt_s: float, c: Components, utilization: float) -> float | None:
    """The least WAN rate at which ``c`` keeps ``compute / step`` at ``utilization``; None when
    no rate does (latency or the local fabric alone exceed the budget). Every flow is taken to
    run at the rate: tuning changes how a rate is reached, not the rate needed."""
    return rate_for(_sync_at(job, rtt_s, c), sync_budget_s(job, utilization, c))


def _net_at(job: model.Job, rtt_s: float, rate: float) -> PathNetwork:
    """The path at ``rtt_s`` with every flow, tuned or not, at exactly ``rate``."""
    at = model.Path(rtt_s=rtt_s, link_bps=rate, flow_rate_bps=rate)
    return PathNetwork(job, at, at)


def _sync_at(job: model.Job, rtt_s: float, c: Components) -> Callable[[float], float]:
    return lambda rate: sync_s(job, _net_at(job, rtt_s, rate), c)[2]


@dataclass(frozen=True)
class Need:
    """What one strategy needs from the WAN; JSON keys are the field names."""

    name: str
    collective: str
    bytes_per_sync: float
    syncs_every_steps: int
    comm_budget_per_sync_s: float     # the longest one sync may take
    comm_floor_s: float               # one sync at an infinite WAN rate (latency, local fabric)
    required_bits_per_second: float | None   # None: the floor alone is over budget
    components: dict[str, Any]
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def needs(job: model.Job, rtt_s: float, utilization: float,
          options: model.Options | None = None) -> list[Need]:
    """Per combination (strategy.combinations without the tuning: a rate is a rate), the WAN
    rate the job needs for ``utilization``; least first, the baseline first."""
    options = options or model.Options()
    combos = combinations(job, options, tunings=("as-is",))
    out = []
    for c in combos:
        budget = sync_budget_s(job, utilization, c)
        collective, size, floor, _ = sync_s(job, _net_at(job, rtt_s, MAX_RATE_BPS), c)
        out.append(Need(c.name(combos[0]), collective, size, c.sync_every, budget, floor,
                        rate_for(_sync_at(job, rtt_s, c), budget), c.to_json(),
                        "rate summed over the G parallel flows" if c.topology == "hierarchical"
                        else ""))
    return [out[0], *sorted(out[1:], key=lambda n: (n.required_bits_per_second is None,
                                                     n.required_bits_per_second or 0.0))]
