"""Throughput results (frozen dataclasses) and their assembly from both ends' samples.

Both ends report the same record shapes (see sampler.IntervalSampler and the ``end`` message):
the receiving end supplies goodput, the sending end supplies bytes written and TCP_INFO.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace

from wanprobe import __version__
from wanprobe.json_fields import Decoded, dicts, objects, open_object, optional, strings
from wanprobe.throughput.protocol import DOWN, UP
from wanprobe.throughput.udp import UdpResult
from wanprobe.throughput.verdict import (
    Judge,
    Verdict,
    VerdictInput,
    bdp_bytes,
    need_judge,
    single_stream_buffer_bytes,
    verdict_of,
)

DIRECTION_NAMES = {UP: "client_to_server", DOWN: "server_to_client"}


@dataclass(frozen=True)
class StreamResult(Decoded, json_name="throughput stream",
                   json_parts={"tcp_info": optional(open_object)}):
    stream_id: int
    direction: str
    bytes_sent: int
    bytes_received: int
    seconds: float
    bits_per_second: float          # receiver goodput
    sender_bits_per_second: float
    retransmits: int | None
    rtt_mean_ms: float | None
    rtt_max_ms: float | None
    tcp_info: dict | None           # sender TCP_INFO at the end (see tcp_info.tcp_info_summary)
    error: str | None = None
    # the data worker process that carried it at each end: worker_id, cpu_s, busy_ratio,
    # demand_ratio (datapath_pool.py); None from a peer without workers
    sender_worker: dict | None = None
    receiver_worker: dict | None = None


@dataclass(frozen=True)
class IntervalResult(Decoded, json_name="throughput interval", json_parts={"streams": dicts}):
    """One reporting interval. ``partial``: the test's final interval, shorter than half the
    reporting interval; its bytes count in the totals but it has no rate (None), and rate
    figures and plots leave it out (see mark_partial_tail)."""

    start_s: float
    end_s: float
    bytes_received: int
    bytes_sent: int
    bits_per_second: float | None
    retransmits: int | None
    streams: tuple[dict, ...]
    partial: bool = False


PARTIAL_TAIL_SHARE = 0.5  # a final interval under half the reporting interval is partial


def mark_partial_tail(intervals: list[IntervalResult],
                      interval_s: float | None = None) -> list[IntervalResult]:
    """Mark the final interval partial when it spans under half the reporting interval
    (``interval_s``, else the longest of the others). Such a tail holds what the receiver read
    after the sender stopped: the bytes its socket still held, read in a few ms, so bytes over
    span would show as a spike (900 Mbit/s on a 100 Mbit/s path, issue 20). iperf3 likewise
    leaves out a final interval that is too short to report."""
    if len(intervals) < 2:
        return intervals
    last = intervals[-1]
    nominal = interval_s or max(iv.end_s - iv.start_s for iv in intervals[:-1])
    if last.end_s - last.start_s >= PARTIAL_TAIL_SHARE * nominal:
        return intervals
    streams = tuple({**r, "bits_per_second": None} for r in last.streams)
    return [*intervals[:-1], replace(last, partial=True, bits_per_second=None, streams=streams)]


@dataclass(frozen=True)
class DirectionSummary(Decoded):
    direction: str
    bits_per_second: float
    sender_bits_per_second: float
    bytes_received: int
    bytes_sent: int
    retransmits: int | None


# What ThroughputResult.from_json (json_fields.Decoded) decodes, for both engines' results:
# iperf3's streams carry a TCP_INFO summary of other keys; the open parts stay dicts.
THROUGHPUT_PARTS = {
    "limited_by": Verdict.from_json, "cpu": open_object, "notes": strings,
    "streams": lambda v, at: objects(v, at, StreamResult.from_json),
    "intervals": lambda v, at: objects(v, at, IntervalResult.from_json),
    "udp": optional(UdpResult.from_json), "reverse": optional(DirectionSummary.from_json)}


@dataclass(frozen=True)
class ThroughputResult(Decoded, json_name="throughput", json_parts=THROUGHPUT_PARTS):
    peer: str
    port: int
    engine: str
    protocol: str
    mode: str
    cc: str | None
    requested_duration_s: float
    duration_s: float
    streams_requested: int
    window_bytes: int | None
    dscp: int
    pacing_rate_bps: float | None
    bits_per_second: float
    sender_bits_per_second: float
    bytes_received: int
    bytes_sent: int
    retransmits: int | None
    min_rtt_ms: float | None
    bdp_bytes: int | None
    single_stream_buffer_bytes: int | None
    limited_by: Verdict
    streams: tuple[StreamResult, ...] = ()
    intervals: tuple[IntervalResult, ...] = ()
    cpu: dict = field(default_factory=dict)
    udp: UdpResult | None = None
    reverse: DirectionSummary | None = None
    partial: bool = False
    partial_reason: str | None = None
    notes: tuple[str, ...] = ()
    engine_version: str | None = None  # "wanprobe 0.1.0", "iperf3 3.12": what ran
    # iperf3 --omit: the first omit_s seconds (slow start) are left out of bits_per_second and
    # of the verdict's goodput; bits_per_second_with_ramp is the whole test's (1.2, issue 35)
    omit_s: float = 0.0
    bits_per_second_with_ramp: float | None = None

    def bbr_bandwidth_max_bps(self) -> float | None:
        """BBR's largest bottleneck estimate after the ramp-up (the streams' sum per interval;
        None unless the streams ran BBR)."""
        sums = [sum(v for r in iv.streams
                    if isinstance(v := (r.get("tcp_info") or {}).get("bbr_bandwidth_bits_per_second"),
                                  int | float))
                for iv in kept_intervals(self.intervals, self.omit_s)]
        return max(sums) if sums and max(sums) > 0 else None

    def to_json(self) -> dict:
        out = asdict(self)
        out["limited_by"] = self.limited_by.to_json()
        out["streams"] = [asdict(s) for s in self.streams]
        out["intervals"] = [asdict(i) for i in self.intervals]
        return _finite(out)


def _finite(obj):
    """JSON has no inf/nan: map them to None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def _rate(nbytes: float, seconds: float | None) -> float:
    return nbytes * 8.0 / seconds if seconds and seconds > 0 else 0.0


