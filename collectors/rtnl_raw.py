"""A minimal rtnetlink dump reader (RTM_GETLINK, RTM_GETQDISC) on a raw ``AF_NETLINK`` socket.

pyroute2 decodes every attribute of every message into Python objects, which costs ~5–20 ms per
dump on this 2-core VM; the sampling path needs a handful of fields, so this reads them directly
from the wire format (``include/uapi/linux/netlink.h``, ``rtnetlink.h``, ``if_link.h``,
``pkt_sched.h``). The ``parse_*`` functions are pure; :func:`dump` does the I/O. pyroute2 stays
the reference implementation (tests compare the two on this host) and the fallback.
"""

from __future__ import annotations

import itertools
import os
import socket
import struct

NLMSG = struct.Struct("=IHHII")            # nlmsghdr: len, type, flags, seq, pid
RTATTR = struct.Struct("=HH")              # rtattr: len, type
IFINFOMSG = struct.Struct("=BxHiII")       # family, pad, type, index, flags, change
TCMSG = struct.Struct("=BxxxiIII")         # family, pad×3, ifindex, handle, parent, info
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
RTM_NEWLINK, RTM_GETLINK, RTM_NEWQDISC, RTM_GETQDISC = 16, 18, 36, 38
IFLA_IFNAME, IFLA_MTU, IFLA_QDISC, IFLA_OPERSTATE, IFLA_STATS64, IFLA_CARRIER_CHANGES = \
    3, 4, 6, 16, 23, 35
TCA_KIND, TCA_STATS = 1, 3
OPERSTATES = ("UNKNOWN", "NOTPRESENT", "DOWN", "LOWERLAYERDOWN", "TESTING", "DORMANT", "UP")
# struct rtnl_link_stats64, in order (if_link.h); newer kernels append fields
STATS64_FIELDS = (
    "rx_packets", "tx_packets", "rx_bytes", "tx_bytes", "rx_errors", "tx_errors", "rx_dropped",
    "tx_dropped", "multicast", "collisions", "rx_length_errors", "rx_over_errors",
    "rx_crc_errors", "rx_frame_errors", "rx_fifo_errors", "rx_missed_errors",
    "tx_aborted_errors", "tx_carrier_errors", "tx_fifo_errors", "tx_heartbeat_errors",
    "tx_window_errors", "rx_compressed", "tx_compressed", "rx_nohandler", "rx_otherhost_dropped",
)
TC_STATS = struct.Struct("=QIIIIIII")      # struct tc_stats: bytes, packets, drops, overlimits,
TC_STATS_FIELDS = ("bytes", "packets", "drops", "overlimits", "bps", "pps", "qlen", "backlog")
_seq = itertools.count(1)


def parse_attrs(buf: bytes, offset: int = 0) -> dict[int, bytes]:
    """``{type: payload}`` of the rtattrs in ``buf[offset:]`` (NLA_F_* flag bits masked)."""
    out: dict[int, bytes] = {}
    while offset + RTATTR.size <= len(buf):
        length, kind = RTATTR.unpack_from(buf, offset)
        if length < RTATTR.size:
            break
        out[kind & 0x3FFF] = buf[offset + RTATTR.size: offset + length]
        offset += (length + 3) & ~3
    return out


def _cstr(b: bytes | None) -> str | None:
    return b.split(b"\0", 1)[0].decode("utf-8", "replace") if b is not None else None


def _u32(b: bytes | None) -> int | None:
    return struct.unpack_from("=I", b)[0] if b is not None and len(b) >= 4 else None


def parse_link(payload: bytes) -> dict:
    """One RTM_NEWLINK payload → ``{ifindex, name, mtu, qdisc, operstate, carrier_changes,
    stats64}``."""
    _family, _type, index, _flags, _change = IFINFOMSG.unpack_from(payload)
    a = parse_attrs(payload, IFINFOMSG.size)
    stats = None
    if IFLA_STATS64 in a:
        raw = a[IFLA_STATS64]
        n = min(len(raw) // 8, len(STATS64_FIELDS))
        stats = dict(zip(STATS64_FIELDS[:n], struct.unpack_from(f"={n}Q", raw), strict=True))
    oper = a.get(IFLA_OPERSTATE)
    return {"ifindex": index, "name": _cstr(a.get(IFLA_IFNAME)), "mtu": _u32(a.get(IFLA_MTU)),
            "qdisc": _cstr(a.get(IFLA_QDISC)),
            "operstate": OPERSTATES[oper[0]] if oper and oper[0] < len(OPERSTATES) else None,
            "carrier_changes": _u32(a.get(IFLA_CARRIER_CHANGES)), "stats64": stats}


def parse_qdisc(payload: bytes) -> dict:
    """One RTM_NEWQDISC payload → ``{ifindex, handle, parent, kind, stats}``."""
    _family, index, handle, parent, _info = TCMSG.unpack_from(payload)
    a = parse_attrs(payload, TCMSG.size)
    stats = None
    if TCA_STATS in a and len(a[TCA_STATS]) >= TC_STATS.size:
        stats = dict(zip(TC_STATS_FIELDS, TC_STATS.unpack_from(a[TCA_STATS]), strict=True))
    return {"ifindex": index, "handle": handle, "parent": parent,
            "kind": _cstr(a.get(TCA_KIND)), "stats": stats}


def split_messages(data: bytes, seq: int) -> tuple[list[tuple[int, bytes]], bool]:
    """``([(type, payload)], done)`` from one recv() buffer; raises OSError on NLMSG_ERROR."""
    out, offset = [], 0
    while offset + NLMSG.size <= len(data):
        length, kind, _flags, mseq, _pid = NLMSG.unpack_from(data, offset)
        if length < NLMSG.size:
            break
        body = data[offset + NLMSG.size: offset + length]
        offset += (length + 3) & ~3
        if mseq != seq:
            continue
        if kind == NLMSG_DONE:
            return out, True
        if kind == NLMSG_ERROR:
            err = -struct.unpack_from("=i", body)[0]
            if err:
                raise OSError(err, f"rtnetlink: {os.strerror(err)}")
            continue
        out.append((kind, body))
    return out, False


def dump(msg_type: int, body: bytes, sock: socket.socket | None = None) -> list[bytes]:
    """Send one NLM_F_DUMP request and collect every reply payload until NLMSG_DONE."""
    own = sock is None
    s = sock or socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC,
                              socket.NETLINK_ROUTE)
    try:
        seq = next(_seq)
        s.send(NLMSG.pack(NLMSG.size + len(body), msg_type, NLM_F_REQUEST | NLM_F_DUMP, seq, 0)
               + body)
        payloads: list[bytes] = []
        while True:
            msgs, done = split_messages(s.recv(1 << 16), seq)
            payloads += [p for _, p in msgs]
            if done:
                return payloads
    finally:
        if own:
            s.close()


def dump_links(sock: socket.socket | None = None) -> list[dict]:
    return [parse_link(p) for p in dump(RTM_GETLINK, IFINFOMSG.pack(0, 0, 0, 0, 0), sock)]


def dump_qdiscs(sock: socket.socket | None = None) -> list[dict]:
    return [parse_qdisc(p) for p in dump(RTM_GETQDISC, TCMSG.pack(0, 0, 0, 0, 0), sock)]
