"""The typed view of a report (``Report.measured``, ``Report.local_host``): every figure the
renderers, the pictures and the scenario checks read comes from the one parser
(diagnose/measured.py), read from the recorded lab report under the keys its writers produce."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from wanprobe.report.document import Report

GOLDEN = Path(__file__).parent / "fixtures" / "golden" / "report_lab.json"


def _doc() -> dict:
    return json.loads(GOLDEN.read_text())


def test_the_typed_view_carries_the_writers_figures() -> None:
    doc = _doc()
    m = Report.from_json(doc).measured
    path = doc["measurements"]["path"]
    assert (m.path.rtt_min_ms, m.path.rtt_p50_ms, m.path.rtt_p99_ms) == tuple(
        path["rtt_ms"][k] for k in ("min", "p50", "p99"))
    assert (m.path.loss_ratio, m.path.loss_forward_ratio, m.path.loss_reverse_ratio) == tuple(
        path["loss"][k] for k in ("ratio", "forward_ratio", "reverse_ratio"))
    assert m.path.capacity_source == path["capacity_source"]
    assert m.path.capacity.bits_per_second == path["capacity_bits_per_second"]
    scan = doc["measurements"]["streams_scan"]
    assert m.streams_scan == tuple((r["streams"], r["per_stream_bits_per_second"]) for r in scan)
    assert m.throughput.bits_per_second == doc["measurements"]["throughput"]["bits_per_second"]
    assert m.errors == (doc["measurements"].get("errors") or {})


def test_a_capacity_not_measured_keeps_its_reason() -> None:
    doc = _doc()
    doc["measurements"]["path"].update(capacity_bits_per_second=None,
                                       capacity_source="not measured: skipped")
    p = Report.from_json(doc).measured.path
    assert p.capacity is None and p.capacity_source == "not measured: skipped"


def test_verify_and_errors_are_typed_and_parsed_once() -> None:
    doc = copy.deepcopy(_doc())
    doc["measurements"]["errors"] = {"capacity": "skipped"}
    doc["measurements"]["verify"] = {
        "bits_per_second": 9.0e7, "bits_per_second_after_omit": 9.5e7, "omit_s": 2.0,
        "verdict": "network", "fixed": True, "path_full": True, "limit": "full", "summary": "s",
        "next_step": "none", "cc": "bbr", "evidence": {}, "capacity_bits_per_second": 1e8,
        "capacity_source": "udp_burst", "share_of_capacity": 0.95, "full_share": 0.9,
        "attempts": []}
    r = Report.from_json(doc)
    assert r.measured is r.measured                     # parsed once per report
    v = r.measured.verify
    assert (v.bits_per_second, v.bits_per_second_after_omit, v.verdict, v.limit, v.next_step) == (
        9.0e7, 9.5e7, "network", "full", "none")
    assert r.measured.errors == {"capacity": "skipped"}


def test_the_local_host_is_typed_from_the_host_dict() -> None:
    doc = _doc()
    host = Report.from_json(doc).local_host
    assert host is not None and host.cc_current == doc["host"]["sysctls"][
        "net.ipv4.tcp_congestion_control"]
