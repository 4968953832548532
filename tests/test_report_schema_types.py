"""The report schema types every measurement (issue 21, "one codec"): each part of
``measurements`` has a ``$defs`` entry with its keys and their JSON types, so a report with the
wrong type in a known key is refused in one line, while objects stay open for the optional keys a
minor version may add.

The writers are held to the schema in both directions, from real result objects built by the
code that writes them (no key is listed here): every key a writer writes is declared, every key
declared is written by some writer, and every key a part lists in ``x-always-written`` is written
by each of its writers.
"""

from __future__ import annotations

import copy
import functools
import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import FIXTURE_TREES
from test_ring_plan import ring_docs
from test_throughput_capacity import fake_path
from test_throughput_protocol import IPERF3_DOC

from collectors.host_drops import HostDrops, read_host_drops
from wanprobe.diagnose.throughput_verdict import JUDGE
from wanprobe.errors import ConfigError
from wanprobe.report.document import Report, schema, shape_schema, validate
from wanprobe.userfiles import json_objects

GOLDEN = Path(__file__).parent / "fixtures" / "golden" / "report_lab.json"
PEER = "198.18.0.2"


def golden() -> dict[str, Any]:
    return json.loads(GOLDEN.read_text())


# -- walking the schema -----------------------------------------------------------------------
def resolved(node: Any) -> dict[str, Any]:
    """``node`` with its ``$ref`` (a local ``#/$defs/NAME``) merged in, the node's own keys on top."""
    if not isinstance(node, dict):
        return {}
    ref = node.get("$ref")
    if ref is None:
        return node
    assert ref.startswith("#/$defs/"), ref
    return {**resolved(schema()["$defs"][ref.removeprefix("#/$defs/")]),
            **{k: v for k, v in node.items() if k != "$ref"}}


def part_schema(name: str) -> dict[str, Any]:
    return schema()["properties"]["measurements"]["properties"][name]


OUTSIDE = {"finding", "knob"}  # typed before issue 21 and written by the rules, not a measurement


def owner(node: Any, at: str) -> str:
    """Key paths restart at a ``$ref``: a record used in two places (tcp_info, throughput) is
    one set of keys, named ``#record.key``."""
    ref = node.get("$ref", "") if isinstance(node, dict) else ""
    name = ref.removeprefix("#/$defs/")
    return f"#{name}" if name and "properties" in schema()["$defs"][name] else at


def declared(node: Any, at: str) -> set[str]:
    """Every key path the schema names under ``node`` (``[]``: list items, ``*``: map values)."""
    if isinstance(node, dict) and node.get("$ref", "").removeprefix("#/$defs/") in OUTSIDE:
        return set()
    at, node = owner(node, at), resolved(node)
    out: set[str] = set()
    for key, sub in (node.get("properties") or {}).items():
        out |= {f"{at}.{key}"} | declared(sub, f"{at}.{key}")
    if isinstance(node.get("items"), dict):
        out |= declared(node["items"], f"{at}[]")
    if isinstance(node.get("additionalProperties"), dict):
        out |= declared(node["additionalProperties"], f"{at}.*")
    return out


def written(doc: Any, node: Any, at: str, undeclared: set[str],
            missing: set[str]) -> set[str]:
    """The key paths ``doc`` writes where the schema types them. Keys of a typed object the
    schema does not name go to ``undeclared``; ``x-always-written`` keys absent, to ``missing``."""
    at, node = owner(node, at), resolved(node)
    out: set[str] = set()
    if isinstance(doc, dict):
        props, extra = node.get("properties"), node.get("additionalProperties")
        missing |= {f"{at}.{k}" for k in node.get("x-always-written", ()) if k not in doc}
        for key, value in doc.items():
            if props is not None and key in props:
                out |= {f"{at}.{key}"} | written(value, props[key], f"{at}.{key}", undeclared,
                                                 missing)
            elif isinstance(extra, dict):
                out |= written(value, extra, f"{at}.*", undeclared, missing)
            elif props is not None:
                undeclared.add(f"{at}.{key}")
    elif isinstance(doc, list) and isinstance(node.get("items"), dict):
        for item in doc:
            out |= written(item, node["items"], f"{at}[]", undeclared, missing)
    return out


