"""The one judgement engine (issue 21): rules registered with the context parts they need, one
loop that runs the rules whose parts a context has, and one error isolation for every domain —
the report, counter health, the daemon's path events and regressions, the after-apply verdict."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import test_diagnose_fabric as fabric
from clirun import invoke
from test_tune_verify import CAP, result

from wanprobe.diagnose import engine, path_findings, regressions, verify_limit
from wanprobe.diagnose.context import COUNTERS, PARTS, REPORT, Context, PathChange, Trend
from wanprobe.diagnose.engine import RULE_ERROR, RULES, first, judge
from wanprobe.diagnose.finding import Finding
from wanprobe.diagnose.inputs import DiagnoseConfig
from wanprobe.diagnose.measured import Measured
from wanprobe.diagnose.path_watch import PathEvent
from wanprobe.diagnose.rule import rule

DIAGNOSE = Path(__file__).resolve().parent.parent / "wanprobe" / "diagnose"


def found(fid: str) -> Finding:
    return Finding(fid, "info", fid, {}, "", "")


def test_rule_tags_its_id_and_parts_and_refuses_unknown_or_only_optional_parts():
    @rule("x.counted", needs=COUNTERS)
    def counted(snap, rates, window_s):
        return None

    assert (counted.rule_id, counted.needs) == ("x.counted", COUNTERS)
    assert rule("x.report")(lambda m, h, c: None).needs == REPORT  # the report's by default
    with pytest.raises(ValueError, match="unknown parts"):
        rule("x.bad", needs=("counters",))
    with pytest.raises(ValueError, match="optional"):
        rule("x.bad", needs=("host", "rates"))
    assert set(COUNTERS) | set(REPORT) | {"path_event", "trend", "verify",
                                          "throughput"} == set(PARTS)


def _decorated(path: Path) -> set[str]:
    """Names of the functions decorated ``@rule(...)`` in one module."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef) and any(
                isinstance(d, ast.Call) and getattr(d.func, "id", "") == "rule"
                for d in node.decorator_list):
            out.add(node.name)
    return out


def test_every_decorated_rule_is_registered_once_with_a_unique_id():
    registered = {(fn.__module__.rsplit(".", 1)[1], fn.__name__) for fn in RULES}
    decorated = {(p.stem, name) for p in DIAGNOSE.glob("*.py") for name in _decorated(p)}
    assert decorated and decorated == registered
    ids = [fn.rule_id for fn in RULES]
    assert len(ids) == len(set(ids)) == len(RULES)
    assert {p for fn in RULES for p in fn.needs} <= set(PARTS)


def test_a_rule_runs_only_where_its_parts_are():
    calls = []

    @rule("t.report")
    def on_report(m, host, config):
        calls.append(("report", host))

    @rule("t.counters", needs=COUNTERS)
    def on_counters(snap, rates, window_s):
        calls.append(("counters", rates, window_s))

    @rule("t.trend", needs=("trend",))
    def on_trend(t):
        calls.append(("trend", t.peer))

    rules = (on_report, on_counters, on_trend)
    assert judge(Context(), rules) == [] and calls == []
    judge(Context(measured=Measured(legacy=True), config=DiagnoseConfig()), rules)
    assert calls == [("report", None)]  # a report without a host is still judged
    calls.clear()
    judge(Context.of_counters(object()), rules)  # one snapshot: no rates, a window of 0
    assert calls == [("counters", None, 0.0)]
    calls.clear()
    judge(Context(trend=Trend("tokyo", "198.18.2.1", {})), rules)
    assert calls == [("trend", "tokyo")]


def test_only_the_domain_of_the_context_answers_from_the_registry():
    ev = PathEvent("tokyo", "rerouted", 40.0, 95.0, 0.2, 0.3, 4.0, 2.0, 5)
    out = judge(Context(path_event=PathChange("tokyo", "198.18.2.1", ev)))
    assert [f.id for f in out] == ["path.rerouted"]
    out = judge(Context(trend=Trend("tokyo", "198.18.2.1", {
        "metric": "loss", "baseline": 0.0, "current": 0.02, "threshold": 0.005,
        "unit": "ratio", "evidence": {}})))
    assert [(f.id, f.severity) for f in out] == [("path.loss_regression", "critical")]


def test_first_match_stops_at_the_first_answer_and_keeps_the_errors_before_it():
    @rule("t.silent", needs=("trend",))
    def silent(t):
        return None

    @rule("t.broken", needs=("trend",))
    def broken(t):
        raise KeyError("boom")

    @rule("t.answers", needs=("trend",))
    def answers(t):
        return found("t.answers")

    @rule("t.later", needs=("trend",))
    def later(t):
        return [found("t.later")]

    ctx = Context(trend=Trend("p", "a", {}))
    rules = (silent, broken, answers, later)
    assert [f.id for f in judge(ctx, rules)] == [RULE_ERROR, "t.answers", "t.later"]
    assert [f.id for f in judge(ctx, rules, first=True)] == [RULE_ERROR, "t.answers"]
    assert first(ctx, (silent, answers, broken)).id == "t.answers"
    assert first(ctx, (broken, answers)).id == "t.answers"  # an error does not hide the answer
    assert first(ctx, (silent,)) is None
    err = first(ctx, (broken,))
    assert err.evidence == {"rule": "t.broken", "error": "KeyError: 'boom'"}


