"""``path.ecmp_imbalance``: the ECMP paths to the peer differ (issue 16).

Reads :attr:`Measured.paths_summary`, the summary of ``measurements["paths"]``: the document of
``wanprobe paths --json`` (per-flow hop lists, RTT and loss; a summary with a chi-square test on
loss and a rank test on RTT). NCCL splits a
transfer equally over its sockets, so its bandwidth is the slowest socket's times their number
(nccl-tests#83, NVIDIA/nccl#438; fleet-multipath.md §3); ECMP hashes each socket's 5-tuple like
a probe flow, so the share of probe flows on a path estimates the share of NCCL sockets that
land there, and with S sockets the chance that at least one crosses the worst path is
1 − (1 − share)^S.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from wanprobe.diagnose.finding import Finding
from wanprobe.diagnose.host_inputs import Host
from wanprobe.diagnose.inputs import DiagnoseConfig
from wanprobe.diagnose.measured import Measured
from wanprobe.diagnose.rule import rule

NCCL_SOCKETS = 8        # e.g. NCCL_SOCKET_NTHREADS=2 × NCCL_NSOCKS_PERTHREAD=4 (product ≤ 64)


def _pct(x: float | None) -> str:
    return "unknown" if x is None else f"{x * 100:.2f} %"


def _p50(p: Mapping[str, Any]) -> float | None:
    return (p.get("rtt_ms") or {}).get("p50")


def _ms(x: float | None) -> str:
    return "unknown" if x is None else f"{x:.2f} ms"


def _first_distinct_hop(worst: Mapping[str, Any],
                        paths: list[Mapping[str, Any]]) -> tuple[int, str] | None:
    """(TTL, address) of the first hop of the worst path that no other path shares: the hop
    to show the carrier."""
    others = [p["hops"] for p in paths if p["path"] != worst["path"]]
    for ttl, hop in enumerate(worst.get("hops") or [], start=1):
        if hop is not None and all(len(h) < ttl or h[ttl - 1] != hop for h in others):
            return ttl, hop
    return None


@rule("path.ecmp_imbalance")
def ecmp_imbalance(m: Measured, host: Host | None, config: DiagnoseConfig) -> Finding | None:
    """Fires when ``paths`` found ≥ 2 paths that differ significantly (its summary's tests)."""
    summary = m.paths_summary or {}
    paths = summary.get("paths") or []
    if len(paths) < 2 or not summary.get("differ"):
        return None
    worst = paths[summary["worst_path"]]
    best = min(paths, key=lambda p: ((p.get("loss_ratio") or 0.0), _p50(p) or 0.0))
    share = worst.get("flow_share") or 0.0
    hit = 1.0 - (1.0 - share) ** NCCL_SOCKETS
    hop = _first_distinct_hop(worst, paths)
    where = f" (first hop only it crosses: {hop[1]} at TTL {hop[0]})" if hop else ""
    evidence = {
        "paths": [{k: p.get(k) for k in ("path", "hops", "flows", "flow_share", "loss_ratio",
                                         "forward_ratio", "reverse_ratio", "rtt_ms")} for p in paths],
        "worst_path": worst["path"], "loss_test": summary.get("loss_test"),
        "rtt_test": summary.get("rtt_test"), "nccl_sockets_assumed": NCCL_SOCKETS,
        "nccl_socket_share_on_worst": round(share, 6),
        "nccl_any_socket_on_worst_probability": round(hit, 6),
        "distinct_hop": {"ttl": hop[0], "address": hop[1]} if hop else None,
    }
    return Finding(
        id="path.ecmp_imbalance", severity="warning",
        title=f"ECMP paths to the peer differ: path {worst['path']} loses "
              f"{_pct(worst.get('loss_ratio'))} at p50 {_ms(_p50(worst))} vs "
              f"{_pct(best.get('loss_ratio'))} at {_ms(_p50(best))} on path {best['path']}",
        evidence=evidence,
        recommendation=f"About {share * 100:.0f} % of NCCL sockets hash onto path {worst['path']} "
                       f"and NCCL runs at its slowest socket: spread over more sockets/QPs "
                       f"(NCCL_NSOCKS_PERTHREAD × NCCL_SOCKET_NTHREADS, or "
                       f"NCCL_IB_QPS_PER_CONNECTION for RoCE) so one bad path costs less, and show "
                       f"the carrier the per-flow hop lists{where}.",
        expected_effect="With the bad path repaired (or avoided) every socket runs at the good "
                        "paths' rate, and so does each all-reduce.",
        impact=None)


RULES = (ecmp_imbalance,)
