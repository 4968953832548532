"""The data worker processes on loopback: a worker that dies mid-test gives a partial result
naming it, not a hang or a traceback; none outlives its test."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import psutil
import pytest
from conftest import free_port
from test_throughput_cli import loopback_server  # noqa: F401  (a fixture)

from wanprobe.diagnose.throughput_verdict import JUDGE
from wanprobe.errors import ProbeError
from wanprobe.throughput import server as server_mod
from wanprobe.throughput.client import run_throughput
from wanprobe.throughput.datapath_pool import available_cores, worker_count


def _workers(proc: psutil.Process, recursive: bool = False) -> list[psutil.Process]:
    """``proc``'s data-worker children that run (a zombie's cmdline raises: left out)."""
    out = []
    for c in proc.children(recursive=recursive):
        try:
            if "datapath_worker" in " ".join(c.cmdline()):
                out.append(c)
        except psutil.Error:
            pass
    return out


def test_worker_count_follows_cores_and_cpus():
    assert worker_count(1) == 1
    assert worker_count(64) == min(64, available_cores())
    assert worker_count(64, cpus=1) == 1
    assert worker_count(3, cpus=1000) == min(3, available_cores())


@pytest.mark.lab
def test_a_worker_killed_mid_test_gives_a_partial_result_naming_it():
    """Adds ~3 s (a 2 s loopback test)."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "wanprobe.throughput.server_cli", "--bind",
                               "127.0.0.1", "--port", str(port), "--max-bytes", str(2**40)],
                              stdout=subprocess.PIPE, text=True)
    me = psutil.Process()
    out: dict = {}
    try:
        assert "listening" in server.stdout.readline()
        client = threading.Thread(target=lambda: out.setdefault("r", run_throughput(
            "127.0.0.1", port=port, duration_s=2, streams=2, max_bytes=2**40, judge=JUDGE)))
        client.start()
        deadline = time.monotonic() + 20
        while not (mine := _workers(me)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert mine, "the client started no data workers"
        # data flowing: the worker's sendfile() calls count in its write_chars (do_sendfile)
        while mine[0].io_counters().write_chars < 10**7 and time.monotonic() < deadline:
            time.sleep(0.02)
        theirs = _workers(psutil.Process(server.pid))
        assert len(theirs) == worker_count(2)
        mine[0].kill()
        client.join(60)
        assert not client.is_alive()
        r = out["r"]
        assert r.partial and "data worker exited unexpectedly" in r.partial_reason
        assert r.bytes_received > 0  # what the other streams moved is kept
        assert _workers(me) == []
        _, alive = psutil.wait_procs(theirs, timeout=10)  # the server's end reaps its own
        assert alive == []
    finally:
        server.kill()
        server.wait(5)


def test_server_that_cannot_start_workers_refuses_in_one_line(
        monkeypatch, loopback_server):  # noqa: F811  (the fixture imported above)
    """A fork that fails (EAGAIN under a task limit) is a refusal the client can read."""
    def no_workers(count):
        raise ProbeError("cannot start the data workers: Resource temporarily unavailable")

    monkeypatch.setattr(server_mod, "DataWorkers", no_workers)
    with pytest.raises(ProbeError, match="refused the test: server: cannot start the data"):
        run_throughput("127.0.0.1", port=loopback_server.port, duration_s=1, max_bytes=10**6,
                       judge=JUDGE)
    assert loopback_server.refusals().get("busy") == 1
