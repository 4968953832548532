"""Throughput test server that `wanprobe reflect` runs beside the STAMP reflector.

Interface contract:
- ``ThroughputServer(limits=ServerLimits(...), hmac_key=..., allow=(CIDR, ...))``
  (``max_duration_s``/``max_bytes`` override the limits, for ad-hoc use);
- ``await server.start(host, port)`` listens on TCP ``port`` (sink/source + control);
  ``start(..., udp=True)`` also binds UDP ``port`` itself (standalone use, no reflector);
- ``server.udp_tap(data, addr, rx_ns) -> bool`` is offered every UDP datagram the reflector's
  socket receives first; it returns True when the datagram belongs to a UDP throughput test
  (registered over the TCP control connection) and was consumed, False to let STAMP handle it;
- ``server.refusals()`` counts refused connections and requests by reason;
- ``await server.close()``.

Control runs on asyncio; data worker processes move the streams' bytes (datapath_pool.py), so
the event loop never touches payload bytes. The server assumes a hostile
client: connections from outside ``allow`` are closed unread; every control connection passes
the gate (gate.py: version, nonces, HMAC when keyed) before any op is dispatched; the handshake
has a deadline and a line-length cap; every request field is range-checked and the test is held
to the limits and quotas (limits.py); the server stops a test whose client does not read its
reports rather than queue them. Each refusal is one line naming the limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import os
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from wanprobe.accept_backoff import (
    AcceptBackoff,
    accept,
    cancel_and_wait,
    connection_cap,
    listen_tcp,
)
from wanprobe.errors import ProbeError, WanprobeError
from wanprobe.probe.access import AllowList, DscpPolicy
from wanprobe.throughput import host_facts_op, ring_op
from wanprobe.throughput import protocol as proto
from wanprobe.throughput.datapath import Payload, Stream, start_streams, stream_final
from wanprobe.throughput.datapath_pool import DataWorkers, worker_count
from wanprobe.throughput.gate import Refused, Session, read_request
from wanprobe.throughput.limits import Quota, ServerLimits, request_refusal
from wanprobe.throughput.sampler import IntervalSampler
from wanprobe.throughput.server_udp import norm_ip, open_sink, run_udp
from wanprobe.throughput.sockopts import apply_stream_options, check_cc
from wanprobe.throughput.stall import flush, wait_unless_stalled
from wanprobe.throughput.udp import UdpReceiverStats
from wanprobe.throughput.udp_sink import UdpSink

DEFAULT_MAX_DURATION_S = ServerLimits.max_duration_s
DEFAULT_MAX_BYTES = ServerLimits.max_bytes_per_test
MAX_STREAMS = ServerLimits.max_streams
MAX_UNSENT_REPORT_BYTES = 256 * 2**10  # a client that lets this much pile up is not reading


@dataclass
class _Test:
    cookie: bytes
    request: proto.TestRequest
    peer_ip: str
    expected: int
    streams: list[Stream] = field(default_factory=list)
    all_connected: asyncio.Event = field(default_factory=asyncio.Event)
    abort: threading.Event = field(default_factory=threading.Event)
    udp: UdpReceiverStats | None = None
    udp_started: bool = False
    workers: DataWorkers | None = None
    sink: UdpSink | None = None       # the UDP test's own socket (None: the reflector's tap)
    local: tuple = ()                  # the control connection's (address, port) at this end


class ThroughputServer:
    """TCP sink/source and UDP sink for `wanprobe throughput` clients."""

    def __init__(self, *, limits: ServerLimits | None = None, hmac_key: bytes | None = None,
                 allow: tuple[str, ...] = (), max_duration_s: float | None = None,
                 max_bytes: int | None = None, max_streams: int | None = None,
                 max_concurrent_tests: int | None = None,
                 dscp_permitted: DscpPolicy | None = None,
                 edge_runner: ring_op.EdgeRunner | None = None) -> None:
        overrides = {k: v for k, v in (("max_duration_s", max_duration_s),
                                       ("max_bytes_per_test", max_bytes),
                                       ("max_streams", max_streams),
                                       ("max_concurrent_tests", max_concurrent_tests))
                     if v is not None}
        self.limits = dataclasses.replace(limits or ServerLimits(), **overrides)
        self.hmac_key = hmac_key
        self.allow = AllowList(allow)
        self.dscp_permitted = dscp_permitted or DscpPolicy()  # the STAMP CoS policy: no 48-63
        self.quota = Quota()
        self._refused: Counter[str] = Counter()
        self._connections = 0
        # every op is reached through the gate only (host_facts: issue 13, read-only)
        self._ops = {"test": self._op_test, host_facts_op.OP: host_facts_op.serve,
                     ring_op.EDGE_OP: functools.partial(ring_op.serve_edge, self),
                     ring_op.RTT_OP: functools.partial(ring_op.serve_rtt, self)}
        # a ring edge is a test this host runs as a client (ring_op.py): the composing layer
        # hands over the client (throughput/client.run_throughput with its judgement); one edge
        # at a time
        self.edge_runner = edge_runner
        self.ring_lock = threading.Lock()
        self._tests: dict[bytes, _Test] = {}
        self._lsock: socket.socket | None = None
        self._usock: socket.socket | None = None
        self._tasks: set[asyncio.Task] = set()
        self._accept_task: asyncio.Task | None = None
        self._payload: Payload | None = None
        self.port: int | None = None

    @property
    def max_duration_s(self) -> float:
        return self.limits.max_duration_s

    @property
    def max_bytes(self) -> int:
        return self.limits.max_bytes_per_test

    def refusals(self) -> dict[str, int]:
        """Refused connections and requests by reason (wanprobe_reflector_refusals_total)."""
        return dict(self._refused)

    # ---- lifecycle -------------------------------------------------------------------------
    async def start(self, host: str, port: int, *, udp: bool = False) -> None:
        """Listen on TCP ``host:port`` (and UDP when ``udp``); port 0 picks a free one."""
        loop = asyncio.get_running_loop()
        try:
            lsock = self._lsock = listen_tcp(host, port, 256)
        except OSError as exc:
            raise ProbeError(f"cannot listen on TCP {host}:{port}: {exc.strerror or exc}") from None
        self.port = lsock.getsockname()[1]
        if udp:  # the same address and port (and IPv6 scope) as the TCP listener
            usock = socket.socket(lsock.family, socket.SOCK_DGRAM)
            usock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # beside a test's own
            usock.bind(lsock.getsockname())
            usock.setblocking(False)
            self._usock = usock
            loop.add_reader(usock.fileno(), self._on_udp_readable)
        self._accept_task = loop.create_task(self._accept_loop())

    async def close(self) -> None:
        """Stop listening and abort every running test."""
        loop = asyncio.get_running_loop()
        for test in list(self._tests.values()):
            test.abort.set()
        await cancel_and_wait([self._accept_task])
        await cancel_and_wait(list(self._tasks))
        if self._usock is not None:
            loop.remove_reader(self._usock.fileno())
            self._usock.close()
            self._usock = None
        if self._lsock is not None:
            self._lsock.close()
            self._lsock = None
        self._payload = None

    # ---- UDP -------------------------------------------------------------------------------
    def udp_tap(self, data: bytes, addr: tuple, rx_ns: int) -> bool:
        """Consume ``data`` when it is a datagram of a registered UDP test from its client."""
        head = proto.unpack_udp_header(data)
        if head is None:
            return False
        cookie, seq, send_ns = head
        test = self._tests.get(cookie)
        if test is None or test.udp is None:
            return False
        try:
            if norm_ip(addr[0]) != test.peer_ip:
                return False
        except ValueError:
            return False
        test.udp.update(seq, send_ns, rx_ns, len(data))
        return True

    def _on_udp_readable(self) -> None:
        while self._usock is not None:
            try:
                data, addr = self._usock.recvfrom(65535)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            if self.allow.permits(addr[0]):
                self.udp_tap(data, addr, time.monotonic_ns())

    # ---- connections -----------------------------------------------------------------------
    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        backoff = AcceptBackoff(f"throughput server port {self.port}")  # EMFILE: wait, one line
        while True:
            sock, addr = await accept(self._lsock, backoff)
            if self.allow and not self.allow.permits(addr[0]):
                self._refused["not_allowed"] += 1  # closed before a byte is read
                sock.close()
                continue
            if self._connections >= connection_cap(self.limits.max_connections):
                self._refused["too_many_connections"] += 1
                sock.close()
                continue
            task = loop.create_task(self._handle(sock, addr))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _read_exact(self, sock: socket.socket, n: int) -> bytes:
        loop = asyncio.get_running_loop()
        buf = b""
        while len(buf) < n:
            chunk = await loop.sock_recv(sock, n - len(buf))
            if not chunk:
                raise ConnectionError("closed during handshake")
            buf += chunk
        return buf

    async def _handle(self, sock: socket.socket, addr: tuple) -> None:
        handed_off = False
        self._connections += 1
        timeout = self.limits.handshake_timeout_s
        try:
            magic = await asyncio.wait_for(self._read_exact(sock, 4), timeout)
            if magic == proto.MAGIC_CONTROL:
                handed_off = True
                await self._control(sock, addr)
            elif magic == proto.MAGIC_DATA:
                rest = await asyncio.wait_for(
                    self._read_exact(sock, proto.DATA_HEADER_BYTES - 4), timeout)
                handed_off = self._attach_data(sock, addr, magic + rest)
            else:
                self._refused["malformed"] += 1
        except TimeoutError:
            self._refused["timeout"] += 1
        except (ConnectionError, OSError, ProbeError):
            pass
        except Exception:  # never let one connection stop the server
            pass
        finally:
            self._connections -= 1
            if not handed_off:
                sock.close()

    def _attach_data(self, sock: socket.socket, addr: tuple, header: bytes) -> bool:
        cookie, stream_id, direction = proto.unpack_data_header(header)
        test = self._tests.get(cookie)
        if test is None or test.udp is not None or norm_ip(addr[0]) != test.peer_ip:
            return False
        if direction not in test.request.directions() or len(test.streams) >= test.expected:
            return False
        req = test.request
        sock.setblocking(True)
        try:
            apply_stream_options(sock, cc=req.cc, window_bytes=req.window_bytes, dscp=req.dscp,
                                 pacing_rate_bps=req.pacing_rate_bps, reset_on_close=direction
                                 == proto.DOWN)  # unread data at the end is freed, not kept
        except WanprobeError:
            return False
        test.streams.append(Stream(stream_id, direction, sock, sending=direction == proto.DOWN))
        if len(test.streams) == test.expected:
            test.all_connected.set()
        return True

    # ---- control: the gate, then one op ------------------------------------------------------
    async def _control(self, sock: socket.socket, addr: tuple) -> None:
        reader, writer = await asyncio.open_connection(sock=sock,
                                                       limit=proto.MAX_REQUEST_LINE_BYTES)
        try:
            try:
                async with asyncio.timeout(self.limits.handshake_timeout_s):
                    session, msg = await read_request(reader, writer, self.hmac_key)
                op = self._ops.get(msg["op"])
                if op is None:
                    raise Refused("malformed", f"unknown op {msg['op'][:32]!r}")
                await op(session, msg, reader, writer, norm_ip(addr[0]))
            except Refused as exc:
                self._refused[exc.reason] += 1
                writer.write(proto.encode("refused", error=str(exc), reason=exc.reason))
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(1.0):
                        await writer.drain()
        except TimeoutError:
            self._refused["timeout"] += 1
        except (ConnectionError, OSError, ProbeError, ValueError):
            pass
        except Exception as exc:  # a bad client must never take the server down
            with contextlib.suppress(Exception):
                writer.write(proto.encode("refused", error=f"server error: {type(exc).__name__}"))
        finally:  # a client that does not read its control socket is reset, not waited on
            if writer.transport.get_write_buffer_size():
                writer.transport.abort()
            writer.close()

    def _test_refusal(self, req: proto.TestRequest, client: str) -> Refused | None:
        lim = self.limits
        if not lim.enabled:
            return Refused("disabled", "throughput tests are disabled on this reflector "
                           "([throughput] enabled = false)")
        reason = request_refusal(req, lim)
        if reason:
            return Refused("over_limit", reason)
        if req.udp and req.udp_rate_bps * req.duration_s / 8 > lim.max_bytes_per_test:
            return Refused("over_limit", "udp_rate_bps × duration_s exceeds this server's limit "
                           f"of {lim.max_bytes_per_test} B per test (max_bytes_per_test)")
        if why := self.dscp_permitted.refusal(req.dscp, "throughput test"):
            return Refused("dscp", why)
        try:
            check_cc(req.cc)
        except WanprobeError as exc:
            return Refused("over_limit", f"server: {exc}")
        if len(self._tests) >= lim.max_concurrent_tests:
            return Refused("busy", "the server is busy with another test; try again later "
                           f"(max_concurrent_tests {lim.max_concurrent_tests})")
        reason = self.quota.refusal(client, lim)
        return Refused("quota", reason) if reason else None

    async def _op_test(self, session: Session, msg: dict, reader, writer, client: str) -> None:
        try:
            req = proto.TestRequest.from_json(msg.get("test"))
        except ProbeError as exc:
            raise Refused("malformed", str(exc)) from None
        refusal = self._test_refusal(req, client)
        if refusal:
            raise refusal
        # The byte cap the server holds the test to (both directions, datapath.py): the smaller
        # of the client's, the per-test limit and what is left of the daily budgets.
        cap = min(req.max_bytes, self.limits.max_bytes_per_test,
                  self.quota.remaining_bytes(client, self.limits))
        req = dataclasses.replace(req, max_bytes=max(cap, 1))
        cookie = os.urandom(proto.COOKIE_BYTES)
        n = 0 if req.udp else req.streams * len(req.directions())
        test = _Test(cookie, req, client, n, udp=UdpReceiverStats() if req.udp else None,
                     local=writer.get_extra_info("sockname") or ())
        self._tests[cookie] = test
        entry = self.quota.reserve(client, req.max_bytes)
        try:
            if req.udp:
                test.sink = open_sink(test, self.port)
            writer.write(proto.encode(**session.sign({
                "op": "accepted", "cookie": cookie.hex(),
                "limits": {**self.limits.to_json(), "max_bytes": req.max_bytes}})))
            await writer.drain()
            eof = asyncio.ensure_future(reader.read(1))  # the client sends nothing until start
            try:
                if n and not await self._until(self._connected_and_ready(test), eof):
                    return
                writer.write(proto.encode("ready"))
                await writer.drain()
            finally:
                eof.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await eof  # the reader has one waiter at a time: let this one go first
            async with asyncio.timeout(self.limits.handshake_timeout_s):
                start = proto.decode(await reader.readline())
            if start.get("op") != "start":
                return
            if req.udp:
                await run_udp(test, reader, writer,
                              lambda line: self._report(test, writer, line))
            else:
                await self._run_tcp(test, reader, writer)
        finally:
            test.abort.set()
            self._tests.pop(test.cookie, None)
            if test.sink is not None:
                await asyncio.get_running_loop().run_in_executor(None, test.sink.stop)
            if test.workers is not None:
                await asyncio.get_running_loop().run_in_executor(None, test.workers.close)
            for s in test.streams:
                if s.thread is None:
                    s.sock.close()
            moved = (test.udp.bytes if test.udp is not None
                     else sum(s.bytes for s in test.streams))
            self.quota.settle(entry, moved)

    async def _connected_and_ready(self, test: _Test) -> None:
        """The data workers (datapath_pool.py) start while the client connects; wait for both."""
        try:
            test.workers = DataWorkers(worker_count(test.expected))
        except ProbeError as exc:
            raise Refused("busy", f"server: {exc}") from None
        await test.all_connected.wait()
        if not await asyncio.get_running_loop().run_in_executor(None, test.workers.wait_ready):
            raise Refused("busy", "the server could not start its data workers; try again later")

    async def _until(self, wait, eof: asyncio.Future) -> bool:
        """True when ``wait`` finished within the handshake timeout, False when the client
        closed the control connection first (the slot is freed at once) or time ran out."""
        task = asyncio.ensure_future(wait)
        done, _ = await asyncio.wait({task, eof}, timeout=self.limits.handshake_timeout_s,
                                     return_when=asyncio.FIRST_COMPLETED)
        task.cancel()
        return task in done and task.result() is not False  # result(): a refusal re-raised

    def _report(self, test: _Test, writer, line: bytes) -> None:
        """Queue one report line; a client that stopped reading ends its test instead of
        growing the server's write buffer without bound."""
        if writer.transport.get_write_buffer_size() > MAX_UNSENT_REPORT_BYTES:
            test.abort.set()
            return
        writer.write(line)

    async def _run_tcp(self, test: _Test, reader, writer) -> None:
        loop = asyncio.get_running_loop()
        req = test.request
        if self._payload is None and any(s.sending for s in test.streams):
            self._payload = Payload()
        finished = loop.create_future()

        def on_finished() -> None:  # from the data thread; the loop may be gone at shutdown
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(lambda: finished.done() or finished.set_result(None))

        t0 = time.monotonic()
        per_stream_cap = max(req.max_bytes // max(len(test.streams), 1), 1)
        start_streams(test.streams, t_start=t0, duration_s=req.duration_s,
                      max_bytes=per_stream_cap, abort=test.abort, payload=self._payload,
                      on_finished=on_finished, workers=test.workers)

        def emit(rec: dict) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed under a server shutdown
                loop.call_soon_threadsafe(self._report, test, writer,
                                          proto.encode("interval", **rec))

        stop = threading.Event()
        sampler = IntervalSampler(test.streams, t_start=t0, interval_s=req.interval_s,
                                  emit=emit, stop=stop)
        sampler.start()
        eof = loop.create_task(reader.read(1))  # the client never sends more; EOF = gone
        try:
            # No polling while data flows: wake when the streams finish or the client goes.
            done = await wait_unless_stalled({finished, eof}, test.streams, req.duration_s + 30)
            if finished not in done:  # the client left, or stopped reading (stall.py)
                test.abort.set()
            stop.set()
            await loop.run_in_executor(None, sampler.join, 2.0)
            await asyncio.sleep(0)  # let the sampler's queued writes go first
            writer.write(proto.encode("end", streams=[stream_final(s) for s in test.streams],
                                      cpu_max_percent=sampler.cpu_max_percent,
                                      engine=await loop.run_in_executor(None, test.workers.summary)))
            await flush(writer)
        finally:
            stop.set()
            eof.cancel()

if __name__ == "__main__":  # the older spelling of ``python -m wanprobe.throughput.server_cli``
    import runpy

    runpy.run_module("wanprobe.throughput.server_cli", run_name="__main__")
