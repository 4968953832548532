"""Reporting intervals (issue 20): a final interval shorter than half the reporting interval is
marked partial, keeps its bytes and has no rate; rates leave it out. The sampler's intervals
are contiguous and end when the counters were read."""

from __future__ import annotations

import threading

import pytest

from wanprobe.diagnose.throughput_verdict import JUDGE
from wanprobe.throughput import protocol as proto
from wanprobe.throughput.result import _Side, after_omit_bps, assemble
from wanprobe.throughput.sampler import IntervalSampler

# The 6 s test on a 100 Mbit/s path: six 1 s intervals and a 6.7 ms tail in which the
# receiver read what its socket still held (750 kB) — shown as 900 Mbit/s.
RATES_MBIT = [12, 78, 90, 82, 79, 95]
TAIL_S, TAIL_BYTES = 0.00667, 750_000


def _records(sending: bool) -> list[dict]:
    spans = [(k * 1.0, k + 1.0) for k in range(6)] + [(6.0, 6.0 + TAIL_S)]
    sizes = [int(r * 1e6 / 8) for r in RATES_MBIT] + [TAIL_BYTES if not sending else 0]
    info = {"rtt_ms": 101.0, "min_rtt_ms": 100.0, "cwnd_packets": 900, "snd_mss_bytes": 1448,
            "total_retrans_packets": 0, "bytes_sent": sum(sizes), "bytes_retrans": 0}
    return [{"k": k, "start_s": a, "end_s": b, "cpu_busy_percent": [5.0],
             "streams": [{"id": 0, "direction": proto.UP, "sending": sending, "bytes": n,
                          "tcp_info": info if sending else None}]}
            for k, ((a, b), n) in enumerate(zip(spans, sizes, strict=True))]


def _assemble():
    total = sum(int(r * 1e6 / 8) for r in RATES_MBIT) + TAIL_BYTES
    final = {"id": 0, "direction": proto.UP, "bytes": total, "elapsed_s": 6.0 + TAIL_S,
             "cpu_s": 0.1, "error": None, "cc": "bbr"}
    client = _Side(_records(True), {(proto.UP, 0): {**final, "sending": True,
                                                   "tcp_info": _records(True)[-2]["streams"][0]["tcp_info"]}}, [5.0])
    server = _Side(_records(False), {(proto.UP, 0): {**final, "sending": False, "tcp_info": None}},
                   [5.0])
    req = proto.TestRequest(duration_s=6.0, interval_s=1.0)
    return assemble(peer="198.18.0.2", port=862, request=req, client=client, server=server,
                    keys={(proto.UP, 0)}, partial_reason=None, judge=JUDGE), total


def test_the_final_short_interval_is_partial_without_a_rate_and_its_bytes_still_count():
    res, total = _assemble()
    j = res.to_json()
    ivs = j["intervals"]
    assert [iv["partial"] for iv in ivs] == [False] * 6 + [True]
    assert [round(iv["bits_per_second"] / 1e6) for iv in ivs[:-1]] == RATES_MBIT
    tail = ivs[-1]
    assert tail["bits_per_second"] is None and tail["streams"][0]["bits_per_second"] is None
    assert tail["bytes_received"] == TAIL_BYTES and tail["end_s"] - tail["start_s"] < 0.5
    # nothing is lost: the intervals add up to the test's bytes
    assert sum(iv["bytes_received"] for iv in ivs) == j["bytes_received"] == total
    # the rates leave it out: no 900 Mbit/s anywhere, the after-ramp rate is the full intervals'
    assert max(iv["bits_per_second"] for iv in ivs if not iv["partial"]) < 100e6
    assert after_omit_bps(res.intervals, 2.0) == pytest.approx(sum(RATES_MBIT[2:]) / 4 * 1e6, rel=1e-3)


def test_a_final_interval_of_at_least_half_the_reporting_interval_is_a_full_one():
    from dataclasses import replace

    from wanprobe.throughput.result import IntervalResult, mark_partial_tail

    ivs = [IntervalResult(k * 1.0, k + 1.0, 10, 10, 80.0, 0, ()) for k in range(3)]
    tail = IntervalResult(3.0, 3.6, 10, 10, 133.0, 0, ())
    assert mark_partial_tail([*ivs, tail], 1.0)[-1] == tail
    short = replace(tail, end_s=3.4)
    marked = mark_partial_tail([*ivs, short], 1.0)[-1]
    assert marked.partial and marked.bits_per_second is None
    # no reporting interval given (iperf3's JSON): the longest of the others stands for it
    assert mark_partial_tail([*ivs, short])[-1].partial
    assert mark_partial_tail([short]) == [short]  # a test shorter than one interval is whole


class _Stream:
    """What the sampler reads of a receiving stream."""

    def __init__(self) -> None:
        self.stream_id, self.direction, self.sending = 0, proto.UP, False
        self.bytes, self.t_last, self.sock = 0, None, None
        self.done = threading.Event()


def test_sampler_intervals_are_contiguous_and_end_when_the_counters_were_read():
    import time

    s = _Stream()
    t0 = time.monotonic()
    recs, stop = [], threading.Event()

    def emit(rec):
        recs.append(rec)
        s.bytes += 1000
        s.t_last = time.monotonic()
        if rec["k"] == 0:
            time.sleep(0.15)  # a late sampler: the next boundary (0.1 s) has passed
        if len(recs) == 3:
            s.done.set()
            stop.set()

    sampler = IntervalSampler([s], t_start=t0, interval_s=0.05, emit=emit, stop=stop)
    sampler.start()
    sampler.join(5.0)
    assert len(recs) >= 3
    for a, b in zip(recs, recs[1:], strict=False):
        assert b["start_s"] == a["end_s"]                    # contiguous
    # the late sample claims the time it was read, not the boundary it missed
    assert recs[1]["end_s"] >= recs[0]["end_s"] + 0.15
    assert recs[1]["streams"][0]["bytes"] == 1000
