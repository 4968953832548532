"""`impact --target-utilization`: the communication budget by hand, and each needed rate fed
back into the forward model (impact.strategies) gives the target utilisation again."""

from __future__ import annotations

import json
import math

import pytest

from wanprobe.cli import main
from wanprobe.errors import UsageError
from wanprobe.models import impact as model
from wanprobe.models import strategy
from wanprobe.models.impact_inverse import max_comm_s, needs, rate_for


@pytest.mark.parametrize("overlap,expected", [
    (0.0, 0.5 * 0.1 / 0.9),          # compute (1 − U) / U
    (0.5, 0.5 * 0.1 / (0.9 * 0.5)),  # ... / (1 − overlap): the hidden half fits under compute
    (0.99, 0.5 / 0.9),               # the hidden part would exceed compute: step = comm
    (1.0, 0.5 / 0.9),
])
def test_comm_budget_by_hand(overlap, expected):
    budget = max_comm_s(0.5, overlap, 0.9)
    assert math.isclose(budget, expected)
    step = model.step_time_s(0.5, budget, overlap)
    assert math.isclose(0.5 / step, 0.9)                  # utilisation = compute / step


def test_rate_for_inverts_a_hand_model():
    assert math.isclose(rate_for(lambda b: 0.01 + 8e9 / b, 0.05), 2e11, rel_tol=1e-6)
    assert rate_for(lambda b: 0.06 + 8e9 / b, 0.05) is None   # latency floor over budget
    with pytest.raises(UsageError):
        max_comm_s(0.5, 0.0, 1.0)


@pytest.mark.parametrize("rtt_s,params,compute_s,reachable_at_least", [
    (0.002, 1e9, 2.0, 5),      # metro distance, 1B model: every strategy can make it
    (0.130, 7e9, 0.5, 1),      # Taipei - US West, 7B: only a sync every H steps can
])
def test_each_needed_rate_gives_the_target_back(rtt_s, params, compute_s, reachable_at_least):
    job = model.Job(params=params, dtype="bf16", sites=2, gpus_per_site=8, compute_s=compute_s)
    options = model.Options(sync_every=500)
    reachable = 0
    for need in needs(job, rtt_s, 0.9, options):
        if need.required_bits_per_second is None:
            assert need.comm_floor_s > need.comm_budget_per_sync_s
            continue
        reachable += 1
        rate = need.required_bits_per_second
        path = model.Path(rtt_s=rtt_s, link_bps=rate, flow_rate_bps=rate)
        net = strategy.network(job, path, options)
        forward = {r.name: r for r in strategy.strategies(job, net, options)}[need.name]
        assert forward.gpu_idle_share == pytest.approx(0.1, abs=1e-6), need
    assert reachable >= reachable_at_least


def test_cli_target_utilization(capsys):
    with pytest.raises(SystemExit) as ex:
        main(["impact", "--params", "7e9", "--compute-ms", "500", "--rtt", "130ms",
              "--target-utilization", "90%", "--json"])
    out = capsys.readouterr()
    assert ex.value.code == 0, out.err
    doc = json.loads(out.out)
    sync = {n["name"]: n for n in doc["needs"]}["sync every 500 steps"]
    assert sync["bytes_per_sync"] == 14e9 and 7e9 < sync["required_bits_per_second"] < 9e9
    with pytest.raises(SystemExit) as ex:
        main(["impact", "--params", "7e9", "--rtt", "130ms", "--target-utilization", "90%"])
    assert ex.value.code == 2 and "--compute-ms" in capsys.readouterr().err
