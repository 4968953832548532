"""The site x site matrix, read from Prometheus's HTTP API (``wanprobe fleet matrix``).

One instant query per figure (the same PromQL as the recording rules, so it works on a
Prometheus that does not load them) and one for firing ``ALERTS``
(https://prometheus.io/docs/prometheus/latest/querying/api/#instant-queries), through
``prom_http``, which treats the server as untrusted input; a figure outside its range (an
infinite RTT, a loss ratio above 1, a rate above 1 Pbit/s) refuses the answer (``figures``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from wanprobe.fleet.figures import BITS_PER_SECOND, RATIO, RTT_SECONDS, Range, checked
from wanprobe.fleet.prom_http import PrometheusError, parse_vector, query
from wanprobe.fleet.rules import RuleSettings, site_pair_queries

__all__ = ["ANY_SITE", "FIELDS", "PrometheusError", "SitePair", "assemble", "parse_vector",
           "query", "site_matrix"]

ANY_SITE = "any"  # dst_site of alerts about a whole daemon (down, stale)


def _figure(record: str, figure: Range) -> Any:
    """A matrix figure, read from the recording rule ``record``, in ``figure``; None: no data."""
    return field(default=None, metadata={"record": record, "range": figure})


@dataclass(frozen=True)
class SitePair:
    """One src → dst cell of the matrix: its figures and the alerts firing for it."""

    src_site: str
    dst_site: str
    rtt_p50_seconds: float | None = _figure("site_pair:wanprobe_rtt_p50:seconds", RTT_SECONDS)
    rtt_p99_seconds: float | None = _figure("site_pair:wanprobe_rtt_p99:seconds", RTT_SECONDS)
    loss_forward_ratio: float | None = _figure("site_pair:wanprobe_loss_forward:ratio", RATIO)
    loss_reverse_ratio: float | None = _figure("site_pair:wanprobe_loss_reverse:ratio", RATIO)
    throughput_bits_per_second: float | None = _figure(
        "site_pair:wanprobe_throughput:bits_per_second", BITS_PER_SECOND)
    alerts: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"src_site": self.src_site, "dst_site": self.dst_site,
                **{k: getattr(self, k) for k in FIELDS}, "alerts": list(self.alerts)}


FIELDS = {f.name: f.metadata["record"] for f in fields(SitePair) if "record" in f.metadata}
RANGES = {f.name: f.metadata["range"] for f in fields(SitePair) if "range" in f.metadata}


def assemble(figures: dict[str, list[tuple[dict[str, str], float]]],
             alerts: list[dict[str, str]], url: str = "Prometheus") -> list[SitePair]:
    """Pure: site pairs from per-figure samples and firing alert labels, sorted by pair; a
    figure outside its range is a PrometheusError naming the series, NaN is no data."""
    cells: dict[tuple[str, str], dict[str, Any]] = {}
    for name, samples in figures.items():
        for labels, value in samples:
            if "src_site" in labels and "dst_site" in labels:
                pair = (labels["src_site"], labels["dst_site"])
                cells.setdefault(pair, {})[name] = checked(value, RANGES[name], FIELDS[name],
                                                           labels, url)
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
    # only wanprobe's: a large Prometheus's other alerts stay out of the series cap
    firing = query(url, 'ALERTS{alertstate="firing", alertname=~"Wanprobe.*"}', timeout_s=timeout_s)
    alerts = [labels for labels, _ in firing if labels.get("alertname", "").startswith("Wanprobe")]
    return assemble(figures, alerts, url)
