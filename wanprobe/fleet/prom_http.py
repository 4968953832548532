"""Prometheus's HTTP API, read with the standard library: instant and range queries.

https://prometheus.io/docs/prometheus/latest/querying/api/ (``/api/v1/query``,
``/api/v1/query_range``). The server is treated as untrusted input: a bounded reply size, a
timeout, and every malformed answer is one error line. ``stats=all`` (Prometheus ≥ 2.35) adds
the samples a query touched, which the windows bench reads.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from wanprobe.errors import WanprobeError

MAX_REPLY_BYTES = 32 * 2**20
Samples = list[tuple[dict[str, str], float]]
Series = list[tuple[dict[str, str], list[tuple[float, float]]]]


class PrometheusError(WanprobeError):
    """Prometheus could not be reached or gave an answer that is not a query result."""

    exit_code = 5


def get(url: str, path: str, params: dict[str, Any], *, timeout_s: float = 10.0) -> bytes:
    """The body of ``GET url/path?params``; an HTTP error carries Prometheus's own message."""
    full = url.rstrip("/") + path + "?" + urllib.parse.urlencode(params)
    try:
        with urllib.request.urlopen(full, timeout=timeout_s) as resp:
            return resp.read(MAX_REPLY_BYTES + 1)
    except urllib.error.HTTPError as exc:
        body = exc.read(MAX_REPLY_BYTES + 1)
        try:
            detail = json.loads(body).get("error", "")
        except (ValueError, AttributeError):
            detail = ""
        raise PrometheusError(f"Prometheus at {url}: HTTP {exc.code} {detail}".strip()) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise PrometheusError(f"cannot reach Prometheus at {url}: {reason}") from None


def _data(body: bytes, url: str, result_type: str) -> dict[str, Any]:
    if len(body) > MAX_REPLY_BYTES:
        raise PrometheusError(f"{url}: reply larger than {MAX_REPLY_BYTES // 2**20} MiB")
    try:
        doc = json.loads(body)
        if doc.get("status") != "success" or doc["data"]["resultType"] != result_type:
            raise PrometheusError(f"{url}: query failed: {doc.get('error', doc.get('status'))}")
        return doc["data"]
    except PrometheusError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError):
        raise PrometheusError(f"{url}: not a Prometheus query result") from None


def parse_vector(body: bytes, url: str = "Prometheus") -> Samples:
    """Samples of a ``resultType: vector`` reply; anything else is a PrometheusError."""
    data = _data(body, url, "vector")
    try:
        return [({str(k): str(v) for k, v in s["metric"].items()}, float(s["value"][1]))
                for s in data["result"]]
    except (ValueError, KeyError, TypeError, AttributeError, IndexError):
        raise PrometheusError(f"{url}: not a Prometheus query result") from None


def parse_matrix(body: bytes, url: str = "Prometheus") -> tuple[Series, dict[str, Any]]:
    """Series of a ``resultType: matrix`` reply, each (labels, [(unix s, value)]), and the
    reply's ``stats`` (empty unless asked for)."""
    data = _data(body, url, "matrix")
    try:
        series = [({str(k): str(v) for k, v in s["metric"].items()},
                   [(float(t), float(v)) for t, v in s["values"]]) for s in data["result"]]
        stats = data.get("stats") or {}
        return series, stats if isinstance(stats, dict) else {}
    except (ValueError, KeyError, TypeError, AttributeError, IndexError):
        raise PrometheusError(f"{url}: not a Prometheus query result") from None


def query(url: str, promql: str, *, timeout_s: float = 10.0, at_s: float | None = None) -> Samples:
    """(labels, value) of every sample of an instant vector query (at ``at_s``, default now)."""
    params: dict[str, Any] = {"query": promql}
    if at_s is not None:
        params["time"] = f"{at_s:.3f}"
    return parse_vector(get(url, "/api/v1/query", params, timeout_s=timeout_s), url)


def query_range(url: str, promql: str, *, start_s: float, end_s: float, step_s: float,
                timeout_s: float = 30.0, stats: bool = False) -> tuple[Series, dict[str, Any]]:
    """Every series of a range query and, with ``stats``, what Prometheus says it cost."""
    params: dict[str, Any] = {"query": promql, "start": f"{start_s:.3f}", "end": f"{end_s:.3f}",
                              "step": f"{step_s:g}", "timeout": f"{timeout_s:g}s"}
    if stats:
        params["stats"] = "all"
    return parse_matrix(get(url, "/api/v1/query_range", params, timeout_s=timeout_s + 5), url)


def label_value(text: str) -> str:
    """``text`` as a PromQL string literal (double-quoted, backslash and quote escaped)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