def _raise(*args, **kwargs):
    raise RuntimeError("injected")


def test_a_raising_counter_rule_is_a_finding_not_a_crash_of_wanprobe_counters(
        tmp_path, monkeypatch):
    """``wanprobe counters`` (and the daemon's sampler, the same service) used to stop on the
    first counter rule that raised; now that rule is an ``engine.rule_error`` finding and the
    other rules still answer."""
    from wanprobe.diagnose import rules_nic

    h = fabric.Host(tmp_path, mtu=1500, ecn={3: (0, 1)}, ethtool=fabric.PFC3)
    monkeypatch.setattr(rules_nic, "growing", _raise)  # every NIC/link counter rule raises
    r = invoke("counters", "--json", "--sys-root", h.sys, "--proc-root", h.proc,
               "--ethtool-root", h.eth)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)["findings"]
    errors = sorted(f["evidence"]["rule"] for f in out if f["id"] == RULE_ERROR)
    assert errors == ["link.downed", "link.phy_errors", "nic.discards", "nic.rx_out_of_buffer"]
    assert {"roce.active_mtu_low", "roce.ecn_disabled"} <= {f["id"] for f in out}


def _daemon(tmp_path):
    from wanprobe.daemon.config import parse_config
    from wanprobe.daemon.main import Daemon

    class Store:
        def __init__(self):
            self.rows = []

        def add_finding(self, ts, finding, peer=None, report_path=None):
            self.rows.append(finding)

    cfg = parse_config({"daemon": {"state_dir": str(tmp_path)}, "probe": {}, "counters": {},
                        "peers": [{"name": "tokyo", "address": "198.18.2.1"}]})
    d = Daemon(cfg, cfg.peers, prober=lambda *a, **k: None, reflector=object(),
               counters=object())
    d.store = Store()
    return d, cfg.peers[0]


def test_a_raising_path_or_regression_rule_is_filed_not_raised_by_the_daemon(
        tmp_path, monkeypatch):
    from wanprobe.daemon.baseline import Transition

    d, peer = _daemon(tmp_path)
    monkeypatch.setattr(path_findings, "step_impact", _raise)
    monkeypatch.setattr(regressions, "_fmt", _raise)
    d._path_event(peer, PathEvent("tokyo", "rerouted", 40.0, 95.0, 0.2, 0.3, 4.0, 2.0, 5))
    d._transition(peer, Transition("tokyo", "rtt_p50", "degraded", 40.0, 95.0, 10.0, "ms"))
    assert [(f["id"], f["evidence"]["rule"]) for f in d.store.rows] == [
        (RULE_ERROR, "path.rerouted"), (RULE_ERROR, "path.regression")]
    reports = sorted((tmp_path / "reports").glob("*.json"))
    assert len(reports) == 2
    assert all(json.loads(p.read_text())["findings"][0]["id"] == RULE_ERROR for p in reports)


def test_a_raising_verdict_rule_is_passed_over_and_named_in_the_evidence(monkeypatch):
    from wanprobe.diagnose.verify import judge as verify_judge

    r = result([30, 65, 66, 64], verdict="receive_window",
               evidence={"rwnd_limited_share": 0.6})
    assert verify_judge(r, 1.0, capacity_bps=CAP).limit == "window"
    # the window rule breaks (its body swapped for one that raises; the engine holds the function
    # itself): the next rule in the table answers, and the error is said
    assert verify_limit.RULES[2] is verify_limit.host_or_window
    monkeypatch.setattr(verify_limit.host_or_window, "__code__", _raise.__code__)
    v = verify_judge(r, 1.0, capacity_bps=CAP)
    assert v.limit == "unexplained" and v.to_json()["evidence"]["rule_errors"] == [
        {"rule": "verify.host_or_window", "error": "RuntimeError: injected"}]
    # every rule below the capacity breaks: unknown, not a traceback
    monkeypatch.setattr(verify_limit, "_base", _raise)
    v = verify_judge(r, 1.0, capacity_bps=CAP)
    assert v.limit == "unknown" and not v.path_full and v.summary
    assert len(v.evidence["rule_errors"]) == len(verify_limit.RULES) - 2  # not unknown, full


def test_the_verdict_table_is_the_documented_order():
    names = [fn.rule_id for fn in verify_limit.RULES]
    assert names == ["verify.unknown", "verify.full", "verify.host_or_window", "verify.cwnd",
                     "verify.cpu_steal", "verify.duration", "verify.cross_traffic", "verify.loss",
                     "verify.sender_process", "verify.cc_rate", "verify.unexplained"]
    assert set(engine.RULES[-len(names):]) == set(verify_limit.RULES)
