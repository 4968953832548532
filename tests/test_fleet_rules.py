"""`wanprobe fleet rules` checked by Prometheus's own promtool: the YAML is valid rules, and the
project's rule unit tests (tests/fixtures/fleet/rules_test.yml) pass: each alert fires on its
input series and stays silent on a healthy one."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from conftest import REPO, require_tool

from wanprobe.cli import main
from wanprobe.fleet.rules import ALERT_NAMES, RuleSettings, prom_duration, rule_groups

RULE_TESTS = REPO / "tests" / "fixtures" / "fleet" / "rules_test.yml"


def fleet_rules(capsys, *args: str) -> str:
    with pytest.raises(SystemExit) as ex:
        main(["fleet", "rules", *args])
    out = capsys.readouterr()
    assert ex.value.code == 0, out.err
    return out.out


@pytest.mark.parametrize("args", [(), ("--window", "10s", "--for", "1s", "--eval-interval", "1s",
                                       "--loss-slo", "5%")])
def test_promtool_check_rules_accepts_fleet_rules(capsys, tmp_path, args):
    promtool = require_tool("promtool")
    rules = tmp_path / "rules.yml"
    rules.write_text(fleet_rules(capsys, *args))
    r = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS: 17 rules found" in r.stdout


def _promtool_test(capsys, tmp_path, *args: str) -> subprocess.CompletedProcess:
    promtool = require_tool("promtool")
    shutil.copy(RULE_TESTS, tmp_path / "rules_test.yml")
    (tmp_path / "rules.yml").write_text(fleet_rules(capsys, "--throughput-baseline", "6h", *args))
    return subprocess.run([promtool, "test", "rules", "rules_test.yml"], cwd=tmp_path,
                          capture_output=True, text=True)


def test_promtool_rule_unit_tests_pass(capsys, tmp_path):
    r = _promtool_test(capsys, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


def test_rule_unit_tests_cover_every_alert_and_can_fail(capsys, tmp_path):
    tested = set(re.findall(r"alertname: (\w+)", RULE_TESTS.read_text()))
    assert tested == set(ALERT_NAMES)
    # a 6 % SLO hides the 5 % and 4 % loss steps: the same tests must fail
    r = _promtool_test(capsys, tmp_path, "--loss-slo", "0.06")
    assert r.returncode != 0
    report = r.stdout + r.stderr
    assert "WanprobeLossForwardAboveSLO" in report and "WanprobeLossReverseAboveSLO" in report


def test_every_alert_names_its_site_pair_and_a_runbook_section():
    doc = rule_groups(RuleSettings())
    alerts = [r for g in doc["groups"] for r in g["rules"] if "alert" in r]
    assert {a["alert"] for a in alerts} == set(ALERT_NAMES)
    runbook = (REPO / "docs" / "runbook.md").read_text()
    for a in alerts:
        assert "{{ $labels.src_" in a["annotations"]["summary"], a["alert"]
        assert f"## {a['alert']}" in runbook, f"docs/runbook.md has no section for {a['alert']}"
    # the labels each alert really carries are checked by promtool against exp_labels
    expected = re.findall(r"exp_labels: \{([^}]*)\}", RULE_TESTS.read_text())
    assert len(expected) >= len(ALERT_NAMES)
    for labels in expected:
        assert "src_site: " in labels and "dst_site: " in labels, labels


@pytest.mark.parametrize("seconds,text", [(300, "5m"), (1, "1s"), (1.5, "1500ms"), (3600, "1h"),
                                          (7 * 86400, "7d"), (90, "90s")])
def test_prom_duration(seconds, text):
    assert prom_duration(seconds) == text


def test_bad_rule_options_are_one_line_errors(capsys):
    for args in (["--loss-slo", "150%"], ["--loss-slo", "0"], ["--window", "fast"],
                 ["--for", "-1s"], ["--floor-step", "x"]):
        with pytest.raises(SystemExit) as ex:
            main(["fleet", "rules", *args])
        err = capsys.readouterr().err
        assert ex.value.code == 2 and len(err.strip().splitlines()) == 1, err
        assert "Traceback" not in err
