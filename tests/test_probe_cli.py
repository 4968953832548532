"""`wanprobe probe / reflect / mtu` on the command line: bad input is one line and exit != 0; a
loopback run prints the issue's JSON keys."""

import asyncio
import json
import socket
import subprocess
import sys

import pytest
from conftest import free_port

from wanprobe.errors import UsageError
from wanprobe.probe.api import run_probe
from wanprobe.probe.icmp import probe_icmp
from wanprobe.probe.tcp_connect import probe_tcp


def run(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "wanprobe", *args], capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("args, words", [
    (["probe", "no-such-host.invalid"], "unknown host"),
    (["probe", "127.0.0.1", "--dscp", "AF99"], "DSCP"),
    (["probe", "127.0.0.1", "--count", "0"], "count"),
    (["probe", "127.0.0.1", "--port", "70000"], "out of range"),
    (["probe", "127.0.0.1", "--method", "udp"], "method"),
    (["probe", "127.0.0.1", "--interval", "-1s"], "interval"),
    (["probe", "127.0.0.1", "--size", "40"], "size"),
    (["mtu", "no-such-host.invalid"], "unknown host"),
    (["reflect", "--port", "abc"], "port"),
    (["reflect", "--bind", "203.0.113.77", "--port", "8620"], "cannot listen"),
])
def test_bad_input_is_one_line(args, words):
    r = run(*args)
    assert r.returncode != 0
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr and words.lower() in lines[0].lower()




def test_reflect_and_probe_json_on_loopback():
    port = free_port()
    refl = subprocess.Popen([sys.executable, "-m", "wanprobe", "reflect", "--bind", "127.0.0.1",
                             "--port", str(port)], stderr=subprocess.PIPE, text=True)
    try:
        assert "STAMP on udp" in refl.stderr.readline()
        r = run("probe", "127.0.0.1", "--port", str(port), "--count", "20", "--interval", "5ms",
                "--dscp", "AF31", "--json")
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert set(doc["rtt_ms"]) == {"min", "p50", "p90", "p99", "max", "mean", "stdev"}
        assert {"sent", "received", "ratio", "forward_ratio", "reverse_ratio", "ci95"} <= set(doc["loss"])
        assert doc["loss"]["received"] == 20 and doc["loss"]["forward_ratio"] == 0
        assert doc["dscp"]["sent"] == 26 and doc["dscp"]["at_reflector"] == 26
        assert doc["dscp"]["returned"] == 26 and doc["dscp"]["bleached"] == "none"
        assert doc["method"] == "stamp" and doc["peer"] == "127.0.0.1"
        assert doc["started_at"].endswith("Z") and "T" in doc["started_at"]
        human = run("probe", "127.0.0.1", "--port", str(port), "--count", "3", "--interval", "5ms")
        assert human.returncode == 0 and "p99" in human.stdout
    finally:
        refl.terminate()
        _, err = refl.communicate(timeout=10)
    assert refl.returncode == 0 and "stopped" in err and "Traceback" not in err


def test_icmp_and_tcp_methods_on_loopback():
    res = run_probe("127.0.0.1", method="icmp", count=10, interval_s=0.005)
    assert res.method == "icmp" and res.loss.received == 10 and res.rtt.p50 < 50
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    try:
        port = listener.getsockname()[1]
        res = asyncio.run(probe_tcp("127.0.0.1", port=port, count=10, interval_s=0.005))
    finally:
        listener.close()
    assert res.method == "tcp" and res.loss.received == 10 and 0 < res.rtt.p50 < 50
    # closed port: the RST still answers; a refused connect is not a lost probe
    res = asyncio.run(probe_tcp("127.0.0.1", port=port, count=3, interval_s=0.005))
    assert res.loss.received == 3


def test_many_sessions_share_one_loop():
    async def many():
        return await asyncio.gather(*[probe_icmp("127.0.0.1", count=5, interval_s=0.01)
                                      for _ in range(50)])
    results = asyncio.run(many())
    assert all(r.loss.received == 5 for r in results)


def test_library_rejects_bad_arguments():
    with pytest.raises(UsageError):
        run_probe("127.0.0.1", method="carrier-pigeon")
    with pytest.raises(UsageError):
        run_probe("127.0.0.1", count=0)
    with pytest.raises(UsageError):
        run_probe("127.0.0.1", dscp=64)
