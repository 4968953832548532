"""Training strategies as combinations, each on the network it assumes (``wanprobe impact``).

A strategy is one choice per component (``Components``):

* ``tuning`` — ``as-is`` (the hosts' rate now: measured, or modelled from their window and
  congestion control) or ``tuned`` (the plan's window and congestion control, or the rate a
  verified tuning measured);
* ``topology`` — ``flat`` (NCCL's flat ring across sites: one TCP flow per WAN crossing),
  ``hierarchical`` (reduce inside each site, then across sites over G parallel flows) or
  ``tree``;
* ``dtype`` — bytes per exchanged element: fp32 4, bf16 / fp16 2, int8 1 (INTELLECT-1's int8
  all-reduce), fp4 0.5 (Streaming DiLoCo's 4-bit outer gradients);
* ``compression`` — none, or top-k with ratio r: k = r·params values with 32-bit indices,
  exchanged as an all-gather across sites (DGC);
* ``sync_every`` — H: every step (data parallel), or every H steps exchanging the outer update
  (local SGD / DiLoCo: the pseudo-gradient, the model's size);
* ``streaming`` — H > 1 only: the sync split into fragments overlapped with the next inner
  steps (Streaming DiLoCo).

The overlap, per step (``hidden_comm_s``), explicitly:

* H = 1: ``step = compute + sync − min(overlap·sync, compute)`` (the job's ``overlap``: DDP's
  buckets all-reduced during the backward pass);
* H > 1, not streamed: the outer sync blocks: ``step = compute + sync / H``;
* H > 1, streamed: the H inner steps run while the fragments travel, so the period is
  ``max(H·compute, sync)`` and ``step = max(compute, sync / H)``: fully hidden while the link
  carries one sync within H steps of compute, and the period stretches to the transfer beyond.

What the model leaves to the user: the effect of H, compression or staleness on convergence
(loss per step) is not measured here; wanprobe reports communication, time and cost.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from wanprobe.errors import UsageError
from wanprobe.models import impact as model
from wanprobe.models.bdp import buffer_needed_bytes, window_from_buffer_bytes

TUNINGS = ("as-is", "tuned")
TOPOLOGY_OF_COLLECTIVE = {"ring": "flat", "hierarchical": "hierarchical", "tree": "tree"}
COLLECTIVE_OF_TOPOLOGY = {v: k for k, v in TOPOLOGY_OF_COLLECTIVE.items()}
LOWER_DTYPES = ("bf16", "int8", "fp4")   # the cheaper encodings a plan tries
CAVEAT = ("the effect of H, compression or staleness on convergence is not measured here: "
          "wanprobe reports communication, time and cost")


@dataclass(frozen=True)
class Components:
    """One choice per component (module docstring); JSON: ``to_json``."""

    tuning: str = "as-is"
    topology: str = "flat"
    dtype: str = "bf16"
    topk_ratio: float | None = None      # None: no compression
    sync_every: int = 1
    streaming: bool = False

    def name(self, base: Components) -> str:
        """"as-is" for ``base``; else the changes from it, joined by " + "."""
        parts = []
        if self.tuning != base.tuning:
            parts.append("tuned hosts" if self.tuning == "tuned" else "as-is hosts")
        if self.topology != base.topology:
            parts.append(self.topology)
        if self.dtype != base.dtype:
            parts.append(f"{self.dtype} gradients")
        if self.topk_ratio is not None:
            parts.append(f"top-k {self.topk_ratio:g}")
        if self.sync_every != base.sync_every:
            parts.append(f"sync every {self.sync_every} steps")
        if self.streaming:
            parts.append("streamed")
        return " + ".join(parts) or "as-is"

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Components:
        """The inverse of ``to_json`` (a strategy result's ``components``)."""
        k = doc.get("compression")
        return cls(doc["tuning"], doc["topology"], doc["dtype"],
                   None if k is None else k["ratio"], doc["sync_every"], doc["streaming"])

    def to_json(self) -> dict[str, Any]:
        return {"tuning": self.tuning, "topology": self.topology, "dtype": self.dtype,
                "compression": None if self.topk_ratio is None else
                {"method": "top-k", "ratio": self.topk_ratio, "index_bytes": model.INDEX_BYTES},
                "sync_every": self.sync_every, "streaming": self.streaming}


class Network(Protocol):
    """What a strategy's exchange costs on the network it assumes: (seconds, WAN rate used)."""

    def allreduce(self, size_bytes: float, topology: str, tuned: bool) -> tuple[float, float]: ...

    def allgather(self, bytes_per_site: float, topology: str,
                  tuned: bool) -> tuple[float, float]: ...


@dataclass(frozen=True)
class PathNetwork:
    """The collectives of ``impact.py`` on one WAN path: ``path`` the hosts as they are,
    ``tuned`` the same path with the tuned hosts' window and congestion control (or their
    measured rate)."""

    job: model.Job
    path: model.Path
    tuned: model.Path

    def _path(self, tuned: bool) -> model.Path:
        return self.tuned if tuned else self.path

    def allreduce(self, size_bytes: float, topology: str, tuned: bool) -> tuple[float, float]:
        return model.collective_time_s(COLLECTIVE_OF_TOPOLOGY[topology], size_bytes, self.job,
                                       self._path(tuned))

    def allgather(self, bytes_per_site: float, topology: str,
                  tuned: bool) -> tuple[float, float]:
        """Each site receives (D−1) messages over its flows (G when hierarchical, else one):
        ``(D−1)·m·8/B + (D−1)·RTT/2``."""
        path, d = self._path(tuned), self.job.sites
        rate = path.flow_rate(self.job.gpus_per_site if topology == "hierarchical" else 1)
        return (d - 1) * bytes_per_site * 8.0 / rate + (d - 1) * path.rtt_s / 2.0, rate


def tuned_path(path: model.Path, window_bytes: float | None, cc: str,
               measured_bps: float | None = None) -> model.Path:
    """The path with tuned hosts: a verified tuning's measured rate when there is one, else the
    model's rate for ``window_bytes`` (None: sized to the link's BDP) and ``cc``."""
    window = window_bytes or window_from_buffer_bytes(buffer_needed_bytes(path.link_bps,
                                                                          path.rtt_s))
    return replace(path, cc=cc, window_bytes=window, flow_rate_bps=measured_bps)


def network(job: model.Job, path: model.Path, options: model.Options) -> PathNetwork:
    """``path`` as the hosts are, and as ``options`` would tune them (a measured tuned rate is
    capped at the path's link)."""
    measured = options.tuned_measured_bps
    return PathNetwork(job, path, tuned_path(
        path, options.tuned_window_bytes, options.tuned_cc,
        None if measured is None else min(measured, path.link_bps)))


def sync_s(job: model.Job, net: Network, c: Components) -> tuple[str, float, float, float]:
    """(collective, bytes per sync, seconds per sync, WAN rate) of ``c`` on ``net``."""
    per = model.dtype_bytes(c.dtype)
    tuned = c.tuning == "tuned"
    if c.topk_ratio is not None:
        if not 0 < c.topk_ratio <= 1:
            raise UsageError(f"top-k ratio must lie in (0, 1], got {c.topk_ratio!r}")
        size = job.params * c.topk_ratio * (per + model.INDEX_BYTES)
        t, rate = net.allgather(size, c.topology, tuned)
        return "allgather", size, t, rate
    size = job.params * per
    t, rate = net.allreduce(size, c.topology, tuned)
    return COLLECTIVE_OF_TOPOLOGY[c.topology], size, t, rate


def step_of(compute_s: float, sync: float, c: Components, overlap: float) -> tuple[float, float]:
    """(step time, communication hidden under compute per step) of one sync every
    ``c.sync_every`` steps (module docstring)."""
    h = c.sync_every
    if h == 1:
        step = model.step_time_s(compute_s, sync, overlap)
    elif c.streaming:
        step = max(compute_s, sync / h)
    else:
        step = compute_s + sync / h
    return step, compute_s + sync / h - step


def evaluate(job: model.Job, net: Network, c: Components, base: Components,
             note: str = "") -> model.StrategyResult:
    """``c``'s prediction; ``comm_time_s`` is per step (one sync's time over H)."""
    collective, size, t, rate = sync_s(job, net, c)
    per_step = t / c.sync_every
    fields: dict[str, Any] = {"name": c.name(base), "collective": collective,
                              "bytes_per_sync": size, "wan_rate_bps": rate,
                              "comm_time_s": per_step, "sync_time_s": t,
                              "components": c.to_json(), "note": note}
    if job.compute_s is None:
        return model.StrategyResult(**fields, step_time_s=None, comm_share=None,
                                    gpu_idle_share=None, idle_cost_per_day=None)
    step, hidden = step_of(job.compute_s, t, c, job.overlap)
    idle = model.gpu_idle_share(job.compute_s, step)
    return model.StrategyResult(**fields, step_time_s=step, comm_share=per_step / step,
                                gpu_idle_share=idle, hidden_comm_s=hidden,
                                idle_cost_per_day=model.idle_cost_per_day(idle, job.gpus,
                                                                          job.gpu_hour_cost))


def check_periods(periods: Sequence[int]) -> tuple[int, ...]:
    """The sync periods to try: 1 and each given H (whole, ≥ 1), ascending."""
    for h in periods:
        if isinstance(h, bool) or int(h) != h or h < 1:
            raise UsageError(f"sync interval must be a whole number ≥ 1, got {h!r}")
    return tuple(sorted({1, *(int(h) for h in periods)}))


def baseline(job: model.Job, options: model.Options) -> Components:
    if options.collective not in TOPOLOGY_OF_COLLECTIVE:
        raise UsageError(f"unknown collective {options.collective!r} "
                         f"(use {', '.join(TOPOLOGY_OF_COLLECTIVE)})")
    return Components(topology=TOPOLOGY_OF_COLLECTIVE[options.collective], dtype=job.dtype)


def combinations(job: model.Job, options: model.Options,
                 tunings: Sequence[str] = TUNINGS) -> list[Components]:
    """Every combination worth computing: the baseline first. Hierarchical only with more than
    one GPU per site (else it is the flat ring); cheaper dtypes than the job's; streaming only
    with H > 1."""
    base = baseline(job, options)
    model.step_time_s(1.0, 0.0, job.overlap)
    topologies = list(dict.fromkeys([base.topology, "flat"]
                                    + (["hierarchical"] if job.gpus_per_site > 1 else [])))
    dtypes = [job.dtype] + [d for d in LOWER_DTYPES
                            if model.dtype_bytes(d) < model.dtype_bytes(job.dtype)]
    topk = [None] + ([options.topk_ratio] if options.topk_ratio is not None else [])
    out = [base]
    for tuning, topo, dt, k, h in itertools.product(tunings, topologies, dtypes, topk,
                                                    check_periods(options.sync_periods)):
        for streaming in ((False, True) if h > 1 else (False,)):
            c = Components(tuning, topo, dt, k, h, streaming)
            if c != base:
                out.append(c)
    return out


def _sort_key(r: model.StrategyResult) -> tuple[float, int, float]:
    """Fastest step first (communication per step without a compute time), then the fewest
    changes, then the least communication per step (the most headroom)."""
    t = r.step_time_s if r.step_time_s is not None else r.comm_time_s
    return (t if math.isfinite(t) else math.inf, len(r.name.split(" + ")), r.comm_time_s)


def strategies(job: model.Job, net: Network, options: model.Options,
               tunings: Sequence[str] = TUNINGS) -> list[model.StrategyResult]:
    """Every combination on ``net``: the baseline ("as-is") first, then fastest first (step
    time, else communication per step; fewer changes first among equals)."""
    combos = combinations(job, options, tunings)
    base = combos[0]
    results = [evaluate(job, net, c, base) for c in combos]
    return [results[0], *sorted(results[1:], key=_sort_key)]


def best(results: Sequence[model.StrategyResult]) -> model.StrategyResult:
    return min(results, key=_sort_key)


def unchanged_training(r: model.StrategyResult) -> bool:
    """Whether ``r`` leaves the optimiser as it is: every step, no top-k, no fewer bits than
    bf16 (what changes convergence is the user's to judge)."""
    c = r.components or {}
    return c.get("sync_every") == 1 and c.get("compression") is None \
        and model.dtype_bytes(str(c.get("dtype"))) >= 2


def shown(results: Sequence[model.StrategyResult], top: int) -> list[model.StrategyResult]:
    """What a table shows: the as-is baseline, the ``top`` fastest, and the fastest that leaves
    the training itself unchanged (``unchanged_training``) when it is not among them."""
    out = [results[0], *list(results[1:])[:top]]
    same = [r for r in results[1:] if unchanged_training(r)]
    if same and same[0] not in out:
        out.append(same[0])
    return out
