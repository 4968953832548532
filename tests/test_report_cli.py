"""`wanprobe report schema|show|ls` through the real CLI: valid JSON Schema, markdown rendering,
and one-line errors on bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import jsonschema
import pytest
from clirun import invoke
from test_report_document import make_report

from wanprobe.report.document import save


def run(*args, subprocess_: bool = False):
    """The CLI in process (CliRunner), or as a real process when the exit code path matters."""
    if subprocess_:
        return subprocess.run([sys.executable, "-m", "wanprobe", *args], capture_output=True,
                              text=True, timeout=60)
    return invoke(*args)


def one_line_error(r) -> str:
    assert r.returncode != 0
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr and lines[0].startswith("wanprobe: error:")
    return lines[0]


def test_report_schema_prints_valid_json_schema():
    r = run("report", "schema")
    assert r.returncode == 0
    doc = json.loads(r.stdout)
    jsonschema.Draft202012Validator.check_schema(doc)
    jsonschema.Draft202012Validator(doc).validate(make_report().to_json())


@pytest.fixture
def report_file(tmp_path):
    return save(make_report(), tmp_path / "report.json")


def test_report_show_markdown(report_file):
    r = run("report", "show", str(report_file), "--format", "markdown")
    assert r.returncode == 0, r.stderr
    assert "## Findings" in r.stdout and "Throughput is limited by the TCP receive window" in r.stdout


def test_report_show_rich_and_json(report_file):
    r = run("report", "show", str(report_file))
    assert r.returncode == 0 and "receive window" in r.stdout
    r = run("report", "show", str(report_file), "--format", "json")
    assert json.loads(r.stdout)["findings"][0]["id"] == "path.window_limited"


def test_report_show_bad_file_is_one_line_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema_version": "1.0", "id": "x"}')
    r = run("report", "show", str(bad), subprocess_=True)
    assert r.returncode == 2 and "not a valid wanprobe report" in one_line_error(r)
    bad.write_text("{{{")
    assert "not JSON" in one_line_error(run("report", "show", str(bad)))
    assert "no such file" in one_line_error(run("report", "show", str(tmp_path / "none.json")))


def test_report_show_unknown_format_is_one_line_error(report_file):
    assert "unknown format" in one_line_error(run("report", "show", str(report_file),
                                                  "--format", "xml"))


def test_report_ls(report_file):
    r = run("report", "ls", str(report_file.parent), "--json")
    assert r.returncode == 0
    rows = json.loads(r.stdout)
    assert [row["top_finding"] for row in rows] == ["critical: path.window_limited"]
    assert "not a directory" in one_line_error(run("report", "ls", str(report_file)))
