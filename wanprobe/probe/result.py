"""Probe results: frozen dataclasses whose ``to_json()`` gives the report keys (issue 3) and whose
``from_json()`` reads them back (issue 21, one codec): derived keys are recomputed, keys unknown
here (a later minor version's, those services/diagnose adds) are left alone."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from wanprobe.errors import ConfigError, shown
from wanprobe.json_fields import fields, objects, pair, quantiles

if TYPE_CHECKING:
    from wanprobe.probe.owd import OwdReport

RTT_KEYS = ("min", "p50", "p90", "p99", "max", "mean", "stdev")
LOSS_KEYS = ("sent", "received", "ci95", "forward_lost", "reverse_lost", "forward_ratio",
             "reverse_ratio", "forward_ci95", "reverse_ci95", "late", "reflector_rate_limited",
             "reflector_replays_refused", "reflector_resets", "unattributed")
PROBE_KEYS = ("method", "peer", "port", "started_at", "duration_s", "interval_s", "size_bytes",
              "rtt_ms", "loss", "dscp", "jitter_ms", "jitter_forward_ms", "jitter_reverse_ms",
              "reordered", "duplicates", "tx_timestamp", "samples", "owd_ms", "reflector")
MTU_KEYS = ("peer", "port", "path_mtu", "local_mtu", "method", "found_by", "timeout_s", "steps")


def _r6(x: float | None) -> float | None:
    return None if x is None else round(x, 6)


def _ci6(x: tuple[float, float] | None) -> list[float] | None:
    return None if x is None else [round(x[0], 6), round(x[1], 6)]


@dataclass(frozen=True)
class RttStats:
    """Round-trip time distribution in ms."""

    min: float
    p50: float
    p90: float
    p99: float
    max: float
    mean: float
    stdev: float

    def to_json(self) -> dict:
        return {k: round(getattr(self, k), 6) for k in RTT_KEYS}

    @classmethod
    def from_json(cls, doc: Any) -> RttStats | None:
        """Read back what ``to_json`` wrote; None when every figure is null (nothing came back);
        ConfigError if malformed."""
        values = quantiles(doc, "path.rtt_ms", RTT_KEYS)
        return None if values is None else cls(*values)


@dataclass(frozen=True)
class LossStats:
    """Round-trip loss and, when the reflector counts what it received, its split by direction.

    ``forward_ratio`` = probes that never reached the reflector / probes sent up to the last
    answered one; ``reverse_ratio`` = replies lost / probes the reflector answered. None when
    the reflector gives no receive count (stateless, no Direct Measurement TLV). All three ratios
    are the path's: what a wanprobe reflector received and did not answer for its rate limit is
    counted in ``reflector_rate_limited`` (None: the reflector cannot say) and left out
    (loss_split.py). ``reflector_replays_refused``: copies of this session's probes its
    authentication refused as replays (never counted as received, so no probe is missing).
    ``reflector_resets``: times the reflector's session restarted (evicted or reset);
    ``reflector_session_refused``: probes the reflector answered only to say it refused their
    new session (its table had no room it may take, issue 37), neither sent on the path nor
    lost; ``unattributed``: unanswered probes whose fate cannot be told apart from the
    reflector's doing (around a restart or a refusal, or after the last answer of a session the
    reflector was dropping from), in no direction and not in ``ratio``."""

    sent: int
    received: int
    ci95: tuple[float, float]
    forward_lost: int | None = None
    forward_of: int | None = None
    reverse_lost: int | None = None
    reverse_of: int | None = None
    forward_ci95: tuple[float, float] | None = None
    reverse_ci95: tuple[float, float] | None = None
    late: int = 0
    reflector_rate_limited: int | None = None
    reflector_replays_refused: int | None = None
    reflector_resets: int = 0
    unattributed: int = 0
    tail: int = 0      # unanswered after the last answer, still counted in ``ratio``
    reflector_session_refused: int = 0

    def tail_unattributed(self) -> LossStats:
        """The same with the tail moved to ``unattributed`` (its reflector was dropping probes
        of this source: a sibling flow said so; multiflow.py)."""
        if not self.tail:
            return self
        from wanprobe.probe.stats import wilson_interval

        moved = replace(self, unattributed=self.unattributed + self.tail, tail=0)
        return replace(moved, ci95=wilson_interval(moved.path_sent - self.received,
                                                   moved.path_sent))

    @property
    def reflector_dropped(self) -> int:
        """Probes the reflector received and did not answer, as far as it said."""
        return self.reflector_rate_limited or 0

    @property
    def path_sent(self) -> int:
        """Probes whose fate is the path's: sent, less the reflector's drops and refusals and
        the unattributed."""
        return (self.sent - self.reflector_dropped - self.unattributed
                - self.reflector_session_refused)

    @property
    def ratio(self) -> float:
        """Round-trip loss of the path: the reflector's own drops are neither sent nor lost."""
        of = self.path_sent
        return (of - self.received) / of if of > 0 else 0.0

    @property
    def forward_ratio(self) -> float | None:
        if self.forward_lost is None or not self.forward_of:
            return None
        return self.forward_lost / self.forward_of

    @property
    def reverse_ratio(self) -> float | None:
        if self.reverse_lost is None or not self.reverse_of:
            return None
        return self.reverse_lost / self.reverse_of

    def to_json(self) -> dict:
        r, ci = _r6, _ci6
        return {
            "sent": self.sent, "received": self.received, "ratio": r(self.ratio),
            "forward_ratio": r(self.forward_ratio), "reverse_ratio": r(self.reverse_ratio),
            "ci95": ci(self.ci95), "forward_ci95": ci(self.forward_ci95),
            "reverse_ci95": ci(self.reverse_ci95), "forward_lost": self.forward_lost,
            "reverse_lost": self.reverse_lost, "late": self.late,
            # the sample behind each ratio (1.2, issue 36): a loss figure carries its size
            "path_sent": self.path_sent, "forward_of": self.forward_of,
            "reverse_of": self.reverse_of,
            "reflector_rate_limited": self.reflector_rate_limited,
            "reflector_replays_refused": self.reflector_replays_refused,
            "reflector_resets": self.reflector_resets,
            "unattributed": self.unattributed,
            "reflector_session_refused": self.reflector_session_refused,   # 1.4 (issue 37)
        }

    @classmethod
    def from_json(cls, doc: Any) -> LossStats:
        """Read back what ``to_json`` wrote; ConfigError if malformed. ``forward_of`` and
        ``reverse_of`` are not written: recovered from the written counts and ratios."""
        (sent, received, ci95, f_lost, r_lost, f_ratio, r_ratio, f_ci, r_ci, late, limited,
         replays, resets, unattributed) = fields(doc, "path.loss", LOSS_KEYS)
        f_of, r_of = doc.get("forward_of"), doc.get("reverse_of")  # written since 1.2
        session_refused = doc.get("reflector_session_refused")     # written since 1.4
        return cls(sent, received, pair(ci95), f_lost,
                   f_of if _is_count(f_of) else _count_of(f_lost, f_ratio, sent), r_lost,
                   r_of if _is_count(r_of) else _count_of(r_lost, r_ratio, sent), pair(f_ci),
                   pair(r_ci), late, limited, replays, resets, unattributed,
                   reflector_session_refused=(session_refused if _is_count(session_refused)
                                              else 0))


