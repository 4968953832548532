"""What diagnose measured, typed: the view every rule and every reader of a report takes. The
report codec (``wanprobe/report/codec.py``, ``measured_of``) builds it once from a report's
``measurements`` dict, each part from the type its producer wrote where one exists
(``ThroughputResult``: :meth:`ThroughputMeasured.of`; ``Capacity``; ``DscpReport``; ``HostFacts``).
Units are in the field names; absent is None, never 0 (docs/conventions.md §3): a rule skips what
was not measured.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal

from collectors.host_facts import HostFacts
from wanprobe.diagnose.finding import Finding
from wanprobe.models.tcp_rate import DEFAULT_MSS_BYTES
from wanprobe.probe.result import DscpReport
from wanprobe.throughput.capacity import Capacity

if TYPE_CHECKING:
    from wanprobe.throughput.result import ThroughputResult

# how a path's capacity figure was obtained: the UDP bursts (exact, or a bound a host set), the
# operator's rate (--link-rate), the TCP test's goodput standing in for it
CapacityMethod = Literal["udp_burst", "operator", "tcp_goodput"]


@dataclass(frozen=True)
class SenderChrono:
    """Where a sender's time went (tcp_chrono, include/net/tcp.h): busy sending, and how much of
    that the receive window or the send buffer held it back (tcpi_busy_time, tcpi_rwnd_limited,
    tcpi_sndbuf_limited)."""

    busy_time_ms: float | None
    rwnd_limited_ms: float | None
    sndbuf_limited_ms: float | None


@dataclass(frozen=True)
class StreamFacts:
    """One stream's final TCP_INFO (``streams[].tcp_info``): the sender's smallest RTT, MSS and
    the window the receiver last advertised (tcpi_min_rtt, tcpi_snd_mss, tcpi_snd_wnd), what it
    sent and resent (tcpi_bytes_sent, tcpi_bytes_retrans) and where its time went."""

    min_rtt_ms: float | None
    snd_mss_bytes: float | None
    snd_wnd_bytes: float | None
    bytes_retrans: float | None
    bytes_sent: float | None
    chrono: SenderChrono


@dataclass(frozen=True)
class LimitedBy:
    """The throughput verdict (``rules_throughput.py``) and the figures of its evidence the rules
    read: shares of busy time, the TCP retransmit rate and the largest window the receiver
    offered."""

    verdict: str | None
    rwnd_limited_share: float | None
    sndbuf_limited_share: float | None
    retransmit_rate: float | None
    peer_window_max_bytes: float | None


# a stream's id as its producer wrote it (an int from either engine; kept as written)
StreamId = int | str | None


@dataclass(frozen=True)
class IntervalView:
    """One reporting interval of a TCP test (``intervals[]``, ``IntervalResult``): when it
    ended, the receiver's goodput over it and each stream's ((id, bits/s) of the streams with a
    rate). ``partial``: the test's short final interval, which has no rate
    (``throughput/result.mark_partial_tail``)."""

    end_s: float
    bits_per_second: float | None
    partial: bool = False
    streams: tuple[tuple[StreamId, float], ...] = ()


@dataclass(frozen=True)
class ThroughputMeasured:
    """One direction's TCP test (``ThroughputResult.to_json``)."""

    bits_per_second: float | None
    min_rtt_ms: float | None
    cc: str | None
    limited_by: LimitedBy
    streams: tuple[StreamFacts, ...]
    # how it was measured: the length asked for and the ramp-up left out (iperf3 --omit)
    requested_duration_s: float | None = None
    omit_s: float | None = None
    intervals: tuple[IntervalView, ...] = field(default=(), repr=False)

    @property
    def verdict(self) -> str | None:
        return self.limited_by.verdict

    def _limited_share(self, field: str) -> float | None:
        """Share of busy time the streams spent limited by ``field`` (tcpi_rwnd_limited or
        tcpi_sndbuf_limited over tcpi_busy_time), summed over streams."""
        lim = busy = 0.0
        seen = False
        for s in self.streams:
            li, bu = getattr(s.chrono, f"{field}_ms"), s.chrono.busy_time_ms
            if li is not None and bu:
                lim, busy, seen = lim + li, busy + bu, True
        return lim / busy if seen and busy > 0 else None

    @property
    def rwnd_limited_share(self) -> float | None:
        """The verdict's figure, else the streams' tcpi_rwnd_limited / tcpi_busy_time."""
        v = self.limited_by.rwnd_limited_share
        return v if v is not None else self._limited_share("rwnd_limited")

    @property
    def sndbuf_limited_share(self) -> float | None:
        v = self.limited_by.sndbuf_limited_share
        return v if v is not None else self._limited_share("sndbuf_limited")

    @property
    def peer_window_max_bytes(self) -> float | None:
        """Largest window the receiver advertised: the verdict's figure, else the streams'
        final snd_wnd."""
        return self.limited_by.peer_window_max_bytes or max(
            (s.snd_wnd_bytes for s in self.streams if s.snd_wnd_bytes), default=None)

    @property
    def mss_bytes(self) -> int:
        """Sender MSS from TCP_INFO (snd_mss), else the 1500-MTU default."""
        return next((int(s.snd_mss_bytes) for s in self.streams if s.snd_mss_bytes),
                    DEFAULT_MSS_BYTES)

    def retrans_sent_bytes(self) -> list[tuple[float, float]]:
        """(bytes_retrans, bytes_sent) of each stream that sent something."""
        return [(s.bytes_retrans, s.bytes_sent) for s in self.streams
                if s.bytes_retrans is not None and s.bytes_sent]

    @classmethod
    def of(cls, result: ThroughputResult) -> ThroughputMeasured:
        """The view of one direction's test, from the producer's own type."""
        return throughput_view(result.bits_per_second, result.min_rtt_ms, result.cc,
                               result.limited_by.verdict, result.limited_by.evidence,
                               [s.tcp_info for s in result.streams],
                               result.requested_duration_s, result.omit_s,
                               tuple(v for iv in result.intervals if (v := interval_view(
                                   iv.end_s, iv.bits_per_second, iv.partial, iv.streams))))


