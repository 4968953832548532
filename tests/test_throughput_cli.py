"""Bad input to `wanprobe throughput`: one line on stderr, non-zero exit, no traceback."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import threading
from pathlib import Path

import pytest
from clirun import invoke
from conftest import free_port

from wanprobe.diagnose.throughput_verdict import JUDGE
from wanprobe.errors import ProbeError, UsageError
from wanprobe.throughput.client import run_throughput
from wanprobe.throughput.server import ThroughputServer


def one_line_error(r: subprocess.CompletedProcess) -> str:
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("wanprobe: error:")
    return lines[0]




def in_process(capsys, *args: str) -> subprocess.CompletedProcess:
    """`wanprobe throughput ARGS` in process (CliRunner: the console script's code path)."""
    return invoke("throughput", *args)


def test_unknown_cc_lists_the_available_ones(capsys):
    line = one_line_error(in_process(capsys, "127.0.0.1", "--cc", "vegas-nope", "--duration", "1s"))
    available = Path("/proc/sys/net/ipv4/tcp_available_congestion_control").read_text().split()
    assert "vegas-nope" in line
    for cc in available:
        assert cc in line


@pytest.mark.parametrize("args, needle", [
    (["--window", "64KiBs"], "unknown size unit"),
    (["--window", "2GiB"], "above the limit of 1.0 GiB"),
    (["--interval", "20s", "--duration", "5s"], "at most the duration"),
    (["--max-duration", "1000h"], "above the limit of 24h"),
    (["--pacing-rate", "100"], "needs a unit"),
    (["--udp", "--rate", "50"], "needs a unit"),
    (["--duration", "90s"], "exceeds the cap"),
    (["--duration", "5s", "--max-duration", "2s"], "exceeds the cap"),
    (["--reverse", "--bidir"], "mutually exclusive"),
    (["--udp"], "--rate"),
    (["--engine", "netperf"], "unknown engine"),
    (["--dscp", "XX"], "DSCP"),
    (["--streams", "0"], "--streams"),
])
def test_bad_options_give_one_line(capsys, args, needle):
    line = one_line_error(in_process(capsys, "127.0.0.1", "--port", str(free_port()), *args))
    assert needle in line


def test_peer_not_listening_is_one_line_probe_error():
    r = invoke("throughput", "127.0.0.1", "--port", str(free_port()), "--duration", "1s")
    line = one_line_error(r)
    assert "connection refused" in line and r.returncode == ProbeError.exit_code


def test_library_raises_usage_error_before_connecting():
    with pytest.raises(UsageError):
        run_throughput("127.0.0.1", port=free_port(), duration_s=120, max_duration_s=60,
                       judge=JUDGE)


@pytest.fixture
def loopback_server():
    """A ThroughputServer with a 2 s / 1 MB limit on loopback, in a background event loop."""
    server = ThroughputServer(max_duration_s=2.0, max_bytes=10**6)
    loop = asyncio.new_event_loop()
    started = threading.Event()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(server.start("127.0.0.1", 0))
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert started.wait(5)
    yield server
    asyncio.run_coroutine_threadsafe(server.close(), loop).result(5)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def test_server_refuses_tests_beyond_its_limits(capsys, loopback_server):
    port = str(loopback_server.port)
    line = one_line_error(in_process(capsys, "127.0.0.1", "--port", port, "--duration", "3s"))
    assert "refused the test" in line and "limit of 2 s" in line
    line = one_line_error(in_process(capsys, "127.0.0.1", "--port", port, "--duration", "1s",
                                     "--max-bytes", "5MB"))
    assert "refused the test" in line and "byte cap" in line


def test_byte_cap_stops_the_sender(loopback_server):
    """Loopback moves far more than 1 MB in 2 s: every stream stops at exactly its share."""
    for streams in (1, 4):
        r = run_throughput("127.0.0.1", port=loopback_server.port, duration_s=2.0,
                           max_bytes=10**6, streams=streams, judge=JUDGE)
        assert not r.partial, r.partial_reason
        assert [s.bytes_sent for s in r.streams] == [10**6 // streams] * streams
        assert r.bytes_received == r.bytes_sent


_HELLO_V2 = b'WPTC{"op":"hello","version":2,"nonce":"' + b"00" * 16 + b'"}\n'


def test_server_survives_malformed_clients(loopback_server):
    port = loopback_server.port
    for raw in (b"GET / HTTP/1.0\r\n\r\n", b"WPTD" + b"\0" * 11,
                _HELLO_V2 + b'{"op":"test","test":{"duration_s":"ten"}}\n',
                _HELLO_V2 + b'{"op":"test","test":{"duration_s":1,"streams":"x"}}\n',
                b"WPTCnot json\n"):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            try:
                s.sendall(raw)
                s.shutdown(socket.SHUT_WR)
                reply = s.makefile("rb").read()
            except OSError:  # reset/ENOTCONN: the server dropped a garbage connection early;
                reply = b""  # fine, as long as it still serves afterwards (checked below)
        if b'"test"' in raw:
            assert b'"refused"' in reply and b"malformed" in reply
    r = run_throughput("127.0.0.1", port=port, duration_s=1.0, max_bytes=10**6, judge=JUDGE)
    assert r.bytes_received > 0 and not r.partial


def test_window_capped_by_rmem_max_is_reported(loopback_server):
    rmem_max = int(Path("/proc/sys/net/core/rmem_max").read_text())
    r = run_throughput("127.0.0.1", port=loopback_server.port, duration_s=0.5, max_bytes=10**6,
                       window_bytes=4 * rmem_max, judge=JUDGE)
    assert any("rmem_max" in note for note in r.notes)
    small = run_throughput("127.0.0.1", port=loopback_server.port, duration_s=0.5,
                           max_bytes=10**6, window_bytes=64 * 1024, judge=JUDGE)
    # no window note (a CPU-steal note may come from the host: not about the window)
    assert not [n for n in small.notes if not n.startswith("CPU steal:")], small.notes


def test_bare_window_is_bytes_as_in_iperf3(capsys, loopback_server):
    """Issue 12: `--window 131072` is 131072 bytes (iperf3's -w), not refused for lack of a unit;
    the JSON result carries the window the test asked for."""
    import json

    r = in_process(capsys, "127.0.0.1", "--port", str(loopback_server.port), "--duration", "0.5s",
                   "--max-bytes", "1MB", "--window", "131072", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["window_bytes"] == 131072, {k: v for k, v in doc.items() if "window" in k}
