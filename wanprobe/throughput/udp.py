"""UDP throughput at a set rate: a paced sender and the receiver's loss/jitter accounting.

Jitter is the RFC 3550 §6.4.1 interarrival jitter, J += (|D| - J)/16 with D the change in
transit time between consecutive packets, as iperf3 -u reports it (in ms). Loss counts
sequence numbers never seen, against the sender's own packet count when it is known.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass

from wanprobe.throughput.protocol import UDP_HEADER_BYTES, UP, pack_udp_header


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

    def lost_packets(self, packets_sent: int | None = None) -> int:
        """Datagrams not received (against the sender's count when given, else up to max seq);
        late (out-of-order) datagrams count as received, duplicates are not expected."""
        expected = packets_sent if packets_sent is not None else self.max_seq + 1
        return max(expected - self.packets, 0)

    def snapshot(self, packets_sent: int | None = None) -> dict:
        return {"packets": self.packets, "bytes": self.bytes,
                "lost_packets": self.lost_packets(packets_sent),
                "out_of_order": self.out_of_order, "jitter_ms": round(self.jitter_ns / 1e6, 4)}


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
    """Live counters of the paced sender (read by the progress display)."""

    packets: int = 0
    bytes: int = 0
    errors: int = 0
    t_start: float | None = None
    t_last: float | None = None


def send_paced(sock: socket.socket, cookie: bytes, *, rate_bps: float, duration_s: float,
               packet_bytes: int, max_bytes: int, state: UdpSendState,
               abort: threading.Event) -> None:
    """Send ``packet_bytes`` datagrams at ``rate_bps`` for ``duration_s`` (blocking; in a thread).

    Pacing is by schedule, not sleep length: packet i is due at t0 + i·size·8/rate, so sleeping
    late is caught up in a burst instead of lowering the rate.
    """
    pad = bytes(max(packet_bytes - UDP_HEADER_BYTES, 0))
    gap_s = packet_bytes * 8.0 / rate_bps
    t0 = time.monotonic()
    state.t_start = t0
    end = t0 + duration_s
    seq = 0
    while not abort.is_set():
        now = time.monotonic()
        if now >= end or state.bytes + packet_bytes > max_bytes:
            break
        due = int((now - t0) / gap_s) + 1
        while seq < due:
            try:
                sock.send(pack_udp_header(cookie, seq, time.monotonic_ns()) + pad)
                state.bytes += packet_bytes
            except OSError:
                state.errors += 1  # e.g. ECONNREFUSED from an ICMP error; keep the schedule
            seq += 1
            state.packets = seq
        state.t_last = time.monotonic()
        nxt = t0 + seq * gap_s
        time.sleep(min(max(nxt - time.monotonic(), 0.0), 0.002))
