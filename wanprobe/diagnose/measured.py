"""What diagnose measured, typed: built once by :meth:`Measured.from_report` from the report's
``measurements`` dict (probe, mtu, throughput, counters and paths JSON). The parser reads each
figure under the one key its producer writes (``probe/result.py``, ``services/diagnose.py``,
``throughput/result.py``, ``verdict.py`` and ``tcp_info.tcp_info_summary``,
``throughput/capacity.py``). Units are in the field names; absent is None, never 0 (docs/conventions.md §3):
a rule skips what was not measured.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from collectors.host_facts import HostFacts
from wanprobe.diagnose.finding import Finding
from wanprobe.diagnose.host_inputs import facts_or_none
from wanprobe.models.tcp_rate import DEFAULT_MSS_BYTES
from wanprobe.probe.result import DscpReport
from wanprobe.throughput.capacity import Capacity


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
    """The throughput verdict (``verdict.py``) and the figures of its evidence the rules read:
    shares of busy time, the TCP retransmit rate and the largest window the receiver offered."""

    verdict: str | None
    rwnd_limited_share: float | None
    sndbuf_limited_share: float | None
    retransmit_rate: float | None
    peer_window_max_bytes: float | None


@dataclass(frozen=True)
class ThroughputMeasured:
    """One direction's TCP test (``ThroughputResult.to_json``)."""

    bits_per_second: float | None
    min_rtt_ms: float | None
    cc: str | None
    limited_by: LimitedBy
    streams: tuple[StreamFacts, ...]

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
    loss_forward_ratio: float | None = None
    loss_reverse_ratio: float | None = None
    capacity_source: str | None = None   # also when the capacity was not measured: why
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
class VerifyMeasured:
    """The closed loop after ``tune apply --verify`` (``Verification.to_json``,
    diagnose/verify.py): the last test's rate, with and without its ramp-up, its own
    throughput verdict, what limits the path now and the next step."""

    bits_per_second: float | None
    bits_per_second_after_omit: float | None
    verdict: str | None
    limit: str | None
    next_step: str | None


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

    @classmethod
    def from_report(cls, m: Mapping[str, Any] | None) -> Measured:
        """The typed measurements of a report's ``measurements`` dict: the one parser."""
        m = m if isinstance(m, Mapping) else {}
        path, mtu = _section(m, "path"), _section(m, "mtu")
        fwd, rev = _section(m, "throughput"), _section(m, "throughput_reverse")
        counters, errors = _section(m, "counters") or {}, _section(m, "errors") or {}
        return cls(
            path=_path(path) if path else None, mtu=_mtu(mtu) if mtu else None,
            throughput=_throughput(fwd) if fwd else None,
            throughput_reverse=_throughput(rev) if rev else None,
            counter_findings=tuple(Finding.from_json(f) for f in counters.get("findings") or ()
                                   if isinstance(f, Mapping)),
            paths_summary=(_section(m, "paths") or {}).get("summary") or None,
            peer_facts=facts_or_none(m.get("peer_facts")),
            peer_facts_error=errors.get("peer_facts"), legacy="peer_facts" not in m,
            streams_scan=_streams_scan(m.get("streams_scan")),
            verify=_verify(verify) if (verify := _section(m, "verify")) else None,
            errors={str(k): str(v) for k, v in errors.items()})

    @property
    def mss_bytes(self) -> int:
        """The forward transfer's sender MSS, else the 1500-MTU default."""
        return self.throughput.mss_bytes if self.throughput else DEFAULT_MSS_BYTES

    @property
    def egress_iface(self) -> str | None:
        """The interface toward the peer (from the MTU measurement)."""
        return self.mtu.iface if self.mtu else None


def _num(d: Any, key: str) -> float | None:
    """``d[key]`` (a dotted path) when it is a finite number; None when absent or not one."""
    cur = d
    for part in key.split("."):
        cur = cur.get(part) if isinstance(cur, Mapping) else None
    if isinstance(cur, bool) or not isinstance(cur, (int, float)) or not math.isfinite(cur):
        return None
    return float(cur)


def _figures(cls: type, d: Any, *skip: str) -> dict[str, float | None]:
    """Each field of dataclass ``cls`` but ``skip``, read from ``d`` under its own name."""
    return {f.name: _num(d, f.name) for f in fields(cls) if f.name not in skip}


