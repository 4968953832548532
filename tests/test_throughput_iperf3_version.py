"""The iperf3 engine reads the installed version and uses what it has (issue 26): --json-stream
from 3.17, CPU figures per thread from 3.16, and says which version ran."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess

from test_throughput_protocol import IPERF3_DOC

from wanprobe.diagnose.throughput_verdict import JUDGE
from wanprobe.throughput.iperf3_engine import (
    iperf3_argv,
    iperf3_version,
    parse_iperf3_json,
    parse_iperf3_version,
    read_json_stream,
)

ARGS = dict(port=5201, duration_s=3, streams=4, reverse=False, bidir=False, cc=None,
            window_bytes=None, dscp=0, pacing_rate_bps=None, udp=False, udp_rate_bps=None,
            interval_s=1.0)


def parse(doc, **kw):
    return parse_iperf3_json(doc, peer="p", port=5201, requested_duration_s=1.0,
                             streams_requested=kw.pop("streams_requested", 1),
                             window_bytes=None, dscp=0, pacing_rate_bps=None,
                             udp_rate_bps=None, **kw, judge=JUDGE)


def test_version_strings_parse():
    assert parse_iperf3_version(b"iperf 3.12 (cJSON 1.7.15)\nLinux vm 6.18") == (3, 12)
    assert parse_iperf3_version(b"iperf 3.16.1 (cJSON 1.7.15)") == (3, 16, 1)
    assert parse_iperf3_version(b"iperf 3.21+ (cJSON 1.7.15)") == (3, 21)
    assert parse_iperf3_version(b"iperf3: unrecognized option") is None


def test_installed_iperf3_version_is_detected_not_assumed():
    binary = shutil.which("iperf3")
    if binary is None:
        assert iperf3_version("/nonexistent/iperf3") is None
        return
    text = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
    version = iperf3_version(binary)
    assert version is not None and ".".join(map(str, version)) in text


def test_json_stream_only_where_the_version_has_it():
    assert "--json-stream" not in iperf3_argv("198.18.0.2", **ARGS, version=(3, 12))
    assert "--json-stream" not in iperf3_argv("198.18.0.2", **ARGS, version=(3, 16, 1))
    assert "--json-stream" not in iperf3_argv("198.18.0.2", **ARGS, version=None)
    argv = iperf3_argv("198.18.0.2", **ARGS, version=(3, 17))
    assert "--json-stream" in argv and "-J" in argv


def test_json_stream_lines_assemble_the_json_document():
    lines = [json.dumps({"event": "start", "data": IPERF3_DOC["start"]}), "not json", "[1]"]
    lines += [json.dumps({"event": "interval", "data": iv}) for iv in IPERF3_DOC["intervals"]]
    lines.append(json.dumps({"event": "end", "data": IPERF3_DOC["end"]}))
    seen = []
    doc = read_json_stream(lines, lambda t, bps: seen.append((t, bps)))
    assert doc == {"start": IPERF3_DOC["start"], "intervals": IPERF3_DOC["intervals"],
                   "end": IPERF3_DOC["end"]}
    assert seen == [(1.0, 88e6)]
    assert parse(doc).bits_per_second == parse(IPERF3_DOC).bits_per_second
    err = read_json_stream([json.dumps({"event": "error", "data": "the server is busy"})])
    assert err["error"] == "the server is busy"


def _two_streams(host_total: float) -> dict:
    doc = copy.deepcopy(IPERF3_DOC)
    doc["end"]["streams"].append(copy.deepcopy(doc["end"]["streams"][0]))
    doc["end"]["cpu_utilization_percent"] = {"host_total": host_total, "remote_total": 20.0}
    return doc


def test_cpu_share_is_per_thread_from_3_16():
    # 120 % of a core over two streams: one thread (3.12) cannot do that and was saturated;
    # two threads (3.16) on two cores used 60 % each
    old = parse(_two_streams(120.0), version=(3, 12), local_cores=2, streams_requested=2)
    new = parse(_two_streams(120.0), version=(3, 16), local_cores=2, streams_requested=2)
    assert old.limited_by.verdict == "host_cpu" and old.limited_by.evidence["side"] == "sender"
    assert new.limited_by.verdict != "host_cpu"
    assert new.cpu["sender_thread_busy_ratio"] == 0.6


def test_result_names_the_version_and_its_ceiling():
    r = parse(_two_streams(50.0), version=(3, 12), streams_requested=2)
    assert r.engine_version == "iperf3 3.12"
    assert any("one thread" in n for n in r.notes)
    r16 = parse(_two_streams(50.0), version=(3, 16, 1), streams_requested=2)
    assert r16.engine_version == "iperf3 3.16.1" and r16.notes == ()
