"""The bulk data path: one thread per test side drives every stream of the test, as iperf3 does.

The thread runs a level-triggered epoll loop over non-blocking sockets: a writable sending stream
gets one ``send`` from a preallocated incompressible payload (a memoryview, no per-byte Python
work), a readable receiving stream one ``recv_into`` of up to RECV_BYTES.

The write size was measured over a veth pair on the 2-core AMD EPYC VM (one epoll thread per
side, Gbit/s, 3 runs each), and it is not monotonic, so it is a table, not a formula:

    streams   128 KiB   256 KiB   512 KiB   1 MiB
    1         16-17     13-15     19-22     26-40
    2         25-30     18-22     30        -
    4         39-43     15-19     -         21-24

hence 1 MiB writes for a lone sending stream and 128 KiB when several share the thread (iperf3
itself, one thread and 128 KiB writes by default, moves 32-48 at -P 4 and 20 with -l 1M). A
blocking thread per stream did worse at 4 streams (24-31, and 4 separate processes 22-27: not
the GIL), and so did two epoll threads of two streams each (20-25 against 35-47 for one).

On veth the sending thread is the bottleneck (busy 0.96-0.99 of a core, mostly in the kernel,
which also runs the receiver's TCP input in its softirq), so what Python does per call counts.
Measured with perf over a 4-stream run: the user-space share of the sending thread is 6 % and
of the receiving thread 15 % (7.7 % and 20 % before the loop below was trimmed; iperf3: under
1 % and about 4 %). The threads beside the data thread wait on events, not in polling loops.
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from wanprobe.throughput.sockopts import TCP_CONGESTION, read_tcp_info
from wanprobe.throughput.tcp_info import TcpInfo, tcp_info_summary

CHUNK_BYTES = 1 << 20    # the payload the senders cycle through
SEND_BYTES_ONE = 1 << 20     # per send() call when one stream sends (see the table above)
SEND_BYTES_MANY = 128 << 10  # per send() call when several do
RECV_BYTES = 256 << 10   # per recv_into() call
_WAKE_S = 0.25           # the loop looks at the abort flag and the deadlines at least this often


class Payload:
    """CHUNK_BYTES of incompressible bytes (os.urandom) behind a memoryview."""

    def __init__(self, size: int = CHUNK_BYTES) -> None:
        self.size = size
        self.view = memoryview(os.urandom(size))


@dataclass
class Stream:
    """One data connection and its live counters (written by the data thread, read by the sampler)."""

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


class _Pump:
    """The epoll loop for the streams of one test on this side (see the module docstring)."""

    def __init__(self, streams: list[Stream], *, t_start: float, duration_s: float,
                 max_bytes: int, abort: threading.Event, payload: Payload | None,
                 grace_s: float) -> None:
        self.streams = streams
        self.send_deadline = t_start + duration_s
        self.recv_deadline = t_start + duration_s + grace_s
        self.drain_s = grace_s
        self.max_bytes = max_bytes
        self.abort = abort
        self.payload = payload
        self.ep = select.epoll()
        self.by_fd: dict[int, list] = {}   # fd -> [stream, offset, drain_until]
        self.buf = bytearray(RECV_BYTES)
        self.send_bytes = (SEND_BYTES_ONE if sum(s.sending for s in streams) == 1
                           else SEND_BYTES_MANY)

    def run(self) -> None:
        """Move bytes on every stream until each is done. Long because: it is the per-read
        hot loop of the datapath (epoll-style select over all streams, send/recv, accounting)
        and keeps its state in locals on purpose."""
        cpu0 = time.thread_time()
        try:
            for s in self.streams:
                s.sock.setblocking(False)
                fd = s.sock.fileno()
                self.by_fd[fd] = [s, 0, None]
                self.ep.register(fd, select.EPOLLOUT if s.sending else select.EPOLLIN)
            # The loop body is the whole per-byte cost of the tool (see the module docstring):
            # its Python work per send/recv is kept to a few attribute and integer operations,
            # one clock read per batch of ready sockets, and the deadlines are visited only
            # when the earliest of them is due.
            by_fd, poll, monotonic = self.by_fd, self.ep.poll, time.monotonic
            send_bytes, max_bytes, buf = self.send_bytes, self.max_bytes, self.buf
            view = self.payload.view if self.payload is not None else None
            size = self.payload.size if self.payload is not None else 0
            next_due = 0.0
            while by_fd and not self.abort.is_set():
                now = monotonic()
                if now >= next_due:
                    next_due = self._deadlines(now)
                ready = poll(min(_WAKE_S, max(next_due - now, 0.0)))
                now = monotonic()
                for fd, _events in ready:
                    state = by_fd.get(fd)
                    if state is None:
                        continue
                    s = state[0]
                    try:
                        if not s.sending:
                            n = s.sock.recv_into(buf)
                            if n == 0:
                                self._finish(fd, None)
                                continue
                        elif state[2] is None:
                            offset = state[1]
                            count = min(send_bytes, size - offset, max_bytes - s.bytes)
                            n = s.sock.send(view[offset:offset + count])
                            state[1] = (offset + n) % size
                        else:  # draining: wait for the receiver to read everything and close
                            if s.sock.recv_into(buf, 4096) == 0:
                                self._finish(fd, None)
                            continue
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError as exc:
                        self._finish(fd, exc.strerror or str(exc))
                        continue
                    if s.t_first is None:
                        s.t_first = now
                    s.t_last = now
                    s.bytes += n
                    if s.bytes >= max_bytes:  # the byte cap, per stream
                        if s.sending:
                            self._shutdown(fd)
                            next_due = min(next_due, state[2] or now)
                        elif s.bytes > max_bytes:
                            self._finish(fd, "byte cap reached")
        finally:
            cpu_s = time.thread_time() - cpu0
            for fd in list(self.by_fd):
                self._finish(fd, None)
            self.ep.close()
            for s in self.streams:
                s.cpu_s = cpu_s  # the one thread's busy time: what the cpu verdict asks about

    def _deadlines(self, now: float) -> float:
        """Act on every deadline that is due; return when the next one falls due."""
        for fd, (s, _off, drain_until) in list(self.by_fd.items()):
            if s.sending and drain_until is None and now >= self.send_deadline:
                self._shutdown(fd)
            elif s.sending and drain_until is not None and now >= drain_until:
                self._finish(fd, None)  # the receiver never closed: keep what was sent
            elif not s.sending and now > self.recv_deadline:
                self._finish(fd, "receive deadline passed")
        due = [self.recv_deadline if not s.sending
               else self.send_deadline if drain_until is None else drain_until
               for s, _off, drain_until in self.by_fd.values()]
        return min(due, default=now)

    def _shutdown(self, fd: int) -> None:
        """The sender is done: FIN, then wait for the receiver's close so that the final
        TCP_INFO covers every byte acknowledged."""
        state = self.by_fd[fd]
        try:
            state[0].sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._finish(fd, None)
            return
        state[2] = time.monotonic() + self.drain_s
        self.ep.modify(fd, select.EPOLLIN)

    def _finish(self, fd: int, error: str | None) -> None:
        s = self.by_fd.pop(fd)[0]
        if error and not s.error:
            s.error = error
        try:
            self.ep.unregister(fd)
        except (OSError, ValueError):
            pass
        if s.sending:
            try:
                s.final_tcp_info = read_tcp_info(s.sock)
            except OSError:
                pass
        try:
            s.sock.close()
        except OSError:
            pass
        s.done.set()


def start_streams(streams: list[Stream], *, t_start: float, duration_s: float, max_bytes: int,
                  abort: threading.Event, payload: Payload | None = None,
                  grace_s: float = 10.0, on_finished: Callable[[], None] | None = None) -> None:
    """Move the data of ``streams`` (``max_bytes`` each) in one daemon thread; each stream's
    ``done`` is set when it has finished, and ``on_finished`` is called (from that thread) once
    all have, so that callers wait on an event instead of polling the streams."""
    for s in streams:
        s.t_start = t_start
        try:
            raw = s.sock.getsockopt(socket.IPPROTO_TCP, TCP_CONGESTION, 16)
            s.cc = raw.split(b"\0", 1)[0].decode() or None
        except OSError:
            s.cc = None
    if any(s.sending for s in streams) and payload is None:
        raise ValueError("sending streams need a payload")
    pump = _Pump(streams, t_start=t_start, duration_s=duration_s, max_bytes=max_bytes,
                 abort=abort, payload=payload, grace_s=grace_s)

    def run() -> None:
        try:
            pump.run()
        except Exception as exc:  # the data thread must never take the process down
            for s in streams:
                if not s.done.is_set():
                    s.error = s.error or f"{type(exc).__name__}: {exc}"
                    s.done.set()
        finally:
            if on_finished is not None:
                on_finished()

    thread = threading.Thread(target=run, name="wanprobe-streams", daemon=True)
    for s in streams:
        s.thread = thread
    thread.start()


def stream_final(stream: Stream) -> dict:
    """The end-of-test report of one stream (same shape from client and server)."""
    return {"id": stream.stream_id, "direction": stream.direction, "sending": stream.sending,
            "bytes": stream.bytes, "elapsed_s": stream.elapsed_s(), "cpu_s": stream.cpu_s,
            "error": stream.error, "cc": stream.cc,
            "tcp_info": tcp_info_summary(stream.final_tcp_info) if stream.sending else None}


