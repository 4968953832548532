"""What the daemon's page shows of the running daemon, copied on the event loop in one go (a
snapshot), so the page is then drawn in a worker thread without touching live state: each peer's
last session, its loss over the short and long windows (probe/loss_window.py: a steady 3 % that
one 10-probe session shows as 0 % is told with its sample and interval), its baseline, the
reflector's refusals, where the history is.

The colour of a peer or a site pair is its *excess over its own baseline*, in units of the
daemon's own regression threshold (daemon/baseline.py): 1.0 is where the daemon would call a
regression (RTT: max(baseline × rtt_increase_ratio, rtt_increase_min_ms) above the baseline
median; loss: loss_increase above the baseline loss). A fixed 1/10/100 ms scale says nothing
on a 130 ms path; this one means the same on every path.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

from wanprobe.pictures.html import number
from wanprobe.probe.loss_window import WindowLoss


class Thresholds(Protocol):
    """The daemon's regression thresholds the excess is measured in (its ``[baseline]``
    settings, ``daemon.config.BaselineSettings``)."""

    @property
    def rtt_increase_ratio(self) -> float: ...
    @property
    def rtt_increase_min_ms(self) -> float: ...
    @property
    def loss_increase(self) -> float: ...


# colour classes of page.css: below a quarter of the threshold, half, the threshold, above
EXCESS_STEPS = ((0.25, "x0"), (0.5, "x1"), (1.0, "x2"), (math.inf, "x3"))


def excess_class(score: float | None) -> str:
    if score is None:
        return "xn"
    return next(c for limit, c in EXCESS_STEPS if score < limit)


@dataclass(frozen=True)
class Excess:
    """A peer's last session against its baseline, 1.0 = the regression threshold; None where
    either side is unknown. ``score``: the largest of them."""

    rtt_p50: float | None = None
    rtt_p99: float | None = None
    loss_forward: float | None = None
    loss_reverse: float | None = None
    loss: float | None = None

    @property
    def score(self) -> float | None:
        known = [v for v in (self.rtt_p50, self.rtt_p99, self.loss_forward, self.loss_reverse,
                             self.loss) if v is not None]
        return max(known) if known else None

    def direction(self, forward: bool) -> float | None:
        """The score of one direction: RTT (round trip) and that direction's loss."""
        loss = self.loss_forward if forward else self.loss_reverse
        known = [v for v in (self.rtt_p50, self.rtt_p99, loss if loss is not None else self.loss)
                 if v is not None]
        return max(known) if known else None


def excess(last: Mapping[str, Any] | None, baseline: Mapping[str, Any],
           s: Thresholds, loss_window: Mapping[str, WindowLoss] | None = None) -> Excess:
    """RTT from the last session; loss from the short window's counts where there are some (a
    single session's 10 probes say nothing below 10 %), else from the last session."""
    if not last:
        return Excess()

    def rtt(key: str) -> float | None:
        cur, base = number(last, "rtt_ms", key), baseline.get(f"rtt_{key}_ms")
        if cur is None or base is None:
            return None
        return (cur - base) / max(base * s.rtt_increase_ratio, s.rtt_increase_min_ms)

    base_loss = baseline.get("loss_ratio")

    def loss(key: str, direction: str) -> float | None:
        w = (loss_window or {}).get(direction)
        cur = w.ratio if w is not None and w.of else number(last, "loss", key)
        if cur is None or base_loss is None:
            return None
        return max(cur - base_loss, 0.0) / s.loss_increase

    return Excess(rtt("p50"), rtt("p99"), loss("forward_ratio", "forward"),
                  loss("reverse_ratio", "reverse"), loss("ratio", "round_trip"))


@dataclass(frozen=True)
class PeerState:
    name: str
    site: str
    address: str
    method: str
    last: Mapping[str, Any] | None        # the last session's ProbeResult JSON
    baseline: Mapping[str, Any]
    settings: Thresholds
    degraded: tuple[str, ...] = ()
    # the loss per direction over the short and long windows (None before any session)
    loss_short: Mapping[str, WindowLoss] | None = None
    loss_long: Mapping[str, WindowLoss] | None = None

    @cached_property
    def excess(self) -> Excess:
        """Computed when first read, in the drawing thread, not on the daemon's loop."""
        return excess(self.last, self.baseline, self.settings, self.loss_short)

    @property
    def last_ts(self) -> float | None:
        started = (self.last or {}).get("started_at")
        try:
            return datetime.fromisoformat(started).timestamp() if started else None
        except (TypeError, ValueError):
            return None


@dataclass(frozen=True)
class DaemonState:
    host: str
    site: str
    version: str
    probe_interval_s: float
    db_path: Path
    tune_state_dir: Path            # the tuner's journals (tuning changes), read only
    peers: tuple[PeerState, ...]
    refusals: Mapping[str, int]
    reflector: str                  # "ok", "off" or why it is down
    fleet: bool                     # a mesh file: draw the site x site matrix
    now: float = field(default_factory=time.time)

    def peer(self, name: str) -> PeerState | None:
        return next((p for p in self.peers if p.name == name), None)


def snapshot(daemon: Any) -> DaemonState:
    """Copy what the page needs from a running ``daemon.main.Daemon`` (call on its loop): the
    baselines (new dicts) and the last sessions (replaced, never changed, by the daemon); all
    arithmetic on them is left to the drawing thread (about 5 ms here at 1,000 peers)."""
    from wanprobe import __version__

    cfg, last, tracker = daemon.cfg, daemon.last_probes, daemon.baseline
    windows, now = daemon.loss_windows, time.time()
    peers = []
    for p in daemon.peers:
        base = tracker.baseline(p.name)
        doc = last.get(p.name)
        peers.append(PeerState(p.name, p.site, p.address, p.methods[0], doc, base, cfg.baseline,
                               tuple(k for k, v in tracker.degraded(p.name).items() if v),
                               windows.loss(p.name, "short", now),
                               windows.loss(p.name, "long", now)))
    refusals: Mapping[str, int] = {}
    if hasattr(daemon.reflector, "refusals"):
        try:
            refusals = dict(daemon.reflector.refusals())
        except Exception:  # noqa: BLE001 - as a scrape: the page never fails for one source
            refusals = {}
    reflector = ("off" if not cfg.reflector_enabled else daemon.reflector_error or "ok")
    return DaemonState(host=daemon.metrics.host, site=cfg.site, version=__version__,
                       probe_interval_s=cfg.probe.interval_s, db_path=cfg.db_path,
                       tune_state_dir=cfg.tune_state_dir, peers=tuple(peers), refusals=refusals,
                       reflector=reflector, fleet=cfg.mesh_file is not None)
