"""The report codec's reading side: a report's ``measurements`` and ``host`` dicts, typed once.

Every reader of a report's figures takes the typed view this module builds — the rules
(``engine.run_rules``), the renderers and the ticket (``Report.measured``/``Report.local_host``),
the impact model, the planner and ``nccl-env`` — and nothing outside ``wanprobe/report`` reads a
report's measurements by key (tests/test_report_codec.py holds every module to that).

:func:`measured_of` reads each figure under the one key its producer writes
(``probe/result.py``, ``services/diagnose.py``, ``throughput/result.py``, ``verdict.py`` and
``tcp_info.tcp_info_summary``, ``throughput/capacity.py``). A throughput section is decoded by
its producer's own ``ThroughputResult.from_json`` and viewed from that type
(``ThroughputMeasured.of``); only a section that decoder refuses (a hand-written or partial
report) is read figure by figure, into the same view. A probe's RTT samples are read up to
one run's bound (``probe/limits.MAX_PROBES``). :func:`host_of` reads the ``host`` dict
``host_config.HostConfig.to_json`` wrote. Units are in the field names; absent is None, never 0
(docs/conventions.md §3): partial, older and hand-written reports stay readable.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import islice
from typing import Any

from collectors.ethtool_ioctl import RingParams
from collectors.host_facts import FactsError, HostFacts, parse_int, parse_triple
from wanprobe.diagnose.finding import Finding
from wanprobe.diagnose.host_inputs import Host, Iface
from wanprobe.diagnose.inputs import OPERATOR_SOURCE
from wanprobe.diagnose.measured import (
    AttemptMeasured,
    CapacityMethod,
    LossSample,
    Measured,
    MtuMeasured,
    PathMeasured,
    ThroughputMeasured,
    VerifyMeasured,
    finite,
    interval_view,
    number,
    throughput_view,
)
from wanprobe.errors import ConfigError
from wanprobe.probe.limits import MAX_PROBES
from wanprobe.probe.result import DscpReport
from wanprobe.throughput.capacity import LIMITS, Capacity
from wanprobe.throughput.result import ThroughputResult

# what a path's ``capacity_source`` names, by how the figure was obtained
BURST_SOURCES = frozenset({"udp_burst", "udp_burst_sender_held", *LIMITS} - {"tcp_goodput"})
OPERATOR_SOURCES = frozenset({OPERATOR_SOURCE, "operator"})  # 1.1 wrote "operator"
ATTEMPT_FIGURES = ("duration_s", "omit_s", "bits_per_second", "bits_per_second_after_omit")


def parts_of(doc: Any) -> tuple[Measured, Host | None]:
    """A report document's measurements and host, typed; any part may be absent (a
    hand-written, partial or 1.0 report, or no object at all)."""
    doc = doc if isinstance(doc, Mapping) else {}
    return measured_of(doc.get("measurements")), host_of(doc.get("host"))


def ring_part(doc: Any) -> Any:
    """A report's ``measurements.ring`` (a ring test's result, ``ring/model.RingResult``), or
    ``doc`` itself when it is not a report holding one (``wanprobe ring --json`` output)."""
    m = doc.get("measurements") if isinstance(doc, Mapping) else None
    return m["ring"] if isinstance(m, Mapping) and "ring" in m else doc


def measured_of(m: Any) -> Measured:
    """The typed measurements of a report's ``measurements`` dict: the one parser."""
    m = m if isinstance(m, Mapping) else {}
    path, mtu = _section(m, "path"), _section(m, "mtu")
    fwd, rev = _section(m, "throughput"), _section(m, "throughput_reverse")
    counters, errors = _section(m, "counters") or {}, _section(m, "errors") or {}
    return Measured(
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


def host_of(host: Any) -> Host | None:
    """This host from the report's ``host`` dict; None when the report has none (absent,
    empty or not an object: a hand-written or damaged report)."""
    if not isinstance(host, Mapping) or not host:
        return None
    sysctls = host.get("sysctls") or {}

    def text(name: str) -> str | None:
        value = sysctls.get(name)
        return str(value) if value is not None else None

    def integer(name: str) -> int | None:
        return parse_int(text(name))

    fq, address = host.get("fq_available"), host.get("address")
    return Host(
        which="local", cc_current=text("net.ipv4.tcp_congestion_control"),
        cc_available=_names(host.get("available_cc")),
        cc_allowed=_names(host.get("allowed_cc")),
        tcp_rmem_bytes=parse_triple(text("net.ipv4.tcp_rmem")),
        tcp_wmem_bytes=parse_triple(text("net.ipv4.tcp_wmem")),
        default_qdisc=text("net.core.default_qdisc"),
        fq_available=fq if isinstance(fq, bool) else None,
        tcp_mtu_probing=integer("net.ipv4.tcp_mtu_probing"),
        tcp_slow_start_after_idle=integer("net.ipv4.tcp_slow_start_after_idle"),
        tcp_notsent_lowat_bytes=integer("net.ipv4.tcp_notsent_lowat"),
        tcp_no_metrics_save=integer("net.ipv4.tcp_no_metrics_save"),
        ifaces=tuple(_iface(n, i) for n, i in (host.get("ifaces") or {}).items()
                     if isinstance(i, Mapping)),
        facts=facts_or_none(host.get("facts")), address=str(address) if address else None)


def facts_or_none(doc: Any) -> HostFacts | None:
    """A host-facts document from a report, None when absent or not valid."""
    try:
        return HostFacts.from_json(doc) if doc else None
    except FactsError:
        return None


def capacity_method(source: str | None) -> CapacityMethod | None:
    """How a path's capacity figure was obtained, from its ``capacity_source``: the UDP bursts
    (exact or a bound a host set), the operator's rate, the TCP test's goodput standing in;
    None when it was not measured (``not measured: why``) or the source is unknown."""
    if source in BURST_SOURCES:
        return "udp_burst"
    if source in OPERATOR_SOURCES:
        return "operator"
    return "tcp_goodput" if source == "tcp_goodput" else None


def _section(m: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    """``m[name]`` when it is a measured (non-empty) dict."""
    part = m.get(name)
    return part if isinstance(part, Mapping) and part else None


def _text(v: Any) -> str | None:
    return v if isinstance(v, str) and v else None


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _throughput(tput: Mapping[str, Any]) -> ThroughputMeasured:
    """The producer's decoder first; a section it refuses (hand-written, partial) figure by
    figure, into the same view."""
    try:
        return ThroughputMeasured.of(ThroughputResult.from_json(tput))
    except ConfigError:
        pass
    lb = tput.get("limited_by")
    lb = lb if isinstance(lb, Mapping) else {}
    evidence = lb.get("evidence")
    return throughput_view(
        tput.get("bits_per_second"), tput.get("min_rtt_ms"), tput.get("cc"), lb.get("verdict"),
        evidence if isinstance(evidence, Mapping) else {},
        [s.get("tcp_info") for s in tput.get("streams") or [] if isinstance(s, Mapping)],
        tput.get("requested_duration_s"), tput.get("omit_s"),
        tuple(v for i in _list(tput.get("intervals")) if isinstance(i, Mapping) and (
            v := interval_view(i.get("end_s"), i.get("bits_per_second"), i.get("partial"),
                               i.get("streams")))))


def _list(v: Any) -> list[Any] | tuple[Any, ...]:
    return v if isinstance(v, list | tuple) else ()


def _samples(v: Any) -> tuple[float, ...]:
    """The finite ones of a probe's RTT samples, at most MAX_PROBES read (one run's bound,
    probe/limits.py): a huge hand-written list is not read past what a run can write."""
    return tuple(x for s in islice(_list(v), MAX_PROBES) if (x := finite(s)) is not None)


def _loss_sample(loss: Any, lost_key: str, of_key: str, ratio_key: str) -> LossSample | None:
    """The counts behind one written ratio: ``of`` as written (1.2), else recovered from the
    ratio (a 1.1 report), never guessed where nothing was counted."""
    loss = loss if isinstance(loss, Mapping) else {}
    lost, of, ratio = _int(loss.get(lost_key)), _int(loss.get(of_key)), number(loss, ratio_key)
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
    cap = number(path, "capacity_bits_per_second")
    loss = path.get("loss")
    rt = loss if isinstance(loss, Mapping) else {}
    rt_of = _int(rt.get("path_sent")) or _int(rt.get("sent"))
    received = _int(rt.get("received"))
    rt_lost = rt_of - received if rt_of and received is not None else None
    source = _text(path.get("capacity_source"))
    return PathMeasured(
        loss_round_trip=LossSample(rt_lost, rt_of)
        if rt_lost is not None and rt_of is not None and 0 <= rt_lost <= rt_of else None,
        loss_forward=_loss_sample(loss, "forward_lost", "forward_of", "forward_ratio"),
        loss_reverse=_loss_sample(loss, "reverse_lost", "reverse_of", "reverse_ratio"),
        started_at=_text(path.get("started_at")), interval_s=number(path, "interval_s"),
        size_bytes=number(path, "size_bytes"),
        method=str(path.get("method", "stamp")), rtt_min_ms=number(path, "rtt_ms.min"),
        loss_sent_probes=number(path, "loss.sent"), loss_ratio=number(path, "loss.ratio"),
        rtt_p50_ms=number(path, "rtt_ms.p50"), rtt_p99_ms=number(path, "rtt_ms.p99"),
        rtt_p90_ms=number(path, "rtt_ms.p90"), rtt_max_ms=number(path, "rtt_ms.max"),
        rtt_samples_ms=_samples(path.get("rtt_samples_ms")),
        loss_forward_ratio=number(path, "loss.forward_ratio"),
        loss_reverse_ratio=number(path, "loss.reverse_ratio"),
        capacity_source=source, capacity_method=capacity_method(source),
        capacity=Capacity(cap, str(path.get("capacity_source"))) if cap is not None else None,
        dscp=DscpReport(sent, at_reflector=_int(dscp.get("at_reflector")),
                        returned=_int(dscp.get("returned"))) if sent else None)


def _mtu(mtu: Mapping[str, Any]) -> MtuMeasured:
    icmp, iface = mtu.get("icmp_seen"), mtu.get("iface")
    return MtuMeasured(
        path_mtu_bytes=number(mtu, "path_mtu"), iface=str(iface) if iface else None,
        iface_mtu_bytes=number(mtu, "iface_mtu"),
        search_max_bytes=number(mtu, "search_max_bytes"),
        icmp_seen=icmp if isinstance(icmp, bool) else None, method=_text(mtu.get("method")))


def _streams_scan(rows: Any) -> tuple[tuple[int, float], ...]:
    """``streams_scan`` rows (services/diagnose.py) with both figures numeric."""
    rows = rows if isinstance(rows, list) else []
    return tuple((int(n), per) for r in rows
                 if (n := number(r, "streams")) is not None
                 and (per := number(r, "per_stream_bits_per_second")) is not None)


def _verify(v: Mapping[str, Any]) -> VerifyMeasured:
    return VerifyMeasured(
        bits_per_second=number(v, "bits_per_second"),
        bits_per_second_after_omit=number(v, "bits_per_second_after_omit"),
        verdict=_text(v.get("verdict")), limit=_text(v.get("limit")),
        next_step=_text(v.get("next_step")),
        attempts=tuple(AttemptMeasured(**{k: number(a, k) for k in ATTEMPT_FIGURES})
                       for a in _list(v.get("attempts")) if isinstance(a, Mapping)))


def _names(v: Any) -> tuple[str, ...]:
    return tuple(str(x) for x in v) if isinstance(v, list | tuple) else ()


def _rings(info: Mapping[str, Any]) -> RingParams | None:
    rx, tx, rx_max, tx_max = (_int(info.get(k))
                              for k in ("rx_ring", "tx_ring", "rx_ring_max", "tx_ring_max"))
    if rx is None or tx is None or rx_max is None or tx_max is None:
        return None
    return RingParams(rx, tx, rx_max, tx_max)


def _iface(name: str, info: Mapping[str, Any]) -> Iface:
    qdisc = info.get("qdisc")
    return Iface(name=str(name), mtu_bytes=_int(info.get("mtu")),
                 qdisc=str(qdisc) if qdisc else None,
                 speed_mbps=finite(info.get("speed_mbps")), rings=_rings(info))
