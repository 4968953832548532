"""Kernel timestamps of the moment a packet enters the lab's wire.

The forwarder reads a TUN device, and a TUN fd carries no timestamps: the time of read() is the
time the forwarder woke up, which on a VM is 0.05-0.3 ms (sometimes milliseconds) after the
packet arrived, and differs per packet. A probe reply that has to wake the forwarder then pays
that lateness on its way back while an ICMP echo reply (generated synchronously inside the
forwarder's own write()) does not, so the lab would be unfair to every probe that is not ping.

An AF_PACKET socket bound to the TUN device sees each packet the namespace transmits in
dev_queue_xmit_nit() (net/core/dev.c), just before tun_net_xmit() queues it for the forwarder,
and stamps the clone there (net_timestamp_set, CLOCK_REALTIME). A classic BPF filter keeps
only outgoing packets and only their first SNAP_BYTES bytes (Documentation/networking/filter.rst:
SKF_AD_PKTTYPE; PACKET_OUTGOING from include/uapi/linux/if_packet.h), so a 64 KiB GSO
super-packet costs one small copy. Both queues are filled in the same order; the forwarder pairs
each frame it reads with the oldest stamp whose leading bytes (IP header + 20) are the frame's,
dropping stamps of packets the TUN ring dropped.
"""

from __future__ import annotations

import collections
import ctypes
import errno
import socket
import struct
import time

ETH_P_ALL = 0x0003
SO_TIMESTAMPNS = 35
SO_ATTACH_FILTER = 26
SO_RCVBUFFORCE = 33
PACKET_OUTGOING = 4
SKF_AD_OFF = -0x1000
SKF_AD_PKTTYPE = 4
SNAP_BYTES = 64
MATCH_BYTES = 40  # IPv4 header + the first 20 bytes of TCP/UDP/ICMP: ids, ports, sequence
RCVBUF_BYTES = 32 << 20  # clones of GSO super-packets are charged at full size
MAX_PENDING = 4096

# ld [SKF_AD_OFF + SKF_AD_PKTTYPE]; jeq #PACKET_OUTGOING, keep, drop; keep: ret #SNAP; drop: ret #0
_FILTER = [(0x20, 0, 0, (SKF_AD_OFF + SKF_AD_PKTTYPE) & 0xFFFFFFFF),
           (0x15, 0, 1, PACKET_OUTGOING),
           (0x06, 0, 0, SNAP_BYTES),
           (0x06, 0, 0, 0)]
_TIMESPEC = struct.Struct("=qq")


class ArrivalStamps:
    """Outgoing-packet kernel timestamps of one TUN device, in CLOCK_MONOTONIC ns.

    Create it in the TUN's network namespace (a socket belongs to the namespace it was made in).
    """

    def __init__(self, ifname: str) -> None:
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(ETH_P_ALL))
        try:
            prog = b"".join(struct.pack("=HBBI", *insn) for insn in _FILTER)
            self._prog = ctypes.create_string_buffer(prog, len(prog))  # kept alive with the socket
            fprog = struct.pack("@HP", len(_FILTER), ctypes.addressof(self._prog))
            self.sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
            self.sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            try:
                self.sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RCVBUF_BYTES)
            except OSError:
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF_BYTES)
            self.sock.bind((ifname, ETH_P_ALL))
            self.sock.setblocking(False)
        except BaseException:
            self.sock.close()
            raise
        self.pending: collections.deque[tuple[bytes, int]] = collections.deque()
        self.cmsg_space = socket.CMSG_SPACE(_TIMESPEC.size)
        self.counters = {"stamped": 0, "unmatched": 0, "skipped": 0}

    def drain(self) -> None:
        """Move every queued stamp into ``pending`` (non-blocking)."""
        recvmsg = self.sock.recvmsg
        pending = self.pending
        mono_minus_real = time.monotonic_ns() - time.time_ns()
        while True:
            try:
                data, anc, _flags, _addr = recvmsg(SNAP_BYTES, self.cmsg_space)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                # bound while the TUN was down: the socket reports ENETDOWN once (af_packet.c
                # packet_do_bind) and receives again when the device comes up
                if exc.errno == errno.ENETDOWN:
                    continue
                raise
            for level, kind, raw in anc:
                if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                    sec, nsec = _TIMESPEC.unpack_from(raw)
                    pending.append((data[:MATCH_BYTES], sec * 1_000_000_000 + nsec + mono_minus_real))
                    break
        while len(pending) > MAX_PENDING:
            pending.popleft()

    def arrival_ns(self, ip_packet: bytes) -> int | None:
        """Monotonic time at which ``ip_packet`` entered the TUN, or None if no stamp matches."""
        if not self.pending:
            self.drain()
        head = ip_packet[:MATCH_BYTES]
        pending = self.pending
        for i, (h, ts) in enumerate(pending):
            if h == head:
                for _ in range(i):  # stamps of frames the TUN ring dropped
                    pending.popleft()
                pending.popleft()
                self.counters["skipped"] += i
                self.counters["stamped"] += 1
                return ts
            if i >= 64:
                break
        self.counters["unmatched"] += 1
        return None

    def close(self) -> None:
        self.sock.close()
