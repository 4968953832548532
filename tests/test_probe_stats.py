"""Statistics and the per-session summary (pure functions)."""

import math

import pytest

from wanprobe.probe import stats
from wanprobe.probe.probe_summary import Reply, summarize
from wanprobe.probe.stamp_packet import ClassOfService


def test_wilson_interval_hand_computed():
    # p = 0.01, n = 2000, z = 1.96: centre = (0.01 + z²/4000)/(1 + z²/2000) ...
    lo, hi = stats.wilson_interval(20, 2000)
    z = stats.Z95
    n, p = 2000, 0.01
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    assert (lo, hi) == pytest.approx((c - h, c + h))
    assert lo == pytest.approx(0.006483, abs=2e-6) and hi == pytest.approx(0.015396, abs=2e-6)
    assert stats.wilson_interval(0, 100)[0] == 0.0
    assert stats.wilson_interval(0, 0) == (0.0, 1.0)


def test_rtt_summary_percentiles():
    s = stats.rtt_summary_ms(list(range(1, 101)))
    assert s["min"] == 1 and s["max"] == 100 and s["p50"] == 50.5
    assert s["p99"] == pytest.approx(99.01)
    assert stats.rtt_summary_ms([]) is None


def test_ipdv_reorder_duplicates():
    assert stats.ipdv_many_ms([0, 1, 2, 4], [10.0, 11.0, 10.0, 50.0]) == [1.0]
    assert stats.count_reordered([0, 2, 1, 3, 3, 5, 4]) == 2
    assert stats.count_duplicates([0, 1, 1, 2, 2, 2]) == 3


def _run(replies, sent, dscp=0):
    tx = {i: 1_000_000_000 * i for i in range(sent)}
    return summarize(method="stamp", peer="p", port=862, started_ns=0, duration_s=1.0,
                     interval_s=1.0, size_bytes=96, dscp=dscp, sent=sent, tx_user_ns=tx,
                     tx_kernel_ns={}, replies=replies, timeout_ns=2 * 10**9)


def test_forward_and_reverse_loss_from_reflector_counts():
    # 10 sent; seqs 2 and 5 never reached the reflector; the reply to 7 was lost on the way back.
    reached = [s for s in range(10) if s not in (2, 5)]
    replies = []
    for i, s in enumerate(reached):
        if s == 7:
            continue
        replies.append(Reply(sseq=s, rx_ns=10**9 * s + 20_000_000, reflector_seq=i,
                             t2_ns=10**9 * s + 10_000_000, t3_ns=10**9 * s + 11_000_000,
                             reflector_rx_count=i + 1))
    r = _run(replies, 10)
    assert r.loss.sent == 10 and r.loss.received == 7
    assert r.loss.forward_lost == 2 and r.loss.reverse_lost == 1
    assert r.loss.forward_ratio == pytest.approx(0.2) and r.loss.reverse_ratio == pytest.approx(1 / 8)
    assert r.rtt.p50 == pytest.approx(19.0)          # 20 ms minus 1 ms residence
    j = r.to_json()
    for k in ("min", "p50", "p90", "p99", "max", "mean", "stdev"):
        assert k in j["rtt_ms"]
    for k in ("sent", "received", "ratio", "forward_ratio", "reverse_ratio", "ci95"):
        assert k in j["loss"]
    assert {"jitter_ms", "reordered", "duplicates", "method", "peer", "started_at"} <= set(j)
    assert set(j["dscp"]) >= {"sent", "at_reflector", "returned"}


def test_stateless_reflector_gives_no_direction():
    replies = [Reply(sseq=s, rx_ns=10**9 * s + 5, reflector_seq=s) for s in (0, 1, 3)]
    r = _run(replies, 4)
    assert r.loss.forward_ratio is None and r.loss.reverse_ratio is None
    assert r.loss.ratio == 0.25


def test_bleaching_attribution():
    fwd = [Reply(sseq=0, rx_ns=5, tos=26 << 2, cos=ClassOfService(26, 0, 0, 0))]
    assert _run(fwd, 1, dscp=26).dscp.bleached == "forward"
    rev = [Reply(sseq=0, rx_ns=5, tos=0, cos=ClassOfService(26, 26, 0, 0))]
    assert _run(rev, 1, dscp=26).dscp.bleached == "reverse"
    ok = [Reply(sseq=0, rx_ns=5, tos=26 << 2, cos=ClassOfService(26, 26, 0, 0))]
    assert _run(ok, 1, dscp=26).dscp.bleached == "none"


def test_percentiles_match_numpy_linear():
    import numpy as np
    rng = np.random.default_rng(3)
    for n in (1, 2, 7, 30, 1001):
        a = rng.exponential(5.0, n)
        got = stats.percentiles_sorted(np.sort(a), (0, 50, 90, 99, 100))
        assert got == pytest.approx(np.percentile(a, [0, 50, 90, 99, 100]).tolist())


@pytest.mark.parametrize("n", [1, 2, 7, 30, 511])
def test_plain_python_path_matches_numpy(n, monkeypatch):
    """Small sessions are summarised without numpy; the figures must equal numpy's."""
    import random

    import numpy as np

    rng = random.Random(n)
    rtts = [60 + rng.expovariate(5.0) for _ in range(n)]
    # odd n: nothing lost (the all-consecutive fast path); even n: gaps in the sequence
    seqs = list(range(n)) if n % 2 else sorted(rng.sample(range(2 * n + 2), n))
    plain = stats.rtt_summary_ms(rtts)
    jit_plain = stats.ipdv_many_ms(seqs, rtts, rtts[::-1], [1.0])
    monkeypatch.setattr(stats, "NUMPY_MIN_SAMPLES", 0)
    ref = stats.rtt_summary_ms(rtts)
    jit_ref = stats.ipdv_many_ms(seqs, rtts, rtts[::-1], [1.0])
    a = np.asarray(rtts)
    assert ref["p99"] == pytest.approx(float(np.percentile(a, 99)), abs=1e-9)
    assert ref["stdev"] == pytest.approx(float(np.std(a)), abs=1e-9)
    assert plain.keys() == ref.keys()
    for k in ref:
        assert plain[k] == pytest.approx(ref[k], rel=1e-12, abs=1e-12), k
    assert jit_plain[2] is None and jit_ref[2] is None
    for p, r in zip(jit_plain[:2], jit_ref[:2], strict=True):
        assert (p is None) == (r is None)
        if p is not None:
            assert p == pytest.approx(r, rel=1e-12)
