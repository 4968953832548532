"""The daemon's windowed loss gauges (issue 36): each peer's loss per direction over the short
window (``[baseline] loss_short``, 5 minutes by default) of its primary method's sessions, with
the 95 % Wilson interval and the probes behind it (probe/loss_window.py).

The last session's ``wanprobe_loss_ratio`` is one draw of a few probes: a steady 3 % reads as 0 in
most sessions of ten. The packet counters let Prometheus pool any window (``increase()`` of lost
over sent), but not say how sure the figure is; these gauges carry the interval the daemon's own
regression test and page use, so an alert or a dashboard can ask "is the loss significantly above
the SLO" (``bound="ci95_low"`` above it) or "is it shown to be within" (``ci95_high`` below it).
Per peer: 2 directions × (3 bounds + 1 sample size) = 8 series (SERIES_PER_PEER)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge

from wanprobe.probe.loss_window import WindowLoss

DIRECTIONS = ("forward", "reverse")
BOUNDS = ("estimate", "ci95_low", "ci95_high")
SERIES_PER_PEER = len(DIRECTIONS) * (len(BOUNDS) + 1)


class LossWindowGauges:
    """``wanprobe_loss_window_ratio{direction,bound}`` and ``wanprobe_loss_window_probes
    {direction}`` on the path labels the caller gives; a direction with no probe in the window
    has no series (unknown, not 0)."""

    def __init__(self, registry: CollectorRegistry, path_labels: list[str]) -> None:
        self.ratio = Gauge("wanprobe_loss_window_ratio", "Probe loss over the daemon's short "
                           "window ([baseline] loss_short) by direction; bound is estimate, "
                           "ci95_low or ci95_high (Wilson 95 % interval).",
                           [*path_labels, "direction", "bound"], registry=registry)
        self.probes = Gauge("wanprobe_loss_window_probes", "Probes behind "
                            "wanprobe_loss_window_ratio: those whose direction was told, in the "
                            "window.", [*path_labels, "direction"], registry=registry)

    def observe(self, labels: tuple[str, ...], window: dict[str, WindowLoss] | None) -> None:
        for d in DIRECTIONS:
            w = (window or {}).get(d)
            if w is None or not w.of:
                self._forget_direction(labels, d)
                continue
            lo, hi = w.ci95
            for bound, value in zip(BOUNDS, (w.ratio, lo, hi), strict=True):
                self.ratio.labels(*labels, d, bound).set(value)
            self.probes.labels(*labels, d).set(w.of)

    def forget(self, labels: tuple[str, ...]) -> None:
        for d in DIRECTIONS:
            self._forget_direction(labels, d)

    def _forget_direction(self, labels: tuple[str, ...], d: str) -> None:
        for gauge, tail in [(self.ratio, (d, b)) for b in BOUNDS] + [(self.probes, (d,))]:
            try:
                gauge.remove(*labels, *tail)
            except KeyError:
                pass
