"""UDP throughput at a set rate: a paced sender and the receiver's loss/jitter accounting.

Jitter is the RFC 3550 §6.4.1 interarrival jitter, J += (|D| - J)/16 with D the change in
transit time between consecutive packets, as iperf3 -u reports it (in ms); a different figure
from the probes' jitter, the mean |IPDV| of RFC 5481 (probe/stats.ipdv_many_ms). Loss counts
sequence numbers never seen, against the sender's own packet count when it is known.

At line rate one ``send`` per datagram is the sender's limit (~0.5 Gbit/s of 1400-byte
datagrams from Python). With UDP GSO (``UDP_SEGMENT``, udp(7), Linux 4.18) one ``send`` of up to
64 KiB leaves as many datagrams of ``packet_bytes`` each, cut by the kernel or the NIC: the
sender writes each datagram's own header (sequence, send time) into one buffer and hands the
kernel up to GSO_MAX_SEGMENTS of them at once. Where the socket refuses it (an older kernel, a
route MTU below the datagram size) it sends one datagram per call and says so.
"""

from __future__ import annotations

import errno
import socket
import threading
import time
from dataclasses import dataclass

from wanprobe.json_fields import Decoded, open_object, optional
from wanprobe.throughput.protocol import UP, pack_udp_header_into

SOL_UDP = getattr(socket, "SOL_UDP", 17)
UDP_SEGMENT = 103          # include/uapi/linux/udp.h
UDP_GRO = 104
GSO_MAX_SEGMENTS = 64      # UDP_MAX_SEGMENTS was 64 before Linux 5.x raised it to 128
GSO_MAX_BYTES = 65000      # one send: the payload must fit one IP packet (64 KiB) with headers


@dataclass
class UdpReceiverStats:
    """Receiver-side accounting; ``update`` is O(1) per datagram."""

    packets: int = 0
    bytes: int = 0
    max_seq: int = -1
    out_of_order: int = 0
    jitter_ns: float = 0.0
    _last_transit_ns: int | None = None
    t_first_ns: int | None = None
    t_last_ns: int | None = None

    def update(self, seq: int, send_ns: int, rx_ns: int, nbytes: int) -> None:
        self.packets += 1
        self.bytes += nbytes
        if seq <= self.max_seq:
            self.out_of_order += 1
        else:
            self.max_seq = seq
        transit = rx_ns - send_ns
        if self._last_transit_ns is not None:
            self.jitter_ns += (abs(transit - self._last_transit_ns) - self.jitter_ns) / 16.0
        self._last_transit_ns = transit
        if self.t_first_ns is None:
            self.t_first_ns = rx_ns
        self.t_last_ns = rx_ns

    def update_batch(self, first_seq: int, last_seq: int, count: int, send_ns: int, rx_ns: int,
                     nbytes: int) -> None:
        """``count`` datagrams read at once (a GRO buffer): sequence numbers ``first_seq`` ..
        ``last_seq`` (their first and last; the kernel joins consecutive datagrams of one flow),
        jitter from the first one's transit."""
        self.update(first_seq, send_ns, rx_ns, nbytes)
        self.packets += count - 1
        self.max_seq = max(self.max_seq, last_seq)

    def lost_packets(self, packets_sent: int | None = None) -> int:
        """Datagrams not received (against the sender's count when given, else up to max seq);
        late (out-of-order) datagrams count as received, duplicates are not expected."""
        expected = packets_sent if packets_sent is not None else self.max_seq + 1
        return max(expected - self.packets, 0)

    def snapshot(self, packets_sent: int | None = None) -> dict:
        return {"packets": self.packets, "bytes": self.bytes,
                "lost_packets": self.lost_packets(packets_sent),
                "out_of_order": self.out_of_order, "jitter_ms": round(self.jitter_ns / 1e6, 4)}


