"""The scheduled ring test's metrics (issue 39), read from its last run at each scrape.

- ``wanprobe_ring_bytes_per_second``: the ring's rate in the configured order, its slowest
  edge with every edge busy (a ring all-reduce's bus bandwidth), × 8 for bit/s;
- ``wanprobe_ring_best_bytes_per_second``: the same for the order the test proposes;
- ``wanprobe_ring_edge_bytes_per_second{from,to,run}``: each edge of the configured ring with
  every edge busy (``run="together"``) and, for an edge between sites, alone (``"alone"``);
- ``wanprobe_ring_shared_bottlenecks``: groups of edges that slowed together on one link;
- ``wanprobe_ring_last_run_timestamp_seconds``: when the last successful run started;
- ``wanprobe_ring_runs_total{result="ok|failed"}``.

Rates are in bytes per second, as ``wanprobe_throughput_bytes_per_second``: ``promtool check
metrics`` refuses ``bits`` in a name (base units). ``from`` and ``to`` are hosts as ``[ring]
hosts`` names them: at most 2 × 64 edge series. A figure the run did not measure has no series,
and the edges are those of the last run only, so a reload that changes the hosts leaves no stale
series behind once the next run is in. Nothing but the counter is exported before the first
run, and nothing at all while no ring is configured.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from wanprobe.ring.model import RingResult

RESULTS = ("ok", "failed")


class RingMetrics:
    """A collector for the daemon's registry: ``observe`` a run, ``failed`` a failure (from the
    event loop); ``collect`` (the scrape's thread) reads one consistent snapshot."""

    def __init__(self, enabled: Callable[[], bool] = lambda: True) -> None:
        self.enabled = enabled
        self.runs = dict.fromkeys(RESULTS, 0)
        self._last: tuple[float, RingResult] | None = None

    def observe(self, ts: float, result: RingResult, *, count: bool = True) -> None:
        """A successful run started at ``ts``; ``count=False`` for one read back from the
        history at start (its run was counted by the daemon that ran it)."""
        self._last = (ts, result)
        if count:
            self.runs["ok"] += 1

    def failed(self) -> None:
        self.runs["failed"] += 1

    def _families(self) -> dict[str, Any]:
        return {
            "ring": GaugeMetricFamily(
                "wanprobe_ring_bytes_per_second", "Bus bandwidth of the last scheduled ring "
                "test in the configured order: its slowest edge's goodput with every edge busy "
                "(x 8 for bit/s)."),
            "best": GaugeMetricFamily(
                "wanprobe_ring_best_bytes_per_second", "The same for the order the last ring "
                "test proposed (each site's hosts adjacent), as measured (x 8 for bit/s)."),
            "edge": GaugeMetricFamily(
                "wanprobe_ring_edge_bytes_per_second", "Goodput of one edge of the configured "
                "ring in the last ring test, with every edge busy (run=together) or alone "
                "(run=alone, edges between sites only); x 8 for bit/s.",
                labels=["from", "to", "run"]),
            "shared": GaugeMetricFamily(
                "wanprobe_ring_shared_bottlenecks", "Groups of ring edges that slowed together "
                "on one link in the last ring test."),
            "last": GaugeMetricFamily(
                "wanprobe_ring_last_run_timestamp_seconds", "Unix time the last successful "
                "scheduled ring test started."),
            "runs": CounterMetricFamily(
                "wanprobe_ring_runs", "Scheduled ring tests run, by result (ok, failed).",
                labels=["result"]),
        }

    def describe(self) -> Iterator[Any]:
        yield from self._families().values()

    def collect(self) -> Iterator[Any]:
        last, runs = self._last, dict(self.runs)
        if last is None and not self.enabled() and not any(runs.values()):
            return
        fam = self._families()
        for result in RESULTS:
            fam["runs"].add_metric([result], runs[result])
        if last is None:
            yield fam["runs"]
            return
        ts, r = last
        if r.ring_bits_per_second is not None:
            fam["ring"].add_metric([], r.ring_bits_per_second / 8)
        if r.best_ring_bits_per_second is not None:
            fam["best"].add_metric([], r.best_ring_bits_per_second / 8)
        for e in r.edges:
            for run, bps in (("together", e.bits_per_second), ("alone", e.alone_bits_per_second)):
                if bps is not None:
                    fam["edge"].add_metric([e.src, e.dst, run], bps / 8)
        fam["shared"].add_metric([], len(r.shared_bottlenecks))
        fam["last"].add_metric([], ts)
        yield from (f for f in fam.values() if f.samples)
