"""The demo story end to end on the taipei-uswest lab: untuned ends (reno, small buffers) →
diagnose → plan → apply in both namespaces → re-measure. The tuned link must be faster in the
same run, the findings must explain why, and rollback must restore every watched value."""

from __future__ import annotations

import pytest
from conftest import new_lab_name

from wanprobe.demo_story import run_demo_story

pytestmark = [pytest.mark.netns, pytest.mark.slow]


def test_demo_story_after_beats_before_and_rollback_restores():
    doc = run_demo_story(True, lab_name=new_lab_name(), duration_s=4.0)
    assert doc["before"]["bits_per_second"] > 0
    assert doc["ratio"] > 1.5, doc
    assert doc["before"]["cc"] == "reno" and doc["after"]["cc"] == "bbr"
    ids = [f["id"] for f in doc["findings"]]
    # the top findings name the faults the lab was built with: loss-based cc on a lossy path
    # and buffers far below the BDP
    assert set(ids[:3]) & {"path.lossy_loss_based_cc", "path.window_limited"}, ids
    keys = {c["key"] for c in doc["plan"]["changes"]}
    assert {"net.ipv4.tcp_congestion_control", "net.ipv4.tcp_rmem"} <= keys
    assert all(n > 0 for n in doc["plan"]["applied"].values())
    assert doc["rollback"]["restored"], doc["rollback"]["differences"]
    # issue 13: tuned at both ends from measurement, the path is full and the network limits
    # (after = `tune apply --verify`, ramp-up omitted)
    assert doc["after"]["bits_per_second"] >= 0.85 * 100e6, doc["after"]
    assert doc["after"]["limited_by"] == "network", doc["after"]
    assert {c["host"] for c in doc["plan"]["changes"]} == {"local", "peer"}