# -- the writers, run on real inputs ----------------------------------------------------------
def probe_docs() -> list[dict]:
    """``ProbeResult.to_json`` from the STAMP sender's own summary (probe_summary.summarize):
    with and without the reflector's clock, Class-of-Service and Reflector Report TLVs; then
    diagnose's capacity keys (services/diagnose._capacity), both ways it fills them."""
    from collectors.clock_state import ClockState
    from wanprobe.probe import error_estimate
    from wanprobe.probe.clock_tlvs import FarClock
    from wanprobe.probe.owd import OwdClock
    from wanprobe.probe.probe_summary import Reply, summarize
    from wanprobe.probe.reflector_report import ReportLog
    from wanprobe.probe.stamp_packet import ClassOfService
    from wanprobe.services.diagnose import DiagnoseOptions, _capacity_keys

    t0, ms = 1_800_000_000 * 10**9, 10**6
    tx = {s: t0 + s * 10 * ms for s in range(20)}
    clock = OwdClock(ClockState("chrony", True, 1.6, "ntp", "chrony: normal"),
                     FarClock((error_estimate.encode(1e-3, synchronized=True),), "ntp",
                              "sw-local", False))

    def session(tlvs: bool):
        replies = [Reply(s, tx[s] + 20 * ms + s * 1000, s, tx[s] + 10 * ms, tx[s] + 10 * ms + 50,
                         26 << 2, ClassOfService(26, 26, 0, 0) if tlvs else None,
                         s + 1 if tlvs else None) for s in range(20) if s != 7]
        return summarize(method="stamp", peer=PEER, port=862, started_ns=t0, duration_s=0.2,
                         interval_s=0.01, size_bytes=168, dscp=26, sent=20, tx_user_ns=tx,
                         tx_kernel_ns=tx, replies=replies, timeout_ns=1000 * ms,
                         clock=clock if tlvs else None,
                         reports=ReportLog(limit_pps=500) if tlvs else None)

    docs = []
    for tlvs in (True, False):
        docs.append(session(tlvs).to_json())
        opts = DiagnoseOptions(PEER, link_rate_bps=1e8 if tlvs else None, capacity=False)
        docs.append({**session(tlvs).to_json(samples=True), **_capacity_keys(opts, {}, None)})
    return docs


def mtu_docs(monkeypatch, _tmp: Path) -> list[dict]:
    """services/diagnose.measure_mtu: ``MtuResult.to_json`` and the route keys it adds."""
    from wanprobe.probe import mtu
    from wanprobe.probe.result import MtuResult, MtuStep
    from wanprobe.services import diagnose

    async def search(peer, **_kw):
        return MtuResult(peer, 862, 1400, 1500, "stamp-df-probe", "largest size answered", 0.15,
                         (MtuStep(88, True, 1), MtuStep(1500, False, 3), MtuStep(1400, True, 1)))

    monkeypatch.setattr(mtu, "probe_path_mtu", search)
    docs = []
    for route_mtu in (None, 1400):
        monkeypatch.setattr(diagnose, "route_to",
                            lambda _p, r=route_mtu: {"iface": "wan0", "route_mtu": r})
        docs.append(diagnose.measure_mtu(diagnose.DiagnoseOptions(PEER)))
    return docs


def finished_workers() -> tuple[dict, dict]:
    """One end's data worker once finished (datapath_pool.DataWorkers, without processes):
    the per-stream worker record and the end's engine summary."""
    import threading

    from wanprobe.throughput.datapath_pool import DataWorkers

    stream = SimpleNamespace(reported=True, error=None, close_parent_copy=lambda: None,
                             done=threading.Event())
    workers = DataWorkers.__new__(DataWorkers)
    workers._reader, workers.procs, workers.process_cpu_s = None, [None], 0.02
    workers.streams, workers._by_worker = [stream], [[0]]
    workers.exits = [{"cpu_s": 0.3, "elapsed_s": 6.0, "user_s": 0.1, "sys_s": 0.2,
                      "run_ns": 300_000_000, "wait_ns": 60_000_000}]
    workers._finish_worker(0, None)
    return stream.worker, workers.summary()