@dataclass(frozen=True)
class UdpResult(Decoded, json_parts={"receiver_host_drops": optional(open_object),
                                     "sender_host_drops": optional(open_object)}):
    """A UDP test at a set rate. ``lost_packets`` is every datagram sent and not received;
    ``host_drop_events`` the buffers the receiving host dropped itself (its socket, its input
    backlog, its NIC: udp_sink.py, collectors/host_drops.py; a GRO buffer holds several
    datagrams, so at least that many datagrams); ``path_lost_packets`` what the path lost: all of
    it when the host dropped nothing, None when it did (the two cannot be told apart then, and
    none is booked on the path) or when a peer could not tell (an older server)."""

    target_bits_per_second: float
    bits_per_second: float
    sender_bits_per_second: float
    packet_bytes: int
    packets_sent: int
    packets_received: int
    lost_packets: int
    lost_percent: float
    out_of_order: int
    jitter_ms: float
    host_drop_events: int | None = None
    path_lost_packets: int | None = None
    receiver: str | None = None              # gro | socket (its own socket) | reflector
    receiver_rcvbuf_bytes: int | None = None
    receiver_host_drops: dict | None = None  # HostDrops increases over the test, far end
    sender_host_drops: dict | None = None    # ... at this end (SndbufErrors: sends dropped here)
    sender_segments: int = 1                 # datagrams per send (UDP GSO)
    sender_cpu_ratio: float | None = None    # the sending thread's CPU time over its wall time
    seconds: float | None = None             # the far end's arrival span (kernel timestamps)


def udp_interval_record(k: int, interval_s: float, snap: dict, last: dict) -> dict:
    """The server's ``interval`` report body for UDP interval ``k`` (``snap``/``last``: the
    receiver snapshots at its end and start)."""
    return {"k": k, "start_s": k * interval_s, "end_s": (k + 1) * interval_s,
            "streams": [{"id": 0, "direction": UP, "sending": False,
                         "bytes": snap["bytes"] - last["bytes"], "tcp_info": None}],
            "udp": {**snap, "packets": snap["packets"] - last["packets"]},
            "cpu_busy_percent": []}


@dataclass
class UdpSendState:
    """Live counters of the paced sender (read by the progress display); ``cpu_s`` is the
    sending thread's own CPU time, ``segments`` the datagrams per ``send`` (1 without GSO)."""

    packets: int = 0
    bytes: int = 0
    errors: int = 0
    t_start: float | None = None
    t_last: float | None = None
    cpu_s: float = 0.0
    segments: int = 1
    gso_note: str | None = None


