"""Paris-style traceroute per flow, without raw sockets (IPv4).

Each flow is one UDP socket whose source port stays the same for every probe, and every probe
goes to the reflector's port: the 5-tuple an ECMP/LAG hash sees is the flow's STAMP 5-tuple, so
every hop is on the path its STAMP packets take (Augustin et al., "Avoiding traceroute anomalies
with Paris traceroute", IMC 2006). The TTL is set per packet (IP_TTL control message); with
IP_RECVERR the kernel queues each ICMP error for the socket, and ``recvmsg(MSG_ERRQUEUE)`` gives
``struct sock_extended_err`` (linux/errqueue.h) with the ICMP type and the offender's address
(SO_EE_OFFENDER) plus the quoted payload, which carries the probe's TTL (ip(7), IP_RECVERR).

Routers rate-limit ICMP errors (Linux: ``net.ipv4.icmp_ratelimit``, a token per 1000 ms per
destination with a burst of 6, net/ipv4/icmp.c / inetpeer.c): unanswered TTLs are retried once
per ``wait_s`` round, up to ``tries``, and a TTL that stays silent is reported as ``None`` — an
unknown hop, never loss. A probe that reaches the reflector is answered by it (a STAMP reply),
which marks the destination's TTL; an ICMP destination-unreachable ends the path too.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from wanprobe.probe import timestamps as ts

ICMP_TIME_EXCEEDED = 11
ICMP_DEST_UNREACH = 3
SO_EE_ORIGIN_ICMP = 2
_EXT_ERR = struct.Struct("IBBBBII")
_SEQ = struct.Struct("!I")
_SSEQ_AT = 24                 # RFC 8762 §4.3.1: Session-Sender Sequence Number in a reflected packet
PROBE_PAYLOAD = 44            # an unauthenticated STAMP base packet (RFC 8762 §4.2.1)
TTL_WINDOW = 3                # TTLs probed beyond the farthest hop heard so far


@dataclass(frozen=True)
class FlowTrace:
    """The hops one flow crossed: ``hops[i]`` answered TTL i+1 (None: stayed silent)."""

    src_port: int
    hops: tuple[str | None, ...]
    reached: bool
    probes: int

    def to_json(self) -> dict:
        return {"src_port": self.src_port, "hops": list(self.hops), "reached": self.reached,
                "trace_probes": self.probes}


@dataclass
class _Flow:
    sock: socket.socket
    port: int
    hops: dict[int, str] = field(default_factory=dict)
    tries: dict[int, int] = field(default_factory=dict)
    dest_ttl: int | None = None
    probes: int = 0

    def limit(self, max_ttl: int) -> int:
        if self.dest_ttl is not None:
            return self.dest_ttl
        return min(max_ttl, max(self.hops, default=0) + TTL_WINDOW)

    def wanted(self, max_ttl: int, tries: int) -> list[int]:
        return [t for t in range(1, self.limit(max_ttl) + 1)
                if t not in self.hops and self.tries.get(t, 0) < tries]


def open_flow_sockets(ports: Sequence[int]) -> list[socket.socket]:
    """One IPv4 UDP socket per source port (0: an ephemeral one), with IP_RECVERR on."""
    socks = []
    try:
        for port in ports:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            socks.append(s)
            s.bind(("0.0.0.0", port))
            s.setsockopt(socket.IPPROTO_IP, ts.IP_RECVERR, 1)
            s.setblocking(False)
    except OSError:
        for s in socks:
            s.close()
        raise
    return socks


def trace_flows(dest: str, port: int, socks: Sequence[socket.socket], *, max_ttl: int = 16,
                tries: int = 12, wait_s: float = 1.0, gap_s: float = 0.0005) -> list[FlowTrace]:
    """Trace every flow (socket) towards ``dest``:``port``; see the module docstring."""
    flows = [_Flow(s, s.getsockname()[1]) for s in socks]
    by_fd = {f.sock.fileno(): f for f in flows}
    poller = select.poll()
    for fd in by_fd:
        poller.register(fd, select.POLLIN | select.POLLERR)
    payload = bytearray(PROBE_PAYLOAD)
    while True:
        sent = 0
        for f in flows:
            for ttl in f.wanted(max_ttl, tries):
                f.tries[ttl] = f.tries.get(ttl, 0) + 1
                _send(f, dest, port, ttl, payload)
                sent += 1
                if gap_s:
                    time.sleep(gap_s)   # pace: a burst of errors is what routers drop first
        if not sent:
            break
        deadline = time.monotonic() + wait_s
        while any(f.wanted(max_ttl, tries) for f in flows):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for fd, _ev in poller.poll(left * 1000):
                _read(by_fd[fd], dest)
        if all(not f.wanted(max_ttl, tries + 1) for f in flows):
            break   # everything answered: no reason to wait for a retry round
    return [_result(f) for f in flows]


def _send(f: _Flow, dest: str, port: int, ttl: int, payload: bytearray) -> None:
    _SEQ.pack_into(payload, 0, ttl)
    f.probes += 1
    with contextlib.suppress(BlockingIOError, InterruptedError, ConnectionRefusedError,
                             OSError):
        f.sock.sendmsg([payload], [(socket.IPPROTO_IP, ts.IP_TTL, struct.pack("i", ttl))], 0,
                       (dest, port))


def _read(f: _Flow, dest: str) -> None:
    """Drain ICMP errors (error queue) and reflector replies of one flow's socket."""
    for _ in range(64):
        try:
            data, anc, _flags, _addr = f.sock.recvmsg(256, ts.ANC_BUFSIZE, ts.MSG_ERRQUEUE)
        except (BlockingIOError, InterruptedError):
            break
        except OSError:
            continue
        for level, typ, cdata in anc:
            if level != socket.IPPROTO_IP or typ != ts.IP_RECVERR or len(cdata) < _EXT_ERR.size + 8:
                continue
            _errno, origin, itype, _code, _pad, _info, _data = _EXT_ERR.unpack_from(cdata)
            if origin != SO_EE_ORIGIN_ICMP or len(data) < 4:
                continue
            ttl = _SEQ.unpack_from(data)[0]
            # SO_EE_OFFENDER: a sockaddr_in right after the struct
            offender = socket.inet_ntoa(cdata[_EXT_ERR.size + 4:_EXT_ERR.size + 8])
            if not 1 <= ttl <= 255:
                continue
            if itype == ICMP_TIME_EXCEEDED:
                f.hops[ttl] = offender
            elif itype == ICMP_DEST_UNREACH:
                f.hops[ttl] = offender
                _reached(f, ttl)
    for _ in range(64):
        try:
            data, addr = f.sock.recvfrom(256)
        except (BlockingIOError, InterruptedError):
            break
        except OSError:
            continue   # e.g. ECONNREFUSED reported once more on the normal path
        if addr[0] != dest or len(data) < _SSEQ_AT + 4:
            continue
        ttl = _SEQ.unpack_from(data, _SSEQ_AT)[0]
        if 1 <= ttl <= 255:
            f.hops[ttl] = addr[0]
            _reached(f, ttl)


def _reached(f: _Flow, ttl: int) -> None:
    if f.dest_ttl is None or ttl < f.dest_ttl:
        f.dest_ttl = ttl
    for t in [t for t in f.hops if t > ttl]:
        del f.hops[t]


def _result(f: _Flow) -> FlowTrace:
    last = f.dest_ttl if f.dest_ttl is not None else max(f.hops, default=0)
    return FlowTrace(f.port, tuple(f.hops.get(t) for t in range(1, last + 1)),
                     f.dest_ttl is not None, f.probes)
