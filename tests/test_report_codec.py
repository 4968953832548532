"""The report codec (issue 38): a report's measurements and host are read in one place,
``wanprobe/report`` (``codec.py``: ``measured_of``, ``host_of``, ``parts_of``), and every other
module takes the typed view. An AST scan holds the packages to it, and a planted example shows
the scan sees each way of reading a report by key; the codec's own readings are checked on whole,
partial and older reports."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from wanprobe.diagnose.measured import AttemptMeasured, IntervalView, Measured, ThroughputMeasured
from wanprobe.report.codec import capacity_method, host_of, measured_of, parts_of

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("wanprobe", "collectors", "tuners")
CODEC_HOME = REPO / "wanprobe" / "report"
REPORT_KEYS = ("measurements",)
REPORT_NAMED_KEYS = ("host",)  # read by key only on something named a report
# Modules that still read a report's measurements by key, each with what replaces it. The scan
# fails on any other, and on an entry that no longer reads by key (remove it then).
PENDING: dict[str, str] = {}


def _key(node: ast.expr) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _name(node: ast.expr) -> str:
    """The identifier a value is read from: ``report`` of ``report``, ``self.report``."""
    if isinstance(node, ast.Name):
        return node.id
    return node.attr if isinstance(node, ast.Attribute) else ""


def _keyed(node: ast.AST) -> tuple[ast.expr, str | None] | None:
    """(the receiver, the key) of ``x.get(key, ...)`` or ``x[key]``; None for anything else."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and node.func.attr == "get" and node.args:
        return node.func.value, _key(node.args[0])
    if isinstance(node, ast.Subscript):
        return node.value, _key(node.slice)
    return None