def _sum_opt(values) -> int | None:
    vals = [v for v in values if v is not None]
    return sum(vals) if vals else None


@dataclass(frozen=True)
class _Side:
    """Records and finals reported by one end; ``finals`` keyed by (direction, stream id)."""

    records: list
    finals: dict
    cpu_max_percent: list
    engine: dict | None = None  # its data workers' and process's CPU (DataWorkers.summary)


def _stream_result(key, sender: _Side, receiver: _Side) -> StreamResult:
    direction, sid = key
    sf, rf = sender.finals.get(key), receiver.finals.get(key)
    s_rows = [r for rec in sender.records for r in rec["streams"]
              if (r["direction"], r["id"]) == key and r["sending"]]
    r_rows = [(rec, r) for rec in receiver.records for r in rec["streams"]
              if (r["direction"], r["id"]) == key and not r["sending"]]
    sent = sf["bytes"] if sf else sum(r["bytes"] for r in s_rows)
    received = rf["bytes"] if rf else sum(r["bytes"] for _, r in r_rows)
    r_secs = rf["elapsed_s"] if rf and rf.get("elapsed_s") else (r_rows[-1][0]["end_s"] if r_rows else None)
    s_secs = sf["elapsed_s"] if sf and sf.get("elapsed_s") else (
        max((rec["end_s"] for rec in sender.records), default=None))
    info = (sf or {}).get("tcp_info") or next(
        (r["tcp_info"] for r in reversed(s_rows) if r["tcp_info"]), None)
    rtts = [r["tcp_info"]["rtt_ms"] for r in s_rows if r["tcp_info"] and r["tcp_info"]["rtt_ms"]]
    return StreamResult(
        stream_id=sid, direction=DIRECTION_NAMES[direction], bytes_sent=sent,
        bytes_received=received, seconds=round(r_secs or 0.0, 6),
        bits_per_second=_rate(received, r_secs), sender_bits_per_second=_rate(sent, s_secs),
        retransmits=(info or {}).get("total_retrans_packets"),
        rtt_mean_ms=round(sum(rtts) / len(rtts), 3) if rtts else None,
        rtt_max_ms=max(rtts) if rtts else None, tcp_info=info,
        error=(rf or {}).get("error") or (sf or {}).get("error"),
        sender_worker=_worker_of(sf), receiver_worker=_worker_of(rf))


