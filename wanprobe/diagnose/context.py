"""The one input of every rule: a frozen :class:`Context` of optional typed parts.

A rule names the parts it needs (``@rule(id, needs=...)``, rule.py) and takes them as its
positional arguments in that order; the engine runs a rule only on a context that has them:

- ``measured``, ``host``, ``config``: one report (the typed :class:`Measured`, the :class:`Host`
  judged — the local one, or the peer's from its facts — and the :class:`DiagnoseConfig`);
- ``snapshot``, ``rates``, ``window_s``: the host's counters (collectors/snapshot.py), the rates
  between two snapshots and the window they span;
- ``path_event``: a change of one peer's path (path_watch.py) with what the daemon knows beside it;
- ``trend``: one peer's metric leaving its rolling baseline (daemon/baseline.py);
- ``verify``: one throughput test after ``tune apply`` against the capacity (verify_limit.py);
- ``throughput``: the figures of one throughput test (``VerdictInput``) the throughput verdict
  judges (rules_throughput.py).

``host`` and ``rates`` may be None beside the parts they belong with (a report without a host;
a single snapshot, no rates): the rules judge that absence themselves (conventions §3).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, TypedDict

from collectors.rates import Rates
from wanprobe.diagnose.host_inputs import Host
from wanprobe.diagnose.inputs import DiagnoseConfig
from wanprobe.diagnose.measured import Measured
from wanprobe.diagnose.path_watch import PathEvent
from wanprobe.throughput.verdict import VerdictInput

if TYPE_CHECKING:  # a type only: the collectors stay unloaded until a snapshot is taken
    from collectors.snapshot import Snapshot

REPORT = ("measured", "host", "config")
COUNTERS = ("snapshot", "rates", "window_s")
OPTIONAL = ("host", "rates")


@dataclass(frozen=True)
class PathChange:
    """A path event of one peer and the figures beside it: the hops traced before and after (a
    peer probed over several flows) and the link rate the training step is costed at."""

    peer: str
    address: str
    event: PathEvent
    hops_before: list[list[str | None]] | None = None  # per flow: hops[i] answered TTL i+1
    hops_after: list[list[str | None]] | None = None
    link_bps: float | None = None


@dataclass(frozen=True)
class Trend:
    """A metric of one peer entering regression: ``transition`` is the daemon's
    ``Transition.to_json()`` (metric, baseline, current, threshold, unit and its evidence)."""

    peer: str
    address: str
    transition: Mapping[str, Any]


class VerifyEvidence(TypedDict):
    """The figures of one throughput test after its ramp-up (``verify_limit.evidence_of``):
    sender TCP_INFO over the kept intervals, CPU, and the throughput verdict's own evidence."""

    cc: str | None
    streams: int
    throughput_verdict: str | None
    side: str | None
    throughput_summary: str | None
    min_rtt_ms: float | None
    srtt_ms: float | None
    pacing_rate_bits_per_second: float | None
    delivery_rate_max_bits_per_second: float | None
    cwnd_max_bytes: int | None
    app_limited_share: float | None
    rwnd_limited_share: float | None
    sndbuf_limited_share: float | None
    retransmit_rate: float | None
    mathis_bound_bits_per_second: float | None
    steal_percent: float | None
    sender_thread_busy_ratio: float | None
    receiver_thread_busy_ratio: float | None
    samples: int
    kept_rates_bits_per_second: list[int]


@dataclass(frozen=True)
class VerifyRun:
    """What the after-apply verdict judges: the figures of one throughput test
    (``verify_limit.evidence_of``), its rate after the ramp-up and the path's capacity."""

    evidence: VerifyEvidence
    rate_bps: float | None
    capacity_bps: float | None
    capacity_source: str | None = None

    @property
    def share(self) -> float | None:
        """The rate as a share of the capacity; None when either is unknown."""
        if not self.capacity_bps or self.capacity_bps <= 0 or self.rate_bps is None:
            return None
        return self.rate_bps / self.capacity_bps


@dataclass(frozen=True)
class Context:
    """The parts one judgement has; see the module docstring."""

    measured: Measured | None = None        # a report ...
    host: Host | None = None
    config: DiagnoseConfig | None = None
    snapshot: Snapshot | None = None        # the host's counters ...
    rates: Rates | None = None
    window_s: float | None = None
    path_event: PathChange | None = None    # the daemon's ...
    trend: Trend | None = None
    verify: VerifyRun | None = None         # the after-apply verdict's
    throughput: VerdictInput | None = None  # and the throughput verdict's

    @classmethod
    def of_counters(cls, snapshot: Snapshot, rates: Rates | None = None,
                    window_s: float | None = None) -> Context:
        """A counters context; the window defaults to the rates' interval (0 without rates)."""
        if window_s is None:
            window_s = rates.interval_s if rates is not None else 0.0
        return cls(snapshot=snapshot, rates=rates, window_s=window_s)

    def has(self, needs: tuple[str, ...]) -> bool:
        """Every part in ``needs`` is here (an optional part counts as here)."""
        return all(p in OPTIONAL or getattr(self, p) is not None for p in needs)

    def parts(self, needs: tuple[str, ...]) -> tuple[object, ...]:
        return tuple(getattr(self, p) for p in needs)


PARTS = tuple(f.name for f in fields(Context))
