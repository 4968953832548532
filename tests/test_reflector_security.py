"""The throughput control channel assumes a hostile client (issue 14): one key for STAMP and
throughput (challenge-response, no key on the wire, replays fail), every request field
range-checked with a line naming the limit, the test slot cannot be held, a client that does not
read cannot grow the server. Real sockets on loopback against a real server."""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys
import threading
import time

import pytest
from reflector_helpers import KEY, Control, ServedThroughput, request_body

from wanprobe.diagnose.throughput_verdict import JUDGE
from wanprobe.errors import ProbeError
from wanprobe.throughput import auth
from wanprobe.throughput import protocol as proto
from wanprobe.throughput.client import run_throughput
from wanprobe.throughput.limits import ServerLimits, request_refusal

WRONG_KEY = b"fedcba9876543210-not-the-key"


def quick(port: int, **kw):
    return run_throughput("127.0.0.1", port=port, duration_s=0.5, max_bytes=2 * 10**6, **kw,
                          judge=JUDGE)


def test_keyed_server_serves_keyed_client_and_refuses_the_others():
    with ServedThroughput(hmac_key=KEY) as server:
        r = quick(server.port, hmac_key=KEY)
        assert not r.partial and r.bytes_received > 0
        with pytest.raises(ProbeError, match="requires authentication"):
            quick(server.port)
        with pytest.raises(ProbeError, match="authentication failed"):
            quick(server.port, hmac_key=WRONG_KEY)
        assert server.refusals() == {"unauthenticated": 1, "bad_key": 1}
        r = quick(server.port, hmac_key=KEY)  # refusals leave the server serving
        assert not r.partial and r.bytes_received > 0


def test_no_key_on_the_wire_and_a_replayed_handshake_is_refused():
    """A recorded hello + signed request, replayed byte for byte on a new connection, carries a
    MAC over the old server nonce: refused, and the key itself never appears in the bytes."""
    with ServedThroughput(hmac_key=KEY) as server:
        first = Control(server.port)
        hello_bytes = proto.MAGIC_CONTROL + proto.encode(
            "hello", version=proto.VERSION, nonce=first.client_nonce.hex())
        assert first.hello()["auth"] is True
        request = first.op_line("test", KEY, test=request_body(duration_s=0.3))
        reply = first.send(request)
        assert reply["op"] == "accepted"
        assert auth.verify_accept(KEY, first.server_nonce, first.client_nonce, reply)
        first.close()
        assert KEY not in hello_bytes + request and KEY.hex().encode() not in request
        replay = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        try:
            replay.sendall(hello_bytes + request)
            lines = replay.makefile("rb").read().splitlines()
        finally:
            replay.close()
        assert [proto.decode(x)["op"] for x in lines] == ["challenge", "refused"]
        assert b"authentication failed" in lines[1]
        assert server.refusals().get("bad_key") == 1


def test_accepted_reply_is_bound_to_the_client_nonce():
    """The server's proof cannot be replayed to another client either."""
    sn, cn = b"s" * 16, b"c" * 16
    msg = auth.sign_accept(KEY, sn, cn, {"op": "accepted", "cookie": "00" * 8})
    assert auth.verify_accept(KEY, sn, cn, msg)
    assert not auth.verify_accept(KEY, sn, b"d" * 16, msg)
    assert not auth.verify_accept(WRONG_KEY, sn, cn, msg)
    assert not auth.verify_request(KEY, sn, cn, msg)  # a server proof is not a client request


def test_keyed_client_will_not_test_against_an_unkeyed_server():
    with ServedThroughput() as server:
        with pytest.raises(ProbeError, match="does not authenticate"):
            quick(server.port, hmac_key=KEY)


def test_old_protocol_gets_one_clear_line():
    with ServedThroughput() as server:
        c = Control(server.port)
        reply = c.send(proto.MAGIC_CONTROL + proto.encode(
            "hello", version=1, test=request_body()))
        c.close()
        assert reply["op"] == "refused"
        assert "protocol v1" in reply["error"] and f"v{proto.VERSION}" in reply["error"]
        assert "\n" not in reply["error"]
        assert server.refusals() == {"old_protocol": 1}


HOSTILE = [
    ({"window_bytes": 2**62}, "window_bytes"),
    ({"pacing_rate_bps": 1e300}, "pacing_rate_bps"),
    ({"udp": True, "udp_rate_bps": -1e6}, "udp_rate_bps"),
    ({"udp": True, "udp_rate_bps": math.nan}, "udp_rate_bps"),
    ({"udp": True, "udp_rate_bps": 1e6, "interval_s": 1e9}, "interval_s"),
    ({"udp": True, "udp_rate_bps": 1e6, "interval_s": 1e-9}, "interval_s"),
    ({"interval_s": math.inf}, "interval_s"),
    ({"duration_s": 60.0}, "max_duration"),
    ({"duration_s": math.nan}, "duration"),
    ({"streams": 10**40}, "max_streams"),
    ({"max_bytes": 2**62}, "max_bytes_per_test"),
    ({"dscp": 64}, "dscp"),
    ({"cc": "x" * 5000}, "congestion control"),
]


