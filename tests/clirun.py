"""Run the wanprobe CLI in this process (typer's CliRunner): the same code path as the console
script (``WanprobeGroup.main``), a hundred times faster than a subprocess. One test per suite,
``tests/test_cli.py``, still runs the real entry point as a subprocess."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
from pathlib import Path

import typer.testing
from typer.testing import CliRunner

from wanprobe import cli

PREBUILT = cli.command()  # the click tree, built once (CliRunner would rebuild it per call)


_typer_get_command = typer.testing._get_command


def _get_command(app):
    """typer's runner builds the tree again on each call (65 ms); wanprobe's is built once."""
    return PREBUILT if app is cli.app else _typer_get_command(app)


typer.testing._get_command = _get_command


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


NET_FAMILIES = (socket.AF_INET, socket.AF_INET6)
NET_EVENTS = ("socket.bind", "socket.connect", "socket.sendto", "socket.sendmsg")


def _child(argv: list[str], w: int, workdir: str) -> None:
    net: list[str] = []

    def hook(event, args):
        if event in NET_EVENTS and getattr(args[0], "family", None) in NET_FAMILIES:
            net.append(f"{event} {args[1]!r}"[:120])

    sys.addaudithook(hook)
    os.chdir(workdir)  # a relative output name lands in the scratch directory
    result = CliRunner().invoke(cli.app, argv)
    exc = result.exception
    doc = {"code": result.exit_code, "stdout": result.stdout[-4000:],
           "stderr": result.stderr[-4000:], "net": net[:3],
           "exception": None if exc is None or isinstance(exc, SystemExit) else repr(exc)[:300]}
    os.write(w, json.dumps(doc).encode())


def run_forked(argv: list[str], workdir: Path, timeout_s: float = 20.0) -> dict:
    """Run ``wanprobe ARGV`` through CliRunner in a forked child (in ``workdir``), killed after
    ``timeout_s``: {"code", "stdout", "stderr", "net", "exception"} or {"timeout": timeout_s}. An audit
    hook lists the IPv4/IPv6 sockets bound, connected or sent from ("net"), so a test can assert
    that a refusal came before any network activity. Fork from a warmed process (PREBUILT run
    once) and each case costs milliseconds."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(r)
        os.setsid()
        try:
            _child(argv, w, str(workdir))
        finally:
            os._exit(0)
    os.close(w)
    chunks, timed_out = [], False
    try:
        while True:
            ready, _, _ = select.select([r], [], [], timeout_s)
            if not ready:
                timed_out = True
                break
            chunk = os.read(r, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(r)
        if timed_out:
            os.killpg(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    if timed_out:
        return {"timeout": timeout_s}
    data = b"".join(chunks)
    return json.loads(data) if data else {"no result": True}


MAX_LINE = 500  # characters in one stderr line of a refusal


def problems(doc: dict) -> str | None:
    """What is wrong with one case's outcome, or None."""
    if doc.get("timeout"):
        return f"did not finish within {doc['timeout']:g} s"
    if doc.get("no result"):
        return "the child died without a result"
    err_lines = [ln for ln in doc["stderr"].splitlines() if ln.strip()]
    out = doc["stdout"] + doc["stderr"]
    if doc["exception"]:
        return f"exception escaped: {doc['exception']}"
    if "Traceback" in out:
        return "traceback: " + doc["stderr"][-300:]
    if doc["code"] == 0:
        return "exit 0 (accepted)" + (" after network activity" if doc["net"] else "")
    if "internal error" in doc["stderr"]:
        return err_lines[0][:300]
    if len(err_lines) > 3:
        return f"{len(err_lines)} lines on stderr: " + " | ".join(err_lines[:4])[:300]
    if any(len(ln) > MAX_LINE for ln in err_lines):
        return f"a stderr line of {max(len(ln) for ln in err_lines)} characters"
    if doc["net"]:
        return f"network activity before the refusal: {doc['net'][0]}"
    return None
