"""The site x site matrix, read from Prometheus's HTTP API (``wanprobe fleet matrix``).

One instant query per figure (the same PromQL as the recording rules, so it works on a
Prometheus that does not load them) and one for firing ``ALERTS``
(https://prometheus.io/docs/prometheus/latest/querying/api/#instant-queries). The server is
treated as untrusted input: bounded reply size, a timeout, and every malformed answer is one
error line.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field, fields
from typing import Any

from wanprobe.errors import WanprobeError
from wanprobe.fleet.rules import RuleSettings, site_pair_queries

MAX_REPLY_BYTES = 32 * 2**20
ANY_SITE = "any"  # dst_site of alerts about a whole daemon (down, stale)


class PrometheusError(WanprobeError):
    """Prometheus could not be reached or gave an answer that is not a query result."""

    exit_code = 5


def _figure(record: str) -> Any:
    """A matrix figure, read from the recording rule ``record``; None: no data."""
    return field(default=None, metadata={"record": record})


@dataclass(frozen=True)
class SitePair:
    """One src → dst cell of the matrix: its figures and the alerts firing for it."""

    src_site: str
    dst_site: str
    rtt_p50_seconds: float | None = _figure("site_pair:wanprobe_rtt_p50:seconds")
    rtt_p99_seconds: float | None = _figure("site_pair:wanprobe_rtt_p99:seconds")
    loss_forward_ratio: float | None = _figure("site_pair:wanprobe_loss_forward:ratio")
    loss_reverse_ratio: float | None = _figure("site_pair:wanprobe_loss_reverse:ratio")
    throughput_bits_per_second: float | None = _figure(
        "site_pair:wanprobe_throughput:bits_per_second")
    alerts: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"src_site": self.src_site, "dst_site": self.dst_site,
                **{k: getattr(self, k) for k in FIELDS}, "alerts": list(self.alerts)}


FIELDS = {f.name: f.metadata["record"] for f in fields(SitePair) if "record" in f.metadata}


def query(url: str, promql: str, *, timeout_s: float = 10.0) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of every sample of an instant vector query."""
    full = url.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    try:
        with urllib.request.urlopen(full, timeout=timeout_s) as resp:
            body = resp.read(MAX_REPLY_BYTES + 1)
    except urllib.error.HTTPError as exc:
        body = exc.read(MAX_REPLY_BYTES + 1)
        try:
            detail = json.loads(body).get("error", "")
        except ValueError:
            detail = ""
        raise PrometheusError(f"Prometheus at {url}: HTTP {exc.code} {detail}".strip()) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise PrometheusError(f"cannot reach Prometheus at {url}: {reason}") from None
    return parse_vector(body, url)


def parse_vector(body: bytes, url: str = "Prometheus") -> list[tuple[dict[str, str], float]]:
    """Samples of a ``resultType: vector`` reply; anything else is a PrometheusError."""
    if len(body) > MAX_REPLY_BYTES:
        raise PrometheusError(f"{url}: reply larger than {MAX_REPLY_BYTES // 2**20} MiB")
    try:
        doc = json.loads(body)
        if doc.get("status") != "success" or doc["data"]["resultType"] != "vector":
            raise PrometheusError(f"{url}: query failed: {doc.get('error', doc.get('status'))}")
        out = []
        for sample in doc["data"]["result"]:
            labels = {str(k): str(v) for k, v in sample["metric"].items()}
            out.append((labels, float(sample["value"][1])))
        return out
    except PrometheusError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, IndexError):
        raise PrometheusError(f"{url}: not a Prometheus query result") from None


def assemble(figures: dict[str, list[tuple[dict[str, str], float]]],
             alerts: list[dict[str, str]]) -> list[SitePair]:
    """Pure: site pairs from per-figure samples and firing alert labels, sorted by pair."""
    cells: dict[tuple[str, str], dict[str, Any]] = {}
    for name, samples in figures.items():
        for labels, value in samples:
            if "src_site" in labels and "dst_site" in labels:
                pair = (labels["src_site"], labels["dst_site"])
                cells.setdefault(pair, {})[name] = value if math.isfinite(value) else None
    names: dict[tuple[str, str], set[str]] = {p: set() for p in cells}
    for a in alerts:
        src, dst, name = a.get("src_site"), a.get("dst_site"), a.get("alertname", "?")
        for pair in names:
            if pair[0] == src and dst in (pair[1], ANY_SITE):
                names[pair].add(name)
        if src is not None and dst not in (None, ANY_SITE) and (src, dst) not in names:
            names[(src, dst)] = {name}
            cells[(src, dst)] = {}
    return [SitePair(src, dst, **cells[(src, dst)], alerts=tuple(sorted(names[(src, dst)])))
            for src, dst in sorted(cells)]


def site_matrix(url: str, settings: RuleSettings, *, timeout_s: float = 10.0) -> list[SitePair]:
    """Query every figure and the firing alerts, then :func:`assemble`."""
    queries = site_pair_queries(settings)
    figures = {name: query(url, queries[record], timeout_s=timeout_s)
               for name, record in FIELDS.items()}
    alerts = [labels for labels, _ in query(url, 'ALERTS{alertstate="firing"}', timeout_s=timeout_s)
              if labels.get("alertname", "").startswith("Wanprobe")]
    return assemble(figures, alerts)
