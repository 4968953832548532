"""`wanprobe probe / reflect / mtu` on the command line: bad input is one line and exit != 0; a
loopback run prints the issue's JSON keys."""

import asyncio
import json
import socket
import subprocess
import sys

import pytest
from clirun import invoke, one_line_error
from conftest import free_port

from wanprobe.errors import UsageError
from wanprobe.probe.api import run_probe
from wanprobe.probe.icmp import probe_icmp
from wanprobe.probe.tcp_connect import probe_tcp


@pytest.mark.parametrize("args, words", [
    (["probe", "no-such-host.invalid"], "unknown host"),
    (["probe", "127.0.0.1", "--dscp", "AF99"], "DSCP"),
    (["probe", "127.0.0.1", "--dscp", "CS7"], "network-control DSCP"),  # issue 37: 48-63
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
    assert words.lower() in one_line_error(invoke(*args)).lower()


def test_nothing_answered_exits_1_and_says_port_unreachable():
    """As ping(8): exit 1 when no probe was answered. A closed UDP port draws ICMP port
    unreachable, and the line says so (the JSON result is still printed)."""
    closed = free_port()
    r = invoke("probe", "127.0.0.1", "--port", closed, "--count", "3", "--interval", "10ms",
               "--timeout", "300ms", "--json")
    line = one_line_error(r)
    assert r.returncode == 1 and "port unreachable (ICMP error)" in line, line
    assert json.loads(r.stdout)["loss"]["received"] == 0


def test_nothing_answered_from_a_silent_port_says_no_reply_and_names_the_key(tmp_path):
    """A bound UDP socket that never answers: no ICMP error comes back, so "no reply", with the
    likely cause of a STAMP port's silence (a reflector in authenticated mode drops unsigned
    probes, RFC 8762 §4.4); with a key, that the key may not match (issue 36)."""
    key = tmp_path / "key"
    key.write_text("0123456789abcdef-silent\n")
    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    silent.bind(("127.0.0.1", 0))
    port = silent.getsockname()[1]
    try:
        r = invoke("probe", "127.0.0.1", "--port", port, "--count", "2", "--interval", "10ms",
                   "--timeout", "300ms")
        keyed = invoke("probe", "127.0.0.1", "--port", port, "--count", "2", "--interval", "10ms",
                       "--timeout", "300ms", "--hmac-key-file", str(key))
    finally:
        silent.close()
    line = one_line_error(r)
    assert r.returncode == 1 and "ICMP" not in line, line
    assert line.endswith(f"no reply from 127.0.0.1 port {port}: if its reflector runs with "
                         "--hmac-key-file, pass the same key (--hmac-key-file); else the "
                         "reflector is down or the probes are filtered"), line
    assert "sent / received" in r.stdout  # the table is still printed, as ping prints its summary
    line = one_line_error(keyed)
    assert keyed.returncode == 1 and "to authenticated probes: the key may not match" in line


@pytest.mark.parametrize("args, limit", [
    (["--count", str(10**12)], "1,000,000 probes"),
    (["--duration", "1000h"], "24h"),
    (["--size", "65536"], "65535"),
    (["--size", "70000"], "65535"),
])
def test_absurd_runs_are_refused_up_front_with_the_limit(args, limit):
    line = one_line_error(invoke("probe", "127.0.0.1", "--port", free_port(), *args))
    assert "limit" in line and limit in line, line




def test_reflect_and_probe_json_on_loopback():
    port = free_port()
    refl = subprocess.Popen([sys.executable, "-m", "wanprobe", "reflect", "--bind", "127.0.0.1",
                             "--port", str(port)], stderr=subprocess.PIPE, text=True)
    try:
        assert "STAMP on udp" in refl.stderr.readline()
        r = invoke("probe", "127.0.0.1", "--port", str(port), "--count", "20", "--interval", "5ms",
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
        human = invoke("probe", "127.0.0.1", "--port", str(port), "--count", "3", "--interval", "5ms")
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