@pytest.mark.parametrize(("fields", "named"), HOSTILE, ids=[h[1] + str(i) for i, h in enumerate(HOSTILE)])
def test_every_numeric_field_is_range_checked_with_a_line_naming_it(fields, named):
    with ServedThroughput(max_duration_s=5.0, max_bytes=10**7) as server:
        c = Control(server.port)
        c.hello()
        reply = c.send(c.op_line("test", test=request_body(**fields)))
        c.close()
        assert reply["op"] == "refused", reply
        assert named in reply["error"] and len(reply["error"]) < 200, reply["error"]
        assert server.refusals() == {"over_limit": 1}
        assert not quick(server.port).partial  # and the server still serves


def test_limits_are_pure_and_name_the_limit():
    lim = ServerLimits(max_duration_s=10.0, max_streams=4)
    assert request_refusal(proto.TestRequest(duration_s=5.0, streams=4), lim) is None
    assert "max_streams" in request_refusal(proto.TestRequest(duration_s=5.0, streams=5), lim)


def test_disabled_server_refuses_everything_and_quota_counts_per_client():
    with ServedThroughput(limits=ServerLimits(enabled=False)) as server:
        with pytest.raises(ProbeError, match="disabled"):
            quick(server.port)
    with ServedThroughput(limits=ServerLimits(tests_per_hour_per_client=2)) as server:
        quick(server.port)
        quick(server.port)
        with pytest.raises(ProbeError, match="tests_per_hour_per_client"):
            quick(server.port)
        assert server.refusals() == {"quota": 1}


def test_daily_byte_budget_caps_and_then_refuses():
    with ServedThroughput(limits=ServerLimits(bytes_per_day_per_client=3 * 10**6)) as server:
        r = run_throughput("127.0.0.1", port=server.port, duration_s=1.0, max_bytes=2 * 10**6,
                           judge=JUDGE)
        assert r.bytes_received == 2 * 10**6
        r = run_throughput("127.0.0.1", port=server.port, duration_s=1.0, max_bytes=2 * 10**6,
                           judge=JUDGE)
        assert r.bytes_received == 10**6  # held to what was left of the day's budget
        with pytest.raises(ProbeError, match="bytes_per_day_per_client"):
            quick(server.port)


def _accepted_then_gone(port: int, **fields) -> None:
    c = Control(port)
    c.hello()
    assert c.send(c.op_line("test", test=request_body(**fields)))["op"] == "accepted"
    c.close()


