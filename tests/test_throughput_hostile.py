"""Issue 19 on the throughput server (loopback, no namespace): a reverse test whose client stops
reading ends and frees its sockets (break 4), ``--dscp 56`` is refused by the reflector's DSCP
policy (break 6), request fields are typed (break 8: ``duration 1e-300``, ``"5"``, ``true``),
an authentication refusal is not "peer unreachable" (break 8), and the accept loop backs off
with one log line when the process is out of file descriptors (break 5)."""

from __future__ import annotations

import socket
import subprocess
import time

import pytest
from clirun import invoke
from reflector_helpers import KEY, Control, ServedThroughput, request_body

from wanprobe.probe.access import DscpPolicy
from wanprobe.throughput import protocol as proto


def server_sockets(port: int) -> list[str]:
    """Server-side TCP sockets of ``port`` that still hold a connection or unsent data
    (``ss``: established, closing with a send queue), the listener excluded."""
    out = subprocess.run(["ss", "-tanH", f"( sport = :{port} )"], capture_output=True,
                         text=True, check=True).stdout.splitlines()
    return [ln for ln in out if ln.split()[0] not in ("LISTEN", "FIN-WAIT-2", "TIME-WAIT")]


@pytest.mark.lab
def test_reverse_test_whose_client_stops_reading_ends_and_frees_its_sockets(monkeypatch):
    from wanprobe.throughput import stall

    monkeypatch.setattr(stall, "STALL_S", 0.5)
    with ServedThroughput(max_duration_s=30.0) as server:
        c = Control(server.port)
        c.hello()
        reply = c.send(c.op_line("test", test=request_body(duration_s=20.0, streams=4,
                                                            reverse=True, max_bytes=2**30)))
        assert reply["op"] == "accepted", reply
        cookie = bytes.fromhex(reply["cookie"])
        data = []
        for i in range(4):  # connected, never read: the server's sends fill every buffer
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect(("127.0.0.1", server.port))
            s.sendall(proto.pack_data_header(cookie, i, proto.DOWN))
            data.append(s)
        assert c.read()["op"] == "ready"
        c.sock.sendall(proto.encode("start"))
        t0 = time.monotonic()
        while time.monotonic() - t0 < 10.0 and (server_sockets(server.port) or server._tests):
            time.sleep(0.2)
        held = server_sockets(server.port)
        took = time.monotonic() - t0
        assert not held and not server._tests, (
            f"a 20 s test whose client stopped reading still holds {len(held)} sockets "
            f"after {took:.1f} s: {held}")
        assert server._connections == 0
        # the slot is free: the next client's test runs
        c2 = Control(server.port)
        c2.hello()
        assert c2.send(c2.op_line("test", test=request_body(duration_s=0.2)))["op"] == "accepted"
        for s in data + [c.sock, c2.sock]:
            s.close()


@pytest.mark.parametrize("fields,says", [
    ({"duration_s": 1e-300}, "duration"), ({"duration_s": "5"}, "duration_s must be a number"),
    ({"duration_s": True}, "duration_s must be a number"), ({"streams": "5"}, "streams must be an integer"),
    ({"streams": 2.0}, "streams must be an integer"), ({"reverse": 1}, "reverse must be a boolean"),
    ({"max_bytes": True}, "max_bytes must be an integer"), ({"cc": 5}, "cc must be a string"),
])
def test_request_fields_must_have_their_types(fields, says):
    with ServedThroughput(max_duration_s=5.0) as server:
        c = Control(server.port)
        c.hello()
        reply = c.send(c.op_line("test", test=request_body(**fields)))
        c.close()
        assert reply["op"] == "refused" and says in reply["error"], reply


def _cli(*args: str) -> subprocess.CompletedProcess:
    return invoke(*args)  # in process: the console script's code path (clirun)


def test_dscp_56_is_refused_by_the_reflectors_policy_with_its_own_exit_code():
    with ServedThroughput(max_duration_s=5.0) as server:
        r = _cli("throughput", "127.0.0.1", "--port", str(server.port), "--duration", "1s",
                 "--dscp", "56")
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 8 and len(lines) == 1 and "CS7" in lines[0], r.stderr
        assert server.refusals() == {"dscp": 1}
    allowed = DscpPolicy(frozenset(range(64)))  # the operator allows it: --cos-dscp CS7
    with ServedThroughput(max_duration_s=5.0, dscp_permitted=allowed) as server:
        r = _cli("throughput", "127.0.0.1", "--port", str(server.port), "--duration", "0.5s",
                 "--max-bytes", "1MB", "--dscp", "56", "--json")
        assert r.returncode == 0, r.stderr


def test_an_authentication_refusal_is_not_peer_unreachable():
    with ServedThroughput(hmac_key=KEY) as server:
        r = _cli("throughput", "127.0.0.1", "--port", str(server.port), "--duration", "1s")
        assert r.returncode == 7 and "requires authentication" in r.stderr, r.stderr
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    r = _cli("throughput", "127.0.0.1", "--port", str(closed), "--duration", "1s")
    assert r.returncode == 5, r.stderr  # nothing listens: unreachable


@pytest.mark.lab
def test_accept_loop_backs_off_with_one_line_when_out_of_descriptors():
    from fd_starved import flooded_stderr

    err = flooded_stderr("""
        from wanprobe.throughput.server import ThroughputServer
        srv = ThroughputServer()
        await srv.start("127.0.0.1", 0)
        port = srv.port
    """, connections=150)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err, err[-500:]
    assert len(lines) == 1, err[-500:]  # one line a minute per listener, with the count
    assert "accept failed" in lines[0] and "Too many open files" in lines[0], lines
