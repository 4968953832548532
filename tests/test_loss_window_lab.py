"""Issue 36 on the lab: a three-peer daemon (0, 0.5 and 3 % forward loss, one lab path each)
reports each peer's loss over its window with an interval that holds the rate the lab loses,
and its loss regression does not fire and clear on binomial noise. Runs bench/daemon_loss_window.py
for 2.5 minutes (the 30-minute soak is the same script's default; its figures are in the issue's
closing note). On main the daemon showed the last 10-probe session: a steady 3 % read as 0.00 %
in most sessions, and the regression fired and cleared twice in four minutes."""

from __future__ import annotations

import statistics

import pytest
from conftest import load_bench, netns_unavailable_reason, require


@pytest.mark.netns
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_three_peer_daemon_windowed_loss_holds_the_set_rates_and_never_flaps():
    require(netns_unavailable_reason())
    bench = load_bench("daemon_loss_window")
    r = bench.run(2.5, short_s=45, sample_s=15.0, interval_s=1.0, loss_window=20)
    bench._print(r)
    assert r["tracebacks"] == 0 and len(r["samples"]) >= 5, r
    per_window = 45 / 1.0 * 10  # probes a full window holds (sessions of 10, one a second)
    for key in r["samples"][0]:
        if key == "t_s":
            continue
        xs = [s[key] for s in r["samples"]]
        assert all(x["estimate"] is not None and x["probes"] >= 0.6 * per_window for x in xs), xs
        # every figure carries its interval, and the interval contains its estimate
        assert all(x["ci95"][0] <= x["estimate"] <= x["ci95"][1] for x in xs), xs
        if key == "three-pct/forward":  # not the 0.00 % a ten-probe session mostly reads
            assert 0.01 <= statistics.median(x["estimate"] for x in xs) <= 0.06, xs
    for peer, f in r["whole_run"].items():
        # the whole run's counts at 99.9 % (six checks: a false failure 1 run in ~170)
        assert f["forward_holds"] and f["reverse_holds"], (peer, f)
        assert f["sent"] >= 1000, (peer, f)
        assert f["loss_fired"] <= 1 and f["loss_cleared"] <= 1, (peer, f)
