"""History store (SQLite WAL) and baseline/regression detection."""

from __future__ import annotations

import random
import sqlite3

import pytest

from wanprobe.daemon.baseline import BaselineTracker, wilson_interval
from wanprobe.daemon.config import BaselineSettings
from wanprobe.history.store import ProbeRow, Store, link_bytes


def _row(ts, peer="p", p50=30.0, sent=10, received=10, **kw):
    return ProbeRow(ts=ts, peer=peer, method="stamp", sent=sent, received=received,
                    loss_ratio=(sent - received) / sent if sent else None,
                    rtt_min_ms=p50 - 1, rtt_p50_ms=p50, rtt_p90_ms=p50 + 1, rtt_p99_ms=p50 + 2,
                    rtt_max_ms=p50 + 3, rtt_mean_ms=p50, jitter_ms=0.1, **kw)


def test_store_is_wal_and_round_trips(tmp_path):
    st = Store(tmp_path / "h.sqlite3")
    doc = {"rtt_ms": {"min": 1.0, "p50": 2.0, "p90": 3.0, "p99": 4.0, "max": 5.0, "mean": 2.1,
                      "stdev": 0.3},
           "loss": {"sent": 100, "received": 97, "ratio": 0.03, "forward_ratio": 0.02,
                    "reverse_ratio": 0.0102}, "jitter_ms": 0.4}
    st.add_probe(ProbeRow.from_probe_json(1000.0, "tokyo-1", "stamp", doc))
    st.add_probe(ProbeRow(ts=1001.0, peer="tokyo-1", method="stamp", error="no answer"))
    st.add_throughput(1002.0, "tokyo-1", {"bits_per_second": 9.4e8, "bytes_sent": 600_000_000,
                                          "bytes_received": 590_000_000, "duration_s": 5.0,
                                          "limited_by": {"verdict": "network"}})
    st.add_counter_rates(1003.0, 15.0, {"tcp": {"RetransSegs": 3.5}})
    st.add_finding(1004.0, {"id": "path.loss_regression", "severity": "critical", "title": "t",
                            "evidence": {"x": 1}}, peer="tokyo-1", report_path="/r.json")
    assert st.count("probes") == 0, "rows are buffered until flush"
    assert st.flush() == 5
    rows = st.probes("tokyo-1")
    assert rows[0].rtt_p99_ms == 4.0 and rows[0].loss_forward_ratio == 0.02 and rows[0].sent == 100
    assert rows[1].error == "no answer"
    assert st.throughput("tokyo-1")[0]["limited_by"] == "network"
    assert st.throughput_bytes_since(0) == 600_000_000
    assert st.findings("tokyo-1")[0]["evidence"] == {"x": 1}
    mode = sqlite3.connect(st.path).execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"
    assert st.integrity_check() == "ok"
    st.close()


def test_direction_counts_fold_as_sums_and_an_old_history_gains_them(tmp_path):
    """Issue 36: a bucket's forward loss is lost/of over its sessions (a mean of ratios weighed a
    10-probe session as much as a 1,000-probe one), and a schema-1 file opens with the columns
    added, its old rows NULL (shown as unknown, folded as the mean of their ratios)."""
    old = tmp_path / "old.sqlite3"
    db = sqlite3.connect(old)
    db.executescript("CREATE TABLE probes (id INTEGER PRIMARY KEY, ts REAL NOT NULL, peer TEXT "
                     "NOT NULL, method TEXT NOT NULL, resolution_s REAL NOT NULL DEFAULT 0, "
                     "sessions INTEGER NOT NULL DEFAULT 1, sent INTEGER, received INTEGER, "
                     "loss_ratio REAL, loss_forward_ratio REAL, loss_reverse_ratio REAL, "
                     "rtt_min_ms REAL, rtt_p50_ms REAL, rtt_p90_ms REAL, rtt_p99_ms REAL, "
                     "rtt_max_ms REAL, rtt_mean_ms REAL, jitter_ms REAL, error TEXT);"
                     "INSERT INTO probes (ts, peer, method, sent, received, loss_ratio, "
                     "loss_forward_ratio) VALUES (10, 'p', 'stamp', 10, 9, 0.1, 0.1);")
    db.commit()
    db.close()
    st = Store(old)
    assert st.probes("p")[0].loss_forward_of is None and st.probes("p")[0].sent == 10
    st.close()
    st = Store(tmp_path / "h.sqlite3")
    for ts, sent, f_lost in ((100.0, 10, 1), (101.0, 1000, 0)):
        st.add_probe(ProbeRow.from_probe_json(ts, "p", "stamp", {"loss": {
            "sent": sent, "received": sent - f_lost, "ratio": f_lost / sent,
            "forward_ratio": f_lost / sent, "forward_lost": f_lost, "forward_of": sent,
            "reverse_ratio": 0.0, "reverse_lost": 0, "reverse_of": sent - f_lost}}))
    st.flush()
    assert st.downsample(now=1000.0, raw_s=10, bucket_s=300) == 2
    (row,) = st.probes("p")
    assert (row.loss_forward_lost, row.loss_forward_of) == (1, 1010)
    assert row.loss_forward_ratio == pytest.approx(1 / 1010)  # not (0.1 + 0) / 2
    assert (row.loss_reverse_lost, row.loss_reverse_of) == (0, 1009)
    st.close()


