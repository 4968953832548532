"""Throughput test server that `wanprobe reflect` runs beside the STAMP reflector.

Interface contract:
- ``ThroughputServer(max_duration_s=..., max_bytes=...)``
- ``await server.start(host, port)`` listens on TCP ``port`` (sink/source + control);
  ``start(..., udp=True)`` also binds UDP ``port`` itself (standalone use, no reflector);
- ``server.udp_tap(data, addr, rx_ns) -> bool`` is offered every UDP datagram the reflector's
  socket receives first; it returns True when the datagram belongs to a UDP throughput test
  (registered over the TCP control connection) and was consumed, False to let STAMP handle it;
- ``await server.close()``.

Control runs on asyncio; each data stream runs in its own thread on a blocking socket
(datapath.py), so the event loop never touches payload bytes. Tests beyond the server's limits
(duration, bytes, streams, one test at a time) are refused with a one-line reason.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import os
import socket
import threading
import time
from dataclasses import dataclass, field

from wanprobe.errors import ProbeError, WanprobeError
from wanprobe.throughput import host_facts_op
from wanprobe.throughput import protocol as proto
from wanprobe.throughput.datapath import Payload, Stream, start_streams, stream_final
from wanprobe.throughput.sampler import IntervalSampler
from wanprobe.throughput.sockopts import apply_stream_options, check_cc
from wanprobe.throughput.udp import UdpReceiverStats

DEFAULT_MAX_DURATION_S = 60.0
DEFAULT_MAX_BYTES = 10 * 2**30
MAX_STREAMS = 128
_SETUP_TIMEOUT_S = 10.0
_UDP_LINGER_S = 1.0


def _norm_ip(host: str) -> str:
    ip = ipaddress.ip_address(host.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return str(ip)


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


class ThroughputServer:
    """TCP sink/source and UDP sink for `wanprobe throughput` clients."""

    def __init__(self, *, max_duration_s: float = DEFAULT_MAX_DURATION_S,
                 max_bytes: int = DEFAULT_MAX_BYTES, max_streams: int = MAX_STREAMS,
                 max_concurrent_tests: int = 1) -> None:
        self.max_duration_s = max_duration_s
        self.max_bytes = max_bytes
        self.max_streams = max_streams
        self.max_concurrent_tests = max_concurrent_tests
        self._tests: dict[bytes, _Test] = {}
        self._lsock: socket.socket | None = None
        self._usock: socket.socket | None = None
        self._tasks: set[asyncio.Task] = set()
        self._accept_task: asyncio.Task | None = None
        self._payload: Payload | None = None
        self.port: int | None = None

    # ---- lifecycle -------------------------------------------------------------------------
    async def start(self, host: str, port: int, *, udp: bool = False) -> None:
        """Listen on TCP ``host:port`` (and UDP when ``udp``); port 0 picks a free one."""
        loop = asyncio.get_running_loop()
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, _, _, _, addr = infos[0]
        lsock = socket.socket(family, socket.SOCK_STREAM)
        lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        lsock.bind(addr)
        lsock.listen(256)
        lsock.setblocking(False)
        self._lsock = lsock
        self.port = lsock.getsockname()[1]
        if udp:
            usock = socket.socket(family, socket.SOCK_DGRAM)
            usock.bind((addr[0], self.port, *addr[2:]))
            usock.setblocking(False)
            self._usock = usock
            loop.add_reader(usock.fileno(), self._on_udp_readable)
        self._accept_task = loop.create_task(self._accept_loop())

    async def close(self) -> None:
        """Stop listening and abort every running test."""
        loop = asyncio.get_running_loop()
        for test in list(self._tests.values()):
            test.abort.set()
        if self._accept_task:
            self._accept_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._accept_task
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
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
            if _norm_ip(addr[0]) != test.peer_ip:
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
            self.udp_tap(data, addr, time.monotonic_ns())

    # ---- connections -----------------------------------------------------------------------
    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, addr = await loop.sock_accept(self._lsock)
            except (asyncio.CancelledError, GeneratorExit):
                raise
            except OSError:
                await asyncio.sleep(0.05)
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
        try:
            magic = await asyncio.wait_for(self._read_exact(sock, 4), _SETUP_TIMEOUT_S)
            if magic == proto.MAGIC_CONTROL:
                handed_off = True
                await self._control(sock, addr)
            elif magic == proto.MAGIC_DATA:
                rest = await asyncio.wait_for(
                    self._read_exact(sock, proto.DATA_HEADER_BYTES - 4), _SETUP_TIMEOUT_S)
                handed_off = self._attach_data(sock, addr, magic + rest)
        except (TimeoutError, ConnectionError, OSError, ProbeError):
            pass
        except Exception:  # never let one connection stop the server
            pass
        finally:
            if not handed_off:
                sock.close()

    def _attach_data(self, sock: socket.socket, addr: tuple, header: bytes) -> bool:
        cookie, stream_id, direction = proto.unpack_data_header(header)
        test = self._tests.get(cookie)
        if test is None or test.udp is not None or _norm_ip(addr[0]) != test.peer_ip:
            return False
        if direction not in test.request.directions() or len(test.streams) >= test.expected:
            return False
        req = test.request
        sock.setblocking(True)
        try:
            apply_stream_options(sock, cc=req.cc, window_bytes=req.window_bytes, dscp=req.dscp,
                                 pacing_rate_bps=req.pacing_rate_bps)
        except WanprobeError:
            return False
        test.streams.append(Stream(stream_id, direction, sock, sending=direction == proto.DOWN))
        if len(test.streams) == test.expected:
            test.all_connected.set()
        return True

    # ---- one test --------------------------------------------------------------------------
    def _refusal(self, req: proto.TestRequest) -> str | None:
        if len(self._tests) >= self.max_concurrent_tests:
            return "the server is busy with another test; try again later"
        if not 0 < req.duration_s <= self.max_duration_s:
            return (f"test duration {req.duration_s:g} s exceeds this server's limit of "
                    f"{self.max_duration_s:g} s")
        if not 0 < req.max_bytes <= self.max_bytes:
            return (f"test byte cap {req.max_bytes} B exceeds this server's limit of "
                    f"{self.max_bytes} B")
        if not 1 <= req.streams <= self.max_streams:
            return f"{req.streams} streams is outside this server's limit of 1-{self.max_streams}"
        if req.udp and (not req.udp_rate_bps or req.udp_rate_bps * req.duration_s / 8 > self.max_bytes):
            return "UDP rate × duration exceeds this server's byte limit"
        try:
            check_cc(req.cc)
        except WanprobeError as exc:
            return f"server: {exc}"
        return None

    async def _control(self, sock: socket.socket, addr: tuple) -> None:
        reader, writer = await asyncio.open_connection(sock=sock, limit=proto.MAX_LINE_BYTES)
        test: _Test | None = None
        try:
            hello = proto.decode(await asyncio.wait_for(reader.readline(), _SETUP_TIMEOUT_S))
            if hello.get("op") == host_facts_op.OP:  # read-only description of this host
                writer.write(await host_facts_op.reply(_norm_ip(addr[0])))
                await writer.drain()
                return
            if hello.get("op") != "hello" or hello.get("version") != proto.VERSION:
                writer.write(proto.encode("refused", error="unsupported protocol version"))
                return
            try:
                req = proto.TestRequest.from_json(hello.get("test") or {})
            except ProbeError as exc:
                writer.write(proto.encode("refused", error=str(exc)))
                return
            reason = self._refusal(req)
            if reason:
                writer.write(proto.encode("refused", error=reason))
                return
            cookie = os.urandom(proto.COOKIE_BYTES)
            n = 0 if req.udp else req.streams * len(req.directions())
            test = _Test(cookie, req, _norm_ip(addr[0]), n,
                         udp=UdpReceiverStats() if req.udp else None)
            self._tests[cookie] = test
            writer.write(proto.encode("accepted", cookie=cookie.hex(),
                                      limits={"max_duration_s": self.max_duration_s,
                                              "max_bytes": self.max_bytes}))
            await writer.drain()
            if n:
                await asyncio.wait_for(test.all_connected.wait(), _SETUP_TIMEOUT_S)
            writer.write(proto.encode("ready"))
            await writer.drain()
            start = proto.decode(await asyncio.wait_for(reader.readline(), _SETUP_TIMEOUT_S))
            if start.get("op") != "start":
                return
            if req.udp:
                await self._run_udp(test, reader, writer)
            else:
                await self._run_tcp(test, reader, writer)
        except (TimeoutError, ConnectionError, OSError, ProbeError, ValueError):
            pass
        except Exception as exc:  # a bad client must never take the server down
            with contextlib.suppress(Exception):
                writer.write(proto.encode("refused", error=f"server error: {type(exc).__name__}"))
        finally:
            if test is not None:
                test.abort.set()
                self._tests.pop(test.cookie, None)
                for s in test.streams:
                    if s.thread is None:
                        s.sock.close()
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

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
                      on_finished=on_finished)

        def emit(rec: dict) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed under a server shutdown
                loop.call_soon_threadsafe(writer.write, proto.encode("interval", **rec))

        stop = threading.Event()
        sampler = IntervalSampler(test.streams, t_start=t0, interval_s=req.interval_s,
                                  emit=emit, stop=stop)
        sampler.start()
        eof = loop.create_task(reader.read(1))  # the client never sends more; EOF = gone
        try:
            # No polling while data flows: wake when the streams finish or the client goes.
            done, _ = await asyncio.wait({finished, eof}, timeout=req.duration_s + 30.0,
                                         return_when=asyncio.FIRST_COMPLETED)
            if finished not in done:
                test.abort.set()
            stop.set()
            await loop.run_in_executor(None, sampler.join, 2.0)
            await asyncio.sleep(0)  # let the sampler's queued writes go first
            writer.write(proto.encode("end", streams=[stream_final(s) for s in test.streams],
                                      cpu_max_percent=sampler.cpu_max_percent))
            await writer.drain()
        finally:
            stop.set()
            eof.cancel()

    async def _run_udp(self, test: _Test, reader, writer) -> None:
        req = test.request
        stats = test.udp
        t0 = time.monotonic()
        k = 0
        last = {"packets": 0, "bytes": 0}
        done_msg: dict | None = None
        read = asyncio.ensure_future(reader.readline())
        hard_end = t0 + req.duration_s + 10.0
        try:
            while time.monotonic() < hard_end:
                boundary = t0 + (k + 1) * req.interval_s
                waited = await asyncio.wait({read}, timeout=max(boundary - time.monotonic(), 0))
                if waited[0]:
                    line = read.result()
                    if not line:
                        return
                    msg = proto.decode(line)
                    if msg.get("op") == "udp_done":
                        done_msg = msg
                        break
                    read = asyncio.ensure_future(reader.readline())
                    continue
                snap = stats.snapshot()
                writer.write(proto.encode("interval", k=k, start_s=k * req.interval_s,
                                          end_s=(k + 1) * req.interval_s, streams=[{
                                              "id": 0, "direction": proto.UP, "sending": False,
                                              "bytes": snap["bytes"] - last["bytes"],
                                              "tcp_info": None}],
                                          udp={**snap, "packets": snap["packets"] - last["packets"]},
                                          cpu_busy_percent=[]))
                last = {"packets": snap["packets"], "bytes": snap["bytes"]}
                k += 1
            await asyncio.sleep(_UDP_LINGER_S if done_msg else 0)  # late datagrams
            sent = int(done_msg["packets_sent"]) if done_msg else None
            span = ((stats.t_last_ns - stats.t_first_ns) / 1e9
                    if stats.t_first_ns is not None and stats.t_last_ns is not None else None)
            writer.write(proto.encode("end", streams=[], cpu_max_percent=[],
                                      udp={**stats.snapshot(sent), "seconds": span}))
            await writer.drain()
        finally:
            read.cancel()


def main(argv: list[str] | None = None) -> None:
    """``python -m wanprobe.throughput.server --bind A --port N`` (tests and ad-hoc use)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bind", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=862)
    parser.add_argument("--max-duration", type=float, default=DEFAULT_MAX_DURATION_S)
    parser.add_argument("--max-bytes", type=int, default=DEFAULT_MAX_BYTES)
    args = parser.parse_args(argv)

    async def serve() -> None:
        server = ThroughputServer(max_duration_s=args.max_duration, max_bytes=args.max_bytes)
        await server.start(args.bind, args.port, udp=True)
        print(f"listening on {args.bind} port {server.port}", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await server.close()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())


if __name__ == "__main__":
    main()
