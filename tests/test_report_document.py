"""The report document: round-trips through JSON, validates against the shipped schema, refuses
bad files with one line, renders as Markdown, and is listed by ``store``."""

from __future__ import annotations

import json

import jsonschema
import pytest

from wanprobe.diagnose.engine import run_rules
from wanprobe.diagnose.inputs import DiagnoseConfig
from wanprobe.errors import ConfigError
from wanprobe.report import document
from wanprobe.report.codec import host_of, measured_of
from wanprobe.report.document import Finding, Knob, Report, load, save, schema
from wanprobe.report.render_md import render_markdown
from wanprobe.report.store import list_reports


def make_report(rid="r1", created="2026-12-02T10:00:00.000Z") -> Report:
    """A report whose findings come from the real engine on a window-limited measurement."""
    host = {"hostname": "h1", "machine_id": "abc", "kernel": "6.18.0", "netns_inode": 4026531833,
            "sysctls": {"net.ipv4.tcp_rmem": "4096 131072 6291456",
                        "net.ipv4.tcp_wmem": "4096 16384 4194304",
                        "net.ipv4.tcp_congestion_control": "reno"},
            "available_cc": ["reno", "bbr", "cubic"], "allowed_cc": ["reno", "bbr"],
            "fq_available": None, "ifaces": {"wan0": {"mtu": 1500, "txqueuelen": 1000,
                                                      "qdisc": "pfifo_fast", "speed_mbps": None}}}
    path = {"method": "stamp", "rtt_ms": {"min": 130.0, "p50": 130.2, "p90": 130.3, "p99": 131.0,
                                          "max": 133.0, "mean": 130.2, "stdev": 0.2},
            "loss": {"sent": 200, "received": 200, "ratio": 0.0}, "dscp": {"sent": 26,
                                                                            "at_reflector": 26,
                                                                            "returned": 26}}
    tput = {"bits_per_second": 190e6, "cc": "reno", "min_rtt_ms": 130.0,
            "limited_by": {"verdict": "receive_window", "evidence": {"rwnd_limited_share": 0.93}},
            "streams": []}
    meas = {"path": path, "mtu": None, "throughput": tput, "counters": None,
            "errors": {"mtu": "no reply"}}
    findings = run_rules(measured_of(meas), host_of(host), DiagnoseConfig(link_rate_bps=10e9))
    return Report(id=rid, created_at=created, tool={"name": "wanprobe", "version": "0.1.0"},
                  host=host, peer={"address": "198.18.0.2", "port": 862}, measurements=meas,
                  findings=tuple(findings), timestamps={"started": created, "finished": created})


def test_schema_is_valid_json_schema():
    jsonschema.Draft202012Validator.check_schema(schema())


def test_report_round_trips_and_validates():
    r = make_report()
    doc = json.loads(json.dumps(r.to_json()))
    jsonschema.Draft202012Validator(schema()).validate(doc)
    back = Report.from_json(doc)
    assert back.to_json() == r.to_json()
    assert back.top.id == "path.window_limited"
    assert back.schema_version == document.SCHEMA_VERSION


def test_contract_keys_for_tuners():
    doc = make_report().to_json()
    assert {"schema_version", "id", "created_at", "tool", "host", "peer", "measurements",
            "findings", "plan", "timestamps"} <= set(doc)
    f = doc["findings"][0]
    assert {"id", "severity", "title", "evidence", "recommendation", "expected_effect",
            "knobs"} <= set(f)
    assert {"tuner", "key", "value", "reason"} <= set(f["knobs"][0])
    assert f["knobs"][0]["tuner"] == "sysctl" and f["knobs"][0]["key"].startswith("net.ipv4.")


@pytest.mark.parametrize("mutate,where", [
    (lambda d: d.pop("findings"), "findings"),
    (lambda d: d["findings"][0].update(severity="fatal"), "findings/0/severity"),
    (lambda d: d["findings"][0]["knobs"][0].update(tuner="bash"), "findings/0/knobs/0/tuner"),
    (lambda d: d.update(schema_version="2.0"), "schema_version"),
    (lambda d: d["peer"].update(port=70000), "peer/port"),
])
def test_invalid_documents_are_refused_with_one_line(mutate, where):
    doc = make_report().to_json()
    mutate(doc)
    with pytest.raises(ConfigError) as err:
        Report.from_json(doc)
    msg = str(err.value)
    assert "\n" not in msg and "not a valid wanprobe report" in msg
    assert where.split("/")[0] in msg or "required" in msg