def throughput_results():
    """``ThroughputResult``s as both engines build them: the wanprobe engine's assembly from
    both ends' interval records (TCP_INFO through tcp_info_summary, a partial final interval),
    its UDP and bidirectional variants, and iperf3's JSON mapped."""
    from wanprobe.throughput import protocol as proto
    from wanprobe.throughput.iperf3_engine import parse_iperf3_json
    from wanprobe.throughput.result import DirectionSummary, UdpResult, _Side, assemble
    from wanprobe.throughput.tcp_info import SIZE_BYTES, parse_tcp_info, tcp_info_summary
    from wanprobe.throughput.udp import far_end_drops

    info = tcp_info_summary(replace(parse_tcp_info(bytes(SIZE_BYTES)), rtt_us=21_000,
                                    min_rtt_us=20_000, snd_cwnd=400, snd_mss=1448,
                                    delivery_rate=12_000_000, busy_time_us=1_000_000), 9.6e7)
    spans = [(k * 1.0, k + 1.0) for k in range(6)] + [(6.0, 6.004)]
    size = 12_000_000

    def records(sending: bool) -> list[dict]:
        return [{"k": k, "start_s": a, "end_s": b, "cpu_busy_percent": [5.0, 7.0],
                 "cpu_steal_percent": 0.1,
                 "streams": [{"id": 0, "direction": proto.UP, "sending": sending, "bytes": size,
                              "tcp_info": info if sending else None}]}
                for k, (a, b) in enumerate(spans)]

    worker, engine = finished_workers()
    final = {"id": 0, "direction": proto.UP, "bytes": size * 7, "elapsed_s": 6.004,
             "cpu_s": 0.3, "error": None, "cc": "bbr", "worker": worker}
    client = _Side(records(True), {(proto.UP, 0): {**final, "sending": True, "tcp_info": info}},
                   [5.0, 7.0], engine)
    server = _Side(records(False), {(proto.UP, 0): {**final, "sending": False,
                                                    "tcp_info": None}}, [5.0, 7.0], engine)

    # the far end's totals (server_udp.run_udp), host drops from a captured /proc, as read
    drops = read_host_drops(proc_root=FIXTURE_TREES / "node_exporter" / "proc")
    end = {"host_drops": drops.since(HostDrops(0, 0, 0, 0, 0)).to_json(), "socket_drops": 0,
           "receiver": "gro", "rcvbuf_bytes": 4 * 2**20}
    udp = UdpResult(1e8, 9.5e7, 1e8, 1400, 8929, 8500, 429, 4.8, 0, 0.05, **far_end_drops(end, 429),
                    sender_host_drops=drops.since(drops).to_json(), sender_segments=46,
                    sender_cpu_ratio=0.21, seconds=0.5)

    def run(omit_s=0.0, **kw):
        return assemble(peer=PEER, port=862, request=proto.TestRequest(duration_s=6.0, **kw),
                        client=client, server=server, keys={(proto.UP, 0)}, partial_reason=None,
                        udp=udp if kw.get("udp") else None, omit_s=omit_s, judge=JUDGE)

    bidir = replace(tcp := run(omit_s=2.0), mode="bidir", reverse=DirectionSummary(
        "server_to_client", 9e7, 9.1e7, 67_500_000, 68_000_000, 3))
    iperf3 = parse_iperf3_json(IPERF3_DOC, peer=PEER, port=5201, requested_duration_s=1.0,
                               streams_requested=1, window_bytes=None, dscp=0,
                               pacing_rate_bps=None, udp_rate_bps=None, judge=JUDGE)
    return [tcp, run(udp=True, udp_rate_bps=1e8), bidir, iperf3]


def throughput_docs() -> list[dict]:
    return [r.to_json() for r in throughput_results()]


def streams_scan_docs(monkeypatch, _tmp: Path) -> list[list]:
    """services/diagnose.measure_streams_scan over the throughput client's result."""
    from wanprobe.models.tcp_ramp import tcp_test_time
    from wanprobe.services import diagnose
    from wanprobe.throughput import client

    res, time = throughput_results()[0], tcp_test_time(1e8, 0.02, measure_min_s=8.0)
    monkeypatch.setattr(client, "run_throughput", lambda *_a, **_kw: res)
    return [diagnose.measure_streams_scan(diagnose.DiagnoseOptions(PEER), time)]


