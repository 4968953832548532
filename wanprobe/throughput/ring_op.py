"""The ring ops: a reflector sends to its ring neighbour, or times its connections to the other
hosts of a ring, for the host that runs ``wanprobe ring`` (issue 39).

Wire (protocol.py control channel, after the gate's hello/challenge, gate.py):
- ``ring_edge{edge: {to, port, duration_s, streams, omit_s, interval_s}}``: this reflector runs
  a throughput test (throughput/client.py) to ``to`` and answers one signed line
  ``ring_result{result: <ThroughputResult JSON>}`` when it ends. The requester closing its
  control connection stops the test within ~0.1 s (``run_throughput(cancel=)``), so an
  interrupted ring leaves nothing sending.
- ``ring_rtt{targets: [address, ...], samples}``: the TCP handshake time to each target's port
  (the kernel's SYN → SYN-ACK, the minimum of ``samples``), answered as one signed line
  ``ring_rtt{rtt_ms: {address: ms | null}}``; what clusters a ring's hosts into sites.

A reflector is a host the operator lets others test against, not a traffic generator anyone can
aim: it sends for a ring only (1) to a request that passed the HMAC gate — a reflector without
a key refuses the ops, (2) to a literal unicast address inside its own ``--allow`` list (which
must exist), on its own port (no other service of an allowed host), (3) within its ``[throughput]`` limits (enabled, duration, streams, bytes, the
requester's hourly and daily quota), (4) one ring edge at a time. Each refusal is one line with
a reason the client maps to an exit code (gate.refusal_error).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import math
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from wanprobe.errors import ProbeError, WanprobeError
from wanprobe.probe.access import AllowList
from wanprobe.throughput import protocol as proto
from wanprobe.throughput.gate import Refused, Session
from wanprobe.throughput.limits import Quota, ServerLimits

# throughput/client.run_throughput with the composing layer's judge bound (services/reflect.py):
# handed to the server, so this package's server never imports its client
EdgeRunner = Callable[..., Any]


class ThroughputServer(Protocol):
    """What the ops read of the server that hands itself over (server.ThroughputServer)."""

    allow: AllowList
    limits: ServerLimits
    quota: Quota
    port: int | None
    hmac_key: bytes | None
    edge_runner: EdgeRunner | None
    ring_lock: threading.Lock

EDGE_OP = "ring_edge"
RESULT_OP = "ring_result"
RTT_OP = "ring_rtt"
MAX_TARGETS = 64
MAX_SAMPLES = 5
CONNECT_TIMEOUT_S = 2.0
MAX_OMIT_S = 10.0


@dataclass(frozen=True)
class EdgeRequest:
    """One ring edge as the requester asks for it."""

    to: str
    port: int
    duration_s: float
    streams: int = 1
    omit_s: float = 0.0
    interval_s: float = 0.5

    def to_json(self) -> dict[str, Any]:
        return {"to": self.to, "port": self.port, "duration_s": self.duration_s,
                "streams": self.streams, "omit_s": self.omit_s, "interval_s": self.interval_s}

    @classmethod
    def from_json(cls, d: Any) -> EdgeRequest:
        """The request's ``edge`` object; Refused("malformed") naming the field."""
        if not isinstance(d, dict):
            raise Refused("malformed", "ring_edge: edge must be an object")
        to = _address(d.get("to"), "to")
        port = d.get("port")
        if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
            raise Refused("malformed", "ring_edge: port must be an integer 1-65535")
        out = cls(to, port, _number(d, "duration_s", 0.1, 3600.0), streams=d.get("streams", 1),
                  omit_s=_number(d, "omit_s", 0.0, MAX_OMIT_S, 0.0),
                  interval_s=_number(d, "interval_s", 0.1, 10.0, 0.5))
        if not isinstance(out.streams, int) or isinstance(out.streams, bool) or out.streams < 1:
            raise Refused("malformed", "ring_edge: streams must be a positive integer")
        return out


def _number(d: dict[str, Any], key: str, low: float, high: float,
            default: float | None = None) -> float:
    v = d.get(key, default)
    if (not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v)
            or not low <= v <= high):
        raise Refused("malformed", f"{key} must be a number {low:g}-{high:g}")
    return float(v)