@dataclass(frozen=True)
class LossSample:
    """``lost`` of ``of`` probes (one direction, or the round trip). Its 95 % interval is
    computed from these counts (the Wilson interval the probe writes, probe/stats.py), so a
    report's written interval is never trusted over its own counts."""

    lost: int
    of: int

    @property
    def ratio(self) -> float:
        return self.lost / self.of if self.of else 0.0

    @property
    def ci95(self) -> tuple[float, float]:
        from wanprobe.probe.stats import wilson_interval

        return wilson_interval(self.lost, self.of)


@dataclass(frozen=True)
class PathMeasured:
    """The probe (``ProbeResult.to_json``: method, ``rtt_ms.min``/``p50``/``p99``,
    ``loss.sent``/``ratio``/``forward_ratio``/``reverse_ratio``, DSCP, the latter None when none
    was sent) and the path capacity diagnose added to it."""

    method: str
    rtt_min_ms: float | None
    loss_sent_probes: float | None
    loss_ratio: float | None
    capacity: Capacity | None
    dscp: DscpReport | None
    rtt_p50_ms: float | None = None
    rtt_p99_ms: float | None = None
    rtt_p90_ms: float | None = None
    rtt_max_ms: float | None = None
    # each probe's RTT (``rtt_samples_ms``, finite ones; empty when the report kept none)
    rtt_samples_ms: tuple[float, ...] = field(default=(), repr=False)
    loss_forward_ratio: float | None = None
    loss_reverse_ratio: float | None = None
    capacity_source: str | None = None   # also when the capacity was not measured: why
    capacity_method: CapacityMethod | None = None  # how the capacity figure was obtained
    # the counts behind the ratios (None: not counted, e.g. a reflector that gives no split)
    loss_round_trip: LossSample | None = None
    loss_forward: LossSample | None = None
    loss_reverse: LossSample | None = None
    started_at: str | None = None        # ISO 8601 UTC, when the probes began
    interval_s: float | None = None
    size_bytes: float | None = None

    def loss_of(self, direction: str) -> LossSample | None:
        """``forward``, ``reverse`` or ``round_trip``."""
        return {"forward": self.loss_forward, "reverse": self.loss_reverse,
                "round_trip": self.loss_round_trip}.get(direction)


@dataclass(frozen=True)
class AttemptMeasured:
    """One TCP test of the verify loop (``Attempt.to_json``): how long it ran and the ramp-up
    it left out, its rate with and without that ramp-up."""

    duration_s: float | None = None
    omit_s: float | None = None
    bits_per_second: float | None = None
    bits_per_second_after_omit: float | None = None


@dataclass(frozen=True)
class VerifyMeasured:
    """The closed loop after ``tune apply --verify`` (``Verification.to_json``,
    diagnose/verify.py): the last test's rate, with and without its ramp-up, its own
    throughput verdict, what limits the path now and the next step."""

    bits_per_second: float | None
    bits_per_second_after_omit: float | None
    verdict: str | None
    limit: str | None
    next_step: str | None
    attempts: tuple[AttemptMeasured, ...] = ()   # each test of the loop, the last one last