def host_facts_docs() -> list[dict]:
    """``HostFacts`` as read from a captured /proc and as a peer's reply is parsed
    (host_facts_op.fetch: ``HostFacts.from_json``), and from an interface's link row."""
    from collectors.host_facts import HostFacts, facts_from, read_host_facts

    here = read_host_facts(None, proc_root=FIXTURE_TREES / "procfs" / "proc")
    link = {"mtu": 1500, "qdisc": "fq", "stats64": {"rx_dropped": 1, "tx_dropped": 2}}
    there = facts_from({"net.ipv4.tcp_rmem": "4096 131072 6291456"}, {"RetransSegs": 3},
                       link, iface="eth0", page_size_bytes=4096, boot_id="0123abcd-00")
    return [here.to_json(), HostFacts.from_json(here.to_json()).to_json(), there.to_json()]


def capacity_docs() -> list[dict]:
    """``Capacity.to_json`` for each way the ladder ends (throughput/capacity.py)."""
    from wanprobe.throughput.capacity import ladder_capacity

    ends = [fake_path(300e6), fake_path(1e12), fake_path(1e12, sender_max_bps=80e6)]
    return [ladder_capacity(burst, start_bps=50e6, max_bps=1e9).to_json() for burst, _ in ends]


def counters_docs(tmp: Path) -> list[dict]:
    """services/counters.document as ``counters`` and diagnose write it: one snapshot (no
    rates) and two (rates and the fabric findings), of the captured /proc and /sys, of the
    synthetic mlx5 ethtool captures 10 s apart (a PFC finding) with an unreadable counter, and
    of a host without devices."""
    from collectors.snapshot import collect
    from wanprobe.services.counters import document, judge

    proc, syn = FIXTURE_TREES / "procfs" / "proc", FIXTURE_TREES / "synthetic"
    eth = []
    for i, name in enumerate(("statistics.t0", "statistics.t1_plus10s")):
        root = tmp / f"e{i}" / "ens1f0np0"
        root.mkdir(parents=True)
        text = (syn / "ethtool" / "ens1f0np0" / name).read_text()
        (root / "statistics").write_text(text + ("     rx_broken: n/a\n" if i else ""))
        eth.append(tmp / f"e{i}")
    first = collect(FIXTURE_TREES / "procfs" / "sys", proc)
    t0, t1 = (collect(syn / "sys", proc, e) for e in eth)
    nothing = collect(tmp / "nosys", proc)
    return [document(*judge(first)), document(*judge(first, replace(first, monotonic_s=first.monotonic_s + 1))),
            document(*judge(t0, replace(t1, monotonic_s=t0.monotonic_s + 10))),
            document(*judge(nothing))]


def verify_docs() -> list[dict]:
    """``Verification.to_json`` of the closed loop (services/verify.verify_loop) over the
    throughput writer's JSON: capacity measured, given, and not measured."""
    from wanprobe.services.verify import verify_loop

    tcp = throughput_results()[0]
    return [verify_loop(lambda _s: tcp, cap, omit_s=1.0).to_json()
            for cap in (lambda _r: (1e8, "udp_burst"), lambda _r: (2e9, "udp_burst"),
                        lambda _r: (None, "not measured: no reply"))]


WRITERS = {
    "path": lambda _mp, _tmp: probe_docs(), "mtu": mtu_docs,
    "throughput": lambda _mp, _tmp: throughput_docs(), "ring": lambda _mp, _tmp: ring_docs(),
    "throughput_reverse": lambda _mp, _tmp: throughput_docs(), "peer_facts": lambda _mp, _tmp: host_facts_docs(),
    "capacity": lambda _mp, _tmp: capacity_docs(), "streams_scan": streams_scan_docs,
    "counters": lambda _mp, tmp: counters_docs(tmp), "verify": lambda _mp, _tmp: verify_docs(),
}


def test_every_measurement_has_a_typed_schema():
    parts = schema()["properties"]["measurements"]["properties"]
    assert set(parts) - {"errors"} == set(WRITERS)
    for name in WRITERS:
        assert declared(part_schema(name), name), f"measurements.{name} declares no keys"


