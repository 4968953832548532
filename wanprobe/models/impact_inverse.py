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
above it. A local-SGD / DiLoCo sync every H steps may take H times the per-step budget: that is
the bulk transfer a ``fleet windows --bytes`` answer can be judged against.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from wanprobe.errors import UsageError
from wanprobe.models import impact as model

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
    note: str = ""

    def to_json(self) -> dict:
        return asdict(self)


def _need(name: str, collective: str, size: float, every: int, budget_s: float,
          comm: Callable[[float], float], note: str = "") -> Need:
    return Need(name, collective, size, every, budget_s, comm(MAX_RATE_BPS),
                rate_for(comm, budget_s), note)


def needs(job: model.Job, rtt_s: float, utilization: float,
          options: model.Options | None = None) -> list[Need]:
    """Per strategy, the WAN rate the job needs for ``utilization`` (see module docstring)."""
    options = options or model.Options()
    if job.compute_s is None:
        raise UsageError("--target-utilization needs --compute-ms (utilisation is compute / step)")
    budget = max_comm_s(job.compute_s, job.overlap, utilization)
    base = model.Path(rtt_s=rtt_s, link_bps=1.0)

    def at(rate: float) -> model.Path:   # every collective then runs at exactly this WAN rate
        return replace(base, link_bps=rate, flow_rate_bps=rate)

    def coll(collective: str, size: float) -> Callable[[float], float]:
        return lambda rate: model.collective_time_s(collective, size, job, at(rate))[0]

    size, c = model.gradient_bytes(job.params, job.dtype), options.collective
    out = [_need("as-is", c, size, 1, budget, coll(c, size),
                 "the same rate for tuned hosts or a bigger link: they change how it is reached")]
    if c != "hierarchical":
        out.append(_need("hierarchical", "hierarchical", size, 1, budget,
                         coll("hierarchical", size), "rate summed over the G parallel flows"))
    for dt in ("fp16", "int8"):
        if model.dtype_bytes(dt) < model.dtype_bytes(job.dtype):
            s = model.gradient_bytes(job.params, dt)
            out.append(_need(f"{dt} gradients", c, s, 1, budget, coll(c, s)))
    k = options.topk_ratio
    out.append(_need(f"top-k {k:g}", "allgather",
                     job.params * k * (model.dtype_bytes(job.dtype) + model.INDEX_BYTES), 1, budget,
                     lambda rate: model.topk_allgather_s(job.params, model.dtype_bytes(job.dtype),
                                                         k, job, at(rate))[0]))
    h = int(options.sync_every)
    out.append(_need(f"sync every {h} steps", c, size, h, budget * h, coll(c, size),
                     "local SGD / DiLoCo: one sync may take H steps' budget"))
    return out