def _section(m: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    """``m[name]`` when it is a measured (non-empty) dict."""
    part = m.get(name)
    return part if isinstance(part, Mapping) and part else None


def _text(v: Any) -> str | None:
    return v if isinstance(v, str) and v else None


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _throughput(tput: Mapping[str, Any]) -> ThroughputMeasured:
    lb = tput.get("limited_by")
    lb = lb if isinstance(lb, Mapping) else {}
    verdict = lb.get("verdict")
    streams = [s.get("tcp_info") for s in tput.get("streams") or [] if isinstance(s, Mapping)]
    return ThroughputMeasured(
        bits_per_second=_num(tput, "bits_per_second"), min_rtt_ms=_num(tput, "min_rtt_ms"),
        cc=_text(tput.get("cc")),
        limited_by=LimitedBy(verdict=str(verdict) if verdict else None,
                             **_figures(LimitedBy, lb.get("evidence") or {}, "verdict")),
        streams=tuple(StreamFacts(chrono=SenderChrono(**_figures(SenderChrono, info)),
                                  **_figures(StreamFacts, info, "chrono")) for info in streams))


def _loss_sample(loss: Any, lost_key: str, of_key: str, ratio_key: str) -> LossSample | None:
    """The counts behind one written ratio: ``of`` as written (1.2), else recovered from the
    ratio (a 1.1 report), never guessed where nothing was counted."""
    loss = loss if isinstance(loss, Mapping) else {}
    lost, of, ratio = _int(loss.get(lost_key)), _int(loss.get(of_key)), _num(loss, ratio_key)
    if lost is None or lost < 0:
        return None
    if of is None:
        sent = _int(loss.get("path_sent")) or _int(loss.get("sent"))
        of = (sent if lost == 0 else round(lost / ratio) if ratio else None)
    if not of or of < lost:
        return None
    return LossSample(lost, of)


def _path(path: Mapping[str, Any]) -> PathMeasured:
    dscp = path.get("dscp")
    dscp = dscp if isinstance(dscp, Mapping) else {}   # absent or malformed: not measured
    sent = _int(dscp.get("sent"))
    cap = _num(path, "capacity_bits_per_second")
    loss = path.get("loss")
    rt = loss if isinstance(loss, Mapping) else {}
    rt_of = _int(rt.get("path_sent")) or _int(rt.get("sent"))
    received = _int(rt.get("received"))
    rt_lost = rt_of - received if rt_of and received is not None else None
    return PathMeasured(
        loss_round_trip=LossSample(rt_lost, rt_of)
        if rt_lost is not None and rt_of is not None and 0 <= rt_lost <= rt_of else None,
        loss_forward=_loss_sample(loss, "forward_lost", "forward_of", "forward_ratio"),
        loss_reverse=_loss_sample(loss, "reverse_lost", "reverse_of", "reverse_ratio"),
        started_at=_text(path.get("started_at")), interval_s=_num(path, "interval_s"),
        size_bytes=_num(path, "size_bytes"),
        method=str(path.get("method", "stamp")), rtt_min_ms=_num(path, "rtt_ms.min"),
        loss_sent_probes=_num(path, "loss.sent"), loss_ratio=_num(path, "loss.ratio"),
        rtt_p50_ms=_num(path, "rtt_ms.p50"), rtt_p99_ms=_num(path, "rtt_ms.p99"),
        loss_forward_ratio=_num(path, "loss.forward_ratio"),
        loss_reverse_ratio=_num(path, "loss.reverse_ratio"),
        capacity_source=_text(path.get("capacity_source")),
        capacity=Capacity(cap, str(path.get("capacity_source"))) if cap is not None else None,
        dscp=DscpReport(sent, at_reflector=_int(dscp.get("at_reflector")),
                        returned=_int(dscp.get("returned"))) if sent else None)


def _mtu(mtu: Mapping[str, Any]) -> MtuMeasured:
    icmp, iface = mtu.get("icmp_seen"), mtu.get("iface")
    return MtuMeasured(
        path_mtu_bytes=_num(mtu, "path_mtu"), iface=str(iface) if iface else None,
        iface_mtu_bytes=_num(mtu, "iface_mtu"), search_max_bytes=_num(mtu, "search_max_bytes"),
        icmp_seen=icmp if isinstance(icmp, bool) else None, method=_text(mtu.get("method")))


def _streams_scan(rows: Any) -> tuple[tuple[int, float], ...]:
    """``streams_scan`` rows (services/diagnose.py) with both figures numeric."""
    rows = rows if isinstance(rows, list) else []
    return tuple((int(n), per) for r in rows
                 if (n := _num(r, "streams")) is not None
                 and (per := _num(r, "per_stream_bits_per_second")) is not None)


def _verify(v: Mapping[str, Any]) -> VerifyMeasured:
    return VerifyMeasured(
        bits_per_second=_num(v, "bits_per_second"),
        bits_per_second_after_omit=_num(v, "bits_per_second_after_omit"),
        verdict=_text(v.get("verdict")), limit=_text(v.get("limit")),
        next_step=_text(v.get("next_step")))
