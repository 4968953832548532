"""Group flows by the path their hop lists name, and test whether the paths differ (pure).

A path fingerprint is a hop list. An unknown hop (``None``: the router stayed silent, e.g. ICMP
rate limit) matches any address, so a flow with a gap joins the path it agrees with on every
known hop instead of inventing a new one. Paths are compared with a chi-square test on their
loss counts and a Kruskal-Wallis rank test on their RTT samples (significance.py): "the paths
differ" is a statistical statement at level ``alpha``, not a threshold on means.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from wanprobe.probe.result import LossStats
from wanprobe.probe.significance import chi2_independence, kruskal_wallis
from wanprobe.probe.stats import rtt_summary_ms

ALPHA = 0.01
MIN_SHIFT_MS = 0.5
MIN_SHIFT_RATIO = 0.02


@dataclass(frozen=True)
class FlowSample:
    """What the summary needs of one flow: its hops, its session's loss counts and RTT samples."""

    src_port: int
    hops: tuple[str | None, ...]
    loss: LossStats
    rtt_samples_ms: tuple[float, ...]


def agrees(a: Sequence[str | None], b: Sequence[str | None]) -> bool:
    """Same length and no known hop differs (``None`` matches anything)."""
    return len(a) == len(b) and all(x is None or y is None or x == y for x, y in zip(a, b, strict=True))


def group_paths(hop_lists: Sequence[Sequence[str | None]]) -> list[int]:
    """Path index per flow. Flows with more known hops choose first, so representatives are
    the best-known hop lists; a path's representative fills its gaps from later members."""
    order = sorted(range(len(hop_lists)), key=lambda i: -sum(h is not None for h in hop_lists[i]))
    reps: list[list[str | None]] = []
    out = [0] * len(hop_lists)
    for i in order:
        hops = hop_lists[i]
        for k, rep in enumerate(reps):
            if agrees(rep, hops):
                reps[k] = [x if x is not None else y for x, y in zip(rep, hops, strict=True)]
                out[i] = k
                break
        else:
            reps.append(list(hops))
            out[i] = len(reps) - 1
    # number paths in the order of their first flow, so output is stable
    first = {}
    for p in out:
        first.setdefault(p, len(first))
    return [first[p] for p in out]


def _ratio(lost: int, of: int) -> float | None:
    return lost / of if of else None


def _sum(values) -> int | None:
    vals = [v for v in values if v is not None]
    return sum(vals) if vals else None


def path_entry(index: int, members: Sequence[FlowSample], total_flows: int) -> dict:
    """One path: its hop list, flows, pooled loss per direction and RTT percentiles."""
    hops: list[str | None] = list(members[0].hops)
    for m in members[1:]:
        hops = [x if x is not None else y for x, y in zip(hops, m.hops, strict=True)]
    losses = [m.loss for m in members]
    sent = sum(x.sent for x in losses)
    received = sum(x.received for x in losses)
    path_sent = sum(x.path_sent for x in losses)   # the reflector's drops are not the path's
    f_lost, f_of = _sum(x.forward_lost for x in losses), _sum(x.forward_of for x in losses)
    r_lost, r_of = _sum(x.reverse_lost for x in losses), _sum(x.reverse_of for x in losses)
    rtt = rtt_summary_ms([x for m in members for x in m.rtt_samples_ms])
    return {
        "path": index, "hops": hops, "src_ports": [m.src_port for m in members],
        "flows": len(members), "flow_share": round(len(members) / total_flows, 6),
        "sent": sent, "received": received, "path_sent": path_sent,
        "loss_ratio": _ratio(path_sent - received, path_sent),
        "forward_lost": f_lost, "forward_ratio": _ratio(f_lost or 0, f_of or 0) if f_lost is not None else None,
        "reverse_lost": r_lost, "reverse_ratio": _ratio(r_lost or 0, r_of or 0) if r_lost is not None else None,
        "rtt_ms": None if rtt is None else {k: round(rtt[k], 6) for k in ("min", "p50", "p99")},
    }


def summarize(flows: Sequence[FlowSample], alpha: float = ALPHA) -> tuple[list[int], dict]:
    """(path index per flow, summary document) for the flows of one ``paths`` run."""
    if not flows:
        return [], {"distinct_paths": 0, "paths": [], "differ": False}
    index = group_paths([f.hops for f in flows])
    n_paths = max(index) + 1
    members = [[f for f, p in zip(flows, index, strict=True) if p == k] for k in range(n_paths)]
    paths = [path_entry(k, m, len(flows)) for k, m in enumerate(members)]
    loss_test = chi2_independence([[p["path_sent"] - p["received"], p["received"]]
                                   for p in paths])
    rtt_test = kruskal_wallis([[x for f in m for x in f.rtt_samples_ms] for m in members])
    differ_loss = loss_test.p_value < alpha
    medians = [p["rtt_ms"]["p50"] for p in paths if p["rtt_ms"]]
    shift_ms = max(medians) - min(medians) if medians else 0.0
    material = bool(medians) and shift_ms >= max(MIN_SHIFT_MS, MIN_SHIFT_RATIO * min(medians))
    differ_rtt = rtt_test.p_value < alpha and material
    worst = max(paths, key=lambda p: ((p["loss_ratio"] or 0.0),
                                      (p["rtt_ms"] or {}).get("p50") or 0.0))
    return index, {
        "distinct_paths": n_paths, "flows_per_path": [p["flows"] for p in paths],
        "worst_path": worst["path"], "alpha": alpha,
        "loss_test": loss_test.to_json(), "rtt_test": rtt_test.to_json(),
        "rtt_median_shift_ms": round(shift_ms, 6),
        "differ_loss": differ_loss, "differ_rtt": differ_rtt,
        "differ": differ_loss or differ_rtt, "paths": paths,
    }
