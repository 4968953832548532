"""Turn per-probe send/receive records into a ProbeResult: a pure function.

RTT = (T4 - T1) - (T3 - T2) (RFC 8762 §4.2, round-trip delay without the reflector's residence
time). Forward/reverse loss from the reflector's receive count (Direct Measurement R_RxC,
RFC 8972 §4.5, or a stateful reflector's sequence number, RFC 8762 §4.3.1) at the last answered
probe: forward lost = probes sent up to it - probes the reflector had received; reverse lost =
probes the reflector had received - replies that came back. Probes after the last answered one
cannot be attributed to a direction; they count in ``loss.ratio`` only. The reflector's own drops
and restarts of its session are taken out (loss_split.py), and so are probes whose new session
it refused (an answer with the Reflector Report TLV's session-refused flag, issue 37: such an
answer is no reply of the path's).
"""

from __future__ import annotations

import time
from collections import Counter
from typing import NamedTuple

from wanprobe.probe import stats
from wanprobe.probe.loss_split import split_loss
from wanprobe.probe.owd import OwdClock, owd_report
from wanprobe.probe.result import DscpReport, ProbeResult, ReflectorInfo, RttStats
from wanprobe.probe.stamp_packet import ClassOfService


class Reply(NamedTuple):
    """One answer as received; absent fields are None (ICMP/TCP have no reflector stamps).
    A NamedTuple because thousands are made per second on the receive path."""

    sseq: int
    rx_ns: int
    reflector_seq: int | None = None
    t2_ns: int | None = None
    t3_ns: int | None = None
    tos: int | None = None
    cos: ClassOfService | None = None
    reflector_rx_count: int | None = None


def iso_utc(unix_ns: int) -> str:
    """ISO 8601 UTC with milliseconds (``2026-12-03T09:15:47.544Z``); gmtime/strftime, about
    half the cost of a datetime round trip (a mesh formats one per session)."""
    sec, rem_ns = divmod(unix_ns, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec)) + f".{rem_ns // 1_000_000:03d}Z"


def _samples(first: dict[int, Reply], tx_user_ns: dict[int, int], tx_kernel_ns: dict[int, int],
             follow_up_ns: dict[int, int], timeout_ns: int) -> tuple[list[int], list[Reply],
                                                                    list[float], list[float],
                                                                    list[float], int, int]:
    """Per reply in sequence order: the RTT less the reflector's residence (T3 − T2, the
    follow-up's T3 where one came), and each direction's one-way delay when T2/T3 are known.
    Returns (sequences, replies kept, RTTs, forward, reverse one-way delays in ms, replies
    timed by the kernel's TX stamp, replies later than the timeout)."""
    seqs: list[int] = []
    kept: list[Reply] = []
    rtts_ms: list[float] = []
    fwd_ms: list[float] = []
    rev_ms: list[float] = []
    kernel_tx = late = 0
    for seq in sorted(first):
        r = first[seq]
        _s, rx_ns, rseq, t2, t3, _tos, _cos, _rxc = r  # unpacked: thousands per second
        t1 = tx_kernel_ns.get(seq)
        if t1 is None:
            t1 = tx_user_ns[seq]
        else:
            kernel_tx += 1
        raw = rx_ns - t1
        residence = 0
        if t2 is not None:
            precise = follow_up_ns.get(rseq) if rseq is not None and follow_up_ns else None
            if precise is not None and 0 <= precise - t2 < raw:
                t3 = precise
            if t3 is not None and 0 <= t3 - t2 < raw:
                residence = t3 - t2
        if raw > timeout_ns:
            late += 1
            continue
        seqs.append(seq)
        kept.append(r)
        rtts_ms.append((raw - residence) / 1e6)
        if t2 is not None and t3 is not None:
            fwd_ms.append((t2 - t1) / 1e6)
            rev_ms.append((rx_ns - t3) / 1e6)
    return seqs, kept, rtts_ms, fwd_ms, rev_ms, kernel_tx, late


