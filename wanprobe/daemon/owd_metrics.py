"""The daemon's one-way delay gauges (issue 20): exported only for a session whose one-way delays
have a known clock error bound (probe/owd.py did not withhold them); a later session without
one removes them, so Prometheus never scrapes a value the clocks cannot back. The variation,
which needs no clock, drives the path watch instead (diagnose/path_watch.py).

The percentiles carry a ``stat`` label (``min``, ``p50``, ``p90``, ``p99``: the keys of the
result's ``owd_ms.forward``/``reverse``), as ``wanprobe_rtt_seconds`` does (metrics.py says
why): a gauge with a ``quantile`` label is refused by ``promtool check metrics``."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Gauge

OWD_STATS = ("min", "p50", "p90", "p99")
DIRECTIONS = ("forward", "reverse")
# series one peer adds per probe method while its one-way delays have a bound
SERIES_PER_PEER_METHOD = len(DIRECTIONS) * len(OWD_STATS) + 1


class OwdGauges:
    """``wanprobe_owd_seconds{direction,stat}`` and ``wanprobe_owd_clock_error_bound_
    seconds``, on the path labels the caller gives."""

    def __init__(self, registry: CollectorRegistry, path_labels: list[str]) -> None:
        self.owd = Gauge("wanprobe_owd_seconds", "One-way delay of the last probe session by "
                         "direction (forward = to the peer); stat is min, p50, p90 or p99. "
                         "Only while the clock error bound is known and smaller than the delays.",
                         [*path_labels, "direction", "stat", "method"], registry=registry)
        self.bound = Gauge("wanprobe_owd_clock_error_bound_seconds", "Worst-case clock error of "
                           "the one-way delays (0 when both ends share one kernel clock).",
                           [*path_labels, "method"], registry=registry)
        self._shown: set[tuple[str, ...]] = set()

    def observe(self, labels: tuple[str, ...], method: str, doc: dict[str, Any]) -> None:
        """Export the ``owd_ms`` of one ProbeResult document, or remove stale values."""
        owd = doc.get("owd_ms") or {}
        bound = owd.get("clock_error_bound_ms")
        fwd, rev = owd.get("forward") or {}, owd.get("reverse") or {}
        if bound is None or owd.get("withheld") or fwd.get("p50") is None \
                or rev.get("p50") is None:
            self.forget(labels, method)
            return
        for direction, values in (("forward", fwd), ("reverse", rev)):
            for key in OWD_STATS:
                if values.get(key) is not None:
                    self.owd.labels(*labels, direction, key, method).set(values[key] / 1e3)
        self.bound.labels(*labels, method).set(bound / 1e3)
        self._shown.add((*labels, method))

    def forget(self, labels: tuple[str, ...], method: str) -> None:
        key = (*labels, method)
        if key not in self._shown:
            return
        self._shown.discard(key)
        for direction in DIRECTIONS:
            for key in OWD_STATS:
                try:
                    self.owd.remove(*labels, direction, key, method)
                except KeyError:
                    pass
        try:
            self.bound.remove(*labels, method)
        except KeyError:
            pass
