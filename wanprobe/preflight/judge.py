"""Go / no-go per host, each no-go with its reasons.

A host is no-go when it is:

- ``unreachable``: nothing came back, neither from its STAMP reflector nor to ICMP echo (or it
  does not resolve), or ``timed_out``: its measurement had not finished at the deadline;
- ``loss_over_slo`` / ``rtt_over_slo``: round-trip loss above the loss SLO (default the fleet
  rules' ``loss_slo_ratio``) with 95 % confidence — the Wilson interval's lower end above it, so
  one lost probe of a few hundred does not block a job (the fleet alerts judge the ratio over
  minutes of probes; a preflight has seconds) — and median RTT above ``--rtt-slo`` when given;
- ``mtu_mismatch``: its interface MTU differs from the job's (the most common MTU among the
  hosts that reported one; a tie goes to the larger, the deliberate jumbo setting), or the DF
  search found a path MTU below the interfaces' (a smaller hop: a black hole when PMTUD fails);
- ``buffers_below_need`` / ``cc_below_need``: even NCCL's maximum of 64 sockets
  (src/transport/net_socket.cc MAX_SOCKETS) cannot carry the host's rate over the job's longest
  measured RTT with its ``tcp_rmem``/``tcp_wmem`` maxima (window/RTT, models/bdp.py), or with
  its congestion control at the loss measured on its path (models/tcp_rate.py). The host's rate
  is what its path carries (:func:`path_rate`: the local daemon's network-limited throughput
  test to it, else the operator's ``--link-rate``), at most what the job needs (``--rate``):
  more than the path carries no buffer can move, so judging against it blames buffers for the
  path. The NIC's speed is never taken for the path's: a 10 Gbit/s port behind a 1 Gbit/s
  circuit would make every host with buffers enough for the circuit no-go. Without any of
  these figures a host's buffers and congestion control are not judged (a note says so). The
  launching host, itself in the job, serves every path: it is judged at the job's fastest.
- ``rerouted``: the local daemon's history holds a ``path.rerouted`` finding for it in the last
  hour, or its RTT floor now is above the hour's minimum by more than the fleet rules'
  ``floor_step_ratio`` and ``floor_step_min_s`` (``WanprobeRttFloorStep``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

from wanprobe.errors import UsageError
from wanprobe.models.collectives import MAX_SOCKETS
from wanprobe.preflight.history import History
from wanprobe.preflight.measure import HostMeasure
from wanprobe.units import format_rate


@dataclass(frozen=True)
class Thresholds:
    loss_slo_ratio: float
    rtt_slo_ms: float | None
    rate_bps: float | None          # what the job needs per host (--rate); None: not said
    floor_step_ratio: float
    floor_step_min_ms: float
    link_rate_bps: float | None = None  # what the paths carry, the operator's word (--link-rate)


@dataclass(frozen=True)
class Rate:
    """The rate a host's buffers and congestion control are judged against, and whence:
    ``measured`` (the local daemon's network-limited test), ``link_rate`` or ``job_rate``."""

    bits_per_second: float
    source: str
    text: str

    def to_json(self) -> dict[str, object]:
        return {"bits_per_second": self.bits_per_second, "source": self.source,
                "text": self.text}


@dataclass(frozen=True)
class Reason:
    code: str
    text: str

    def to_json(self) -> dict[str, str]:
        return {"code": self.code, "text": self.text}


@dataclass(frozen=True)
class Job:
    """Figures of the whole job the per-host checks compare with."""

    mtu_bytes: int | None
    longest_rtt_ms: float | None
    longest_to: str | None


def _pct(x: float) -> str:
    return f"{x * 100:.3g} %"


def job_figures(ms: list[HostMeasure]) -> Job:
    mtus = [m.facts.iface_mtu_bytes for m in ms if m.facts and m.facts.iface_mtu_bytes]
    counts = Counter(mtus).most_common()
    mtu = max(v for v, n in counts if n == counts[0][1]) if counts else None
    rtts = [(m.probe.rtt.p50, m.entry.host) for m in ms if m.probe and m.probe.rtt]
    longest = max(rtts, default=(None, None))
    return Job(mtu, longest[0], longest[1])


def _reachability(m: HostMeasure, bound_s: float) -> list[Reason]:
    if m.error is not None:
        return [Reason("unreachable", m.error)]
    if m.local:
        return []
    p = m.probe
    if p is not None and p.loss.received:
        return []
    if not m.finished:
        return [Reason("timed_out", f"no answer within the {bound_s:g} s bound "
                                    "(no STAMP reply, ICMP not finished)")]
    stamp = (f"{m.stamp.loss.sent} STAMP probes to UDP {m.entry.port} unanswered"
             if m.stamp else f"STAMP: {m.stamp_error}")
    icmp = (f"{m.icmp.loss.sent} ICMP echoes unanswered" if m.icmp else f"ICMP: {m.icmp_error}")
    return [Reason("unreachable", f"{stamp}; {icmp}")]


def _slo(m: HostMeasure, th: Thresholds) -> list[Reason]:
    p = m.probe
    if p is None or not p.loss.received:
        return []
    out = []
    loss = p.loss
    lo, hi = loss.ci95
    if lo > th.loss_slo_ratio:  # above the SLO with 95 % confidence, not by a probe's chance
        out.append(Reason("loss_over_slo", f"{p.method} round-trip loss {_pct(loss.ratio)} "
                          f"({loss.sent - loss.received} of {loss.sent}; 95 % CI {_pct(lo)}–"
                          f"{_pct(hi)}) over the SLO of {_pct(th.loss_slo_ratio)}"))
    if th.rtt_slo_ms is not None and p.rtt and p.rtt.p50 > th.rtt_slo_ms:
        out.append(Reason("rtt_over_slo", f"{p.method} RTT median {p.rtt.p50:.3g} ms (p99 "
                          f"{p.rtt.p99:.3g} ms) over the SLO of {th.rtt_slo_ms:g} ms"))
    return out


def _mtu(m: HostMeasure, job: Job) -> list[Reason]:
    out = []
    own = m.facts.iface_mtu_bytes if m.facts else None
    if own and job.mtu_bytes and own != job.mtu_bytes:
        out.append(Reason("mtu_mismatch", f"interface {m.facts.iface or '?'} has MTU {own}, the "
                          f"job's hosts {job.mtu_bytes}: frames above {min(own, job.mtu_bytes)} "
                          "bytes between them are dropped or fragmented"))
    if m.mtu is not None:
        ifaces = min(x for x in (m.mtu.local_mtu, own) if x)
        if m.mtu.path_mtu < ifaces:
            out.append(Reason("mtu_mismatch", f"path MTU {m.mtu.path_mtu} (DF probes) below the "
                              f"interfaces' {ifaces}: a hop along the path has a smaller MTU"))
    return out


def path_rate(m: HostMeasure, th: Thresholds, history: History | None) -> Rate | None:
    """What the path to ``m`` carries: the fastest network-limited throughput test to it in the
    local daemon's history, else the operator's ``--link-rate``; None when neither says."""
    cap = history.first(history.capacity, m.names) if history is not None else None
    if cap is not None:
        return Rate(cap.bits_per_second, "measured",
                    f"the {format_rate(cap.bits_per_second)} its path carried (the local "
                    f"daemon's throughput test at {_hm(cap.ts, date=True)}, limited by the path)")
    if th.link_rate_bps:
        return Rate(th.link_rate_bps, "link_rate",
                    f"the {format_rate(th.link_rate_bps)} the paths carry (--link-rate)")
    return None


def host_rates(ms: list[HostMeasure], th: Thresholds,
               history: History | None) -> list[Rate | None]:
    """Per host, the rate its buffers and congestion control are judged against: its path's
    (the launching host's: the job's fastest path), lowered to the job's ``--rate`` when the
    job needs less; the job's rate alone where no path figure is known."""
    paths = [None if m.local else path_rate(m, th, history) for m in ms]
    fastest = max((r for r in paths if r), key=lambda r: r.bits_per_second, default=None)
    out = []
    for m, path in zip(ms, paths, strict=True):
        if m.local and fastest is not None:
            path = replace(fastest, text=f"the job's fastest path: {fastest.text}")
        need = th.rate_bps
        if need and (path is None or need < path.bits_per_second):
            path = Rate(need, "job_rate", f"the job's {format_rate(need)} (--rate)")
        out.append(path)
    return out


def _capacity(m: HostMeasure, job: Job, rate: Rate | None) -> list[Reason]:
    """Buffers and congestion control against the host's rate over the job's longest path."""
    from wanprobe.models.bdp import window_from_buffer_bytes, window_limited_rate_bps
    from wanprobe.models.tcp_rate import cc_limited_rate_bps

    f = m.facts
    if f is None or rate is None or not job.longest_rtt_ms:
        return []
    rtt_s, out, bps = job.longest_rtt_ms / 1e3, [], rate.bits_per_second
    maxima = [t[2] for t in (f.tcp_rmem_bytes, f.tcp_wmem_bytes) if t]
    if maxima:
        per = window_limited_rate_bps(window_from_buffer_bytes(min(maxima)), rtt_s)
        if per * MAX_SOCKETS < bps:
            out.append(Reason("buffers_below_need", f"tcp_rmem/tcp_wmem max {min(maxima):,} B "
                              f"allow ~{per / 1e6:.0f} Mbit/s per socket at the job's longest RTT "
                              f"({job.longest_rtt_ms:.3g} ms, to {job.longest_to}); NCCL's 64 "
                              f"sockets reach {format_rate(per * 64)} of {rate.text}"))
    p = m.probe
    loss = p.loss.ratio if p and p.loss.received else 0.0
    if f.cc_current and loss > 0:
        try:
            mss = (job.mtu_bytes or 1500) - 52  # IPv4 + TCP with timestamps
            per = cc_limited_rate_bps(f.cc_current, bps, mss, rtt_s, loss)
        except UsageError:
            return out  # a cc without a model here (e.g. dctcp): not judged
        if per * MAX_SOCKETS < bps:
            better = " (bbr is allowed here)" if "bbr" in f.cc_allowed else ""
            out.append(Reason("cc_below_need", f"{f.cc_current} at {_pct(loss)} loss and "
                              f"{job.longest_rtt_ms:.3g} ms reaches ~{per / 1e6:.3g} Mbit/s per "
                              f"socket, 64 sockets {format_rate(per * 64)} of "
                              f"{rate.text}{better}"))
    return out


def _rerouted(m: HostMeasure, th: Thresholds, history: History | None) -> list[Reason]:
    if history is None or m.local:
        return []
    out = [Reason("rerouted", f"the local daemon reported it at {_hm(r.ts)}: {r.title}")
           for r in history.reroutes_of(m.names, m.address)[-1:]]
    floor = history.first(history.floor_ms, m.names)
    p = m.probe
    if floor and p and p.rtt and not out:
        step = p.rtt.min - floor
        if step > floor * th.floor_step_ratio and step > th.floor_step_min_ms:
            out.append(Reason("rerouted", f"RTT floor {p.rtt.min:.3g} ms, {step:.3g} ms above "
                              f"the last hour's {floor:.3g} ms in the daemon's history (more than "
                              f"{th.floor_step_ratio * 100:g} % and {th.floor_step_min_ms:g} ms: "
                              "WanprobeRttFloorStep)"))
    return out


def _hm(ts: float, date: bool = False) -> str:
    import time
    return time.strftime(("%Y-%m-%d " if date else "") + "%H:%M:%S UTC", time.gmtime(ts))


def verdicts(ms: list[HostMeasure], th: Thresholds, history: History | None,
             bound_s: float, rates: list[Rate | None] | None = None
             ) -> list[tuple[HostMeasure, list[Reason]]]:
    """Each host with its reasons (empty: go); ``rates``: :func:`host_rates`, if the caller
    has them already."""
    job = job_figures(ms)
    rates = host_rates(ms, th, history) if rates is None else rates
    out = []
    for m, rate in zip(ms, rates, strict=True):
        reasons = _reachability(m, bound_s)
        if not reasons:
            reasons = (_slo(m, th) + _mtu(m, job) + _capacity(m, job, rate)
                       + _rerouted(m, th, history))
        out.append((m, reasons))
    return out