def enable_gso(sock: socket.socket, packet_bytes: int) -> int:
    """Datagrams per ``send`` on ``sock``: UDP_SEGMENT set to ``packet_bytes`` (up to
    GSO_MAX_SEGMENTS in GSO_MAX_BYTES), or 1 where the kernel refuses the option."""
    segments = min(GSO_MAX_SEGMENTS, GSO_MAX_BYTES // max(packet_bytes, 1))
    if segments < 2:
        return 1
    try:
        sock.setsockopt(SOL_UDP, UDP_SEGMENT, packet_bytes)
    except OSError:
        return 1
    return segments


def send_paced(sock: socket.socket, cookie: bytes, *, rate_bps: float, duration_s: float,
               packet_bytes: int, max_bytes: int, state: UdpSendState,
               abort: threading.Event) -> None:
    """Send ``packet_bytes`` datagrams at ``rate_bps`` for ``duration_s`` (blocking; in a thread),
    ``state.segments`` of them per ``send`` (GSO, see :func:`enable_gso`).

    Pacing is by schedule, not sleep length: datagram i is due at t0 + i·size·8/rate, so
    sleeping late is caught up in a burst instead of lowering the rate. A blocking socket waits
    while the first hop's queue is full (the sender is then held back to the rate the path
    takes, udp_sendmsg's sk_wmem accounting).
    """
    cpu0 = time.thread_time()
    buf = bytearray(packet_bytes * state.segments)
    view = memoryview(buf)
    gap_s = packet_bytes * 8.0 / rate_bps
    t0 = time.monotonic()
    state.t_start = t0
    end = t0 + duration_s
    seq = 0
    try:
        while not abort.is_set():
            now = time.monotonic()
            if now >= end or state.bytes + packet_bytes > max_bytes:
                break
            due = min(int((now - t0) / gap_s) + 1, seq + (max_bytes - state.bytes) // packet_bytes)
            while seq < due and not abort.is_set():
                now_ns = time.monotonic_ns()
                if now_ns >= end * 1e9:  # a sender held back by its first hop stops on time
                    break
                n = min(due - seq, state.segments)
                for i in range(n):
                    pack_udp_header_into(buf, i * packet_bytes, cookie, seq + i, now_ns)
                try:
                    sock.send(view[:n * packet_bytes])
                    state.bytes += n * packet_bytes
                except OSError as exc:
                    if n > 1 and exc.errno in (errno.EINVAL, errno.EMSGSIZE, errno.EIO):
                        # the route's MTU is below a datagram, or no GSO on this path: one by one
                        state.segments = 1
                        state.gso_note = (f"UDP GSO refused ({errno.errorcode.get(exc.errno)}): "
                                          "one datagram per send, the sender may be the limit")
                        continue
                    state.errors += n  # e.g. ECONNREFUSED from an ICMP error: keep the schedule
                seq += n
                state.packets = seq
            state.t_last = time.monotonic()
            nxt = t0 + seq * gap_s
            time.sleep(min(max(nxt - time.monotonic(), 0.0), 0.002))
    finally:
        state.cpu_s = time.thread_time() - cpu0


def far_end_drops(end: dict, lost: int) -> dict:
    """From the server's ``end`` totals: the drop events of its host (its test socket's own
    counter, else its namespace's UDP RcvbufErrors; its CPUs' input backlog; its NIC) and what
    the path lost — all that was lost when the host dropped nothing, else unknown (None), never
    booked on the path. Unknown (None) too from a server that does not report them."""
    drops = end.get("host_drops")
    facts = {"receiver": end.get("receiver") if isinstance(end.get("receiver"), str) else None,
             "receiver_rcvbuf_bytes": _count(end.get("rcvbuf_bytes"))}
    if not isinstance(drops, dict):
        return {**facts, "host_drop_events": None, "path_lost_packets": None}
    own = _count(end.get("socket_drops"))
    if own is None:
        own = _count(drops.get("udp_rcvbuf_errors"))
    events = sum(p or 0 for p in (own, _count(drops.get("backlog_drops")),
                                  _count(drops.get("nic_rx_drops"))))
    return {**facts, "receiver_host_drops": {k: _count(v) for k, v in drops.items()
                                             if isinstance(k, str)},
            "host_drop_events": events, "path_lost_packets": None if events else max(lost, 0)}


def udp_totals(end: object, peer: str) -> dict:
    """The far end's UDP totals, checked: packets and bytes non-negative integers, the arrival
    span a positive number or None, lost packets a count or None; ProbeError (one line) for a
    peer that sends anything else."""
    from wanprobe.errors import ProbeError

    if not isinstance(end, dict) or _count(end.get("packets")) is None \
            or _count(end.get("bytes")) is None:
        raise ProbeError(f"{peer}: malformed UDP totals from the server")
    secs = end.get("seconds")
    ok = isinstance(secs, int | float) and not isinstance(secs, bool) and 0 < secs < 1e6
    jitter = end.get("jitter_ms")
    return {**end, "seconds": secs if ok else None, "lost_packets": _count(end.get("lost_packets")),
            "out_of_order": _count(end.get("out_of_order")) or 0,
            "jitter_ms": jitter if isinstance(jitter, int | float) and not isinstance(jitter, bool)
            and 0 <= jitter < 1e9 else 0.0}


def _count(value: object) -> int | None:
    """A non-negative integer counter from a peer's report, else None (a hostile or old peer)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
