"""Rules on path events (path_watch.py, the ``path_event`` part): ``path.rerouted`` and
``path.queueing``, with what the new RTT does to a training step (models/impact.py) for a
reference job, in the evidence (``training_step``; the report schema's ``impact`` is a rate
share, left None here)."""

from __future__ import annotations

from typing import Any

from wanprobe.diagnose.context import PathChange
from wanprobe.diagnose.finding import Finding
from wanprobe.diagnose.rule import rule
from wanprobe.models.impact import Job, Path, collective_time_s, gradient_bytes

# The daemon knows no job: a reference one (1 B parameters, bf16, 2 sites × 8 GPUs, flat ring)
# shows the order of the effect; `wanprobe impact` computes it for the real job.
REFERENCE_JOB = Job(params=1e9, dtype="bf16", sites=2, gpus_per_site=8)
ASSUMED_LINK_BPS = 10e9


def step_impact(old_rtt_ms: float, new_rtt_ms: float, link_bps: float | None) -> dict[str, Any]:
    """Ring all-reduce time of the reference job's gradient at the old and the new RTT."""
    link = link_bps or ASSUMED_LINK_BPS
    size = gradient_bytes(REFERENCE_JOB.params, REFERENCE_JOB.dtype)
    before, _ = collective_time_s("ring", size, REFERENCE_JOB, Path(rtt_s=old_rtt_ms / 1e3, link_bps=link))
    after, _ = collective_time_s("ring", size, REFERENCE_JOB, Path(rtt_s=new_rtt_ms / 1e3, link_bps=link))
    return {"allreduce_s_before": round(before, 6), "allreduce_s_after": round(after, 6),
            "increase_ratio": round(after / before - 1.0, 6) if before > 0 else None,
            "job": {"params": REFERENCE_JOB.params, "dtype": REFERENCE_JOB.dtype,
                    "sites": REFERENCE_JOB.sites, "gpus_per_site": REFERENCE_JOB.gpus_per_site,
                    "collective": "ring"},
            "link_bps": link, "link_assumed": link_bps is None}


# what each event means for the operator: (recommendation, expected effect)
_ADVICE = {
    "rerouted": ("Traffic moved to a different route (a cut or a failover): ask the carrier "
                 "which segment failed and when it returns; re-size TCP buffers for the new RTT "
                 "(wanprobe tune) while it lasts.",
                 "Every synchronous step pays the longer RTT per latency-bound phase, and a "
                 "window sized for the old RTT caps throughput."),
    "queueing": ("A queue is building on the path (congestion, not a route change): check "
                 "utilisation of the busiest hop, use DSCP/ECN or pace bulk transfers; rerouting "
                 "will not help.",
                 "Tail RTT stalls synchronous collectives at their slowest step."),
}


def _finding(c: PathChange, kind: str, title: str, old_ms: float, new_ms: float) -> Finding:
    evidence = {"peer": c.peer, "address": c.address, **c.event.to_json(),
                "hops_before": c.hops_before, "hops_after": c.hops_after,
                "training_step": step_impact(old_ms, new_ms, c.link_bps)}
    recommendation, effect = _ADVICE[kind]
    return Finding(id=f"path.{kind}", severity="warning", title=title, evidence=evidence,
                   recommendation=recommendation, expected_effect=effect)


@rule("path.rerouted", needs=("path_event",))
def rerouted(c: PathChange) -> Finding | None:
    """A reroute moves the RTT floor: the step is costed at the old and the new floor."""
    ev = c.event
    if ev.event != "rerouted":
        return None
    return _finding(c, "rerouted", f"Path to {c.peer} rerouted: RTT floor {ev.old_floor_ms:.2f} → "
                    f"{ev.new_floor_ms:.2f} ms with the spread unchanged",
                    ev.old_floor_ms, ev.new_floor_ms)


@rule("path.queueing", needs=("path_event",))
def queueing(c: PathChange) -> Finding | None:
    """A queue raises the spread over a steady floor: the step is costed at floor + spread, in
    the direction(s) path_watch named."""
    ev = c.event
    if ev.event != "queueing":
        return None
    where = {"forward": f", on the way to {c.peer}", "reverse": f", on the way back from "
             f"{c.peer}", "both": ", in both directions"}.get(ev.direction or "", "")
    return _finding(c, "queueing", f"Queueing on the path to {c.peer}{where}: RTT spread "
                    f"{ev.old_spread_ms:.2f} → {ev.new_spread_ms:.2f} ms over a steady "
                    f"{ev.new_floor_ms:.2f} ms floor", ev.old_floor_ms + ev.old_spread_ms,
                    ev.new_floor_ms + ev.new_spread_ms)


RULES = (rerouted, queueing)
