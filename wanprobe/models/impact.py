"""Training impact: from a path and a job's shape to step time, GPU idle share and cost.

Definitions (pure, documented once here and in the CLI help):

* ``comm_s`` — time of one gradient synchronisation (per step; for local-SGD amortised over
  the H steps between syncs).
* ``step_s = compute + comm − min(overlap·comm, compute)``: a fraction ``overlap`` of the
  communication can hide under compute, but never more than the compute time. ``overlap = 0``
  gives ``compute + comm``; ``overlap = 1`` gives ``max(compute, comm)``.
* ``comm_share = comm / step``; ``gpu_idle_share = (step − compute) / step``: the part of each
  step the GPUs wait for the network.
* ``idle_cost_per_day = gpu_idle_share · GPUs · 24 h · cost per GPU-hour``.

The strategies, combinations of host tuning, topology, gradient bytes, compression, sync period
and streaming, are ``strategy.py``'s; this module holds the job, the path and the collectives
they run on.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from wanprobe.errors import UsageError
from wanprobe.models.collectives import (
    flat_ring_across_sites_s,
    hierarchical_allreduce_s,
    tree_allreduce_s,
)
from wanprobe.models.tcp_rate import DEFAULT_MSS_BYTES, achievable_rate_bps

DTYPE_BYTES: dict[str, float] = {"fp32": 4, "bf16": 2, "fp16": 2, "int8": 1, "fp4": 0.5}
COLLECTIVES = ("ring", "hierarchical", "tree")
INDEX_BYTES = 4  # top-k sends a 32-bit index with every value (DGC)


def dtype_bytes(dtype: str) -> float:
    """Bytes per gradient element of ``dtype`` (fp32, bf16, fp16, int8, fp4)."""
    key = str(dtype).strip().lower()
    if key not in DTYPE_BYTES:
        raise UsageError(f"unknown dtype {dtype!r} (use {', '.join(DTYPE_BYTES)})")
    return DTYPE_BYTES[key]


def gradient_bytes(params: float, dtype: str) -> float:
    """Bytes of one full gradient: ``params · bytes(dtype)`` (100e9 bf16 → 200 GB)."""
    if not (math.isfinite(params) and params > 0):
        raise UsageError(f"--params must be > 0, got {params!r}")
    return float(params) * dtype_bytes(dtype)


def step_time_s(compute_s: float | None, comm_s: float, overlap: float = 0.0) -> float:
    """``compute + comm − min(overlap·comm, compute)`` (see module docstring)."""
    if compute_s is None:
        raise UsageError("a compute time (--compute-ms) is needed for step time and GPU idle share")
    if not (compute_s > 0 and math.isfinite(compute_s)):
        raise UsageError(f"compute time must be > 0, got {compute_s!r}")
    if not 0.0 <= overlap <= 1.0:
        raise UsageError(f"overlap must lie in [0, 1], got {overlap!r}")
    if not comm_s >= 0:
        raise UsageError(f"communication time must be ≥ 0, got {comm_s!r}")
    return compute_s + comm_s - min(overlap * comm_s, compute_s)


def gpu_idle_share(compute_s: float, step_s: float) -> float:
    """``(step − compute) / step``: the fraction of a step the GPUs wait."""
    if not step_s > 0:
        raise UsageError(f"step time must be > 0, got {step_s!r}")
    return max(0.0, (step_s - compute_s) / step_s)


def idle_cost_per_day(idle_share: float, gpus: int, gpu_hour_cost: float) -> float:
    """``idle share · GPUs · 24 h · cost per GPU-hour``."""
    if gpu_hour_cost < 0:
        raise UsageError(f"GPU-hour cost must be ≥ 0, got {gpu_hour_cost!r}")
    return idle_share * gpus * 24.0 * gpu_hour_cost


@dataclass(frozen=True)
class Path:
    """The WAN path a synchronous step waits for: its p99 RTT and its slowest peer."""

    rtt_s: float                      # p99 round-trip time
    link_bps: float                   # link (or contracted) capacity
    loss: float = 0.0                 # packet loss fraction
    cc: str = "cubic"                 # congestion control on the hosts now
    window_bytes: float | None = None  # per-flow receive window now (None: unlimited)
    flow_rate_bps: float | None = None  # measured per-flow rate, overrides the model
    mss_bytes: int = DEFAULT_MSS_BYTES

    def flow_rate(self, streams: int = 1) -> float:
        """Achievable rate of ``streams`` flows on this path with the current host settings."""
        if self.flow_rate_bps is not None:
            return min(self.link_bps, streams * self.flow_rate_bps)
        return achievable_rate_bps(self.link_bps, self.rtt_s, self.loss, self.mss_bytes,
                                   self.cc, self.window_bytes, streams)


@dataclass(frozen=True)
class Job:
    """A data-parallel training job's shape."""

    params: float
    dtype: str = "bf16"
    sites: int = 2
    gpus_per_site: int = 8
    compute_s: float | None = None
    overlap: float = 0.0
    gpu_hour_cost: float = 2.5
    local_rate_bps: float = 400e9     # intra-site fabric per GPU (NVLink/IB class)
    local_alpha_s: float = 10e-6

    @property
    def gpus(self) -> int:
        return self.sites * self.gpus_per_site


@dataclass(frozen=True)
class StrategyResult:
    """One strategy's prediction; JSON keys are the field names."""

    name: str
    collective: str
    bytes_per_sync: float
    wan_rate_bps: float
    comm_time_s: float
    step_time_s: float | None
    comm_share: float | None
    gpu_idle_share: float | None
    idle_cost_per_day: float | None
    note: str = ""
    sync_time_s: float | None = None      # one sync (comm_time_s is per step: sync / H)
    hidden_comm_s: float | None = None    # communication hidden under compute, per step
    components: dict | None = None        # strategy.Components.to_json()

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Options:
    """Knobs of the strategies."""

    collective: str = "ring"
    tuned_window_bytes: float | None = None   # None: sized to the BDP of the link
    tuned_cc: str = "bbr"
    tuned_measured_bps: float | None = None   # a verified tuning's measured rate
    topk_ratio: float | None = 0.01           # None: no top-k compression tried
    sync_every: int = 500                     # H of local SGD / DiLoCo
    more_sync_every: tuple[int, ...] = ()     # further H to try
    more_bandwidth_bps: float | None = None   # None: 4× the link

    @property
    def sync_periods(self) -> tuple[int, ...]:
        return (self.sync_every, *self.more_sync_every)


def collective_time_s(collective: str, size_bytes: float, job: Job, path: Path) -> tuple[float, float]:
    """(seconds, WAN rate used) of one all-reduce of ``size_bytes`` with ``collective``.

    ``ring``: one flat ring, one TCP flow per WAN crossing; ``hierarchical``: G parallel flows;
    ``tree``: binomial tree over the D·G ranks at the single-flow WAN rate. α = RTT/2.
    """
    alpha = path.rtt_s / 2.0
    if collective == "ring":
        rate = path.flow_rate(1)
        return flat_ring_across_sites_s(size_bytes, job.sites, job.gpus_per_site, alpha, rate,
                                        job.local_rate_bps), rate
    if collective == "hierarchical":
        rate = path.flow_rate(job.gpus_per_site)
        return hierarchical_allreduce_s(size_bytes, job.sites, job.gpus_per_site, alpha, rate,
                                        job.local_rate_bps, job.local_alpha_s), rate
    if collective == "tree":
        rate = path.flow_rate(1)
        return tree_allreduce_s(size_bytes, job.gpus, alpha, rate), rate
    raise UsageError(f"unknown collective {collective!r} (use {', '.join(COLLECTIVES)})")