def _busy_for_s(port: int, limit_s: float = 4.0) -> float:
    """Seconds until the server accepts a new test (the slot was freed)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        c = Control(port)
        c.hello()
        reply = c.send(c.op_line("test", test=request_body(duration_s=0.2)))
        c.close()
        if reply["op"] == "accepted":
            return time.monotonic() - t0
        assert "busy" in reply["error"]
        time.sleep(0.05)
    raise AssertionError(f"the test slot was still held after {limit_s} s")


@pytest.mark.parametrize("fields", [{"udp": True, "udp_rate_bps": 1e6, "duration_s": 4.0},
                                    {"streams": 4, "duration_s": 4.0}], ids=["udp", "tcp"])
def test_the_slot_is_freed_when_the_client_goes(fields):
    """Accepted, then the client closes before its data connections / datagrams: the slot is
    free again at once, not after the 10 s setup timeout the server used to wait out."""
    with ServedThroughput(max_duration_s=5.0) as server:
        _accepted_then_gone(server.port, **fields)
        assert _busy_for_s(server.port) < 4.0


def test_a_client_that_does_not_read_its_reports_is_cut_off():
    """The server's queue of unsent report lines is bounded: once a client has let
    MAX_UNSENT_REPORT_BYTES pile up, its test is aborted and nothing more is queued."""
    import threading

    from wanprobe.throughput import server as srv

    class Transport:
        def __init__(self) -> None:
            self.size = 0

        def get_write_buffer_size(self) -> int:
            return self.size

    class Writer:
        def __init__(self) -> None:
            self.transport, self.lines = Transport(), []

        def write(self, line: bytes) -> None:
            self.lines.append(line)
            self.transport.size += len(line)

    class Test:
        abort = threading.Event()

    writer, test = Writer(), Test()
    line = b"x" * 1000 + b"\n"
    for _ in range(10 * srv.MAX_UNSENT_REPORT_BYTES // len(line)):
        srv.ThroughputServer._report(None, test, writer, line)
    assert test.abort.is_set()
    assert writer.transport.size <= srv.MAX_UNSENT_REPORT_BYTES + len(line)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "wanprobe", *args], capture_output=True,
                          text=True, timeout=60)


def test_cli_refusals_are_one_line(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_bytes(KEY)
    wrong_file = tmp_path / "wrong"
    wrong_file.write_bytes(WRONG_KEY)
    with ServedThroughput(hmac_key=KEY) as server:
        port = str(server.port)
        for extra, says in (((), "requires authentication"),
                            (("--hmac-key-file", str(wrong_file)), "authentication failed")):
            r = _cli("throughput", "127.0.0.1", "--port", port, "--duration", "1s", *extra)
            lines = r.stderr.strip().splitlines()
            assert r.returncode != 0 and len(lines) == 1 and says in lines[0], r.stderr
        r = _cli("throughput", "127.0.0.1", "--port", port, "--duration", "1s",
                 "--max-bytes", "1MB", "--hmac-key-file", str(key_file), "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["bytes_received"] == 10**6


def test_new_client_against_an_old_server_says_so_in_one_line():
    """A v1 server answers a v2 hello with its generic refusal; the client names the cause."""
    lsock = socket.create_server(("127.0.0.1", 0))
    port = lsock.getsockname()[1]

    def old_server() -> None:
        conn, _ = lsock.accept()
        with conn:
            conn.makefile("rb").readline()
            conn.sendall(b'{"op":"refused","error":"unsupported protocol version"}\n')

    t = threading.Thread(target=old_server, daemon=True)
    t.start()
    try:
        with pytest.raises(ProbeError, match="older wanprobe.*upgrade"):
            quick(port)
    finally:
        t.join(5)
        lsock.close()


@pytest.mark.slow
def test_udp_test_whose_client_never_reads_stays_small_and_ends():
    """The issue's memory attack at the smallest interval the server now allows (1e-9 is
    refused above): a UDP test at 0.1 s reports whose client floods datagrams and never reads
    its control connection. The server process stays far under 200 MiB and frees the slot
    when the test's duration (plus the udp_done grace) is over."""
    import psutil
    from conftest import free_port

    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "wanprobe.throughput.server", "--bind",
                               "127.0.0.1", "--port", str(port), "--max-duration", "3"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert "listening" in server.stdout.readline()
        proc = psutil.Process(server.pid)
        c = Control(port)
        c.hello()
        c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        reply = c.send(c.op_line("test", test=request_body(
            duration_s=3.0, udp=True, udp_rate_bps=1e9, interval_s=0.1, max_bytes=10**9)))
        assert reply["op"] == "accepted", reply
        assert c.read()["op"] == "ready"
        c.sock.sendall(proto.encode("start"))
        cookie = bytes.fromhex(reply["cookie"])
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        u.connect(("127.0.0.1", port))
        t0, peak, seq = time.monotonic(), 0, 0
        while time.monotonic() - t0 < 3.0:
            for _ in range(200):
                u.send(proto.pack_udp_header(cookie, seq, time.monotonic_ns()) + bytes(1372))
                seq += 1
            peak = max(peak, proc.memory_info().rss)
        u.close()
        freed_s = _busy_for_s(port, limit_s=12.0)
        peak = max(peak, proc.memory_info().rss)
        c.close()
        print(f"no-read UDP client: {seq} datagrams sent, server peak RSS "
              f"{peak / 2**20:.1f} MiB, slot free {freed_s:.1f} s after the flood")
        assert peak < 200 * 2**20
    finally:
        server.kill()
        server.wait(5)


def test_host_facts_are_served_only_through_the_gate():
    """The read-only host description (issue 13) is one more op behind the key: a keyed client
    gets it (the reply's MAC checked), an unkeyed or wrong-key client is refused and counted."""
    from wanprobe.throughput import host_facts_op

    with ServedThroughput(hmac_key=KEY) as server:
        facts = host_facts_op.fetch("127.0.0.1", server.port, hmac_key=KEY)
        assert facts.tcp_rmem_bytes is not None
        with pytest.raises(ProbeError, match="sent no host facts .*requires authentication"):
            host_facts_op.fetch("127.0.0.1", server.port)
        with pytest.raises(ProbeError, match="sent no host facts .*authentication failed"):
            host_facts_op.fetch("127.0.0.1", server.port, hmac_key=WRONG_KEY)
        refused = server.refusals()
        assert refused.get("unauthenticated", 0) >= 1 and refused.get("bad_key", 0) >= 1
