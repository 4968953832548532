"""The rule on the daemon's regressions (the ``trend`` part, daemon/baseline.py: a metric of a
peer entering the degraded state against its rolling baseline): loss, median RTT, tail RTT,
throughput."""

from __future__ import annotations

from wanprobe.diagnose.context import Trend
from wanprobe.diagnose.finding import Finding
from wanprobe.diagnose.rule import rule

# metric -> (finding id, title, recommendation, expected effect)
_TITLES = {
    "loss": ("path.loss_regression", "Loss to {peer} rose from {base} to {cur}",
             "Check the path for congestion or a failing link/optic; compare forward and reverse "
             "loss to find the direction; open a ticket with the carrier if it persists.",
             "Loss-based congestion control (cubic/reno) slows down sharply with loss; restoring "
             "the baseline loss restores the baseline throughput."),
    "rtt_p50": ("path.rtt_regression", "Median RTT to {peer} rose from {base} to {cur}",
                "Look for a route change (traceroute), queueing on the path or a failover.",
                "Collective time grows with RTT per step; the BDP and needed buffers grow too."),
    "rtt_p99": ("path.rtt_tail_regression", "p99 RTT to {peer} rose from {base} to {cur}",
                "Look for queueing (bufferbloat), microbursts or congestion on the path.",
                "Tail latency stalls synchronous collectives at their slowest step."),
    "throughput": ("path.throughput_regression", "Throughput to {peer} fell from {base} to {cur}",
                   "Run `wanprobe diagnose` against the peer to see what limits the transfer.",
                   "Gradient exchange time grows in proportion to the lost throughput."),
}


def _fmt(value: float, unit: str) -> str:
    if unit == "ratio":
        return f"{value * 100:.2f} %"
    if unit == "ms":
        return f"{value:.2f} ms"
    from wanprobe.units import format_rate

    return format_rate(value)


@rule("path.regression", needs=("trend",))
def regression(t: Trend) -> Finding:
    """The finding for one regression (metric, baseline, current, threshold, unit and its
    evidence). Loss and throughput are critical: they cut the rate a synchronous step runs at;
    RTT is a warning."""
    tr = t.transition
    fid, title, rec, effect = _TITLES[tr["metric"]]
    severity = "critical" if tr["metric"] in ("loss", "throughput") else "warning"
    return Finding(
        id=fid, severity=severity,
        title=title.format(peer=t.peer, base=_fmt(tr["baseline"], tr["unit"]),
                           cur=_fmt(tr["current"], tr["unit"])),
        evidence={"peer": t.peer, "address": t.address, "metric": tr["metric"],
                  "baseline": tr["baseline"], "current": tr["current"],
                  "threshold": tr["threshold"], "unit": tr["unit"], **tr["evidence"]},
        recommendation=rec, expected_effect=effect)


RULES = (regression,)
