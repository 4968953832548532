"""The far end of a UDP test, made so that it is never the limit of what it measures.

A UDP test's datagrams come to the server's port (the STAMP reflector's). Read one at a time by
the reflector's event loop, a Python receiver takes ~0.3 Gbit/s and drops the rest, which a
loss count would book on the path (issue 35: 1,772 Mbit/s sent, 260 received at 5 Gbit/s). So
each UDP test gets a socket of its own:

- bound to the server's address and port and *connected* to the client's UDP address (the
  client names its source port in the request): the kernel's UDP lookup gives a connected socket
  the higher score (compute_score in net/ipv4/udp.c), so the test's datagrams reach it and
  everything else still reaches the reflector. Both sockets set SO_REUSEADDR;
- UDP GRO (``UDP_GRO``, udp(7), Linux 5.0): a GSO sender's datagrams arrive as one buffer of up to
  64 KiB with their segment size in a cmsg, ~45 datagrams per ``recvmsg``;
- a receive buffer sized to the burst (SO_RCVBUFFORCE where the process may, else SO_RCVBUF up
  to ``net.core.rmem_max``), and arrival times from the kernel (SO_TIMESTAMPNS), so a reader
  that runs late still times the burst as it arrived;
- the socket's own drop counter, read when the test ends (SO_MEMINFO's SK_MEMINFO_DROPS,
  sock_diag(7); SO_RXQ_OVFL's copy rides on the *next* datagram, so drops at the end of a burst
  would go unseen). The kernel counts a dropped buffer once, and with GRO a buffer holds several
  datagrams: the count is of drop events, a lower bound of the datagrams. Those are the host's
  drops, never the path's: a burst this host dropped is a lower bound of the path, named so, and
  none of its loss is booked on the path (throughput/capacity.py).

The socket is read in a thread of its own, off the event loop.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time

from wanprobe.throughput.protocol import UDP_HEADER_BYTES, unpack_udp_header
from wanprobe.throughput.udp import SOL_UDP, UDP_GRO, UdpReceiverStats

SO_MEMINFO = 55           # include/uapi/asm-generic/socket.h
SK_MEMINFO_DROPS = 8      # include/uapi/linux/sock_diag.h (Linux 4.15)
SO_TIMESTAMPNS = 35       # SO_TIMESTAMPNS_OLD: struct timespec {long, long}
SO_RCVBUFFORCE = 33
RCVBUF_MIN_BYTES = 4 * 2**20
RCVBUF_MAX_BYTES = 512 * 2**20
RCVBUF_OVERHEAD = 2       # skb truesize over payload for 1400-byte datagrams not joined by GRO
READ_BYTES = 2**17        # a GRO buffer is at most 64 KiB; MSG_TRUNC says if one is larger
POLL_S = 0.05             # how long a read waits: an empty socket for this long is "idle"
_INT = struct.Struct("i")  # udp_cmsg_recv puts the segment size as a native int
_TIMESPEC = struct.Struct("qq")
_ANC_BYTES = 256


def rcvbuf_for(rate_bps: float, duration_s: float, max_bytes: int | None = None) -> int:
    """A receive buffer that holds the whole burst (as kernel skbs; never more than the test's
    byte cap allows), within RCVBUF_MIN_BYTES..RCVBUF_MAX_BYTES."""
    burst = min(rate_bps * duration_s / 8, max_bytes or float("inf")) * RCVBUF_OVERHEAD
    return int(min(max(burst, RCVBUF_MIN_BYTES), RCVBUF_MAX_BYTES))


class UdpSink:
    """One UDP test's receiving socket and the thread that reads it into ``stats``."""

    def __init__(self, stats: UdpReceiverStats, cookie: bytes) -> None:
        self.stats = stats
        self.cookie = cookie
        self.sock: socket.socket | None = None
        self.gro = False
        self.kernel_timestamps = False
        self.rcvbuf_forced = False
        self.rcvbuf_bytes: int | None = None
        self.foreign = 0        # datagrams on the test's 5-tuple that are not the test's
        self.truncated = 0
        self.cpu_s = 0.0
        self.idle_since: float | None = None   # monotonic time of the last empty read
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def open(self, local: tuple, remote: tuple, rcvbuf_bytes: int) -> None:
        """Bind ``local`` (the server's address and port), connect ``remote`` (the client's
        UDP address). Raises OSError when either fails: the caller falls back to the tap."""
        family = socket.AF_INET6 if ":" in local[0] else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_DGRAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._buffer(sock, rcvbuf_bytes)
            with contextlib.suppress(OSError):
                sock.setsockopt(SOL_UDP, UDP_GRO, 1)
                self.gro = True
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
                self.kernel_timestamps = True
            sock.bind(local)
            sock.connect(remote)
            sock.settimeout(POLL_S)
        except OSError:
            sock.close()
            raise
        self.sock = sock

    def _buffer(self, sock: socket.socket, want: int) -> None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, want)
            self.rcvbuf_forced = True
        except OSError:  # no CAP_NET_ADMIN: the kernel caps SO_RCVBUF at net.core.rmem_max
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, want)
        self.rcvbuf_bytes = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 2

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="udp-sink", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop reading and close the socket (blocking up to ``timeout_s``; call it off the
        event loop)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self.sock is not None:
            self.sock.close()

    def drained_since(self, t: float) -> bool:
        """True once a read found the socket empty after monotonic time ``t``."""
        idle = self.idle_since
        return idle is not None and idle > t

    def drops(self) -> int | None:
        """The socket's drop events so far (SK_MEMINFO_DROPS), None where the kernel has none."""
        if self.sock is None or self.sock.fileno() < 0:
            return None
        try:
            raw = self.sock.getsockopt(socket.SOL_SOCKET, SO_MEMINFO, 4 * (SK_MEMINFO_DROPS + 1))
        except OSError:
            return None
        if len(raw) < 4 * (SK_MEMINFO_DROPS + 1):
            return None
        return struct.unpack_from(f"{SK_MEMINFO_DROPS + 1}I", raw)[SK_MEMINFO_DROPS]

    def facts(self) -> dict:
        """What the client reports of this end (call before :meth:`stop`)."""
        return {"receiver": "gro" if self.gro else "socket", "rcvbuf_bytes": self.rcvbuf_bytes,
                "rcvbuf_forced": self.rcvbuf_forced, "socket_drops": self.drops(),
                "kernel_timestamps": self.kernel_timestamps, "foreign": self.foreign,
                "truncated": self.truncated, "receiver_cpu_seconds": round(self.cpu_s, 4)}

    def _run(self) -> None:
        cpu0 = time.thread_time()
        buf = bytearray(READ_BYTES)
        sock = self.sock
        try:
            while not self._stop.is_set() and sock is not None:
                try:
                    nbytes, anc, flags, _addr = sock.recvmsg_into([buf], _ANC_BYTES)
                except TimeoutError:
                    self.idle_since = time.monotonic()
                    continue
                except OSError:  # an ICMP error queued on the connected socket: keep reading
                    continue
                if flags & socket.MSG_TRUNC:
                    self.truncated += 1
                    continue
                self._account(buf, nbytes, anc)
        finally:
            self.cpu_s = time.thread_time() - cpu0

    def _account(self, buf: bytearray, nbytes: int, anc: list) -> None:
        seg = nbytes
        rx_ns = None
        for level, kind, data in anc:
            if level == SOL_UDP and kind == UDP_GRO and len(data) >= 4:
                seg = _INT.unpack_from(data)[0] or nbytes
            elif level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= 16:
                sec, ns = _TIMESPEC.unpack_from(data)
                rx_ns = sec * 1_000_000_000 + ns
        first = unpack_udp_header(buf[:UDP_HEADER_BYTES])
        if first is None or first[0] != self.cookie or seg < UDP_HEADER_BYTES:
            self.foreign += 1
            return
        count = -(-nbytes // seg)
        last_at = (count - 1) * seg
        last = unpack_udp_header(buf[last_at:last_at + UDP_HEADER_BYTES]) if count > 1 else first
        last_seq = last[1] if last is not None and last[0] == self.cookie else first[1] + count - 1
        self.stats.update_batch(first[1], last_seq, count, first[2],
                                rx_ns if rx_ns is not None else time.time_ns(), nbytes)