def _worker_of(final: dict | None) -> dict | None:
    worker = (final or {}).get("worker")
    return worker if isinstance(worker, dict) else None


def _intervals(direction: int, sender: _Side, receiver: _Side,
               interval_s: float | None = None) -> list[IntervalResult]:
    by_k: dict[int, dict] = {}
    for rec in receiver.records:
        by_k.setdefault(rec["k"], {})["recv"] = rec
    for rec in sender.records:
        by_k.setdefault(rec["k"], {})["send"] = rec
    out = []
    for k in sorted(by_k):
        recv, send = by_k[k].get("recv"), by_k[k].get("send")
        span = recv or send
        rows = {}
        for rec, sending in ((recv, False), (send, True)):
            for r in (rec or {}).get("streams", []):
                if r["direction"] != direction or r["sending"] != sending:
                    continue
                row = rows.setdefault(r["id"], {"id": r["id"], "bytes_received": 0, "bytes_sent": 0})
                if sending:
                    row["bytes_sent"] = r["bytes"]
                    row["tcp_info"] = r["tcp_info"]
                else:
                    row["bytes_received"] = r["bytes"]
        secs = span["end_s"] - span["start_s"]
        for row in rows.values():
            row["bits_per_second"] = _rate(row["bytes_received"], secs)
        streams = tuple(rows[i] for i in sorted(rows))
        retrans = [(r.get("tcp_info") or {}).get("total_retrans_packets") for r in streams]
        recv_bytes = sum(r["bytes_received"] for r in streams)
        out.append(IntervalResult(
            start_s=span["start_s"], end_s=span["end_s"], bytes_received=recv_bytes,
            bytes_sent=sum(r["bytes_sent"] for r in streams),
            bits_per_second=_rate(recv_bytes, secs), retransmits=_sum_opt(retrans),
            streams=streams))
    # Per-interval retransmits are cumulative in TCP_INFO; report the interval's increase.
    prev = 0
    fixed = []
    for iv in out:
        if iv.retransmits is None:
            fixed.append(iv)
            continue
        fixed.append(replace(iv, retransmits=max(iv.retransmits - prev, 0)))
        prev = iv.retransmits
    return mark_partial_tail(fixed, interval_s)


def _worker_share(side: _Side, sending: bool, key: str) -> float | None:
    """Max over the side's data workers carrying ``sending`` streams of their ``key`` share
    (busy_ratio or demand_ratio); a peer without workers (protocol 2) reported its one data
    thread's cpu_s per stream, read as busy."""
    ratios = []
    for f in side.finals.values():
        if f.get("sending") != sending:
            continue
        worker = f.get("worker") if isinstance(f.get("worker"), dict) else None
        if worker is not None:
            if isinstance(worker.get(key), int | float):
                ratios.append(float(worker[key]))
        elif key == "busy_ratio" and f.get("elapsed_s") and f.get("cpu_s") is not None:
            ratios.append(f["cpu_s"] / f["elapsed_s"])
    return max(ratios) if ratios else None


def _cores_busy(side: _Side) -> float | None:
    """Mean busy % over the side's intervals of the cores its data workers may run on."""
    ids = (side.engine or {}).get("cpu_ids") if isinstance(side.engine, dict) else None
    means = []
    for rec in side.records:
        busy = rec.get("cpu_busy_percent")
        if not isinstance(busy, list) or not busy:
            continue
        pick = [busy[i] for i in ids if isinstance(i, int) and 0 <= i < len(busy)] if ids else busy
        vals = [b for b in pick if isinstance(b, int | float)]
        if vals:
            means.append(sum(vals) / len(vals))
    return round(sum(means) / len(means), 1) if means else None


