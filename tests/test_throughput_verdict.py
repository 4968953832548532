"""limited_by verdict rules (pure) with hand-computed Mathis and BDP figures."""

from __future__ import annotations

import math

import pytest

from wanprobe.diagnose.throughput_verdict import decide
from wanprobe.throughput.verdict import VerdictInput, bdp_bytes, single_stream_buffer_bytes


def base(**kw) -> VerdictInput:
    values = dict(goodput_bps=90e6, streams=1, busy_time_ms=4000.0, rwnd_limited_ms=0.0,
                  sndbuf_limited_ms=0.0, bytes_sent=45_000_000, bytes_retrans=0,
                  min_rtt_ms=60.0, srtt_ms=62.0, mss_bytes=1448,
                  delivery_rate_max_bps=96e6, snd_wnd_max_bytes=3_000_000,
                  cwnd_max_bytes=1_500_000, sender_thread_busy=0.05,
                  receiver_thread_busy=0.1)
    values.update(kw)
    return VerdictInput(**values)


def test_bdp_and_single_stream_buffer_hand_computed():
    # 100 Mbit/s × 60 ms = 750 000 B; the buffer for one stream is 2×BDP (window = half).
    assert bdp_bytes(100e6, 0.060) == 750_000
    assert single_stream_buffer_bytes(100e6, 0.060) == 1_500_000
    assert bdp_bytes(0, 0.06) is None and bdp_bytes(1e6, 0) is None


def test_clean_fast_path_is_network():
    v = decide(base())
    assert v.verdict == "network"
    assert v.evidence["bdp_bytes"] == bdp_bytes(96e6, 0.060)


def test_rwnd_limited_share_gives_receive_window():
    v = decide(base(goodput_bps=4e6, rwnd_limited_ms=3200.0, snd_wnd_max_bytes=65536,
                    min_rtt_ms=130.0, srtt_ms=130.0, window_bytes=65536))
    assert v.verdict == "receive_window"
    assert v.evidence["rwnd_limited_share"] == pytest.approx(0.8)
    assert v.evidence["window_allows_per_stream_bits_per_second"] == pytest.approx(
        65536 * 8 / 0.130, rel=1e-6)


def test_rate_reaching_the_window_gives_receive_window_even_when_pacing_hides_the_chrono():
    # 262144 B per 130 ms = 16.1 Mbit/s; cwnd is larger, so the peer's window is the limit.
    v = decide(base(goodput_bps=15.5e6, rwnd_limited_ms=400.0, snd_wnd_max_bytes=262144,
                    cwnd_max_bytes=900_000, min_rtt_ms=130.0, srtt_ms=130.0))
    assert v.verdict == "receive_window"
    # The same rate with cwnd below the window is not the window's doing.
    w = decide(base(goodput_bps=15.5e6, rwnd_limited_ms=0.0, snd_wnd_max_bytes=262144,
                    cwnd_max_bytes=200_000, min_rtt_ms=130.0, srtt_ms=130.0))
    assert w.verdict != "receive_window"


def test_sndbuf_limited_share_gives_send_buffer():
    v = decide(base(sndbuf_limited_ms=2500.0, rwnd_limited_ms=100.0))
    assert v.verdict == "send_buffer"
    assert v.evidence["sndbuf_limited_share"] == pytest.approx(0.625)


def test_loss_that_explains_the_rate_is_congestion_with_mathis_bound():
    # p = 1 %, MSS 1448, RTT 60 ms: (1448·8/0.06)·1.2247/0.1 = 2 364 317 bit/s.
    v = decide(base(goodput_bps=2.3e6, bytes_sent=1_000_000, bytes_retrans=10_000,
                    delivery_rate_max_bps=2.9e6, srtt_ms=63.0, cwnd_max_bytes=20_000))
    assert v.verdict == "congestion"
    expected = 1448 * 8 / 0.060 * math.sqrt(1.5) / math.sqrt(0.01)
    assert v.evidence["mathis_bound_bits_per_second"] == pytest.approx(expected, rel=1e-4)
    assert v.evidence["retransmit_rate"] == pytest.approx(0.01)
    assert "Mathis" in v.summary


