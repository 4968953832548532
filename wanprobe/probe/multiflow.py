"""One probe spread over K source ports (``probe --flows K``, the daemon's per-peer ``flows``).

A single source port sees one ECMP path: with one bad path in eight it reports 0 % or the bad
path's loss, by chance (issue 16). Spreading the same packets over K flows (each port constant,
``count/K`` packets at ``K × interval``, starts staggered, so the aggregate rate is unchanged)
measures what K sockets see. The result is the usual probe document for all flows together
(pooled RTT samples, summed loss counts per direction) plus ``flows`` (one entry per source
port) and, when the flows were traced (flowtrace.py), ``paths``: flows grouped by hop list, each
with a short ``fingerprint`` (bounded: a hash of the hop list, at most one per distinct path).
"""

from __future__ import annotations

import hashlib
import math
import statistics
from dataclasses import replace

from wanprobe.probe.flowtrace import FlowTrace
from wanprobe.probe.owd import merge as owd_merge
from wanprobe.probe.path_groups import summarize
from wanprobe.probe.paths import FlowResult, probe_ports, trace_ports
from wanprobe.probe.result import LossStats, ProbeResult, ReflectorInfo, RttStats
from wanprobe.probe.stats import rtt_summary_ms, wilson_interval


def fingerprint(hops) -> str | None:
    """8 hex digits naming a hop list (unknown hops as ``*``); None without hops."""
    if not hops or all(h is None for h in hops):
        return None
    return hashlib.sha1(",".join(h or "*" for h in hops).encode()).hexdigest()[:8]


def _sum(values) -> int | None:
    vals = [v for v in values if v is not None]
    return sum(vals) if len(vals) == len(values) else None


def _reflector(infos: list[ReflectorInfo | None]) -> ReflectorInfo | None:
    """One flow's reflector report stands for all (one reflector); the first that said."""
    said = [i for i in infos if i is not None and i.counts is not None]
    return said[0] if said else next((i for i in infos if i is not None), None)


def merge(results: list[ProbeResult], interval_s: float) -> ProbeResult:
    """The flows of one multi-flow probe as one result: pooled RTTs, summed loss counts."""
    samples = tuple(x for r in results for x in r.rtt_samples_ms)
    rtt = rtt_summary_ms(samples)
    sent = sum(r.loss.sent for r in results)
    received = sum(r.loss.received for r in results)
    f_lost, f_of = _sum([r.loss.forward_lost for r in results]), _sum([r.loss.forward_of for r in results])
    r_lost, r_of = _sum([r.loss.reverse_lost for r in results]), _sum([r.loss.reverse_of for r in results])
    limited = _sum([r.loss.reflector_rate_limited for r in results])
    refused = _sum([r.loss.reflector_replays_refused for r in results])
    path_sent = sum(r.loss.path_sent for r in results)
    loss = LossStats(
        sent=sent, received=received, ci95=wilson_interval(path_sent - received, path_sent),
        forward_lost=f_lost, forward_of=f_of, reverse_lost=r_lost, reverse_of=r_of,
        forward_ci95=wilson_interval(f_lost, f_of) if f_lost is not None and f_of else None,
        reverse_ci95=wilson_interval(r_lost, r_of) if r_lost is not None and r_of else None,
        late=sum(r.loss.late for r in results), reflector_rate_limited=limited,
        reflector_replays_refused=refused,
        reflector_resets=sum(r.loss.reflector_resets for r in results),
        unattributed=sum(r.loss.unattributed for r in results),
        reflector_session_refused=sum(r.loss.reflector_session_refused for r in results))
    jitters = [r.jitter_ms for r in results if r.jitter_ms is not None]
    return replace(
        results[0], duration_s=max(r.duration_s for r in results), interval_s=interval_s,
        reflector=_reflector([r.reflector for r in results]),
        rtt=RttStats(**rtt) if rtt else None, loss=loss,
        jitter_ms=statistics.median(jitters) if jitters else None,
        jitter_forward_ms=None, jitter_reverse_ms=None, owd=owd_merge([r.owd for r in results]),
        reordered=sum(r.reordered for r in results), duplicates=sum(r.duplicates for r in results),
        rtt_samples_ms=samples)


def multiflow_doc(flows: list[FlowResult], interval_s: float) -> dict:
    """The aggregate probe document plus ``flows`` and, when traced, ``paths``."""
    doc = merge([f.probe for f in flows], interval_s).to_json()
    doc["flows"] = [{"src_port": f.trace.src_port, "hops": list(f.trace.hops),
                     "fingerprint": fingerprint(f.trace.hops),
                     "loss": {k: f.probe.to_json()["loss"][k] for k in
                              ("sent", "received", "forward_ratio", "reverse_ratio",
                               "reflector_rate_limited")},
                     "rtt_ms": {k: f.probe.to_json()["rtt_ms"][k] for k in ("min", "p50", "p99")}}
                    for f in flows]
    if any(f.trace.hops for f in flows):
        _, summary = summarize([f.sample() for f in flows])
        for p in summary["paths"]:
            p["fingerprint"] = fingerprint(p["hops"])
        doc["paths"] = summary
    return doc


async def probe_flows(addr: str, port: int, *, flows: int, count: int, interval_s: float,
                      timeout_s: float = 2.0, src_ports: list[int] | None = None,
                      trace: bool = True, known: list[FlowTrace] | None = None,
                      trace_tries: int = 12, trace_wait_s: float = 1.0,
                      hmac_key=None) -> tuple[list[FlowResult], dict]:
    """Probe ``addr`` with ``count`` packets over ``flows`` ports; (flow results, document).
    Ports: ``src_ports``, else ephemeral. Without ``trace`` the hop lists are ``known`` (an
    earlier trace of the same ports) or empty."""
    ports = src_ports or [0] * flows
    if trace:
        traces = await trace_ports(addr, port, ports, tries=trace_tries, wait_s=trace_wait_s)
    elif known is not None:
        traces = list(known)
    elif 0 in ports:   # no probe sent (tries=0): only picks free ephemeral ports
        picked = await trace_ports(addr, port, ports, max_ttl=1, tries=0)
        traces = [FlowTrace(t.src_port, (), False, 0) for t in picked]
    else:
        traces = [FlowTrace(p, (), False, 0) for p in ports]
    per_flow = max(1, math.ceil(count / len(traces)))
    results = await probe_ports(addr, port, [t.src_port for t in traces], count=per_flow,
                                interval_s=interval_s * len(traces), timeout_s=timeout_s,
                                hmac_key=hmac_key)
    flow_results = [FlowResult(t, r) for t, r in zip(traces, results, strict=True)]
    return flow_results, multiflow_doc(flow_results, interval_s)