def test_load_errors_are_one_line(tmp_path):
    cases = {"missing.json": None, "garbage.json": "{not json", "array.json": "[1, 2]",
             "binary.json": b"\xff\xfe\x00"}
    for name, content in cases.items():
        p = tmp_path / name
        if isinstance(content, bytes):
            p.write_bytes(content)
        elif content is not None:
            p.write_text(content)
        with pytest.raises(ConfigError) as err:
            load(p)
        assert "\n" not in str(err.value) and name in str(err.value)
    with pytest.raises(ConfigError, match="is a directory"):
        load(tmp_path)


def test_save_is_atomic_and_loadable(tmp_path):
    out = save(make_report(), tmp_path / "r.json")
    assert load(out).to_json() == make_report().to_json()
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temp file left behind


def test_finding_rejects_unknown_severity_and_clamps_impact():
    with pytest.raises(ValueError):
        Finding("a.b", "fatal", "t", {}, "", "")
    assert Finding("a.b", "info", "t", {}, "", "", (), 1.7).impact == 1.0
    assert Knob("sysctl", "k", "v", "r").to_json() == {"tuner": "sysctl", "key": "k",
                                                       "value": "v", "reason": "r"}


def test_markdown_has_findings_evidence_and_knobs():
    md = render_markdown(make_report())
    assert md.startswith("# Network path report: h1 → 198.18.0.2")
    assert "| loss, round trip | 0.000% (0 of 200; 95 % interval 0.000%–1.885%) |" in md
    assert "None" not in md and "path.window_limited" not in md  # no internal ids
    assert "[CRITICAL] Throughput is limited by the TCP receive window" in md
    assert "| rwnd_limited_share | 93.000% |" in md   # values formatted by their unit suffix
    assert "| rtt_ms | 130 | probe (stamp) rtt_ms.min |" in md
    assert "| peer | `net.ipv4.tcp_rmem` |" in md  # each knob once, with the host it is for
    assert "`net.ipv4.tcp_rmem`" in md and "not measured: **mtu**" in md
    assert "190.0 Mbit/s" in md


def test_store_lists_reports_newest_first(tmp_path):
    save(make_report("old", "2026-12-01T00:00:00.000Z"), tmp_path / "a.json")
    save(make_report("new", "2026-12-02T00:00:00.000Z"), tmp_path / "b.json")
    (tmp_path / "plan.json").write_text('{"plan_version": 1}')          # not a report: skipped
    (tmp_path / "broken.json").write_text('{"schema_version": "1.0"}')  # a broken report: listed
    entries = list_reports(tmp_path)
    assert [e.id for e in entries if not e.error] == ["new", "old"]
    assert entries[0].top_finding == "critical: path.window_limited"
    broken = [e for e in entries if e.error]
    assert len(broken) == 1 and broken[0].path.endswith("broken.json")
    with pytest.raises(ConfigError):
        list_reports(tmp_path / "nope")


def test_rich_render_prints_hostile_strings_literally():
    """Text from a report file is data, never rich markup."""
    from rich.console import Console

    from wanprobe.report.render_rich import render_rich

    r = make_report()
    odd = Finding("path.odd", "warning", "[/bold] title [red]", {"k": "[/x]"}, "[/z] rec", "[/w]",
                  (Knob("sysctl", "[/a]", "[/b]", "[/c]"),))
    r2 = Report(r.id, r.created_at, r.tool, r.host, r.peer, r.measurements, (odd,), r.timestamps)
    console = Console(record=True, width=120)
    render_rich(r2, console)
    text = console.export_text()
    assert all(s in text for s in ("[/bold] title [red]", "[/x]", "[/z] rec", "[/a]", "[/c]"))