@dataclass(frozen=True)
class DscpReport:
    """DSCP sent, seen at the reflector (CoS TLV DSCP2) and on returned packets.

    ``bleached``: "forward" when the reflector saw a different DSCP than sent, "reverse" when the
    reflector saw the right one but replies came back remarked, "none", or None (unknown)."""

    sent: int
    at_reflector: int | None = None
    returned: int | None = None
    ecn_at_reflector: int | None = None
    requested_return: int | None = None
    reflector_refused: bool | None = None
    bleached: str | None = None

    def to_json(self) -> dict:
        return {
            "sent": self.sent, "at_reflector": self.at_reflector, "returned": self.returned,
            "ecn_at_reflector": self.ecn_at_reflector, "bleached": self.bleached,
            "reflector_refused": self.reflector_refused,
        }

    @classmethod
    def from_json(cls, doc: Any) -> DscpReport:
        """Read back what ``to_json`` wrote; ConfigError if malformed."""
        sent, at, returned, ecn, bleached, refused = fields(
            doc, "path.dscp", ("sent", "at_reflector", "returned", "ecn_at_reflector", "bleached",
                               "reflector_refused"))
        return cls(sent, at, returned, ecn, reflector_refused=refused, bleached=bleached)


@dataclass(frozen=True)
class ReflectorInfo:
    """What a STAMP session learned about its reflector from the Reflector Report TLV
    (reflector_report.py): ``counts`` "reported" (a wanprobe reflector counted its drops),
    "not_supported" (a third-party reflector echoed the TLV) or None (no reply); the rate it
    answers per source address, probes/s, when it said."""

    counts: str | None = None
    limit_pps: int | None = None

    def to_json(self) -> dict:
        return {"counts": self.counts, "limit_pps": self.limit_pps}

    @classmethod
    def from_json(cls, doc: Any) -> ReflectorInfo | None:
        """Read back what ``to_json`` wrote (None: no reply); ConfigError if malformed."""
        return None if doc is None else cls(*fields(doc, "path.reflector", ("counts", "limit_pps")))