@dataclass(frozen=True)
class MtuMeasured:
    """The DF-bit path MTU search (``run.measure_mtu``), the interface toward the peer and its
    MTU, the largest size the search could send, and whether ICMP "fragmentation needed" came
    back (the kernel learned a route MTU)."""

    path_mtu_bytes: float | None
    iface: str | None
    iface_mtu_bytes: float | None
    search_max_bytes: float | None
    icmp_seen: bool | None
    method: str | None


@dataclass(frozen=True)
class Measured:
    """Everything one diagnose measured; None where a part was not measured. ``legacy``: a
    report from before schema 1.1 (no ``peer_facts`` key at all), which knows one host only."""

    path: PathMeasured | None = None
    mtu: MtuMeasured | None = None
    throughput: ThroughputMeasured | None = None          # forward: this host sends
    throughput_reverse: ThroughputMeasured | None = None  # reverse: the peer sends
    counter_findings: tuple[Finding, ...] = ()  # judged when the snapshots were taken
    paths_summary: Mapping[str, Any] | None = None  # ``wanprobe paths --json`` summary
    peer_facts: HostFacts | None = None
    peer_facts_error: str | None = None
    legacy: bool = False
    # per-stream rate at 1, 2, 4, 8 streams (``--full``): ((streams, bits/s per stream), ...)
    streams_scan: tuple[tuple[int, float], ...] = ()
    verify: VerifyMeasured | None = None
    errors: Mapping[str, str] = field(default_factory=dict)  # part -> why it was not measured

    @property
    def mss_bytes(self) -> int:
        """The forward transfer's sender MSS, else the 1500-MTU default."""
        return self.throughput.mss_bytes if self.throughput else DEFAULT_MSS_BYTES

    @property
    def egress_iface(self) -> str | None:
        """The interface toward the peer (from the MTU measurement)."""
        return self.mtu.iface if self.mtu else None


def finite(v: Any) -> float | None:
    """``v`` as a float when it is a finite number (not a bool); None otherwise."""
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return None
    return float(v)


def number(d: Any, key: str) -> float | None:
    """``d[key]`` (a dotted path) when it is a finite number; None when absent or not one."""
    cur = d
    for part in key.split("."):
        cur = cur.get(part) if isinstance(cur, Mapping) else None
    return finite(cur)


def _figures(cls: type, d: Any, *skip: str) -> dict[str, float | None]:
    """Each field of dataclass ``cls`` but ``skip``, read from ``d`` under its own name."""
    return {f.name: number(d, f.name) for f in fields(cls) if f.name not in skip}


def throughput_view(bits_per_second: Any, min_rtt_ms: Any, cc: Any, verdict: Any,
                    evidence: Mapping[str, Any], tcp_infos: Iterable[Any],
                    requested_duration_s: Any = None, omit_s: Any = None,
                    intervals: tuple[IntervalView, ...] = ()) -> ThroughputMeasured:
    """One direction's view from the figures of its result: the verdict's evidence and each
    stream's final TCP_INFO summary are the producer's open objects, read under their keys."""
    return ThroughputMeasured(
        bits_per_second=finite(bits_per_second), min_rtt_ms=finite(min_rtt_ms),
        cc=cc if isinstance(cc, str) and cc else None,
        limited_by=LimitedBy(verdict=str(verdict) if verdict else None,
                             **_figures(LimitedBy, evidence, "verdict")),
        streams=tuple(StreamFacts(chrono=SenderChrono(**_figures(SenderChrono, info)),
                                  **_figures(StreamFacts, info, "chrono")) for info in tcp_infos),
        requested_duration_s=finite(requested_duration_s), omit_s=finite(omit_s),
        intervals=intervals)


def _stream_id(v: Any) -> StreamId:
    if v is None or isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool)):
        return v
    return str(v)


def interval_view(end_s: Any, bits_per_second: Any, partial: Any,
                  streams: Any) -> IntervalView | None:
    """One interval's view from its figures; its streams are the producer's open rows, read
    under their keys (``id``, ``bits_per_second``). None without a finite ``end_s``; a stream
    without a finite rate is left out."""
    end = finite(end_s)
    if end is None:
        return None
    rows = streams if isinstance(streams, list | tuple) else ()
    return IntervalView(
        end_s=end, bits_per_second=finite(bits_per_second), partial=bool(partial),
        streams=tuple((_stream_id(r.get("id")), bps) for r in rows if isinstance(r, Mapping)
                      and (bps := number(r, "bits_per_second")) is not None))
