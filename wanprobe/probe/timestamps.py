"""Kernel packet timestamps and per-packet IP header fields from recvmsg ancillary data.

Constants are the asm-generic / x86-64 values (include/uapi/asm-generic/socket.h,
include/uapi/linux/net_tstamp.h, include/uapi/linux/in.h); Python 3.11 does not export them.
Semantics: Documentation/networking/timestamping.rst. Software RX stamps are taken in
``__netif_receive_skb``, software TX stamps in the driver's ``skb_tx_timestamp()`` (veth, tun and
loopback all call it), both CLOCK_REALTIME, so RTT = rx - tx leaves out the Python send/receive
path on the measuring host.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

SO_TIMESTAMPNS = 35          # SO_TIMESTAMPNS_OLD: cmsg holds struct timespec {long, long}
SO_TIMESTAMPING = 37         # SO_TIMESTAMPING_OLD: cmsg holds struct scm_timestamping {ts[3]}
SCM_TIMESTAMPNS = SO_TIMESTAMPNS
SCM_TIMESTAMPING = SO_TIMESTAMPING

SOF_TIMESTAMPING_TX_SOFTWARE = 1 << 1
SOF_TIMESTAMPING_RX_SOFTWARE = 1 << 3
SOF_TIMESTAMPING_SOFTWARE = 1 << 4
SOF_TIMESTAMPING_OPT_ID = 1 << 7
SOF_TIMESTAMPING_OPT_TSONLY = 1 << 11

IP_TOS = 1
IP_TTL = 2
IP_PKTINFO = 8
IP_MTU_DISCOVER = 10
IP_RECVERR = 11
IP_RECVTTL = 12
IP_RECVTOS = 13
IP_MTU = 14
IP_PMTUDISC_PROBE = 3
IPV6_RECVERR = 25
IPV6_MTU_DISCOVER = 23
IPV6_MTU = 24
IPV6_PMTUDISC_PROBE = 3
IPV6_RECVPKTINFO = 49
IPV6_PKTINFO = 50
IPV6_RECVHOPLIMIT = 51
IPV6_HOPLIMIT = 52
IPV6_RECVTCLASS = 66
IPV6_TCLASS = 67

SO_EE_ORIGIN_TIMESTAMPING = 4
MSG_ERRQUEUE = 0x2000

ANC_BUFSIZE = 512
_TIMESPEC = struct.Struct("qq")
_EXT_ERR = struct.Struct("IBBBBII")
_U32 = struct.Struct("I")


@dataclass(frozen=True, slots=True)
class Ancillary:
    """What the kernel told us about one received datagram; None when absent."""

    rx_ns: int | None = None
    tos: int | None = None            # full TOS / traffic-class byte (DSCP << 2 | ECN)
    ttl: int | None = None
    local_addr: str | None = None     # header destination address (IP_PKTINFO)


def enable_rx_metadata(sock: socket.socket, *, timestamping: bool = False,
                       tx_timestamps: bool = False, ttl_and_dst: bool = True) -> None:
    """Ask for RX timestamps, the received TOS/TTL and the local address on ``sock``.

    ``timestamping`` selects SO_TIMESTAMPING (with optional TX software stamps on the error
    queue, ids from SOF_TIMESTAMPING_OPT_ID counting sends from 0) instead of SO_TIMESTAMPNS.
    ``ttl_and_dst=False`` skips the TTL and destination-address messages (a sender needs
    neither, and each costs time on every packet).
    """
    if timestamping or tx_timestamps:
        flags = SOF_TIMESTAMPING_RX_SOFTWARE | SOF_TIMESTAMPING_SOFTWARE
        if tx_timestamps:
            flags |= SOF_TIMESTAMPING_TX_SOFTWARE | SOF_TIMESTAMPING_OPT_ID \
                | SOF_TIMESTAMPING_OPT_TSONLY
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, flags)
    else:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    if sock.family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, IPV6_RECVTCLASS, 1)
        if ttl_and_dst:
            sock.setsockopt(socket.IPPROTO_IPV6, IPV6_RECVHOPLIMIT, 1)
            sock.setsockopt(socket.IPPROTO_IPV6, IPV6_RECVPKTINFO, 1)
    if sock.family == socket.AF_INET or sock.type == socket.SOCK_DGRAM:
        try:
            sock.setsockopt(socket.IPPROTO_IP, IP_RECVTOS, 1)
            if ttl_and_dst:
                sock.setsockopt(socket.IPPROTO_IP, IP_RECVTTL, 1)
                sock.setsockopt(socket.IPPROTO_IP, IP_PKTINFO, 1)
        except OSError:
            if sock.family == socket.AF_INET:
                raise


def parse_ancillary(ancdata: list[tuple[int, int, bytes]]) -> Ancillary:
    """Pick the RX timestamp, TOS, TTL and destination address out of recvmsg ancillary data."""
    rx_ns = tos = ttl = None
    local = None
    for level, typ, data in ancdata:
        if level == socket.SOL_SOCKET:
            if typ in (SCM_TIMESTAMPNS, SCM_TIMESTAMPING) and len(data) >= 16:
                sec, nsec = _TIMESPEC.unpack_from(data)
                if sec or nsec:
                    rx_ns = sec * 1_000_000_000 + nsec
        elif level == socket.IPPROTO_IP:
            if typ == IP_TOS and data:
                tos = data[0]
            elif typ == IP_TTL and len(data) >= 4:
                ttl = int.from_bytes(data[:4], "little")
            elif typ == IP_PKTINFO and len(data) >= 12:
                local = socket.inet_ntop(socket.AF_INET, data[8:12])
        elif level == socket.IPPROTO_IPV6:
            if typ == IPV6_TCLASS and len(data) >= 4:
                tos = int.from_bytes(data[:4], "little") & 0xFF
            elif typ == IPV6_HOPLIMIT and len(data) >= 4:
                ttl = int.from_bytes(data[:4], "little")
            elif typ == IPV6_PKTINFO and len(data) >= 16:
                local = socket.inet_ntop(socket.AF_INET6, data[:16])
    return Ancillary(rx_ns, tos, ttl, local)


def tos_cmsg(family: int, tos: int) -> tuple[int, int, bytes]:
    """A sendmsg control message setting the TOS / traffic class of one datagram."""
    if family == socket.AF_INET6:
        return (socket.IPPROTO_IPV6, IPV6_TCLASS, struct.pack("i", tos))
    return (socket.IPPROTO_IP, IP_TOS, struct.pack("i", tos))


def source_cmsg(family: int, local_addr: str) -> tuple[int, int, bytes]:
    """A sendmsg control message choosing the source address (answers leave from the address
    the request was sent to, even on a socket bound to the wildcard)."""
    if family == socket.AF_INET6:
        return (socket.IPPROTO_IPV6, IPV6_PKTINFO,
                socket.inet_pton(socket.AF_INET6, local_addr) + struct.pack("I", 0))
    return (socket.IPPROTO_IP, IP_PKTINFO,
            struct.pack("i", 0) + socket.inet_pton(socket.AF_INET, local_addr) + bytes(4))


def read_tx_timestamps(sock: socket.socket, limit: int = 1024) -> list[tuple[int, int]]:
    """Drain software TX timestamps from the error queue: [(opt_id, tx_ns), ...].

    One recvmsg per stamp (Python has no recvmmsg), so this is on every probe's path: the
    cmsg checks are ordered by type first and read ``sock_extended_err`` (linux/errqueue.h:
    u32 errno; u8 origin, type, code, pad; u32 info; u32 data) by offset."""
    out: list[tuple[int, int]] = []
    recvmsg = sock.recvmsg
    unpack_ts = _TIMESPEC.unpack_from
    unpack_u32 = _U32.unpack_from
    sol_socket = socket.SOL_SOCKET
    for _ in range(limit):
        try:
            ancdata = recvmsg(0, ANC_BUFSIZE, MSG_ERRQUEUE)[1]
        except OSError:  # BlockingIOError: queue drained; anything else: stop for now
            break
        ts_ns = opt_id = None
        for level, typ, data in ancdata:
            if typ == SCM_TIMESTAMPING and level == sol_socket and len(data) >= 16:
                sec, nsec = unpack_ts(data)
                ts_ns = sec * 1_000_000_000 + nsec
            elif (typ == IP_RECVERR and level == socket.IPPROTO_IP
                  or typ == IPV6_RECVERR and level == socket.IPPROTO_IPV6) \
                    and len(data) >= _EXT_ERR.size and data[4] == SO_EE_ORIGIN_TIMESTAMPING:
                opt_id = unpack_u32(data, 12)[0]
        if ts_ns and opt_id is not None:
            out.append((opt_id, ts_ns))
    return out


REORDER_SLACK = 64   # stamps may arrive this many ids out of order before one counts as lost


class TxStampTracker:
    """Pairs kernel TX software stamps with what was sent (sender, ICMP sender and reflector).

    With SOF_TIMESTAMPING_OPT_ID the kernel numbers every datagram sent on the socket from 0
    (u32, wrapping; Documentation/networking/timestamping.rst), so a local counter advanced on
    each *successful* send predicts the id its stamp will carry. ``max_pending`` bounds the map
    when stamps never come (no TX stamping on this host): it is then simply emptied.
    """

    __slots__ = ("_next_id", "pending", "max_pending")

    def __init__(self, max_pending: int | None = None) -> None:
        self._next_id = 0
        self.pending: dict[int, object] = {}
        self.max_pending = max_pending

    def sent(self, what: object) -> None:
        """Record that one datagram, identified by ``what``, has just been sent."""
        pending = self.pending
        if self.max_pending is not None and len(pending) > self.max_pending:
            pending.clear()
        pending[self._next_id] = what
        self._next_id = (self._next_id + 1) & 0xFFFFFFFF

    def drain(self, sock: socket.socket, limit: int = 1024) -> list[tuple[object, int]]:
        """Read the stamps waiting on ``sock``: [(what, tx_ns), ...] for the ones we sent."""
        pending = self.pending
        pop = pending.pop
        out = []
        opt_id = None
        for opt_id, tx_ns in read_tx_timestamps(sock, limit):
            what = pop(opt_id, None)
            if what is not None:
                out.append((what, tx_ns))
        if opt_id is not None:
            self._drop_lost(opt_id)
        return out

    def _drop_lost(self, newest_id: int) -> None:
        """Stamps leave one socket's error queue in send order; one that has not come while
        stamps of datagrams sent ``REORDER_SLACK`` later have, was dropped by the kernel (error
        queue over the receive buffer, net/core/skbuff.c sock_queue_err_skb): forget it, so the
        map (in send order) never grows and ``forget`` stays cheap. That probe falls back to the
        clock read before sendmsg."""
        pending = self.pending
        while pending:
            oldest = next(iter(pending))
            if not REORDER_SLACK <= (newest_id - oldest) & 0xFFFFFFFF < 0x80000000:
                return
            del pending[oldest]

    def forget(self, owner: object) -> None:
        """Drop pending entries ``(owner, ...)`` whose stamps nobody will wait for any more."""
        pending = self.pending
        for k in [k for k, v in pending.items() if v[0] is owner]:
            del pending[k]