def _address(v: Any, what: str) -> str:
    """A literal unicast address (no name: the reflector resolves nothing for a requester)."""
    try:
        ip = ipaddress.ip_address(v if isinstance(v, str) else "")
    except ValueError:
        raise Refused("malformed", f"{what} must be a literal IP address") from None
    if ip.is_multicast or ip.is_unspecified or ip.is_loopback:
        raise Refused("not_allowed", f"{ip} is not a unicast host address")
    return str(ip)


def _gate(server: ThroughputServer, session: Session, targets: list[str]) -> None:
    """The four conditions under which this reflector sends for a ring (module docstring)."""
    if session.key is None:
        raise Refused("unauthenticated", "ring tests need an authenticated request: this "
                      "reflector has no key (start it with --hmac-key-file), and without one "
                      "anyone could aim its traffic at a third party")
    if not server.allow:
        raise Refused("not_allowed", "ring tests need an --allow list naming the hosts this "
                      "reflector may send to")
    for to in targets:
        if not server.allow.permits(to):
            raise Refused("not_allowed", f"{to} is outside this reflector's --allow list")
    if not server.limits.enabled:
        raise Refused("disabled", "throughput tests are disabled on this reflector "
                      "([throughput] enabled = false)")


async def serve_edge(server: ThroughputServer, session: Session, msg: dict, reader,
                     writer, client: str) -> None:
    """The ``ring_edge`` op: gate, limits, then the test to the neighbour; its result signed."""
    req = EdgeRequest.from_json(msg.get("edge"))
    _gate(server, session, [req.to])
    if req.port != server.port:  # another service on an allowed host is not a ring neighbour
        raise Refused("not_allowed", f"a ring edge goes to the reflector port of this one "
                      f"({server.port}), not {req.port}")
    lim = server.limits
    if req.duration_s + req.omit_s > lim.max_duration_s or req.streams > lim.max_streams:
        raise Refused("over_limit", f"ring edge of {req.duration_s + req.omit_s:g} s and "
                      f"{req.streams} streams exceeds this reflector's limits "
                      f"({lim.max_duration_s:g} s, {lim.max_streams} streams)")
    if why := server.quota.refusal(client, lim):
        raise Refused("quota", why)
    if server.edge_runner is None:
        raise Refused("disabled", "this server runs no ring edges (started without a "
                      "throughput client: `wanprobe reflect` has one)")
    if not server.ring_lock.acquire(blocking=False):
        raise Refused("busy", "this reflector is already sending a ring edge")
    entry = server.quota.reserve(client, lim.max_bytes_per_test)
    try:
        result = await _run_edge(server, req, reader)
    finally:
        server.ring_lock.release()
    Quota.settle(entry, int(result.get("bytes_sent") or 0))
    writer.write(proto.encode(**session.sign({"op": RESULT_OP, "result": result})))
    await writer.drain()


async def _run_edge(server: ThroughputServer, req: EdgeRequest, reader) -> dict[str, Any]:
    """The test in a thread; the requester's EOF cancels it. The result's JSON, or
    ``{"error": ...}`` when the neighbour refused or failed (the ring names the edge)."""
    runner = server.edge_runner
    assert runner is not None
    cancel = threading.Event()
    loop = asyncio.get_running_loop()

    def run() -> dict[str, Any]:
        try:
            return runner(req.to, port=req.port, duration_s=req.duration_s,
                          streams=req.streams, interval_s=req.interval_s, omit_s=req.omit_s,
                          hmac_key=server.hmac_key, max_bytes=server.limits.max_bytes_per_test,
                          cancel=cancel).to_json()
        except WanprobeError as exc:
            return {"error": str(exc)[:300]}

    task = loop.run_in_executor(None, run)
    eof = asyncio.ensure_future(reader.read(1))
    try:
        done, _ = await asyncio.wait({task, eof}, return_when=asyncio.FIRST_COMPLETED)
        if task not in done:  # the requester went away (Ctrl-C, a lost host): stop now
            cancel.set()
        return await task
    finally:
        cancel.set()
        eof.cancel()