# -- 1. the lab report validates; a wrong type in a known key is refused in one line ------------
def test_the_recorded_lab_report_validates_strictly():
    doc = golden()
    validate(doc)
    assert Report.from_json(doc).measurements["path"]["peer"] == PEER


WRONG = [
    (("path", "rtt_ms", "p50"), "fast"),
    (("path", "loss", "sent"), 1.5),
    (("path", "loss", "ci95"), 0.01),
    (("path", "dscp", "bleached"), "sideways"),
    (("path", "tx_timestamp"), "later"),
    (("path", "owd_ms", "local_clock", "synchronized"), "yes"),
    (("path", "reflector", "limit_pps"), "500"),
    (("path", "rtt_samples_ms", 0), None),
    (("mtu", "path_mtu"), "1500"),
    (("mtu", "steps", 0, "passed"), 1),
    (("mtu", "icmp_seen"), None),
    (("throughput", "bits_per_second"), "94 Mbit/s"),
    (("throughput", "limited_by", "verdict"), "gremlins"),
    (("throughput", "streams", 0, "tcp_info", "cwnd_packets"), 1.5),
    (("throughput", "intervals", 0, "partial"), "no"),
    (("throughput", "cpu", "client", "cores"), "two"),
    (("throughput", "notes"), "none"),
    (("throughput_reverse", "mode"), "sideways"),
    (("throughput_reverse", "streams", 0, "direction"), 0),
    (("peer_facts", "tcp_rmem_bytes"), [4096, 131072]),
    (("peer_facts", "cc_allowed"), "reno bbr"),
    (("peer_facts", "version"), "1"),
    (("capacity", "capacity_source"), "a guess"),
    (("capacity", "bursts", 0, "lost_packets"), 0.5),
    (("streams_scan", 0, "streams"), "1"),
    (("streams_scan", 1, "per_stream_bits_per_second"), None),
    (("counters", "netdevs", "wan0", "mtu"), "1500"),
    (("counters", "tcp", "RetransSegs"), "7"),
    (("counters", "sources", 0, "status"), "fine"),
    (("counters", "rates"), []),
    (("verify", "limit"), "gremlins"),
    (("verify", "fixed"), "yes"),
    (("verify", "attempts", 0, "omit_s"), "2 s"),
]


@functools.cache
def valid_with_verify() -> str:
    """The lab report with the verify part ``tune apply --verify --report-out`` adds, checked
    valid once (each case below breaks one key of a copy)."""
    doc = golden()
    doc["measurements"]["verify"] = verify_docs()[0]
    validate(doc)
    return json.dumps(doc)


@pytest.mark.parametrize("where,value", WRONG, ids=lambda x: "/".join(map(str, x))
                         if isinstance(x, tuple) else None)
def test_a_wrong_type_in_a_known_key_is_refused_in_one_line_naming_it(where, value):
    doc = json.loads(valid_with_verify())
    node = doc["measurements"]
    for key in where[:-1]:
        node = node[key]
    assert where[-1] in node if isinstance(node, dict) else where[-1] < len(node)
    node[where[-1]] = value
    with pytest.raises(ConfigError) as err:
        Report.from_json(doc)
    line = str(err.value)
    assert "\n" not in line
    assert f"at 'measurements/{'/'.join(map(str, where))}'" in line, line


def test_keys_a_minor_version_adds_stay_allowed_and_untyped_parts_stay_open():
    doc = golden()
    m = doc["measurements"]
    m["path"]["a_1_2_key"] = {"any": ["thing"]}
    m["throughput"]["streams"][0]["tcp_info"]["snd_ssthresh"] = 7
    m["counters"]["netdevs"]["wan0"]["future"] = None
    m["paths"] = {"paths": []}  # `wanprobe paths` documents, not typed here
    validate(doc)