def steal_percent(side: _Side) -> float | None:
    """Mean over the side's intervals of its host's CPU steal (sampler.CpuBusy): time the
    hypervisor gave to other guests. On a virtual machine a burst of it starves the sender, the
    receiver or, in the lab, the delay line: a figure of the host, not of the path."""
    vals = [r["cpu_steal_percent"] for r in side.records
            if isinstance(r.get("cpu_steal_percent"), int | float)]
    return round(sum(vals) / len(vals), 2) if vals else None


def engine_cpu(client: _Side, server: _Side, bits: float) -> dict:
    """The engine's own CPU per end (its data workers and its process) and per Gbit moved."""
    out: dict = {}
    total = 0.0
    for name, side in (("client", client), ("server", server)):
        e = dict(side.engine) if isinstance(side.engine, dict) else None
        out[name] = e
        if not e:
            total = None
            continue
        cpu_s = sum(x for x in (e.get("data_cpu_seconds"), e.get("process_cpu_seconds"))
                    if isinstance(x, int | float))
        elapsed, cores = e.get("elapsed_s"), e.get("cores")
        e["engine_cpu_share_ratio"] = (round(cpu_s / (elapsed * cores), 4)
                                       if isinstance(elapsed, int | float) and elapsed > 0
                                       and isinstance(cores, int) and cores > 0 else None)
        e["cpu_seconds_per_gigabit"] = round(cpu_s / (bits / 1e9), 5) if bits > 0 else None
        if total is not None:
            total += cpu_s
    out["engine_cpu_seconds_per_gigabit"] = (round(total / (bits / 1e9), 5)
                                             if total is not None and bits > 0 else None)
    return out


