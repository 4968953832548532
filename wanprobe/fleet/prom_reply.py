"""Prometheus's query answers (``resultType`` vector and matrix JSON), parsed under a series cap.

https://prometheus.io/docs/prometheus/latest/querying/api/#expression-query-result-formats.
The server is untrusted input (issue 37): 150,000 series parsed as nested lists and dicts took
342 MB (``fleet windows``) and 529 MB (``fleet matrix``), and one series of 32 MiB of points
would build 365 MB of lists at once. So before decoding, one pass over the bytes finds where
each series starts (``{"metric":``, which valid JSON cannot hold inside a string) and refuses
more than :data:`MAX_SERIES` of them or a stretch between two starts over
:data:`MAX_SERIES_BYTES`; then each series is made compact the moment the decoder has built it
(``object_pairs_hook``): its points as two float64 arrays, 16 bytes a point instead of about
150 for a list, a float and a string. What is built at once stays under a series' worth.
Timestamps must be finite; values are kept as sent (``fleet.figures`` judges them per figure).
"""

from __future__ import annotations

import json
import math
import re
from array import array
from collections.abc import Iterator
from typing import Any

from wanprobe.errors import WanprobeError

# One answer holds at most this many series: a site pair per series for `fleet matrix`
# (100 sites), a host pair of one site pair for the goodput of `fleet windows` (the
# 2,000-host mesh of bench/windows_query_cost.py has 500).
MAX_SERIES = 10_000
# One series' JSON: Prometheus returns at most 11,000 points a series (about 40 bytes each);
# fleet queries ask for at most 2,161 (90 days of hours).
MAX_SERIES_BYTES = 2**20
_SERIES_START = re.compile(rb'\{\s*"metric"\s*:')


class PrometheusError(WanprobeError):
    """Prometheus could not be reached, was too slow or too large, or gave an answer that is
    not a query result or holds a figure no measurement makes."""

    exit_code = 5


class Points:
    """One series' points, (unix s, value) in order, as two float64 arrays."""

    __slots__ = ("times", "values")

    def __init__(self) -> None:
        self.times, self.values = array("d"), array("d")

    def __iter__(self) -> Iterator[tuple[float, float]]:
        return zip(self.times, self.values, strict=True)

    def __len__(self) -> int:
        return len(self.times)


class _Series:
    """A decoded element of ``data.result``: labels and either one value or points."""

    __slots__ = ("labels", "value", "points")

    def __init__(self, labels: dict[str, str], value: float | None, points: Points | None):
        self.labels, self.value, self.points = labels, value, points


class _NotAResult(Exception):
    """Raised inside the decoder's hook; turned into one PrometheusError."""


def _time(t: Any) -> float:
    ts = float(t)
    if not math.isfinite(ts):
        raise ValueError(f"timestamp {t!r}")
    return ts


def _series(obj: dict[str, Any]) -> _Series:
    labels = {str(k): str(v) for k, v in obj["metric"].items()}
    if "values" in obj:
        points = Points()
        for t, v in obj["values"]:
            points.times.append(_time(t))
            points.values.append(float(v))
        return _Series(labels, None, points)
    t, v = obj["value"]
    _time(t)
    return _Series(labels, float(v), None)


def _too_many(url: str) -> PrometheusError:
    return PrometheusError(f"Prometheus at {url}: more than {MAX_SERIES} series in one answer "
                           "(the limit of fleet queries); refused")


def _scan(body: bytes, url: str) -> None:
    """Refuse, before anything is decoded, more than MAX_SERIES series or a stretch without a
    series start longer than MAX_SERIES_BYTES (the decoder builds each stretch at once)."""
    count = last = 0
    for m in _SERIES_START.finditer(body):
        count += 1
        if count > MAX_SERIES:
            raise _too_many(url)
        if m.start() - last > MAX_SERIES_BYTES:
            break
        last = m.start()
    if len(body) - last > MAX_SERIES_BYTES:
        raise PrometheusError(f"Prometheus at {url}: a series (or the text around it) over "
                              f"{MAX_SERIES_BYTES // 2**10} KiB in one answer; refused")


def _decode(body: bytes, url: str) -> Any:
    """``json.loads(body)`` with every series element made a :class:`_Series` as it is built."""
    count = 0

    def hook(pairs: list[tuple[str, Any]]) -> Any:
        nonlocal count
        obj = dict(pairs)
        if not isinstance(obj.get("metric"), dict) or not ("value" in obj or "values" in obj):
            return obj
        count += 1
        if count > MAX_SERIES:  # series that do not start with "metric" (_scan missed them)
            raise _too_many(url)
        try:
            return _series(obj)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise _NotAResult from exc

    _scan(body, url)
    try:
        return json.loads(body, object_pairs_hook=hook)
    except (_NotAResult, ValueError, RecursionError):
        raise PrometheusError(f"{url}: not a Prometheus query result") from None


def _data(body: bytes, url: str, result_type: str) -> dict[str, Any]:
    doc = _decode(body, url)
    try:
        if doc.get("status") != "success" or doc["data"]["resultType"] != result_type:
            raise PrometheusError(f"{url}: query failed: {doc.get('error', doc.get('status'))}")
        data = doc["data"]
        want = "points" if result_type == "matrix" else "value"
        if not isinstance(data["result"], list) or not all(
                isinstance(s, _Series) and getattr(s, want) is not None for s in data["result"]):
            raise PrometheusError(f"{url}: not a Prometheus query result")
        return data
    except (KeyError, TypeError, AttributeError):
        raise PrometheusError(f"{url}: not a Prometheus query result") from None


def parse_vector(body: bytes, url: str = "Prometheus") -> list[tuple[dict[str, str], float]]:
    """(labels, value) of a ``resultType: vector`` answer; anything else is a PrometheusError."""
    return [(s.labels, s.value) for s in _data(body, url, "vector")["result"]]


def parse_matrix(body: bytes, url: str = "Prometheus"
                 ) -> tuple[list[tuple[dict[str, str], Points]], dict[str, Any]]:
    """Series of a ``resultType: matrix`` answer, each (labels, points), and the answer's
    ``stats`` (empty unless asked for)."""
    data = _data(body, url, "matrix")
    stats = data.get("stats") or {}
    return [(s.labels, s.points) for s in data["result"]], stats if isinstance(stats, dict) else {}