def test_a_1_1_report_from_before_the_later_optional_keys_still_validates():
    """What 1.1 reports written before issue 20 lack (one-way delay, the reflector's report, the
    data workers, the partial interval, boot ids) and called differently (``cpu``) still reads."""
    doc = golden()
    m = doc["measurements"]
    for key in ("owd_ms", "reflector", "rtt_samples_ms", "capacity_bits_per_second",
                "capacity_source"):
        m["path"].pop(key)
    for key in ("reflector_rate_limited", "reflector_replays_refused", "reflector_resets",
                "unattributed"):
        m["path"]["loss"].pop(key)
    for part in ("throughput", "throughput_reverse"):
        t = m[part]
        t.pop("engine_version")
        t["limited_by"]["verdict"] = "cpu"
        t["cpu"] = {k: t["cpu"][k] for k in ("sender_thread_busy_ratio",
                                             "receiver_thread_busy_ratio",
                                             "client_core_busy_max_percent",
                                             "server_core_busy_max_percent")}
        for s in t["streams"]:
            s.pop("sender_worker"), s.pop("receiver_worker")
        for iv in t["intervals"]:
            iv.pop("partial")
    m["peer_facts"].pop("boot_id")
    doc["host"]["facts"].pop("boot_id")
    validate(doc)


# -- 2. the writers and the schema agree, both ways ---------------------------------------------
@pytest.mark.parametrize("name", sorted(WRITERS))
def test_writers_write_what_the_schema_declares_and_nothing_else(name, monkeypatch, tmp_path):
    docs = WRITERS[name](monkeypatch, tmp_path)
    node = part_schema(name)
    seen: set[str] = set()
    for doc in docs:
        undeclared: set[str] = set()
        missing: set[str] = set()
        seen |= written(doc, node, name, undeclared, missing)
        assert not undeclared, f"{name}: written, not in the schema: {sorted(undeclared)}"
        assert not missing, f"{name}: x-always-written, not written: {sorted(missing)}"
        report = golden()
        report["measurements"][name] = json.loads(json.dumps(doc))  # as a file holds it
        validate(report)
    nothing_writes = declared(node, name) - seen
    assert not nothing_writes, f"{name}: declared, written by nothing: {sorted(nothing_writes)}"


def test_x_always_written_names_only_declared_keys():
    for node in json_objects(schema()["$defs"]):
        always = node.get("x-always-written")
        if always is not None:
            assert set(always) <= set(node.get("properties") or {}), always
            assert "required" not in node


def test_the_host_facts_in_host_are_the_same_record():
    doc = golden()
    doc["host"]["facts"]["cc_allowed"] = "reno bbr"
    with pytest.raises(ConfigError, match="at 'host/facts/cc_allowed'"):
        validate(doc)


# -- 3. the shape-only schema -------------------------------------------------------------------
def test_shape_schema_keeps_containers_through_refs_and_drops_scalar_types():
    shape = shape_schema()
    for node in json_objects(shape):
        assert not {"required", "enum", "x-always-written", "minItems"} & set(node)
    doc = json.loads(valid_with_verify())
    validate(doc, strict=False)
    loose = copy.deepcopy(doc)
    loose["measurements"]["path"]["rtt_ms"]["p50"] = "fast"     # a scalar: anything goes
    loose["measurements"]["throughput"]["limited_by"]["verdict"] = "gremlins"
    del loose["measurements"]["path"]["loss"]
    validate(loose, strict=False)
    for where, value in ((("path", "loss"), "none"), (("throughput", "streams"), {}),
                         (("counters", "netdevs", "wan0"), []), (("verify", "attempts"), 3),
                         (("streams_scan",), {"streams": 1})):
        bad = copy.deepcopy(doc)
        node = bad["measurements"]
        for key in where[:-1]:
            node = node[key]
        node[where[-1]] = value
        with pytest.raises(ConfigError, match=f"at 'measurements/{'/'.join(where)}'"):
            validate(bad, strict=False)


def test_a_figure_its_writer_could_not_compute_is_null_and_the_report_still_saves():
    """Absent is None (docs/conventions.md §3): the throughput writer writes null for a rate it
    could not compute (inf/NaN), the verify loop for a test that moved nothing. Such a report is
    valid — refusing it would lose the whole diagnose at save — while a wrong type still is not."""
    doc = json.loads(valid_with_verify())
    m = doc["measurements"]
    m["throughput"]["bits_per_second"] = None
    m["throughput"]["sender_bits_per_second"] = None
    m["verify"]["bits_per_second"] = None
    m["capacity"]["capacity_bits_per_second"] = None
    Report.from_json(doc)
    m["throughput"]["bits_per_second"] = "fast"
    with pytest.raises(ConfigError, match="measurements/throughput/bits_per_second"):
        Report.from_json(doc)