def test_link_bytes_counts_both_directions_of_bidir():
    assert link_bytes({"mode": "bidir", "bytes_sent": 10, "bytes_received": 9,
                       "reverse": {"bytes_sent": 7, "bytes_received": 6}}) == 17
    assert link_bytes({"bytes_sent": 10, "bytes_received": 12}) == 12


def test_downsampling_and_retention(tmp_path):
    st = Store(tmp_path / "h.sqlite3")
    now = 1_000_000.0
    # 2 hours of old rows every 10 s, plus fresh ones
    for i in range(720):
        st.add_probe(_row(now - 3 * 86400 - i * 10, received=9 if i % 2 else 10))
    for i in range(30):
        st.add_probe(_row(now - i * 10))
    st.add_counter_rates(now - 3 * 86400, 15, {"a": 1.0})
    st.flush()
    folded = st.downsample(now=now, raw_s=86400, bucket_s=300)
    assert folded == 720
    rows = st.probes("p")
    buckets = [r for r in rows if r.resolution_s == 300]
    assert 24 <= len(buckets) <= 25 and sum(b.sessions for b in buckets) == 720
    assert sum(b.sent for b in buckets) == 7200 and sum(b.received for b in buckets) == 6840
    full = [b for b in buckets if b.sessions == 30]
    assert full and full[0].loss_ratio == pytest.approx(0.05)
    assert len([r for r in rows if r.resolution_s == 0]) == 30, "fresh rows stay raw"
    deleted = st.expire(now=now, raw_s=86400, downsampled_s=2 * 86400)
    assert deleted == len(buckets) + 1  # old buckets and the old counter sample
    assert st.count("probes") == 30 and st.integrity_check() == "ok"
    st.close()


def test_wilson_interval_hand_computed():
    lo, hi = wilson_interval(1, 50)  # p = 0.02, n = 50, z = 1.96
    assert lo == pytest.approx(0.003539, abs=1e-5) and hi == pytest.approx(0.104954, abs=1e-5)
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_loss_regression_with_hysteresis_and_frozen_baseline():
    """Enter on the pooled window's Wilson lower bound, clear on its upper bound (issue 36)."""
    b = BaselineTracker(BaselineSettings(window=20, recent=5, min_samples=10, loss_window=5,
                                         loss_increase=0.01, clear_fraction=0.5))
    rng = random.Random(1)
    events = []
    t = 0.0
    for _ in range(30):  # clean: 50-packet sessions with a rare lost packet
        t += 1
        events += b.observe_probe(_row(t, sent=50, received=50 - (rng.random() < 0.1)))
    assert events == [], "a lost packet now and then is not a regression"
    for _ in range(6):  # 10 % loss
        t += 1
        events += b.observe_probe(_row(t, sent=50, received=45, loss_forward_ratio=0.1,
                                       loss_reverse_ratio=0.0))
    assert [(e.metric, e.state) for e in events] == [("loss", "degraded")]
    ev = events[0]
    assert ev.current > 0.03 and ev.baseline < 0.01
    assert ev.evidence["forward_ratio"] == pytest.approx(0.1)
    assert ev.evidence["recent_ci95"][0] > ev.baseline + 0.01
    assert ev.evidence["recent_sessions"] == 5
    assert b.baseline("p")["loss_ratio"] < 0.01, "the degraded period is not learnt"
    events.clear()
    for _ in range(10):  # still degraded: no repeated reports
        t += 1
        events += b.observe_probe(_row(t, sent=50, received=45))
    assert events == []
    for _ in range(5):  # 1.4 %: its interval's upper bound is not back within half the threshold
        t += 1
        events += b.observe_probe(_row(t, sent=1000, received=986))
    assert events == [], "hysteresis: not cleared until significantly back"
    for _ in range(5):
        t += 1
        events += b.observe_probe(_row(t, sent=1000, received=1000))
    assert [(e.metric, e.state) for e in events] == [("loss", "recovered")]


