"""Issue 21, one codec: the probe's results read back from the JSON their writers give.

The docs are the REAL writer outputs of tests/test_report_schema_types.py (``probe_docs``,
``mtu_docs``) and the recorded lab report; the property is ``from_json(doc).to_json() == doc``
for the writer's own keys. services/diagnose adds keys to both documents after the writer
(``DIAGNOSE_PATH_KEYS``, ``DIAGNOSE_MTU_KEYS``): from_json leaves them alone."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
from test_report_schema_types import GOLDEN, mtu_docs, probe_docs

from wanprobe.errors import ConfigError
from wanprobe.probe.owd import OwdReport
from wanprobe.probe.result import LossStats, MtuResult, ProbeResult

DIAGNOSE_PATH_KEYS = {"capacity_bits_per_second", "capacity_source", "capacity_is_lower_bound"}
DIAGNOSE_MTU_KEYS = {"search_max_bytes", "iface", "iface_mtu", "route_mtu", "icmp_seen"}


def writers_own(doc: dict, added: set[str]) -> dict:
    return {k: v for k, v in doc.items() if k not in added}


def path_round_trip(doc: dict) -> dict:
    result = ProbeResult.from_json(doc)
    return result.to_json(samples="rtt_samples_ms" in doc)


def test_every_probe_document_round_trips():
    docs = probe_docs()
    assert {d["owd_ms"] is None for d in docs} == {True, False}
    assert any("rtt_samples_ms" in d for d in docs)
    assert any(d["loss"]["forward_ratio"] is not None for d in docs)
    for doc in docs:
        assert path_round_trip(doc) == writers_own(doc, DIAGNOSE_PATH_KEYS)
        if doc["owd_ms"] is not None:
            assert OwdReport.from_json(doc["owd_ms"]).to_json() == doc["owd_ms"]


def test_every_mtu_document_round_trips(monkeypatch, tmp_path):
    docs = mtu_docs(monkeypatch, tmp_path)
    for doc in docs:
        assert DIAGNOSE_MTU_KEYS <= set(doc)
        assert MtuResult.from_json(doc).to_json() == writers_own(doc, DIAGNOSE_MTU_KEYS)


def test_the_recorded_lab_report_round_trips():
    m = json.loads(Path(GOLDEN).read_text())["measurements"]
    assert path_round_trip(m["path"]) == writers_own(m["path"], DIAGNOSE_PATH_KEYS)
    assert MtuResult.from_json(m["mtu"]).to_json() == writers_own(m["mtu"], DIAGNOSE_MTU_KEYS)


@pytest.mark.parametrize("lost,of", [(1, 3), (7, 1000), (1, 7919), (3, 100_003), (0, 50)])
def test_a_direction_ratio_is_given_back_although_its_count_is_not_written(lost, of):
    loss = LossStats(20, 19, (0.0, 0.1), forward_lost=lost, forward_of=of, reverse_lost=0,
                     reverse_of=0)
    doc = loss.to_json()
    assert LossStats.from_json(doc).to_json() == doc


@pytest.mark.parametrize("where,key", [
    (("loss",), "sent"), (("owd_ms", "far_clock"), "sync_source"), (("rtt_ms",), "p99"),
    (("owd_ms", "variation", "reverse"), "max"), ((), "method"),
])
def test_a_malformed_path_document_is_refused_in_one_line(where, key):
    doc = copy.deepcopy(next(d for d in probe_docs() if d["owd_ms"] is not None))
    node = doc
    for step in where:
        node = node[step]
    del node[key]
    with pytest.raises(ConfigError) as err:
        ProbeResult.from_json(doc)
    assert str(err.value) == ".".join(("path", *where)) + f": missing key {key!r}"


def test_a_malformed_mtu_document_is_refused_in_one_line(monkeypatch, tmp_path):
    doc = mtu_docs(monkeypatch, tmp_path)[0]
    for bad, says in (({**doc, "steps": [{"size_bytes": 88}]}, "mtu.steps[0]: missing key 'passed'"),
                      ({**doc, "steps": "x" * 500}, "mtu.steps: expected a JSON array"),
                      ("not a dict", "mtu: expected a JSON object"),
                      (writers_own(doc, {"path_mtu"}), "mtu: missing key 'path_mtu'")):
        with pytest.raises(ConfigError, match="^" + re.escape(says)) as err:
            MtuResult.from_json(bad)
        assert "\n" not in str(err.value) and len(str(err.value)) < 200


def test_far_clock_words_that_are_not_hex_are_refused():
    doc = copy.deepcopy(next(d for d in probe_docs() if d["owd_ms"] is not None))
    doc["owd_ms"]["far_clock"]["error_estimates"] = ["zz"]
    with pytest.raises(ConfigError, match="error_estimates must be hex words"):
        ProbeResult.from_json(doc)
