"""`wanprobe diagnose` bad input: one-line errors, non-zero exit, no traceback; and a diagnose
against loopback with no reflector still produces a valid report marking what was not measured."""

from __future__ import annotations

import json

import pytest
from clirun import invoke

from wanprobe.report.document import Report
from wanprobe.services.diagnose import DiagnoseOptions, diagnose, parse_route_get


def run(*args):
    """`wanprobe diagnose ARGS` in process (CliRunner: the console script's code path)."""
    return invoke("diagnose", *args)


@pytest.mark.parametrize("args,needle", [
    (["127.0.0.1", "--quick", "--full"], "exclude each other"),
    (["127.0.0.1", "--port", "70000"], "out of range"),
    (["127.0.0.1", "--dscp", "AF99"], "DSCP"),
    (["127.0.0.1", "--dscp", "49"], "network-control DSCP"),  # issue 37: 48-63 never sent
    (["127.0.0.1", "--link-rate", "fast"], "rate"),
    (["no-such-host.invalid"], "cannot resolve"),
    (["127.0.0.1", "--netns", "no-such-ns-wanprobe"], "no network namespace"),
    (["127.0.0.1", "--loss-slo", "0"], "loss-slo"),
    (["127.0.0.1", "--loss-slo", "80%"], "loss-slo"),
    (["127.0.0.1", "--loss-slo", "lots"], "ratio"),
    (["127.0.0.1", "--loss-slo", "abc"], "--loss-slo: cannot parse ratio 'abc'"),  # issue 37
])
def test_bad_input_is_one_line_error(args, needle):
    r = run(*args)
    assert r.returncode != 0
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert needle.lower() in lines[0].lower()


@pytest.mark.slow
def test_peer_without_reflector_is_not_measured_not_a_crash(tmp_path):
    """Nothing listens on this port: path, mtu and throughput are marked not measured, the host
    rules still run, and the document is valid."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound by us and never answered
        report = diagnose(DiagnoseOptions(peer="127.0.0.1", port=port, counters=False))
    doc = json.loads(json.dumps(report.to_json()))
    Report.from_json(doc)  # validates against the schema
    errors = doc["measurements"]["errors"]
    assert set(errors) >= {"path", "mtu", "throughput"}
    assert doc["measurements"]["path"] is None and doc["measurements"]["throughput"] is None
    assert all(not f["id"].startswith("path.") for f in doc["findings"])
    assert all(f["id"] != "engine.rule_error" for f in doc["findings"])


@pytest.mark.slow
def test_a_silent_peer_writes_its_report_and_exits_5(tmp_path):
    """README exit codes: 5 is "peer unreachable" — the report is written first, saying what
    was not measured and why."""
    import socket

    out = tmp_path / "r.json"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))  # bound by us and never answered
        r = run("127.0.0.1", "--port", str(s.getsockname()[1]), "--no-throughput", "-o", str(out),
                "--json")
    assert r.returncode == 5, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "no STAMP reply" in lines[0] and "--hmac-key-file" in lines[0]
    doc = json.loads(out.read_text())
    assert doc["measurements"]["path"] is None and "path" in doc["measurements"]["errors"]


def test_parse_route_get():
    cached = ('[{"dst":"198.18.0.2","dev":"wp0","prefsrc":"198.18.0.1","flags":[],'
              '"metrics":[{"mtu":1380}],"cache":["expires 597sec"],"uid":0}]')
    assert parse_route_get(cached) == {"iface": "wp0", "route_mtu": 1380}
    plain = '[{"dst":"198.18.0.2","dev":"wp0","prefsrc":"198.18.0.1","flags":[],"uid":0,"cache":[]}]'
    assert parse_route_get(plain) == {"iface": "wp0", "route_mtu": None}
    assert parse_route_get("garbage") == {}