def _loss_transitions(seed: int, clean: int, rate: float, sessions: int = 600) -> list[str]:
    """The loss transitions of default settings over ``clean`` clean sessions of 10 probes,
    then ``sessions`` at ``rate`` (binomial draws of ``seed``)."""
    b = BaselineTracker(BaselineSettings())
    rng = random.Random(seed)
    events = []
    for i in range(clean + sessions):
        p = rate if i >= clean else 0.0
        lost = sum(rng.random() < p for _ in range(10))
        events += b.observe_probe(_row(float(i), sent=10, received=10 - lost))
    return [e.state for e in events if e.metric == "loss"]


def test_steady_loss_in_small_sessions_does_not_flap_and_a_step_is_found():
    """Issue 36: a steady 3 % read through 10-probe sessions fired and cleared twice in four
    minutes. Over 20 seeds of 600 sessions: a path that always lost 3 % or never lost gives
    no transition (at most one stray fire in 20 runs, never a fire and a clear), a clean path
    that steps to 3 % is found in every run and stays found."""
    steady = [_loss_transitions(seed, 0, 0.03) for seed in range(20)]
    assert sum(len(t) for t in steady) <= 1 and all(len(t) <= 1 for t in steady), steady
    assert all(_loss_transitions(seed, 150, 0.0) == [] for seed in range(5))
    steps = [_loss_transitions(seed, 150, 0.03) for seed in range(20)]
    assert all(t == ["degraded"] for t in steps), steps


def test_rtt_regression_and_silence_on_noise():
    b = BaselineTracker(BaselineSettings(window=30, recent=5, min_samples=10,
                                         rtt_increase_ratio=0.25, rtt_increase_min_ms=1.0))
    rng = random.Random(2)
    events = []
    for i in range(40):
        events += b.observe_probe(_row(i, p50=60 + rng.uniform(-2, 2)))
    assert events == []
    for i in range(40, 46):
        events += b.observe_probe(_row(i, p50=90 + rng.uniform(-2, 2)))
    kinds = {(e.metric, e.state) for e in events}
    assert ("rtt_p50", "degraded") in kinds and ("rtt_p99", "degraded") in kinds
    p50 = next(e for e in events if e.metric == "rtt_p50")
    assert p50.baseline == pytest.approx(60, abs=1.5) and p50.current == pytest.approx(90, abs=2)


def test_throughput_drop_detected():
    b = BaselineTracker(BaselineSettings(min_samples=10, throughput_drop_ratio=0.3))
    events = []
    for _ in range(3):
        events += b.observe_throughput("p", 9.0e8)
    assert events == []
    events += b.observe_throughput("p", 4.0e8)
    assert [(e.metric, e.state) for e in events] == [("throughput", "degraded")]
    assert b.observe_throughput("p", 8.9e8)[0].state == "recovered"


def test_error_rows_do_not_feed_the_baseline():
    b = BaselineTracker(BaselineSettings(min_samples=2, recent=1))
    for i in range(5):
        assert b.observe_probe(ProbeRow(ts=i, peer="p", method="stamp", error="timeout")) == []
    assert b.baseline("p")["sessions"] == 0


def test_baseline_aggregates_stay_equal_to_a_recomputation():
    """The incremental windows (sorted RTTs, pooled losses) match recomputing them from the rows,
    through evictions, missing p99s and a degraded period that freezes the window."""
    import statistics

    rng = random.Random(7)
    b = BaselineTracker(BaselineSettings(window=20, recent=3, min_samples=5))
    for i in range(400):
        lossy = 150 <= i < 200
        b.observe_probe(ProbeRow(ts=i, peer="p", method="stamp", sent=50,
                                 received=30 if lossy else 50 - (rng.random() < 0.2),
                                 rtt_p50_ms=20 + rng.random(),
                                 rtt_p99_ms=None if rng.random() < 0.2 else 25 + rng.random()))
        st = b._peers["p"]
        rows = list(st.rows.history)
        assert st.sorted_ms["rtt_p50_ms"] == sorted(r.rtt_p50_ms for r in rows)
        assert st.sorted_ms["rtt_p99_ms"] == sorted(r.rtt_p99_ms for r in rows
                                                    if r.rtt_p99_ms is not None)
        for pairs, sums in ((st.loss_recent, (st.recent_lost, st.recent_sent)),
                            (st.loss_base, (st.base_lost, st.base_sent))):
            assert sums == (sum(lost for lost, _ in pairs), sum(sent for _, sent in pairs))
        assert len(st.loss_base) <= 2 * b.s.loss_window
        if rows:
            assert b.baseline("p")["rtt_p50_ms"] == statistics.median(r.rtt_p50_ms for r in rows)