def summarize(*, method: str, peer: str, port: int | None, started_ns: int, duration_s: float,
              interval_s: float, size_bytes: int | None, dscp: int, sent: int,
              tx_user_ns: dict[int, int], tx_kernel_ns: dict[int, int], replies: list[Reply],
              timeout_ns: int, follow_up_ns: dict[int, int] | None = None,
              clock: OwdClock | None = None, reports=None) -> ProbeResult:
    """Compute the result of one session from its raw records. ``follow_up_ns`` maps a reflector
    sequence number to the kernel transmit time the reflector reported later (RFC 8972 §4.7); it
    replaces T3 read before sendmsg. ``clock`` (both ends' clocks) gives the one-way delays and
    their bound (owd.py). ``reports``: what the replies' Reflector Report TLVs said
    (reflector_report.ReportLog; STAMP only)."""
    refused = reports.session_refused if reports is not None else None
    if refused:   # answers that say the reflector kept no session: they measure nothing
        replies = [r for r in replies if r[0] not in refused]
    arrival = [r[0] for r in replies]
    first: dict[int, Reply] = {r[0]: r for r in reversed(replies)}  # the first copy of each
    seqs, kept, rtts_ms, fwd_ms, rev_ms, kernel_tx, late = _samples(
        first, tx_user_ns, tx_kernel_ns, follow_up_ns or {}, timeout_ns)
    received = len(seqs)
    loss = split_loss(sent, received, late, kept, reports)
    summary = stats.rtt_summary_ms(rtts_ms)
    have_oneway = len(fwd_ms) == len(seqs)
    jitter, jitter_fwd, jitter_rev = stats.ipdv_many_ms(seqs, rtts_ms, fwd_ms, rev_ms)
    return ProbeResult(
        method=method, peer=peer, port=port, started_at=iso_utc(started_ns),
        duration_s=duration_s, interval_s=interval_s, size_bytes=size_bytes,
        rtt=RttStats(**summary) if summary else None, loss=loss,
        dscp=_dscp(dscp, kept),
        jitter_ms=jitter, jitter_forward_ms=jitter_fwd if have_oneway else None,
        jitter_reverse_ms=jitter_rev if have_oneway else None,
        reordered=stats.count_reordered(arrival), duplicates=stats.count_duplicates(arrival),
        tx_timestamp=("kernel" if kernel_tx == len(first) and first else
                      "user" if kernel_tx == 0 else "mixed"),
        rtt_samples_ms=tuple(rtts_ms),
        owd=owd_report(fwd_ms, rev_ms, clock) if have_oneway else None,
        reflector=(ReflectorInfo(reports.counts, reports.limit_pps) if reports is not None
                   else None),
    )


def _mode(values: list) -> object | None:
    if not values:
        return None
    if values.count(values[0]) == len(values):  # the usual case, without a Counter
        return values[0]
    return Counter(values).most_common(1)[0][0]


def _dscp(sent: int, answered: list[Reply]) -> DscpReport:
    returned = _mode([r.tos >> 2 for r in answered if r.tos is not None])
    cos = [r.cos for r in answered if r.cos is not None]
    if not cos:
        bleached = "none" if returned == sent else None
        return DscpReport(sent, None, returned, bleached=bleached)
    at_reflector = _mode([c.dscp2 for c in cos])
    ecn = _mode([c.ecn for c in cos])
    requested = _mode([c.dscp1 for c in cos])
    refused = _mode([c.rp for c in cos]) == 1
    forward = at_reflector != sent
    reverse = (not refused and returned is not None and returned != requested)
    bleached = {(True, True): "both", (True, False): "forward", (False, True): "reverse",
                (False, False): "none"}[(forward, reverse)]
    return DscpReport(sent, at_reflector, returned, ecn, requested, refused, bleached)
