"""The ring ops' gate (throughput/ring_op.py, issue 39): a reflector sends to a third host only
for an authenticated request, to an address inside its own --allow list, on its own port, within
its limits. Each refusal is one line with a reason that maps to an exit code; all of them come
before any traffic. (The ops at work, between namespaces: tests/test_ring_lab.py.)"""

from __future__ import annotations

import functools

import pytest
from reflector_helpers import Control, ServedThroughput

from wanprobe.diagnose.throughput_verdict import JUDGE
from wanprobe.errors import AuthRefused, PeerLimit, ProbeError
from wanprobe.throughput.client import run_throughput
from wanprobe.throughput.ring_op import EDGE_OP, RTT_OP, EdgeRequest, RingCall

KEY = b"ring-test-key-0123456789"
RUN = functools.partial(run_throughput, judge=JUDGE)
OTHER = "198.18.77.7"  # never sent to: every case below is refused first


def _edge(server_port: int, to: str = OTHER, **over) -> dict:
    return {"edge": {**EdgeRequest(to=to, port=server_port, duration_s=1.0).to_json(), **over}}


def test_a_reflector_without_a_key_refuses_to_send_for_anyone():
    with ServedThroughput(allow=("127.0.0.0/8", "198.18.0.0/15"), edge_runner=RUN) as server:
        with pytest.raises(AuthRefused, match="ring tests need an authenticated request"):
            RingCall("127.0.0.1", server.port, None).request(EDGE_OP, _edge(server.port), 5.0)
        assert server.refusals() == {"unauthenticated": 1}


@pytest.mark.parametrize("allow,to,why", [
    ((), OTHER, "need an --allow list"),
    (("127.0.0.0/8",), OTHER, "outside this reflector's --allow list"),
    (("127.0.0.0/8",), "127.0.0.2", "not a unicast host address"),
    (("0.0.0.0/0",), "224.0.0.1", "not a unicast host address"),
])
def test_it_sends_only_inside_its_allow_list(allow, to, why):
    with ServedThroughput(hmac_key=KEY, allow=allow, edge_runner=RUN) as server:
        with pytest.raises(AuthRefused, match=why):
            RingCall("127.0.0.1", server.port, KEY).request(EDGE_OP, _edge(server.port, to), 5.0)


def test_only_to_its_own_port_and_within_its_limits():
    with ServedThroughput(hmac_key=KEY, allow=("127.0.0.0/8", "198.18.0.0/15"),
                          max_duration_s=5.0, edge_runner=RUN) as server:
        call = RingCall("127.0.0.1", server.port, KEY)
        with pytest.raises(AuthRefused, match="not 22"):
            call.request(EDGE_OP, _edge(server.port, port=22), 5.0)
        with pytest.raises(PeerLimit, match="exceeds this reflector's limits"):
            call.request(EDGE_OP, _edge(server.port, duration_s=9.0), 5.0)
        with pytest.raises(PeerLimit, match="exceeds this reflector's limits"):
            call.request(EDGE_OP, _edge(server.port, streams=10_000), 5.0)


@pytest.mark.parametrize("over,why", [
    ({"to": "example.com"}, "literal IP address"), ({"to": None}, "literal IP address"),
    ({"port": 0}, "port must be"), ({"duration_s": "5"}, "duration_s must be"),
    ({"duration_s": float("nan")}, "duration_s must be"), ({"streams": 0}, "streams must be"),
    ({"streams": True}, "streams must be"), ({"omit_s": 1e9}, "omit_s must be"),
])
def test_a_malformed_edge_is_one_line(over, why):
    with ServedThroughput(hmac_key=KEY, allow=("127.0.0.0/8",), edge_runner=RUN) as server:
        with pytest.raises(ProbeError, match=why) as err:
            RingCall("127.0.0.1", server.port, KEY).request(EDGE_OP, _edge(server.port, **over),
                                                            5.0)
        assert "\n" not in str(err.value)


def test_a_wrong_key_and_a_bad_rtt_request_are_refused():
    with ServedThroughput(hmac_key=KEY, allow=("127.0.0.0/8",), edge_runner=RUN) as server:
        with pytest.raises(AuthRefused, match="authentication failed"):
            RingCall("127.0.0.1", server.port, b"another-key-0123456789").request(
                EDGE_OP, _edge(server.port), 5.0)
        call = RingCall("127.0.0.1", server.port, KEY)
        for body, why in (({"targets": []}, "targets must be"),
                          ({"targets": ["198.18.0.1"] * 65}, "targets must be"),
                          ({"targets": [OTHER]}, "outside this reflector's --allow list"),
                          ({"targets": [OTHER], "samples": 99}, "samples must be")):
            with pytest.raises(ProbeError, match=why):
                call.request(RTT_OP, body, 5.0)


def test_an_unkeyed_edge_request_by_hand_gets_a_refusal_line_not_traffic():
    with ServedThroughput(allow=("127.0.0.0/8",), edge_runner=RUN) as server:
        c = Control(server.port)
        assert c.hello()["op"] == "challenge"
        reply = c.send(c.op_line(EDGE_OP, **_edge(server.port)))
        c.close()
        assert reply["op"] == "refused" and reply["reason"] == "unauthenticated", reply


def test_an_unreachable_host_is_one_line():
    with pytest.raises(ProbeError, match="is `wanprobe reflect` running there"):
        RingCall("127.0.0.1", 9, KEY).request(RTT_OP, {"targets": ["198.18.0.1"]}, 2.0)
