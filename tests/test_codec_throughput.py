"""The throughput, capacity and verify measurements decode what they write (issue 21, "one
codec"): ``X.from_json(doc).to_json() == doc`` for the real writers' output of
test_report_schema_types (both throughput engines, UDP, bidirectional; each way the capacity
ladder ends; the closed loop with capacity measured, given and not measured) and for the
recorded lab report; a document of the wrong shape is refused in one line naming the key."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
from test_report_schema_types import (
    capacity_docs,
    golden,
    throughput_docs,
    throughput_results,
    verify_docs,
)

from wanprobe.diagnose.verify import Attempt, Verification
from wanprobe.errors import ConfigError
from wanprobe.throughput.capacity import Burst, Capacity
from wanprobe.throughput.result import (
    DirectionSummary,
    IntervalResult,
    StreamResult,
    ThroughputResult,
    UdpResult,
)
from wanprobe.throughput.tcp_info import SIZE_BYTES, TcpInfo, parse_tcp_info
from wanprobe.throughput.verdict import Verdict

CODECS = {"throughput": ThroughputResult, "throughput_reverse": ThroughputResult,
          "capacity": Capacity, "verify": Verification}


def writer_docs(name: str) -> list[dict]:
    return {"throughput": throughput_docs, "throughput_reverse": throughput_docs,
            "capacity": capacity_docs, "verify": verify_docs}[name]()


@pytest.mark.parametrize("name", sorted(CODECS))
def test_every_writer_doc_round_trips(name):
    docs = writer_docs(name)
    assert docs
    for doc in docs:
        assert CODECS[name].from_json(copy.deepcopy(doc)).to_json() == doc


@pytest.mark.parametrize("name", ["throughput", "throughput_reverse", "capacity"])
def test_the_recorded_lab_report_parts_round_trip(name):
    doc = golden()["measurements"][name]
    assert CODECS[name].from_json(copy.deepcopy(doc)).to_json() == doc


def test_throughput_decodes_to_the_typed_parts_both_engines_build():
    results = throughput_results()
    engines = {r.engine for r in results}
    assert engines == {"wanprobe", "iperf3"}
    for res in results:
        back = ThroughputResult.from_json(res.to_json())
        assert back == res  # no float is rounded and no inf/nan in these: exact inverse
        assert isinstance(back.limited_by, Verdict)
        assert all(isinstance(s, StreamResult) for s in back.streams)
        assert all(isinstance(i, IntervalResult) for i in back.intervals)
    udp, bidir = results[1], results[2]
    assert isinstance(ThroughputResult.from_json(udp.to_json()).udp, UdpResult)
    assert isinstance(ThroughputResult.from_json(bidir.to_json()).reverse, DirectionSummary)
    assert ThroughputResult.from_json(results[0].to_json()).intervals[-1].partial


def test_capacity_and_verify_decode_to_their_typed_parts():
    for doc in capacity_docs():
        cap = Capacity.from_json(doc)
        assert cap.bits_per_second == doc["capacity_bits_per_second"]
        assert cap.bursts and all(isinstance(b, Burst) for b in cap.bursts)
    for doc in verify_docs():
        v = Verification.from_json(doc)
        assert all(isinstance(a, Attempt) for a in v.attempts)
        assert (v.fixed, v.path_full) == (doc["fixed"], doc["path_full"])


def test_derived_verify_keys_are_recomputed_not_read():
    doc = verify_docs()[0]
    doc["share_of_capacity"], doc["fixed"] = 0.123, not doc["fixed"]
    again = Verification.from_json(doc).to_json()
    assert again == verify_docs()[0]


def test_a_report_from_before_the_optional_keys_decodes_with_their_defaults():
    doc = golden()["measurements"]["throughput"]
    doc.pop("engine_version")
    for s in doc["streams"]:
        s.pop("sender_worker"), s.pop("receiver_worker")
    for iv in doc["intervals"]:
        iv.pop("partial")
    res = ThroughputResult.from_json(doc)
    assert res.engine_version is None
    assert res.streams[0].sender_worker is None and not res.intervals[0].partial


def test_tcp_info_round_trips():
    info = replace(parse_tcp_info(bytes(SIZE_BYTES)), rtt_us=21_000, snd_cwnd=400)
    assert TcpInfo.from_json(info.to_json()) == info
    assert TcpInfo.from_json({}) == TcpInfo()


DROP = object()


def _edited(doc: dict, value, *path) -> dict:
    """``doc`` with the key at ``path`` set to ``value`` (removed for DROP)."""
    node = doc
    for key in path[:-1]:
        node = node[key]
    if value is DROP:
        node.pop(path[-1])
    else:
        node[path[-1]] = value
    return doc


def _key_path(name: str, path: tuple) -> str:
    """How an error names the place ``path`` below ``name``: ``throughput.streams[0]``."""
    return name + "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in path)


# (codec, its name in errors, its recorded documents, which one, the key path to remove):
# each is refused naming the key.
MISSING = [
    (ThroughputResult, "throughput", throughput_docs, 0, ("bits_per_second",)),
    (ThroughputResult, "throughput", throughput_docs, 0, ("streams", 0, "stream_id")),
    (ThroughputResult, "throughput", throughput_docs, 0, ("limited_by", "verdict")),
    (ThroughputResult, "throughput", throughput_docs, 1, ("udp", "jitter_ms")),
    (ThroughputResult, "throughput", throughput_docs, 2, ("reverse", "direction")),
    (Capacity, "capacity", capacity_docs, 0, ("capacity_source",)),
    (Capacity, "capacity", capacity_docs, 0, ("bursts", 0, "lost_packets")),
    (Verification, "verify", verify_docs, 0, ("next_step",)),
    (Verification, "verify", verify_docs, 0, ("attempts", 0, "omit_s")),
]
BAD = [(codec, lambda d=docs, i=i, p=path: _edited(d()[i], DROP, *p),
        f"{_key_path(name, path[:-1])}: missing key {path[-1]!r}")
       for codec, name, docs, i, path in MISSING] + [
    (ThroughputResult, lambda: _edited(throughput_docs()[0], 7, "streams"),
     "throughput.streams: expected a JSON array, got 7"),
    (ThroughputResult, lambda: _edited(throughput_docs()[0], "x", "intervals", 0, "streams", 0),
     "throughput.intervals[0].streams[0]: expected a JSON object, got 'x'"),
    (ThroughputResult, lambda: _edited(throughput_docs()[0], None, "limited_by"),
     "throughput.limited_by: expected a JSON object, got None"),
    (ThroughputResult, lambda: _edited(throughput_docs()[0], [1], "notes"),
     "throughput.notes: expected strings, got [1]"),
    (ThroughputResult, lambda: ["not", "an", "object"],
     "throughput: expected a JSON object, got ['not', 'an', 'object']"),
    (Verification, lambda: _edited(verify_docs()[0], "none", "evidence"),
     "verify.evidence: expected a JSON object, got 'none'"),
]


@pytest.mark.parametrize(("codec", "make", "message"), BAD, ids=[m for _c, _m, m in BAD])
def test_a_malformed_document_is_refused_in_one_line_naming_the_key(codec, make, message):
    with pytest.raises(ConfigError) as err:
        codec.from_json(make())
    assert str(err.value) == message
    assert "\n" not in str(err.value)
