"""Issue 40's validation in the lab: a small model trained with torch.distributed gloo on the
CPU across two lab sites (Taipei-Tokyo, 35 ms, 100 Mbit/s; one rank per site), synchronous and
local SGD with H in {1, 4, 16}, fp32 and bf16 exchanges; the plan's predicted step time (the
strategy model over the measured ring, bench/validate_plan.py's ``measure``) within ±15 % of
the measured one in every case. One run here; the bench runs two and three sites, three runs
each (docs/planning.md has its figures)."""

from __future__ import annotations

import pytest
from conftest import RATE_RERUNS, TEST_LAB_PREFIX, load_bench, netns_unavailable_reason, require

# not ``alone``: the compute time in the prediction is measured inside the same steps, so a
# busy neighbour slows both sides alike; at 100 Mbit/s gloo is far from this host's limits
pytestmark = [pytest.mark.netns, pytest.mark.slow, pytest.mark.timeout(300)]
KEY = "plan-validation-shared-key-01234"


# A rate test on a shared 2-core VM (conftest.RATE_RERUNS): gloo's 3-6 MB exchange every step
# varied 0.77-0.87 s between runs of the same lab; a fault of ours fails all three tries
@RATE_RERUNS
def test_training_step_times_are_what_the_plan_predicts(tmp_path):
    require(netns_unavailable_reason())
    pytest.importorskip("torch", reason="needs torch's CPU wheel (the test extra)")
    bench = load_bench("validate_plan")
    key = tmp_path / "key"
    key.write_text(KEY)
    key.chmod(0o600)
    profile, ranks = bench.PROFILES[2]
    with bench.lab_of(f"{TEST_LAB_PREFIX}pl", profile, bench.RATE_BPS) as lab:
        rows = bench.measure(lab, key, ranks, params=bench.DEFAULT_PARAMS, periods=2)
    assert {(r["sync_every"], r["dtype"]) for r in rows} == {
        (h, dt) for h in (1, 4, 16) for dt in ("fp32", "bf16")}
    for r in rows:
        print(f"H={r['sync_every']:>2} {r['dtype']}: measured {r['measured_step_s']:.3f} s, "
              f"predicted {r['predicted_step_s']:.3f} s (sync {r['predicted_sync_s']:.3f} s, "
              f"compute {r['compute_s']:.3f} s), ratio {r['ratio']:.3f}")
    for r in rows:
        assert abs(r["ratio"] - 1) <= bench.TOLERANCE, r
    # the exchange matters in these cases: fp32 every step spends most of its step on it
    sync1 = next(r for r in rows if r["sync_every"] == 1 and r["dtype"] == "fp32")
    assert sync1["predicted_sync_s"] > sync1["compute_s"]