async def serve_rtt(server: ThroughputServer, session: Session, msg: dict, reader,
                    writer, client: str) -> None:
    """The ``ring_rtt`` op: handshake times to the targets' ports (same port as this one)."""
    targets = msg.get("targets")
    if not isinstance(targets, list) or not 1 <= len(targets) <= MAX_TARGETS:
        raise Refused("malformed", f"ring_rtt: targets must be a list of 1-{MAX_TARGETS} addresses")
    addrs = [_address(t, "each target") for t in targets]
    samples = msg.get("samples", 3)
    if not isinstance(samples, int) or isinstance(samples, bool) or not 1 <= samples <= MAX_SAMPLES:
        raise Refused("malformed", f"ring_rtt: samples must be an integer 1-{MAX_SAMPLES}")
    _gate(server, session, addrs)
    port = server.port or 0
    loop = asyncio.get_running_loop()
    rtts = await loop.run_in_executor(None, lambda: {a: handshake_ms(a, port, samples)
                                                     for a in dict.fromkeys(addrs)})
    writer.write(proto.encode(**session.sign({"op": RTT_OP, "rtt_ms": rtts})))
    await writer.drain()


def handshake_ms(address: str, port: int, samples: int) -> float | None:
    """The smallest TCP connect time to ``address:port`` over ``samples`` tries (SYN → SYN-ACK,
    one round trip); None when no try connected. The connections close unused."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    best: float | None = None
    for _ in range(samples):
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.settimeout(CONNECT_TIMEOUT_S)
            t0 = time.monotonic()
            try:
                s.connect((address, port))
            except OSError:
                continue
            ms = (time.monotonic() - t0) * 1e3
            with contextlib.suppress(OSError):
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        best = ms if best is None else min(best, ms)
    return None if best is None else round(best, 3)


def check_reply(reply: dict, op: str, peer: str) -> dict:
    """The verified reply of a ring op (``client_request`` checked its MAC), or ProbeError."""
    if reply.get("op") != op:
        raise ProbeError(f"{peer}: unexpected reply {str(reply.get('op'))[:32]!r} to {op} "
                         "(an older wanprobe without ring tests?)")
    return reply


class RingCall:
    """One ring op to one host from the host running the ring, on a blocking socket that
    another thread may ``close()`` to cancel (the far end then stops its test)."""

    def __init__(self, host: str, port: int, hmac_key: bytes | None) -> None:
        self.host, self.port, self.key = host, port, hmac_key
        self._sock: socket.socket | None = None
        self._closed = threading.Event()

    def close(self) -> None:
        self._closed.set()
        sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def request(self, op: str, body: dict[str, Any], reply_within_s: float) -> dict[str, Any]:
        """Send ``op`` and return its verified reply; ProbeError (one line, the host named)
        when the host cannot be reached, refuses, or the call was cancelled."""
        from wanprobe.throughput.gate import client_request

        try:
            sock = socket.create_connection((self.host, self.port), timeout=CONNECT_TIMEOUT_S)
        except OSError as exc:
            raise ProbeError(f"{self.host} port {self.port}: {exc.strerror or exc} (is "
                             "`wanprobe reflect` running there?)") from None
        self._sock = sock
        if self._closed.is_set():
            self.close()
        with sock:
            sock.settimeout(reply_within_s)
            rfile = sock.makefile("rb")

            def readline(what: str) -> dict:
                # nothing before the challenge: the far end closed it unread (its --allow list)
                hint = (f": is this host inside {self.host}'s --allow list?"
                        if what == "challenge" else "")
                try:
                    line = rfile.readline(proto.MAX_LINE_BYTES)
                except OSError as exc:
                    raise ProbeError(f"{self.host}: no {what} ({exc.strerror or exc}){hint}"
                                     ) from None
                if not line:
                    raise ProbeError(f"{self.host} closed the connection before its {what}"
                                     + (" (cancelled)" if self._closed.is_set() else hint))
                return proto.decode(line)

            try:
                reply = client_request(sock, readline, self.host, self.key, op, body)
            except OSError as exc:
                raise ProbeError(f"{self.host}: {exc.strerror or exc}") from None
        return check_reply(reply, RESULT_OP if op == EDGE_OP else op, self.host)
