"""The bulk data path: one thread per stream on a blocking socket, no per-byte Python work.

Senders ``send`` slices of one preallocated incompressible payload (a memoryview: no per-byte
Python work), as iperf3 write()s its buffer; receivers ``recv_into`` one large buffer. Not
sendfile from a memfd: on the 2-core AMD EPYC VM, sendfile moved 12-15 Gbit/s (1 stream) and
21-26 (4 streams) over a veth pair where send() moved 20-24 and 26-29 in the same session, as
iperf3 -Z (sendfile) is slower than its default write() there (27 vs 42 Gbit/s at -P 4). SO_SNDTIMEO/SO_RCVTIMEO bound each blocking call so threads
notice the deadline and an abort without polling in Python.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

from wanprobe.throughput.sockopts import TCP_CONGESTION, read_tcp_info
from wanprobe.throughput.tcp_info import TcpInfo

CHUNK_BYTES = 1 << 20
MIN_CHUNK_BYTES = 16 << 10
RECV_BUFFER_BYTES = 1 << 20
_WAKE_S = 0.25


def _set_timeouts(sock: socket.socket, seconds: float) -> None:
    tv = struct.pack("ll", int(seconds), int((seconds % 1) * 1e6))
    sock.settimeout(None)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)


class Payload:
    """CHUNK_BYTES of incompressible bytes (os.urandom) behind a memoryview."""

    def __init__(self, size: int = CHUNK_BYTES) -> None:
        self.size = size
        self.view = memoryview(os.urandom(size))


@dataclass
class Stream:
    """One data connection and its live counters (written by its thread, read by the sampler)."""

    stream_id: int
    direction: int
    sock: socket.socket
    sending: bool
    bytes: int = 0
    t_start: float | None = None
    t_first: float | None = None
    t_last: float | None = None
    cpu_s: float = 0.0
    error: str | None = None
    final_tcp_info: TcpInfo | None = None
    cc: str | None = None
    done: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def elapsed_s(self) -> float | None:
        """Wall time from the test start to the last byte moved."""
        if self.t_start is None or self.t_last is None:
            return None
        return max(self.t_last - self.t_start, 1e-9)


def _send_loop(stream: Stream, payload: Payload, deadline: float, max_bytes: int,
               abort: threading.Event, drain_s: float) -> None:
    sock = stream.sock
    offset = 0
    view = payload.view
    # Adapt the bytes per call so one call takes ~10-50 ms: a slow path must not overrun the
    # deadline by a whole 1 MiB chunk, a fast one must not pay a syscall per 16 KiB.
    chunk = MIN_CHUNK_BYTES
    while not abort.is_set() and stream.bytes < max_bytes:
        t_call = time.monotonic()
        if t_call >= deadline:
            break
        count = min(chunk, payload.size - offset, max_bytes - stream.bytes)
        try:
            n = sock.send(view[offset:offset + count])
        except (BlockingIOError, InterruptedError):
            chunk = max(chunk // 2, MIN_CHUNK_BYTES)
            continue
        except OSError as exc:
            stream.error = exc.strerror or str(exc)
            return
        if n == 0:
            stream.error = "connection closed by peer"
            return
        now = time.monotonic()
        if stream.t_first is None:
            stream.t_first = now
        stream.t_last = now
        stream.bytes += n
        offset = (offset + n) % payload.size
        took = now - t_call
        if took < 0.01 and n == count:
            chunk = min(chunk * 2, CHUNK_BYTES)
        elif took > 0.05:
            chunk = max(chunk // 2, MIN_CHUNK_BYTES)
    try:
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        return
    # Wait for the receiver to read everything and close, so the final TCP_INFO covers it all.
    end = time.monotonic() + drain_s
    scratch = bytearray(4096)
    while not abort.is_set() and time.monotonic() < end:
        try:
            if sock.recv_into(scratch) == 0:
                break
        except (BlockingIOError, InterruptedError, TimeoutError):
            continue
        except OSError:
            break


def _recv_loop(stream: Stream, deadline: float, max_bytes: int, abort: threading.Event) -> None:
    sock = stream.sock
    buf = bytearray(RECV_BUFFER_BYTES)
    while not abort.is_set():
        try:
            n = sock.recv_into(buf)
        except (BlockingIOError, InterruptedError, TimeoutError):
            if time.monotonic() > deadline:
                stream.error = "receive deadline passed"
                return
            continue
        except OSError as exc:
            stream.error = exc.strerror or str(exc)
            return
        if n == 0:
            return
        now = time.monotonic()
        if stream.t_first is None:
            stream.t_first = now
        stream.t_last = now
        stream.bytes += n
        if stream.bytes > max_bytes or now > deadline:
            stream.error = "byte cap reached" if stream.bytes > max_bytes else "receive deadline passed"
            return


def start_stream(stream: Stream, *, t_start: float, duration_s: float, max_bytes: int,
                 abort: threading.Event, payload: Payload | None = None,
                 grace_s: float = 10.0) -> None:
    """Run the stream in a daemon thread; ``stream.done`` is set when it has finished."""
    stream.t_start = t_start
    _set_timeouts(stream.sock, _WAKE_S)
    try:
        raw = stream.sock.getsockopt(socket.IPPROTO_TCP, TCP_CONGESTION, 16)
        stream.cc = raw.split(b"\0", 1)[0].decode() or None
    except OSError:
        stream.cc = None

    def run() -> None:
        cpu0 = time.thread_time()
        try:
            if stream.sending:
                assert payload is not None
                _send_loop(stream, payload, t_start + duration_s, max_bytes, abort, grace_s)
                stream.final_tcp_info = read_tcp_info(stream.sock)
            else:
                _recv_loop(stream, t_start + duration_s + grace_s, max_bytes, abort)
        except Exception as exc:  # a data thread must never take the process down
            stream.error = f"{type(exc).__name__}: {exc}"
        finally:
            stream.cpu_s = time.thread_time() - cpu0
            try:
                stream.sock.close()
            except OSError:
                pass
            stream.done.set()

    stream.thread = threading.Thread(target=run, name=f"wanprobe-stream-{stream.stream_id}",
                                     daemon=True)
    stream.thread.start()


def stream_final(stream: Stream) -> dict:
    """The end-of-test report of one stream (same shape from client and server)."""
    from wanprobe.throughput.sampler import tcp_info_summary

    return {"id": stream.stream_id, "direction": stream.direction, "sending": stream.sending,
            "bytes": stream.bytes, "elapsed_s": stream.elapsed_s(), "cpu_s": stream.cpu_s,
            "error": stream.error, "cc": stream.cc,
            "tcp_info": tcp_info_summary(stream.final_tcp_info) if stream.sending else None}