def test_loss_far_below_the_rate_is_not_congestion():
    # BBR keeps 27 Mbit/s through 1 % loss: 40× the Mathis bound, so loss did not set it.
    v = decide(base(goodput_bps=27e6, bytes_sent=18_000_000, bytes_retrans=200_000,
                    min_rtt_ms=210.0, srtt_ms=224.0))
    assert v.verdict == "network"
    assert v.evidence["mathis_bound_bits_per_second"] < 27e6 / 3


def test_standing_queue_means_the_bottleneck_not_random_loss():
    v = decide(base(goodput_bps=2.3e6, bytes_sent=1_000_000, bytes_retrans=10_000,
                    srtt_ms=120.0, cwnd_max_bytes=20_000))
    assert v.verdict == "network"


def test_saturated_data_thread_is_host_cpu_first():
    v = decide(base(receiver_thread_busy=0.97, rwnd_limited_ms=3000.0))
    assert v.verdict == "host_cpu" and v.evidence["side"] == "receiver"


def test_worker_waiting_for_a_shared_core_is_host_cpu_not_network():
    # on a CPU 30 % of the time and runnable but waiting for it 66 %: a core shared with other
    # load starved the sender; without the demand figure the rest reads as network
    quiet = base(sender_thread_busy=0.30, receiver_thread_busy=0.2)
    assert decide(quiet).verdict == "network"
    v = decide(base(sender_thread_busy=0.30, sender_cpu_demand=0.96, receiver_thread_busy=0.2,
                    receiver_cpu_demand=0.25))
    assert v.verdict == "host_cpu" and v.evidence["side"] == "sender"
    assert v.evidence["sender_cpu_demand_ratio"] == 0.96


def test_worker_that_mostly_sleeps_is_not_host_cpu():
    v = decide(base(sender_thread_busy=0.30, sender_cpu_demand=0.85))
    assert v.verdict == "network"


def test_pacing_cap_reached_is_pacing():
    v = decide(base(goodput_bps=49e6, pacing_rate_bps=50e6))
    assert v.verdict == "pacing"


def test_unknown_inputs_do_not_crash():
    v = decide(VerdictInput(goodput_bps=0.0, streams=1))
    assert v.verdict == "network"
    assert v.to_json()["evidence"]["bdp_bytes"] is None


def test_slow_start_burst_does_not_hide_loss_limited_steady_rate():
    # Average 9 Mbit/s (slow start before the first loss) but 2.5 Mbit/s steady at p = 1 %.
    kw = dict(goodput_bps=9e6, bytes_sent=1_000_000, bytes_retrans=10_000, srtt_ms=63.0,
              cwnd_max_bytes=20_000)
    assert decide(base(**kw)).verdict == "network"
    v = decide(base(steady_goodput_bps=2.5e6, **kw))
    assert v.verdict == "congestion"
    assert v.evidence["steady_per_stream_bits_per_second"] == 2.5e6


def test_busy_cores_count_only_when_the_workers_wanted_them():
    # the side's cores full (ksoftirqd and other load) and its workers wanting a CPU 70 % of
    # the time: the host set the rate; the same cores full around a sender that mostly slept
    # waiting for the path: the network did
    starved = base(sender_thread_busy=0.1, sender_cpu_demand=0.7, sender_cores_busy_percent=99.0)
    v = decide(starved)
    assert v.verdict == "host_cpu" and v.evidence["side"] == "sender"
    assert v.evidence["sender_cores_busy_percent"] == 99.0
    assert decide(base(sender_thread_busy=0.1, sender_cpu_demand=0.2,
                       sender_cores_busy_percent=99.0)).verdict == "network"
    assert decide(base(receiver_thread_busy=0.1, receiver_cpu_demand=0.7,
                       receiver_cores_busy_percent=80.0)).verdict == "network"


def test_a_rule_that_raises_fails_the_verdict_with_its_own_error():
    """More bytes retransmitted than sent is no loss rate: the verdict fails as it did when the
    throughput engine decided it (the engine's rule_error is not a verdict)."""
    from wanprobe.errors import UsageError

    with pytest.raises(UsageError, match="loss must be a fraction"):
        decide(base(bytes_sent=1_000, bytes_retrans=5_000))
