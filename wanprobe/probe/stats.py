"""Probe statistics: RTT percentiles (numpy), loss confidence intervals, IPDV jitter, reordering.

Pure functions over plain sequences; no I/O. numpy is imported on first use and only for
sessions of at least NUMPY_MIN_SAMPLES: a mesh of hundreds of ~30-sample sessions is cheaper in
plain Python (numpy's per-call overhead and its ~0.1 s import dominate there). Both paths use the
same formulas (Hyndman & Fan type 7 percentiles, population stdev) and agree to float rounding.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence

NUMPY_MIN_SAMPLES = 512
Z95 = 1.959963984540054  # two-sided 95 % standard normal quantile


def wilson_interval(failures: int, trials: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (Wilson 1927; Brown, Cai & DasGupta 2001):

    centre = (p + z²/2n) / (1 + z²/n),  half = z·sqrt(p(1-p)/n + z²/4n²) / (1 + z²/n).

    Returns (0, 1) for zero trials: no claim can be made.
    """
    if trials <= 0:
        return (0.0, 1.0)
    p = failures / trials
    z2 = z * z
    denom = 1.0 + z2 / trials
    centre = (p + z2 / (2 * trials)) / denom
    half = z * math.sqrt(p * (1 - p) / trials + z2 / (4 * trials * trials)) / denom
    lo = 0.0 if failures == 0 else max(0.0, centre - half)
    hi = 1.0 if failures == trials else min(1.0, centre + half)
    return (lo, hi)


def percentiles_sorted(a: Sequence[float], qs: Sequence[float]) -> list[float]:
    """Percentiles of an ascending array with numpy's default 'linear' rule (Hyndman & Fan
    type 7: position q/100 * (n-1), interpolated), without np.percentile's per-call overhead,
    which dominates for the ~30-sample sessions a mesh runs every minute."""
    n = len(a)
    out = []
    for q in qs:
        pos = q / 100.0 * (n - 1)
        lo = int(pos)
        hi = min(lo + 1, n - 1)
        out.append(float(a[lo] + (a[hi] - a[lo]) * (pos - lo)))
    return out


def rtt_summary_ms(rtts_ms: Sequence[float]) -> dict[str, float] | None:
    """min, p50, p90, p99, max, mean, stdev (population) in ms; None without samples."""
    n = len(rtts_ms)
    if n == 0:
        return None
    if n < NUMPY_MIN_SAMPLES:
        a = sorted(rtts_ms)
        p50, p90, p99 = percentiles_sorted(a, (50, 90, 99))
        mean = math.fsum(a) / n
        var = math.fsum((x - mean) ** 2 for x in a) / n
        return {"min": float(a[0]), "p50": p50, "p90": p90, "p99": p99, "max": float(a[-1]),
                "mean": mean, "stdev": math.sqrt(var)}
    import numpy as np

    a = np.sort(np.asarray(rtts_ms, dtype=float))
    p50, p90, p99 = percentiles_sorted(a, (50, 90, 99))
    mean = float(a.mean())
    return {"min": float(a[0]), "p50": p50, "p90": p90, "p99": p99, "max": float(a[-1]),
            "mean": mean, "stdev": float(np.sqrt(np.mean((a - mean) ** 2)))}


def ipdv_many_ms(sorted_seqs: Sequence[int], *series: Sequence[float]) -> list[float | None]:
    """The probe's jitter: mean |IPDV| between consecutive sequence numbers (RFC 5481 §1.2/§4.2:
    IPDV(i) = D(i) - D(i-1) for packets i-1 and i both received), for each delay series over the
    same ascending sequence numbers, sharing the work (one call per session, not one per series).
    Offsets between unsynchronised clocks cancel, so one-way delays from different hosts are fine
    here. None for a series without a pair, or not one delay per sequence number.

    The one IPDV jitter (issue 38). Not the throughput test's UDP jitter (throughput/udp.py),
    which is the RFC 3550 §6.4.1 interarrival jitter: a running estimate, J += (|D| - J)/16, as
    iperf3 reports it, so the two figures differ on the same packets."""
    n = len(sorted_seqs)
    if n < 2:
        return [None] * len(series)
    if n < NUMPY_MIN_SAMPLES:
        if sorted_seqs[-1] - sorted_seqs[0] == n - 1:  # nothing lost: every pair is consecutive
            return [None if len(d) != n else
                    math.fsum(map(abs, map(operator.sub, d[1:], d[:-1]))) / (n - 1)
                    for d in series]
        pairs = [i for i in range(1, n) if sorted_seqs[i] - sorted_seqs[i - 1] == 1]
        if not pairs:
            return [None] * len(series)
        return [None if len(d) != n else
                math.fsum(abs(d[i] - d[i - 1]) for i in pairs) / len(pairs) for d in series]
    import numpy as np

    consecutive = np.diff(np.asarray(sorted_seqs)) == 1
    if not consecutive.any():
        return [None] * len(series)
    out: list[float | None] = []
    for d in series:
        if len(d) != len(sorted_seqs):
            out.append(None)
            continue
        out.append(float(np.abs(np.diff(np.asarray(d, dtype=float)))[consecutive].mean()))
    return out


def count_reordered(arrival_seqs: Sequence[int]) -> int:
    """Packets that arrived with a sequence number below one already seen (RFC 4737 §3
    "reordered" singleton), ignoring duplicates."""
    highest = -1
    seen: set[int] = set()
    reordered = 0
    for s in arrival_seqs:
        if s in seen:
            continue
        seen.add(s)
        if s < highest:
            reordered += 1
        else:
            highest = s
    return reordered


def count_duplicates(arrival_seqs: Sequence[int]) -> int:
    """Copies of a sequence number beyond the first."""
    return len(arrival_seqs) - len(set(arrival_seqs))
