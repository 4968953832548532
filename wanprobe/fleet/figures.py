"""What a figure read back from Prometheus can be: the range a measurement can take.

A Prometheus answer is untrusted input (issue 37): ``+Inf`` or ``1e308`` made ``fleet windows``
exit 70 (OverflowError) and ``fleet matrix`` print "loss inf%" and a 300-digit Tbit/s figure.
A sample outside its figure's range — infinite, negative, a loss ratio above 1, a rate above
1 Pbit/s — refuses the whole answer in one line naming the series (exit 5, as any answer that
is not a wanprobe query result): no figure is shown or planned on from a server that returns
it. NaN is PromQL's 0/0 (a rate ratio over a window without probes) and reads as no data.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from wanprobe.errors import shown
from wanprobe.fleet.prom_reply import PrometheusError
from wanprobe.units import MAX_RATE_BPS


@dataclass(frozen=True)
class Range:
    """The values a figure can take: ``[0, high]``; ``what`` names it in the refusal."""

    what: str
    high: float


RATIO = Range("a loss ratio", 1.0)
RTT_SECONDS = Range("an RTT in seconds", 3600.0)       # no probe waits an hour for its reply
BITS_PER_SECOND = Range("a rate in bit/s", MAX_RATE_BPS)  # 1 Pbit/s, as --rate options allow
COUNT = Range("a count", 2.0**53)                       # past it a float64 drops whole packets


def series_name(name: str, labels: dict[str, str], limit: int = 4) -> str:
    """``name{a="x", b="y"}`` with the first ``limit`` labels, values quoted as data."""
    shown_labels = [f"{k}={shown(v, 40)}" for k, v in sorted(labels.items())
                    if k != "__name__"][:limit]
    return f"{name}{{{', '.join(shown_labels)}}}"


def checked(value: float, figure: Range, name: str, labels: dict[str, str],
            url: str) -> float | None:
    """``value`` if a measurement can make it, None for NaN (no data), else PrometheusError."""
    if math.isnan(value):
        return None
    if 0.0 <= value <= figure.high:
        return value
    raise PrometheusError(f"Prometheus at {url} answered {series_name(name, labels)} = {value:g}, "
                          f"which is not {figure.what} (0 to {figure.high:g}); refused")


def check_points(points: Iterable[float], figure: Range, name: str, labels: dict[str, str],
                 url: str) -> None:
    """Refuse a series with one value outside ``figure`` (NaN passes: no data)."""
    for v in points:
        if not 0.0 <= v <= figure.high and not math.isnan(v):
            checked(v, figure, name, labels, url)
