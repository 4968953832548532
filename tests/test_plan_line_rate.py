"""Tuning at high bandwidth-delay products (issue 35): buffers from the measured capacity, and
when one stream cannot fill the path the plan says how many streams and the NCCL socket
settings; a host's rmem_max/wmem_max are raised with the buffers they would cap.

The reports are the recorded lab report (tests/fixtures/golden/report_lab.json, a real
``diagnose --full``) moved to a 130 ms path whose capacity was measured at 5 Gbit/s, its hosts'
TCP memory as an init namespace shows it (a lab namespace hides tcp_mem: there one stream with a
274 MiB buffer carried 0.92 × the oracle at 5 Gbit/s, bench/tune_vs_oracle.py).
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

from tuners.from_report import build_plan
from wanprobe.diagnose.engine import run_rules
from wanprobe.diagnose.inputs import DiagnoseConfig
from wanprobe.models.collectives import split_sockets
from wanprobe.report.codec import host_of, measured_of

GOLDEN = Path(__file__).parent / "fixtures" / "golden" / "report_lab.json"
PAGE = 4096
# tcp_mem as the kernel sizes it on a 24 GiB host (tcp_init_mem: 1/16 and 1/8 of RAM pages ...)
TCP_MEM_24G = (287907, 383878, 575814)


def line_rate_report(rate_bps: float, *, tcp_mem=TCP_MEM_24G, rmem_max: int = 212992,
                     verdict: str | None = None) -> dict:
    doc = json.loads(GOLDEN.read_text())
    m = doc["measurements"]
    m["path"]["rtt_ms"] = {k: v + 110.0 for k, v in m["path"]["rtt_ms"].items()}
    m["path"].update(capacity_bits_per_second=rate_bps, capacity_source="udp_burst_sender_held")
    for facts in (doc["host"]["facts"], m["peer_facts"]):
        facts.update(tcp_mem_pages=list(tcp_mem) if tcp_mem else None, page_size_bytes=PAGE,
                     rmem_max_bytes=rmem_max, wmem_max_bytes=rmem_max,
                     tcp_rmem_bytes=[4096, 65536, 262144], tcp_wmem_bytes=[4096, 16384, 262144],
                     cc_current="reno")
    if verdict:
        for part in ("throughput", "throughput_reverse"):
            m[part]["limited_by"]["verdict"] = verdict
    doc["findings"] = [f.to_json() for f in run_rules(measured_of(m), host_of(doc["host"]),
                                                      DiagnoseConfig())]
    return doc


def _found(doc: dict, rule: str, direction: str | None = None) -> list[dict]:
    return [f for f in doc["findings"] if f["id"] == rule
            and direction in (None, f.get("direction"))]


def test_at_5_gbit_the_plan_names_a_stream_count_and_nccl_sockets():
    doc = line_rate_report(5e9)
    streams = _found(doc, "path.streams_needed")
    assert streams, [f["id"] for f in doc["findings"]]
    ev = streams[0]["evidence"]
    # one flow's buffer is capped by tcp_mem[1] ÷ 16 flows: its window per RTT is short of 5G
    budget = TCP_MEM_24G[1] * PAGE // 16
    assert ev["buffer_bytes"] <= budget and ev["per_stream_ceiling_bps"] < 5e9
    n = math.ceil(5e9 / ev["per_stream_ceiling_bps"])
    assert ev["streams_needed"] == n >= 2
    threads, per = split_sockets(n)
    assert (ev["nccl_socket_nthreads"], ev["nccl_nsocks_perthread"]) == (threads, per)
    plan = build_plan(doc, {}, host_id="m/a", side="local")
    manual = {x.key: x.value for x in plan.manual}
    assert manual == {"NCCL_SOCKET_NTHREADS": str(threads), "NCCL_NSOCKS_PERTHREAD": str(per)}
    assert all(f"{n} streams" in x.reason for x in plan.manual)


def test_where_one_stream_carries_the_path_no_stream_count_is_named():
    assert not _found(line_rate_report(2e9, tcp_mem=None), "path.streams_needed")
    assert not _found(line_rate_report(100e6), "path.streams_needed")


def test_a_cpu_bound_stream_is_a_per_stream_ceiling_too():
    doc = line_rate_report(2e9, tcp_mem=None, verdict="host_cpu")
    (found,) = _found(doc, "path.streams_needed", "forward")
    measured = doc["measurements"]["throughput"]["bits_per_second"]
    assert found["evidence"]["per_stream_ceiling_bps"] == measured
    assert found["evidence"]["streams_needed"] == math.ceil(2e9 / measured)


def test_buffers_come_from_the_capacity_and_rmem_max_is_raised_with_them():
    doc = line_rate_report(2e9, verdict="receive_window")
    windows = _found(doc, "path.window_limited", "forward")  # the peer receives
    assert windows
    ev = windows[0]["evidence"]
    bdp = 2e9 * 0.13 / 8
    assert 2 * bdp <= ev["buffer_bytes"] <= 16 * bdp  # sized for 2 Gbit/s, not for a false figure
    keys = {(k["key"], k["host"]) for k in windows[0]["knobs"]}
    assert ("net.core.rmem_max", "peer") in keys and ("net.core.wmem_max", "local") in keys
    plan = build_plan(copy.deepcopy(doc), {}, host_id="m/a", side="peer",
                      local_addresses=frozenset({"198.18.0.1"}))
    rmax = [c for c in plan.changes if c.key == "net.core.rmem_max"]
    assert rmax and int(rmax[0].new) == ev["buffer_bytes"]
    # a host whose rmem_max already allows the buffer gets no such knob
    roomy = line_rate_report(2e9, verdict="receive_window", rmem_max=2**30)
    assert not any(k["key"].startswith("net.core.") for f in _found(roomy, "path.window_limited")
                   for k in f["knobs"])
