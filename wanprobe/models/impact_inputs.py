"""What the impact model takes per candidate site, and the path a joint job waits for.

A :class:`Candidate` is read from a report by ``wanprobe.report.impact_reader`` (the typed
measurements and host of the report); :func:`slowest` is pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from wanprobe.errors import ConfigError
from wanprobe.models.impact import Path


@dataclass(frozen=True)
class Candidate:
    """One candidate site from a report: its name, its path now, and what its plan would set."""

    name: str
    source: str
    path: Path
    rtt_p50_s: float | None
    measured_bps: float | None
    tuned_window_bytes: float | None
    tuned_cc: str | None
    tuned_measured_bps: float | None = None   # the report's verified tuning (measurements.verify)

    def to_json(self) -> dict:
        return {"name": self.name, "source": self.source, "rtt_p99_s": self.path.rtt_s,
                "rtt_p50_s": self.rtt_p50_s, "loss": self.path.loss, "cc": self.path.cc,
                "window_bytes": self.path.window_bytes, "measured_bps": self.measured_bps,
                "link_bps": self.path.link_bps, "tuned_window_bytes": self.tuned_window_bytes,
                "tuned_cc": self.tuned_cc, "tuned_measured_bps": self.tuned_measured_bps}


def slowest(candidates: Sequence[Candidate]) -> Path:
    """The path a job spanning all candidates waits for: the worst p99 RTT, the lowest loss-free
    capacity and the slowest peer's per-flow rate, the highest loss."""
    if not candidates:
        raise ConfigError("no report given")
    worst = min(candidates, key=lambda c: c.path.flow_rate(1))
    return Path(rtt_s=max(c.path.rtt_s for c in candidates),
                link_bps=min(c.path.link_bps for c in candidates),
                loss=max(c.path.loss for c in candidates), cc=worst.path.cc,
                window_bytes=worst.path.window_bytes, flow_rate_bps=worst.path.flow_rate(1),
                mss_bytes=worst.path.mss_bytes)
