"""No reader of the report asks for a key no writer produces (issue 21).

A real report of a lab diagnose (``--full``: both directions, the stream scan, counters, peer
facts; tests/fixtures/golden/report_lab.json, recorded with
``python tests/test_report_readers.py --record`` as root) is handed, tracked, to every reader
(tests/report_readers.py); each key they look up and do not find must be one the writers
produce somewhere: in the recorded shape of a real report (report_shape.json), or listed in
``WRITTEN_ELSEWHERE`` with the writer that does. test_report_golden.py runs the same check on a
report it has just measured.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import report_readers

GOLDEN = Path(__file__).resolve().parent / "fixtures" / "golden"


def _shape():
    return json.loads((GOLDEN / "report_shape.json").read_text())


def test_the_tracker_sees_a_missed_key_at_its_path():
    log: set = set()
    doc = report_readers.track({"a": {"b": 1}, "l": [{"c": 2}]}, (), log)
    assert doc["a"].get("b") == 1 and doc["a"].get("x") is None
    assert "y" not in doc["l"][0]
    assert log == {("a", "x"), ("l", "[]", "y")}
    shape = {"a": {"b": "number"}, "l": {"<list>": {"c": "number", "?y": "number"}}}
    assert report_readers.unknown_keys(log, shape) == (["a.x"], [])


def test_no_reader_asks_for_a_key_no_writer_produces():
    from wanprobe.report.document import validate

    doc = json.loads((GOLDEN / "report_lab.json").read_text())
    validate(doc)
    log = report_readers.ask_every_reader(doc)
    unknown, unverifiable = report_readers.unknown_keys(log, _shape())
    print(f"\n{len(log)} keys asked for and not in this report; not written anywhere: {unknown}; "
          f"where the shape saw only null: {unverifiable}")
    assert unknown == []


def record() -> None:
    """Diagnose --full once on a fresh lab (20 ms, 100 Mbit/s) and store the report."""
    import os

    from wanprobe.lab import Lab, netns
    from wanprobe.lab.scenario import start_reflector

    with Lab(name=f"rr{os.getpid() % 100000}", rtt_ms=20, rate_bps=100e6) as lab:
        proc = start_reflector(lab)
        try:
            r = lab.a.run([sys.executable, "-m", "wanprobe", "diagnose", lab.b.addr, "--full",
                           "--json"], capture_output=True, text=True, timeout=300)
        finally:
            netns.stop(proc)
    if r.returncode != 0:
        raise SystemExit(r.stderr)
    doc = json.loads(r.stdout)
    (GOLDEN / "report_lab.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    if sys.argv[1:] != ["--record"]:
        sys.exit("usage: python tests/test_report_readers.py --record")
    record()
