"""Golden of the report a real diagnose writes (issue 21): `wanprobe diagnose PEER --quick
--json` on a lab (20 ms, 100 Mbit/s, a reflector in b) gives a report with the keys and value
types recorded in tests/fixtures/golden/report_shape.json (tests/report_shape.py: values vary
per run, so only keys and JSON types are compared; a null matches anything).

A difference is a change of the report contract: record the shape again
(``python tests/test_report_golden.py --record``, as root: two lab runs, merged) and bump
``schema_version`` with a note in docs/changelog.md saying what moved.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import report_readers
import report_shape
from test_diagnose_netns import diagnose_in_a, reflected  # noqa: F401 - the fixture

GOLDEN = Path(__file__).resolve().parent / "fixtures" / "golden" / "report_shape.json"
LAB = {"rtt_ms": 20, "rate_bps": 100e6}


def test_shape_records_keys_and_types_not_values():
    a = report_shape.shape({"x": 1, "y": [{"k": "v"}, {"k": "w", "o": None}]})
    assert a == {"x": "number", "y": {"<list>": {"k": "string", "?o": "null"}}}
    b = report_shape.shape({"x": 2.5, "y": [], "z": True})
    assert report_shape.differences(a, b) == [".z: added"]
    assert report_shape.differences(b, a) == [".z: removed"]
    assert report_shape.differences(a, {"x": "string", "y": {"<list>": None}}) == \
        [".x: string, was number"]
    assert report_shape.differences(a, {"x": "null", "y": {"<list>": {"k": "string"}}}) == []


@pytest.mark.netns
def test_lab_diagnose_report_keeps_its_shape(reflected):  # noqa: F811 - the imported fixture
    from wanprobe.report.document import Report

    lab = reflected(**LAB)
    doc = diagnose_in_a(lab)
    assert doc["measurements"]["errors"] == {}, doc["measurements"]["errors"]
    Report.from_json(doc)  # the schema holds it
    want = json.loads(GOLDEN.read_text())
    diff = report_shape.differences(want, report_shape.shape(doc))
    assert not diff, "the report's keys or types moved (bump schema_version, say it in " \
                     f"docs/changelog.md, record again): {diff}"
    # and no reader asks this fresh report for a key no writer produces (test_report_readers.py)
    unknown, _ = report_readers.unknown_keys(report_readers.ask_every_reader(doc), want)
    assert unknown == [], unknown


def _every_finding_key() -> list[dict]:
    from wanprobe.report.document import Finding, Knob

    full = Finding("path.x", "warning", "t", {}, "r", "e", (
        Knob("link", "wan0/mtu", "1380", "r", side="local", iface="wan0", host="local"),
        Knob("sysctl", "k", "v", "r")), impact=0.5, host="peer", direction="forward")
    return [full.to_json(), Finding("path.y", "info", "t", {}, "r", "e").to_json()]


def record(runs: int = 2) -> None:
    """Diagnose ``runs`` times on a fresh lab and store the merged shape."""
    import os

    from wanprobe.lab import Lab, netns
    from wanprobe.lab.scenario import start_reflector

    extra = _every_finding_key()
    merged = None
    with Lab(name=f"rg{os.getpid() % 100000}", **LAB) as lab:
        proc = start_reflector(lab)
        try:
            for _ in range(runs):
                r = lab.a.run([sys.executable, "-m", "wanprobe", "diagnose", lab.b.addr,
                               "--quick", "--json"], capture_output=True, text=True, timeout=180)
                if r.returncode != 0:
                    raise SystemExit(r.stderr)
                doc = json.loads(r.stdout)
                # which findings fire varies per run: every key a finding or knob may carry
                doc["findings"] += extra
                doc["measurements"]["counters"]["findings"] += extra
                merged = report_shape.merge(merged, report_shape.shape(doc))
        finally:
            netns.stop(proc)
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_text(json.dumps(merged, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    if sys.argv[1:] != ["--record"]:
        sys.exit("usage: python tests/test_report_golden.py --record")
    record()
    print(f"recorded {GOLDEN}")
