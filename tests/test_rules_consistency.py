"""No finding is emitted that its own evidence contradicts (issue 36): on the rule golden's 600
random but valid measurement sets (tests/golden_rules.py), every finding that names a limit
carries figures that agree with it. The issue's case: "limited by the TCP receive window of the
peer" while its evidence said the window carries ≈ 421 Mbit/s on a 96 Mbit/s path."""

from __future__ import annotations

import golden_rules as gen
import pytest

from wanprobe.diagnose.engine import run_rules
from wanprobe.report.codec import host_of, measured_of


def _findings():
    for i in range(gen.SETS):
        m, h, cfg = gen.measurement_set(i)
        for f in run_rules(measured_of(m), host_of(h), cfg):
            yield i, cfg, f


@pytest.fixture(scope="module")
def findings() -> list:
    return list(_findings())


def test_a_window_finding_only_where_the_window_is_short_of_the_path(findings):
    seen = 0
    for i, _cfg, f in findings:
        if f.id != "path.window_limited":
            continue
        seen += 1
        ev = f.evidence
        cap, link = ev.get("window_limited_rate_bps"), ev.get("link_rate_bps")
        assert ev.get("verdict") == "receive_window" or cap is None or not link or cap < link, \
            (i, f.title, f.expected_effect)
    assert seen > 50  # the sets reach the rule


def test_loss_findings_agree_with_their_interval_and_counts(findings):
    above = unresolved = 0
    for i, cfg, f in findings:
        if f.id not in ("path.loss_above_slo", "path.loss_unresolved"):
            continue
        ev = f.evidence
        lo, hi = ev["ci95"]
        assert ev["loss_ratio"] == pytest.approx(ev["lost"] / ev["sent"]), (i, ev)
        assert lo <= ev["loss_ratio"] <= hi and ev["loss_slo"] == cfg.loss_slo, (i, ev)
        if f.id == "path.loss_above_slo":
            above += 1
            assert lo > cfg.loss_slo, (i, f.title)
            bound = ev.get("stream_rate_bound_bps")
            assert bound is None or bound <= ev["link_rate_bps"], (i, ev)
        else:
            unresolved += 1
            assert lo <= cfg.loss_slo <= hi, (i, f.title)
    assert above > 20 and unresolved > 20


def test_a_stream_count_only_where_one_stream_falls_short(findings):
    for i, _cfg, f in findings:
        if f.id == "path.streams_needed":
            ev = f.evidence
            assert ev["per_stream_ceiling_bps"] < ev["link_rate_bps"], (i, ev)
            assert ev["streams_needed"] * ev["per_stream_ceiling_bps"] >= ev["link_rate_bps"]