@dataclass(frozen=True)
class ProbeResult:
    """One probe run against one peer."""

    method: str
    peer: str
    port: int | None
    started_at: str                  # ISO 8601 UTC
    duration_s: float
    interval_s: float
    size_bytes: int | None
    rtt: RttStats | None
    loss: LossStats
    dscp: DscpReport
    jitter_ms: float | None = None
    jitter_forward_ms: float | None = None
    jitter_reverse_ms: float | None = None
    reordered: int = 0
    duplicates: int = 0
    tx_timestamp: str = "kernel"     # "kernel" (SO_TIMESTAMPING TX) or "user" (clock read)
    rtt_samples_ms: tuple[float, ...] = field(default=(), repr=False)
    owd: OwdReport | None = None     # one-way delay per direction (STAMP only; owd.py)
    reflector: ReflectorInfo | None = None
    # the number of RTT samples when they were not kept (read back from a report without them)
    sample_count: int | None = field(default=None, repr=False)

    def to_json(self, *, samples: bool = False) -> dict:
        r = _r6
        doc = {
            "method": self.method, "peer": self.peer, "port": self.port,
            "started_at": self.started_at, "duration_s": round(self.duration_s, 3),
            "interval_s": self.interval_s, "size_bytes": self.size_bytes,
            "rtt_ms": self.rtt.to_json() if self.rtt else dict.fromkeys(RTT_KEYS),
            "loss": self.loss.to_json(), "jitter_ms": r(self.jitter_ms),
            "jitter_forward_ms": r(self.jitter_forward_ms),
            "jitter_reverse_ms": r(self.jitter_reverse_ms),
            "reordered": self.reordered, "duplicates": self.duplicates,
            "dscp": self.dscp.to_json(), "tx_timestamp": self.tx_timestamp,
            "samples": (len(self.rtt_samples_ms) if self.sample_count is None
                        else self.sample_count),
            "owd_ms": self.owd.to_json() if self.owd is not None else None,
            "reflector": self.reflector.to_json() if self.reflector is not None else None,
        }
        if samples:
            doc["rtt_samples_ms"] = [round(x, 6) for x in self.rtt_samples_ms]
        return doc

    @classmethod
    def from_json(cls, doc: Any) -> ProbeResult:
        """Read back what ``to_json`` wrote, with or without ``rtt_samples_ms`` (without them,
        ``sample_count`` keeps how many there were); ConfigError if malformed."""
        from wanprobe.probe.owd import OwdReport

        (method, peer, port, started_at, duration_s, interval_s, size_bytes, rtt, loss, dscp,
         jitter, jitter_f, jitter_r, reordered, duplicates, tx_timestamp, samples, owd,
         reflector) = fields(doc, "path", PROBE_KEYS)
        kept = doc.get("rtt_samples_ms")
        if kept is not None and len(kept) != samples:
            raise ConfigError(f"path: samples is {shown(samples)} but rtt_samples_ms holds "
                              f"{len(kept)}")
        return cls(method, peer, port, started_at, duration_s, interval_s, size_bytes,
                   RttStats.from_json(rtt), LossStats.from_json(loss), DscpReport.from_json(dscp),
                   jitter, jitter_f, jitter_r, reordered, duplicates, tx_timestamp,
                   tuple(kept or ()), OwdReport.from_json(owd), ReflectorInfo.from_json(reflector),
                   sample_count=None if kept is not None else samples)


@dataclass(frozen=True)
class MtuStep:
    """One size tried in a path-MTU search."""

    size_bytes: int
    passed: bool
    tries: int

    def to_json(self) -> dict:
        return {"size_bytes": self.size_bytes, "passed": self.passed, "tries": self.tries}


@dataclass(frozen=True)
class MtuResult:
    """Path MTU: the largest IP packet (header included) that crossed the path and was answered."""

    peer: str
    port: int
    path_mtu: int
    local_mtu: int
    method: str
    found_by: str
    timeout_s: float
    steps: tuple[MtuStep, ...] = ()

    def to_json(self) -> dict:
        return {
            "peer": self.peer, "port": self.port, "path_mtu": self.path_mtu,
            "local_mtu": self.local_mtu, "method": self.method, "found_by": self.found_by,
            "timeout_s": self.timeout_s, "steps": [s.to_json() for s in self.steps],
        }

    @classmethod
    def from_json(cls, doc: Any) -> MtuResult:
        """Read back what ``to_json`` wrote; ConfigError if malformed."""
        *head, steps = fields(doc, "mtu", MTU_KEYS)
        return cls(*head, objects(steps, "mtu.steps", lambda s, at: MtuStep(
            *fields(s, at, ("size_bytes", "passed", "tries")))))


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _count_of(lost: int | None, ratio: float | None, sent: int) -> int | None:
    """The denominator of a written ``lost / of`` ratio (``of`` is not in the JSON): None when
    nothing was counted, 0 when the ratio was withheld, else a count that gives the written
    ratio back (``sent`` when none were lost)."""
    if lost is None:
        return None
    if ratio is None:
        return 0
    if lost == 0:
        return max(sent, 1)
    guess = max(round(lost / ratio), lost) if ratio > 0 else lost
    for n in sorted(range(max(guess - 3, 1), guess + 4), key=lambda n: abs(n - guess)):
        if round(lost / n, 6) == ratio:
            return n
    raise ConfigError(f"path.loss: ratio {shown(ratio)} does not follow from {lost} lost")