def _verdict_input(direction: int, streams: list[StreamResult], intervals: list[IntervalResult],
                   goodput: float, sender: _Side, receiver: _Side, window_bytes,
                   pacing_rate_bps) -> VerdictInput:
    infos = [s.tcp_info for s in streams if s.tcp_info]

    def total(key):
        return _sum_opt(i.get(key) for i in infos)

    min_rtts = [i["min_rtt_ms"] for i in infos if i.get("min_rtt_ms")]
    rtts = [r["tcp_info"]["rtt_ms"] for iv in intervals for r in iv.streams
            if r.get("tcp_info") and r["tcp_info"].get("rtt_ms")]
    delivery = [sum((r.get("tcp_info") or {}).get("delivery_rate_bits_per_second") or 0
                    for r in iv.streams) for iv in intervals]
    wnds = [r["tcp_info"]["snd_wnd_bytes"] for iv in intervals for r in iv.streams
            if r.get("tcp_info") and r["tcp_info"].get("snd_wnd_bytes")]
    mss = [i["snd_mss_bytes"] for i in infos if i.get("snd_mss_bytes")]
    cwnds = [r["tcp_info"]["cwnd_packets"] * r["tcp_info"]["snd_mss_bytes"]
             for iv in intervals for r in iv.streams
             if r.get("tcp_info") and r["tcp_info"].get("cwnd_packets")
             and r["tcp_info"].get("snd_mss_bytes")]
    span = max((iv.end_s - iv.start_s for iv in intervals), default=0.0)
    full = sorted(iv.bits_per_second for iv in intervals
                  if not iv.partial and iv.end_s - iv.start_s >= 0.99 * span)
    return VerdictInput(
        goodput_bps=goodput, streams=max(len(streams), 1),
        steady_goodput_bps=full[len(full) // 2] if len(full) >= 3 else None,
        busy_time_ms=total("busy_time_ms"), rwnd_limited_ms=total("rwnd_limited_ms"),
        sndbuf_limited_ms=total("sndbuf_limited_ms"), bytes_sent=total("bytes_sent"),
        bytes_retrans=total("bytes_retrans"), min_rtt_ms=min(min_rtts) if min_rtts else None,
        srtt_ms=sum(rtts) / len(rtts) if rtts else None,
        mss_bytes=max(mss) if mss else None,
        delivery_rate_max_bps=max(delivery) if delivery and max(delivery) > 0 else None,
        window_bytes=window_bytes, snd_wnd_max_bytes=max(wnds) if wnds else None,
        cwnd_max_bytes=max(cwnds) if cwnds else None,
        sender_thread_busy=_worker_share(sender, True, "busy_ratio"),
        receiver_thread_busy=_worker_share(receiver, False, "busy_ratio"),
        sender_cpu_demand=_worker_share(sender, True, "demand_ratio"),
        receiver_cpu_demand=_worker_share(receiver, False, "demand_ratio"),
        sender_cores_busy_percent=_cores_busy(sender),
        receiver_cores_busy_percent=_cores_busy(receiver),
        sender_core_busy_percent=max(sender.cpu_max_percent, default=None),
        receiver_core_busy_percent=max(receiver.cpu_max_percent, default=None),
        pacing_rate_bps=pacing_rate_bps)


def summarize_direction(direction: int, keys, sender: _Side, receiver: _Side, *,
                        window_bytes=None, pacing_rate_bps=None, interval_s=None):
    """Streams, intervals, totals and verdict input for one direction of a test."""
    streams = [_stream_result(k, sender, receiver) for k in sorted(keys) if k[0] == direction]
    intervals = _intervals(direction, sender, receiver, interval_s)
    received = sum(s.bytes_received for s in streams)
    sent = sum(s.bytes_sent for s in streams)
    r_secs = max((s.seconds for s in streams), default=0.0)
    s_secs = max((f.get("elapsed_s") or 0.0 for k, f in sender.finals.items() if k[0] == direction),
                 default=0.0) or (intervals[-1].end_s if intervals else 0.0)
    goodput = _rate(received, r_secs)
    vin = _verdict_input(direction, streams, intervals, goodput, sender, receiver,
                         window_bytes, pacing_rate_bps)
    summary = DirectionSummary(
        direction=DIRECTION_NAMES[direction], bits_per_second=goodput,
        sender_bits_per_second=_rate(sent, s_secs), bytes_received=received, bytes_sent=sent,
        retransmits=_sum_opt(s.retransmits for s in streams))
    return streams, intervals, summary, vin, r_secs


def kept_intervals(intervals: Sequence[IntervalResult], omit_s: float) -> list[IntervalResult]:
    """The intervals that start at or after ``omit_s`` (iperf3 --omit), partial ones left out:
    what every rate after the ramp-up is read from."""
    return [iv for iv in intervals if iv.start_s >= omit_s - 1e-9 and not iv.partial]


def after_omit_bps(intervals: Sequence[IntervalResult], omit_s: float) -> float | None:
    """Received bits per second over the full intervals that start at or after ``omit_s``
    (iperf3 --omit); None when none does."""
    kept = kept_intervals(intervals, omit_s)
    secs = sum(iv.end_s - iv.start_s for iv in kept)
    return sum(iv.bytes_received for iv in kept) * 8.0 / secs if kept and secs > 0 else None


def _verdict(vin: VerdictInput, udp: UdpResult | None, judge: Judge | None,
             sender: _Side, receiver: _Side) -> Verdict:
    """A UDP test's fixed verdict, or the caller's judge's on a TCP test's figures; with both
    ends' mean CPU steal in its evidence."""
    verdict = verdict_of(vin, udp.lost_percent if udp else None, judge, udp=udp is not None)
    return replace(verdict, evidence={**verdict.evidence,
                                      "sender_steal_percent": steal_percent(sender),
                                      "receiver_steal_percent": steal_percent(receiver)})


def assemble(*, peer: str, port: int, request, client: _Side, server: _Side, keys,
             partial_reason: str | None, udp: UdpResult | None = None,
             notes: tuple[str, ...] = (), omit_s: float = 0.0,
             judge: Judge | None = None) -> ThroughputResult:
    """Build the ThroughputResult of a wanprobe-engine test from both ends' reports; with
    ``omit_s`` its rate and verdict leave out the ramp-up (iperf3 --omit). ``judge``: the
    caller's (verdict.Judge) decides a TCP test's verdict and the notes its evidence calls for;
    a UDP test's verdict is fixed, and without a judge it has no notes of its own."""
    need_judge(judge, udp is not None)
    main = DOWN if request.reverse else UP
    ends = {UP: (client, server), DOWN: (server, client)}
    streams, intervals, summ, vin, secs = summarize_direction(
        main, keys, *ends[main], window_bytes=request.window_bytes,
        pacing_rate_bps=request.pacing_rate_bps, interval_s=request.interval_s)
    with_ramp = None
    if omit_s > 0 and udp is None:
        steady = after_omit_bps(intervals, omit_s)
        if steady is not None:
            with_ramp = summ.bits_per_second
            summ = replace(summ, bits_per_second=steady)
            vin = replace(vin, goodput_bps=steady)
    reverse = None
    all_streams = list(streams)
    if request.bidir:
        rs, _, reverse, _, _ = summarize_direction(DOWN, keys, *ends[DOWN],
                                                  window_bytes=request.window_bytes,
                                                  interval_s=request.interval_s)
        all_streams += rs
    verdict = _verdict(vin, udp, judge, *ends[main])
    notes = (*notes, *(judge.notes(verdict.evidence) if judge else ()))
    rtt_s = (vin.min_rtt_ms or 0) / 1000.0
    rate = max(summ.bits_per_second, vin.delivery_rate_max_bps or 0.0)
    bdp = bdp_bytes(rate, rtt_s)
    return ThroughputResult(
        peer=peer, port=port, engine="wanprobe", protocol="udp" if request.udp else "tcp",
        mode="bidir" if request.bidir else ("reverse" if request.reverse else "forward"),
        cc=request.cc or _cc_of(ends[main][0]), requested_duration_s=request.duration_s,
        duration_s=round(secs if udp is None else request.duration_s, 6),
        streams_requested=request.streams, window_bytes=request.window_bytes,
        dscp=request.dscp, pacing_rate_bps=request.pacing_rate_bps,
        bits_per_second=udp.bits_per_second if udp else summ.bits_per_second,
        sender_bits_per_second=udp.sender_bits_per_second if udp else summ.sender_bits_per_second,
        bytes_received=summ.bytes_received, bytes_sent=summ.bytes_sent,
        retransmits=summ.retransmits, min_rtt_ms=vin.min_rtt_ms, bdp_bytes=bdp,
        single_stream_buffer_bytes=single_stream_buffer_bytes(rate, rtt_s), limited_by=verdict,
        streams=tuple(all_streams), intervals=tuple(intervals),
        cpu={"sender_thread_busy_ratio": vin.sender_thread_busy,
             "receiver_thread_busy_ratio": vin.receiver_thread_busy,
             "sender_cpu_demand_ratio": vin.sender_cpu_demand,
             "receiver_cpu_demand_ratio": vin.receiver_cpu_demand,
             **engine_cpu(client, server, summ.bytes_received * 8.0
                          + (reverse.bytes_received * 8.0 if reverse else 0.0)),
             "client_core_busy_max_percent": client.cpu_max_percent,
             "server_core_busy_max_percent": server.cpu_max_percent},
        udp=udp, reverse=reverse, partial=partial_reason is not None,
        partial_reason=partial_reason, notes=tuple(notes),
        engine_version=f"wanprobe {__version__}",
        omit_s=omit_s if with_ramp is not None else 0.0, bits_per_second_with_ramp=with_ramp)


def _cc_of(sender: _Side) -> str | None:
    """The congestion control the sending sockets actually used."""
    return next((f.get("cc") for f in sender.finals.values() if f.get("cc")), None)
