"""Unit tests for the multi-path pieces (issue 16): significance tests against hand-computed
values, path grouping with unknown hops, and the paths summary."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from wanprobe.probe.path_groups import FlowSample, group_paths, summarize
from wanprobe.probe.result import LossStats
from wanprobe.probe.significance import chi2_independence, chi2_sf, gamma_q, kruskal_wallis


@pytest.mark.parametrize("x", [0.1, 1.0, 5.991464547107979, 20.0, 80.0])
def test_chi2_sf_two_df_is_exponential(x):
    # chi-square with 2 df is exponential with mean 2: sf(x) = exp(-x/2)
    assert chi2_sf(x, 2) == pytest.approx(math.exp(-x / 2), rel=1e-9)


@pytest.mark.parametrize("x", [0.01, 0.5, 3.841458820694124, 12.5, 40.0])
def test_chi2_sf_one_df_is_erfc(x):
    assert chi2_sf(x, 1) == pytest.approx(math.erfc(math.sqrt(x / 2)), rel=1e-9, abs=1e-15)


def test_gamma_q_integer_a_closed_form():
    # Q(3, x) = exp(-x) (1 + x + x²/2)
    for x in (0.3, 2.0, 4.5, 9.0):
        assert gamma_q(3, x) == pytest.approx(math.exp(-x) * (1 + x + x * x / 2), rel=1e-9)


def test_chi2_independence_hand_computed():
    # expected 20/80 per row: (10-20)²/20 + (90-80)²/80 + (30-20)²/20 + (70-80)²/80 = 12.5
    r = chi2_independence([[10, 90], [30, 70]])
    assert r.statistic == pytest.approx(12.5)
    assert r.df == 1
    assert r.p_value == pytest.approx(math.erfc(math.sqrt(12.5 / 2)))


def test_chi2_independence_without_loss_is_no_evidence():
    r = chi2_independence([[0, 100], [0, 50], [0, 80]])
    assert (r.statistic, r.p_value) == (0.0, 1.0)


def test_kruskal_wallis_hand_computed():
    # ranks 1..6: sums 6 and 15; H = 12/42 (36/3 + 225/3) - 21 = 3.857142...
    r = kruskal_wallis([[1, 2, 3], [4, 5, 6]])
    assert r.statistic == pytest.approx(12 / 42 * 87 - 21)
    assert r.p_value == pytest.approx(math.erfc(math.sqrt(r.statistic / 2)))


def test_kruskal_wallis_tie_correction():
    # mid-ranks 1.5 1.5 3.5 | 3.5 5.5 5.5; H = 3.047619 / (1 - 18/210) = 3.333...
    r = kruskal_wallis([[1, 1, 2], [2, 3, 3]])
    assert r.statistic == pytest.approx(10 / 3)
    assert kruskal_wallis([[5, 5], [5, 5, 5]]).p_value == 1.0


def test_group_paths_unknown_hop_joins_matching_path():
    a = ("r1", "x", "dst")
    b = ("r1", "y", "dst")
    gap = ("r1", None, "dst")
    assert group_paths([a, b, gap, a]) == [0, 1, 0, 0] or group_paths([a, b, gap, a]) == [0, 1, 1, 0]
    # a gap never creates a path of its own when a known one agrees
    assert len(set(group_paths([a, gap, b]))) == 2
    assert group_paths([("r1", None), ("r2", None)]) == [0, 1]


def _flow(port, hops, lost, sent=100, rtt=40.0):
    loss = LossStats(sent, sent - lost, (0.0, 0.0), forward_lost=lost, forward_of=sent,
                     reverse_lost=0, reverse_of=sent - lost)
    return FlowSample(port, hops, loss, tuple(rtt + 0.01 * (i % 7) for i in range(sent - lost)))


def test_summary_finds_the_lossy_path():
    good, bad = ("r1", "p0", "dst"), ("r1", "p1", "dst")
    flows = [_flow(1, good, 0), _flow(2, bad, 9), _flow(3, good, 0), _flow(4, bad, 11)]
    index, s = summarize(flows)
    assert s["distinct_paths"] == 2 and s["flows_per_path"] == [2, 2]
    assert index == [0, 1, 0, 1]
    assert s["worst_path"] == 1 and s["paths"][1]["forward_ratio"] == pytest.approx(0.1)
    assert s["differ_loss"] and s["loss_test"]["p_value"] < 1e-4
    assert not s["differ_rtt"]   # same RTT distribution
    assert s["paths"][1]["flow_share"] == 0.5


def test_summary_rtt_difference_must_be_material():
    a, b = ("r1", "p0", "dst"), ("r1", "p1", "dst")
    tiny = summarize([_flow(1, a, 0, rtt=40.0), _flow(2, b, 0, rtt=40.05)])[1]
    assert tiny["rtt_test"]["p_value"] < 0.01 and not tiny["differ_rtt"]
    big = summarize([_flow(1, a, 0, rtt=40.0), _flow(2, b, 0, rtt=95.0)])[1]
    assert big["differ_rtt"] and big["worst_path"] == 1


@pytest.mark.parametrize("args,message", [
    (["--flows", "0"], "--flows must be 1-256"),
    (["--count", "0"], "--count must be >= 1"),
    (["--interval", "soon"], "--interval"),
    (["--max-ttl", "99"], "--max-ttl must be 1-64"),
])
def test_paths_cli_bad_input_is_one_line(args, message):
    r = subprocess.run([sys.executable, "-m", "wanprobe", "paths", "198.18.2.1", *args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_ecmp_imbalance_finding_names_path_share_and_hop():
    from wanprobe.diagnose.engine import run_rules
    from wanprobe.diagnose.inputs import DiagnoseConfig
    from wanprobe.diagnose.rules_ecmp import NCCL_SOCKETS, ecmp_imbalance
    from wanprobe.report.codec import measured_of

    good, bad = ("r1", "p0", "dst"), ("r1", "p1", "dst")
    flows = [_flow(1, good, 0), _flow(2, bad, 9), _flow(3, good, 0), _flow(4, good, 0)]
    _, summary = summarize(flows)

    def judge(m: dict):
        return ecmp_imbalance(measured_of(m), None, DiagnoseConfig())

    f = judge({"paths": {"summary": summary}})
    assert f is not None and f.id == "path.ecmp_imbalance"
    ev = f.evidence
    assert ev["worst_path"] == 1 and ev["nccl_socket_share_on_worst"] == 0.25
    assert ev["nccl_any_socket_on_worst_probability"] == pytest.approx(1 - 0.75 ** NCCL_SOCKETS)
    assert ev["distinct_hop"] == {"ttl": 2, "address": "p1"}
    assert "25 %" in f.recommendation and "p1 at TTL 2" in f.recommendation
    # registered with diagnose's rules
    assert "path.ecmp_imbalance" in {x.id for x in run_rules(
        measured_of({"paths": {"summary": summary}}), None, DiagnoseConfig())}
    # same paths: nothing to report
    _, same = summarize([_flow(1, good, 0), _flow(2, bad, 0)])
    assert judge({"paths": {"summary": same}}) is None
    assert judge({"path": None}) is None


def test_paths_cli_src_ports_parsing():
    from wanprobe.commands.paths import _ports
    from wanprobe.errors import UsageError

    assert _ports("40000-40003") == [40000, 40001, 40002, 40003]
    assert _ports("5,7") == [5, 7]
    for bad in ("x-y", "0-3", "1-70000", "40000-"):
        with pytest.raises(UsageError, match="--src-ports"):
            _ports(bad)
