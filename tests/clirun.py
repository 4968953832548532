"""Run the wanprobe CLI in this process (typer's CliRunner): the same code path as the console
script (``WanprobeGroup.main``), a hundred times faster than a subprocess. One test per suite,
``tests/test_cli.py``, still runs the real entry point as a subprocess."""

from __future__ import annotations

import subprocess

from typer.testing import CliRunner

from wanprobe import cli


def invoke(*args: str) -> subprocess.CompletedProcess:
    """Run ``wanprobe ARGS`` in process; the result looks like ``subprocess.run``'s."""
    result = CliRunner().invoke(cli.app, [str(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception  # an escaped exception is a test failure with its traceback
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


def one_line_error(r: subprocess.CompletedProcess) -> str:
    """The single stderr line of a failed run (asserting there is exactly one, no traceback)."""
    assert r.returncode != 0, r.stdout
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("wanprobe: error:"), lines[0]
    return lines[0]