def report_key_reads(source: str) -> list[str]:
    """Where ``source`` reads a report's measurements (or its host) by key, or calls a
    ``from_report`` parser of a report's parts: ``x.get("measurements")``,
    ``x["measurements"]``, ``report.measurements.get(...)`` / ``[...]``, ``report.get("host")``,
    ``Measured.from_report(...)``. One ``line: what`` per reading."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "from_report":
            found.append(f"{node.lineno}: {_name(node.func.value)}.from_report")
            continue
        keyed = _keyed(node)
        if keyed is None:
            continue
        receiver, key = keyed
        if key in REPORT_KEYS:
            found.append(f"{node.lineno}: [{key!r}]")
        elif isinstance(receiver, ast.Attribute) and receiver.attr == "measurements":
            found.append(f"{node.lineno}: .measurements[{key!r}]")
        elif key in REPORT_NAMED_KEYS and "report" in _name(receiver).lower():
            found.append(f"{node.lineno}: {_name(receiver)}[{key!r}]")
    return sorted(set(found), key=lambda s: (int(s.split(":")[0]), s))


def test_the_scan_sees_each_way_of_reading_a_report_by_key():
    planted = '''
def a(report): return report.get("measurements", {}).get("path")
def b(doc): return doc["measurements"]["throughput"]
def c(r): return r.measurements.get("errors") or r.measurements["path"]
def d(report): return (report.get("host") or {}).get("address")
def e(doc): return Measured.from_report(doc)
def f(knob): return knob.get("host"), knob["host"]     # a knob's host: not a report's
def g(report): return report.measured.path, report.local_host  # the typed view
'''
    assert report_key_reads(planted) == [
        "2: ['measurements']", "3: ['measurements']", "4: .measurements['errors']",
        "4: .measurements['path']", "5: report['host']", "6: Measured.from_report"]


def test_no_module_outside_the_report_package_reads_a_report_by_key():
    found, pending_clean = {}, []
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            if CODEC_HOME in path.parents:
                continue
            rel = str(path.relative_to(REPO))
            reads = report_key_reads(path.read_text())
            if reads and rel not in PENDING:
                found[rel] = reads
            elif not reads and rel in PENDING:
                pending_clean.append(rel)
    assert found == {}, "read a report through wanprobe/report/codec.py (parts_of, measured_of)"
    assert pending_clean == [], "no longer reads by key: remove from PENDING"


def test_partial_older_and_malformed_parts_are_read_as_absent():
    assert measured_of(None) == Measured(legacy=True)
    assert measured_of({"path": "x", "throughput": [], "peer_facts": None}) == Measured()
    m, h = parts_of({"measurements": {"throughput": {"bits_per_second": 5e8, "cc": "bbr"}},
                     "host": {"sysctls": {"net.ipv4.tcp_rmem": "4096 131072 6291456"},
                              "address": "198.18.0.1"}})
    assert m.throughput is not None and m.throughput.bits_per_second == 5e8
    assert m.throughput.cc == "bbr" and m.throughput.verdict is None and m.legacy
    assert h is not None and h.tcp_rmem_bytes == (4096, 131072, 6291456)
    assert h.address == "198.18.0.1"
    assert parts_of("not a report") == (Measured(legacy=True), None)
    assert host_of({}) is None


def test_a_whole_throughput_section_is_viewed_through_its_producer_type():
    from wanprobe.throughput.result import ThroughputResult
    from wanprobe.throughput.verdict import Verdict

    result = ThroughputResult(
        peer="p", port=1, engine="wanprobe", protocol="tcp", mode="forward", cc="cubic",
        requested_duration_s=6.0, duration_s=6.0, streams_requested=1, window_bytes=None,
        dscp=0, pacing_rate_bps=None, bits_per_second=9e8, sender_bits_per_second=9e8,
        bytes_received=1, bytes_sent=1, retransmits=0, min_rtt_ms=30.0, bdp_bytes=None,
        single_stream_buffer_bytes=None,
        limited_by=Verdict("receive_window", {"rwnd_limited_share": 0.7}), omit_s=2.0)
    doc = result.to_json()
    view = measured_of({"throughput": doc}).throughput
    assert view == ThroughputMeasured.of(result)
    assert view is not None and view.rwnd_limited_share == 0.7 and view.omit_s == 2.0
    assert view.requested_duration_s == 6.0 and view.verdict == "receive_window"


@pytest.mark.parametrize(("source", "method"), [
    ("udp_burst", "udp_burst"), ("udp_burst_receiver_limited", "udp_burst"),
    ("operator (--link-rate)", "operator"), ("operator", "operator"),
    ("tcp_goodput", "tcp_goodput"), ("not measured: refused", None), (None, None)])
def test_the_capacity_source_is_typed_once(source, method):
    assert capacity_method(source) == method
    path = measured_of({"path": {"method": "stamp", "capacity_bits_per_second": 1e9,
                                 "capacity_source": source}}).path
    assert path is not None and path.capacity_method == method


def test_samples_intervals_and_attempts_are_typed_with_malformed_values_left_out():
    rows = [{"id": 0, "bits_per_second": 1e8}, {"id": 1, "bits_per_second": True}, "x",
            {"id": 2, "bits_per_second": float("inf")}]
    m = measured_of({
        "path": {"method": "stamp", "rtt_samples_ms": [1.0, True, "x", float("nan"), 2],
                 "rtt_ms": {"min": 1.0, "p90": 1.5, "max": 2.0}},
        "throughput": {"bits_per_second": 5e8, "intervals": [
            {"end_s": 1.0, "bits_per_second": 1e8, "streams": rows},
            {"end_s": None, "streams": rows}, "x",
            {"end_s": 1.2, "bits_per_second": None, "partial": True, "streams": []}]},
        "verify": {"bits_per_second": 9e8, "attempts": [
            {"duration_s": 6.0, "omit_s": 2.0, "bits_per_second": 8e8,
             "bits_per_second_after_omit": None}, 3]}})
    assert m.path is not None and m.path.rtt_samples_ms == (1.0, 2.0)
    assert (m.path.rtt_p90_ms, m.path.rtt_max_ms) == (1.5, 2.0)
    assert m.throughput is not None and m.throughput.intervals == (
        IntervalView(1.0, 1e8, streams=((0, 1e8),)), IntervalView(1.2, None, partial=True))
    assert m.verify is not None and m.verify.attempts == (AttemptMeasured(6.0, 2.0, 8e8),)


def test_the_intervals_of_a_whole_section_come_from_its_producer_type():
    from wanprobe.throughput.result import IntervalResult, ThroughputResult
    from wanprobe.throughput.verdict import Verdict

    ivs = (IntervalResult(0.0, 1.0, 1, 1, 8e8, 0, ({"id": 3, "bits_per_second": 8e8},)),
           IntervalResult(1.0, 1.1, 1, 1, None, 0, ({"id": 3, "bits_per_second": None},),
                          partial=True))
    result = ThroughputResult(
        peer="p", port=1, engine="wanprobe", protocol="tcp", mode="forward", cc="cubic",
        requested_duration_s=1.0, duration_s=1.1, streams_requested=1, window_bytes=None,
        dscp=0, pacing_rate_bps=None, bits_per_second=8e8, sender_bits_per_second=8e8,
        bytes_received=1, bytes_sent=1, retransmits=0, min_rtt_ms=30.0, bdp_bytes=None,
        single_stream_buffer_bytes=None, limited_by=Verdict("network", {}), intervals=ivs)
    view = measured_of({"throughput": result.to_json()}).throughput
    assert view is not None and view.intervals == (
        IntervalView(1.0, 8e8, streams=((3, 8e8),)), IntervalView(1.1, None, partial=True))
