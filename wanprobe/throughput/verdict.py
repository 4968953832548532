"""The figures a throughput verdict is judged from and the verdict's JSON-coded type: data of
the measurement, no judgement (issue 38). What limited a transfer is decided by the composing
layer's :class:`Judge` (``wanprobe.diagnose.throughput_verdict.JUDGE``: the first-match table
of ``diagnose/rules_throughput.py``), which the result's builders (``result.assemble``,
``iperf3_engine.parse_iperf3_json``) are handed; a UDP test's verdict is fixed (``network``:
its loss and jitter are in ``udp.*``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from wanprobe.json_fields import Decoded, open_object
from wanprobe.models.bdp import bdp_bytes as _bdp_bytes
from wanprobe.models.bdp import buffer_needed_bytes


def bdp_bytes(rate_bps: float, rtt_s: float) -> int | None:
    """Bandwidth-delay product in whole bytes (models.bdp), None when rate or RTT is unknown."""
    if not rate_bps or not rtt_s or rate_bps <= 0 or rtt_s <= 0:
        return None
    return int(round(_bdp_bytes(rate_bps, rtt_s)))


def single_stream_buffer_bytes(rate_bps: float, rtt_s: float) -> int | None:
    """Socket buffer one stream needs for ``rate_bps`` at ``rtt_s`` (about 2×BDP; models.bdp)."""
    if not rate_bps or not rtt_s or rate_bps <= 0 or rtt_s <= 0:
        return None
    return buffer_needed_bytes(rate_bps, rtt_s)


@dataclass(frozen=True)
class VerdictInput:
    """Aggregates over the run's sending sockets (sums over streams unless noted)."""

    goodput_bps: float
    streams: int
    steady_goodput_bps: float | None = None  # median over full intervals (past slow start)
    busy_time_ms: float | None = None
    rwnd_limited_ms: float | None = None
    sndbuf_limited_ms: float | None = None
    bytes_sent: int | None = None
    bytes_retrans: int | None = None
    min_rtt_ms: float | None = None          # minimum over streams
    srtt_ms: float | None = None             # mean smoothed RTT over intervals and streams
    mss_bytes: int | None = None
    delivery_rate_max_bps: float | None = None  # max over intervals of the streams' sum
    window_bytes: int | None = None          # requested --window
    snd_wnd_max_bytes: int | None = None     # largest receive window the peer advertised
    cwnd_max_bytes: int | None = None        # largest congestion window (cwnd × MSS)
    sender_thread_busy: float | None = None  # max data-worker CPU share on the sending host
    receiver_thread_busy: float | None = None
    # max over the side's data workers of (time on a CPU + time runnable but waiting for one)
    # / wall time (/proc/<pid>/schedstat): near 1 when the worker always had work and only a
    # CPU was missing, also when it shared its core with other load
    sender_cpu_demand: float | None = None
    receiver_cpu_demand: float | None = None
    # mean busy % over the test of the cores the side's workers may run on (/proc/stat)
    sender_cores_busy_percent: float | None = None
    receiver_cores_busy_percent: float | None = None
    sender_core_busy_percent: float | None = None
    receiver_core_busy_percent: float | None = None
    pacing_rate_bps: float | None = None     # requested per-stream pacing cap


@dataclass(frozen=True)
class Verdict(Decoded, json_name="limited_by", json_parts={"evidence": open_object}):
    verdict: str
    evidence: dict = field(default_factory=dict)
    summary: str = ""

    def to_json(self) -> dict:
        return {"verdict": self.verdict, "summary": self.summary, "evidence": self.evidence}


@dataclass(frozen=True)
class Judge:
    """What the composing layer hands a result's builder: the decision on a TCP test's figures
    and the notes a verdict's evidence calls for (both from ``wanprobe/diagnose``)."""

    decide: Callable[[VerdictInput], Verdict]
    notes: Callable[[Mapping[str, Any]], tuple[str, ...]]


def verdict_of(vin: VerdictInput, udp_lost_percent: float | None, judge: Judge | None,
               *, udp: bool) -> Verdict:
    """A UDP test's fixed verdict (at a set rate the sender, not the network, chose the rate:
    its loss and jitter are the figures, under ``udp.*``), or the caller's judge's on a TCP
    test's figures (both engines build their result through this)."""
    if udp:
        return Verdict("network", {"lost_percent": udp_lost_percent},
                       "UDP at a set rate: see udp.* for loss and jitter")
    need_judge(judge, udp)
    assert judge is not None
    return judge.decide(vin)


def need_judge(judge: Judge | None, udp: bool) -> None:
    """A TCP test is judged by the caller's :class:`Judge`; only a UDP test's verdict is fixed."""
    if judge is None and not udp:
        raise TypeError("a TCP throughput test needs a judge "
                        "(wanprobe.diagnose.throughput_verdict.JUDGE)")
