"""Issue 19 on the throughput server (loopback, no namespace): a reverse test whose client stops
reading ends and frees its sockets (break 4), a DSCP outside the reflector's policy is refused
(break 6) and network control is never sent (issue 37), request fields are typed (break 8:
``duration 1e-300``, ``"5"``, ``true``), an authentication refusal is not "peer unreachable"
(break 8), and the accept loop backs off with one log line when the process is out of file
descriptors (break 5)."""

from __future__ import annotations

import socket
import subprocess
import time

import pytest
from clirun import invoke
from reflector_helpers import KEY, Control, ServedThroughput, request_body

from wanprobe.probe.access import DscpPolicy
from wanprobe.throughput import protocol as proto
from wanprobe.units import parse_dscp


def server_sockets(port: int) -> list[str]:
    """Server-side TCP sockets of ``port`` that still hold a connection or unsent data
    (``ss``: established, closing with a send queue), the listener excluded."""
    out = subprocess.run(["ss", "-tanH", f"( sport = :{port} )"], capture_output=True,
                         text=True, check=True).stdout.splitlines()
    return [ln for ln in out if ln.split()[0] not in ("LISTEN", "FIN-WAIT-2", "TIME-WAIT")]


def reverse_never_read(port: int, *, duration_s: float, streams: int, max_bytes: int):
    """A reverse test started whose data connections are connected and never read (the
    server's sends fill every buffer): the control connection and the data sockets."""
    c = Control(port)
    c.hello()
    reply = c.send(c.op_line("test", test=request_body(duration_s=duration_s, streams=streams,
                                                        reverse=True, max_bytes=max_bytes)))
    assert reply["op"] == "accepted", reply
    cookie = bytes.fromhex(reply["cookie"])
    data = []
    for i in range(streams):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", port))
        s.sendall(proto.pack_data_header(cookie, i, proto.DOWN))
        data.append(s)
    assert c.read()["op"] == "ready"
    c.sock.sendall(proto.encode("start"))
    return c, data


@pytest.mark.lab
def test_reverse_test_whose_client_stops_reading_ends_and_frees_its_sockets(monkeypatch):
    from wanprobe.throughput import stall

    monkeypatch.setattr(stall, "STALL_S", 0.5)
    with ServedThroughput(max_duration_s=30.0) as server:
        c, data = reverse_never_read(server.port, duration_s=20.0, streams=4, max_bytes=2**30)
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


def test_a_dscp_the_reflectors_policy_refuses_has_its_own_exit_code():
    no_ef = DscpPolicy(frozenset(range(64)) - {46})  # the operator's --cos-dscp leaves EF out
    with ServedThroughput(max_duration_s=5.0, dscp_permitted=no_ef) as server:
        r = _cli("throughput", "127.0.0.1", "--port", str(server.port), "--duration", "1s",
                 "--dscp", "EF")
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 8 and len(lines) == 1 and "EF" in lines[0], r.stderr
        assert server.refusals() == {"dscp": 1}


@pytest.mark.parametrize("dscp", ["63", "CS7", "49"])
def test_network_control_dscp_is_never_sent(dscp):
    """Issue 37: ``throughput --dscp 63`` ran (exit 0). DSCP 48-63 (IP precedence 6/7, RFC 791,
    RFC 2474 §4.2.2.2) is refused by this host before it connects (exit 2, one line), even to a
    server that allows it; a server under the default policy refuses such a request itself."""
    allowed = DscpPolicy(frozenset(range(64)))
    with ServedThroughput(max_duration_s=5.0, dscp_permitted=allowed) as server:
        r = _cli("throughput", "127.0.0.1", "--port", str(server.port), "--duration", "0.5s",
                 "--max-bytes", "1MB", "--dscp", dscp)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and "network-control" in lines[0], r.stderr
        assert dscp in lines[0] and "Traceback" not in r.stderr
        assert server.refusals() == {}
    with ServedThroughput(max_duration_s=5.0) as server:
        c = Control(server.port)
        c.hello()
        reply = c.send(c.op_line("test", test=request_body(dscp=parse_dscp(dscp))))
        c.close()
        assert reply["op"] == "refused" and "not permitted" in reply["error"], reply


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
