"""Findings for path events (path_watch.py): ``path.rerouted`` and ``path.queueing``, with what
the new RTT does to a training step (models/impact.py) for a reference job, in the evidence
(``training_step``; the report schema's ``impact`` is a rate share, left None here)."""

from __future__ import annotations

from typing import Any

from wanprobe.diagnose.finding import Finding
from wanprobe.diagnose.path_watch import PathEvent
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


def path_finding(peer_name: str, address: str, ev: PathEvent, *, hops_before=None, hops_after=None,
                 link_bps: float | None = None) -> Finding:
    """The finding (report schema) for a ``rerouted`` or ``queueing`` event. A reroute moves the
    floor, so the step is costed at the floor; a queue at floor + spread."""
    evidence = {"peer": peer_name, "address": address, **ev.to_json(),
                "hops_before": hops_before, "hops_after": hops_after}
    if ev.event == "rerouted":
        kind, old_ms, new_ms = "rerouted", ev.old_floor_ms, ev.new_floor_ms
        title = (f"Path to {peer_name} rerouted: RTT floor {ev.old_floor_ms:.2f} → "
                 f"{ev.new_floor_ms:.2f} ms with the spread unchanged")
    else:
        kind = "queueing"
        old_ms, new_ms = ev.old_floor_ms + ev.old_spread_ms, ev.new_floor_ms + ev.new_spread_ms
        where = {"forward": f", on the way to {peer_name}", "reverse": f", on the way back from "
                 f"{peer_name}", "both": ", in both directions"}.get(ev.direction or "", "")
        title = (f"Queueing on the path to {peer_name}{where}: RTT spread "
                 f"{ev.old_spread_ms:.2f} → {ev.new_spread_ms:.2f} ms over a steady "
                 f"{ev.new_floor_ms:.2f} ms floor")
    evidence["training_step"] = step_impact(old_ms, new_ms, link_bps)
    recommendation, effect = _ADVICE[kind]
    return Finding(id=f"path.{kind}", severity="warning", title=title, evidence=evidence,
                   recommendation=recommendation, expected_effect=effect)
