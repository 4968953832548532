"""ICMP echo probes (RFC 792 / RFC 4443) on one raw socket shared by all sessions in a loop.

Needs root or CAP_NET_RAW. Sessions are told apart by the echo identifier; the payload starts
with a magic so other ping processes' traffic on the same host is ignored. RTT uses kernel
software TX/RX timestamps like the STAMP sender (timestamps.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from wanprobe.errors import PermissionRequired, UsageError
from wanprobe.probe import probe_options as options
from wanprobe.probe import timestamps as ts
from wanprobe.probe.peer import IP_HEADER_BYTES, resolve_peer
from wanprobe.probe.probe_summary import Reply, summarize
from wanprobe.probe.result import ProbeResult
from wanprobe.probe.session_base import SessionIds, SessionRecords, drain_tx_stamps, send_failed

MAGIC = b"WANPROBE"
ICMP_HEADER = 8
_HDR = struct.Struct("!BBHHH")


def icmp_checksum(data: bytes) -> int:
    """RFC 1071 Internet checksum."""
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def echo_request(family: int, ident: int, seq: int, payload: bytes) -> bytes:
    """An echo request; IPv6 leaves the checksum to the kernel (RFC 3542 §3.1)."""
    if family == socket.AF_INET6:
        return _HDR.pack(128, 0, 0, ident, seq & 0xFFFF) + payload
    head = _HDR.pack(8, 0, 0, ident, seq & 0xFFFF)
    csum = icmp_checksum(head + payload)
    return _HDR.pack(8, 0, csum, ident, seq & 0xFFFF) + payload


@dataclass
class _Session(SessionRecords):
    peer: str
    ident: int


class IcmpSender:
    """One raw ICMP socket serving concurrent echo sessions in the running loop."""

    def __init__(self, family: int = socket.AF_INET, *, tx_timestamps: bool = True) -> None:
        self.family = family
        self.tx_timestamps = tx_timestamps
        self._sock: socket.socket | None = None
        self._loop = None
        self._by_ident: dict[int, _Session] = {}
        self._idents = SessionIds()
        self._tx_stamps = ts.TxStampTracker()  # OPT_ID -> (session, seq)

    def open(self) -> None:
        if self._sock is not None:
            return
        self._loop = asyncio.get_running_loop()
        proto = socket.IPPROTO_ICMPV6 if self.family == socket.AF_INET6 else socket.IPPROTO_ICMP
        try:
            sock = socket.socket(self.family, socket.SOCK_RAW, proto)
        except PermissionError:
            raise PermissionRequired("ICMP probes need root or CAP_NET_RAW") from None
        options.ready_socket(sock, tx_timestamps=self.tx_timestamps)
        self._sock = sock
        self._loop.add_reader(sock.fileno(), self._on_readable)

    def close(self) -> None:
        if self._sock is not None:
            options.close_socket(self._loop, self._sock)
            self._sock = None

    async def run(self, peer: str, *, count: int | None = None, duration_s: float | None = None,
                  interval_s: float = 1.0, size: int | None = None, dscp: int = 0,
                  timeout_s: float = 2.0, on_progress=None) -> ProbeResult:
        total = options.probe_count(count, duration_s, interval_s)
        overhead = IP_HEADER_BYTES[self.family] + ICMP_HEADER
        size = size if size is not None else overhead + 56
        if size < overhead + len(MAGIC):
            raise UsageError(f"--size {size} is below the ICMP minimum of {overhead + len(MAGIC)}")
        self.open()
        sess = _Session(peer, self._idents.take(self._by_ident, "ICMP sessions"))
        sess.done = asyncio.Event()
        self._by_ident[sess.ident] = sess
        payload = MAGIC + bytes(size - overhead - len(MAGIC))
        cmsgs = [ts.tos_cmsg(self.family, dscp << 2)] if dscp else []
        loop = self._loop
        started_ns = time.time_ns()
        t0 = loop.time()
        try:
            for seq in range(total):
                delay = t0 + seq * interval_s - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                self._send(sess, seq, echo_request(self.family, sess.ident, seq, payload), cmsgs)
                if on_progress is not None:
                    on_progress(seq + 1, len(sess.answered), total)
            sess.sending = False
            if len(sess.answered) < len(sess.tx_user_ns):
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(sess.done.wait(), timeout_s)
        finally:
            self._by_ident.pop(sess.ident, None)
            self._tx_stamps.forget(sess)
        return summarize(
            method="icmp", peer=peer, port=None, started_ns=started_ns,
            duration_s=loop.time() - t0, interval_s=interval_s, size_bytes=size, dscp=dscp,
            sent=len(sess.tx_user_ns), tx_user_ns=sess.tx_user_ns,
            tx_kernel_ns=sess.tx_kernel_ns, replies=sess.replies, timeout_ns=int(timeout_s * 1e9),
        )

    def _send(self, sess: _Session, seq: int, packet: bytes, cmsgs: list) -> None:
        now = time.time_ns()
        sess.tx_user_ns[seq] = now
        try:
            self._sock.sendmsg([packet], cmsgs, 0, (sess.peer, 0))
        except OSError as exc:
            send_failed(exc, f"ICMP to {sess.peer}")
            return
        if self.tx_timestamps:
            self._tx_stamps.sent((sess, seq))

    def _on_readable(self) -> None:
        sock = self._sock
        if sock is None:
            return
        if self.tx_timestamps and self._tx_stamps.pending:
            drain_tx_stamps(self._tx_stamps, sock)
        for _ in range(256):
            try:
                data, ancdata, _flags, addr = sock.recvmsg(65536, ts.ANC_BUFSIZE)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                continue
            tos = None
            if self.family == socket.AF_INET:
                if len(data) < 20:
                    continue
                ihl = (data[0] & 0x0F) * 4
                tos = data[1]
                icmp = data[ihl:]
                reply_type = 0
            else:
                icmp = data
                reply_type = 129
            if len(icmp) < ICMP_HEADER + len(MAGIC) or icmp[0] != reply_type:
                continue
            _t, _c, _sum, ident, seq16 = _HDR.unpack_from(icmp)
            sess = self._by_ident.get(ident)
            if sess is None or sess.peer != addr[0] or icmp[8:8 + len(MAGIC)] != MAGIC:
                continue
            seq = _unwrap(seq16, len(sess.tx_user_ns))
            if seq not in sess.tx_user_ns:
                continue
            anc = ts.parse_ancillary(ancdata)
            sess.replies.append(Reply(sseq=seq, rx_ns=anc.rx_ns or time.time_ns(),
                                      tos=tos if tos is not None else anc.tos))
            sess.answered.add(seq)
            if not sess.sending and len(sess.answered) >= len(sess.tx_user_ns):
                sess.done.set()


def _unwrap(seq16: int, sent: int) -> int:
    """Map a 16-bit echo sequence back to the latest probe number that has those low bits."""
    if sent <= 0x10000:
        return seq16
    base = (sent - 1) & ~0xFFFF
    seq = base | seq16
    return seq if seq < sent else seq - 0x10000


_shared: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


async def probe_icmp(peer: str, *, count: int | None = None, duration_s: float | None = None,
                     interval_s: float = 1.0, size: int | None = None, dscp: int = 0,
                     timeout_s: float = 2.0, sender: IcmpSender | None = None,
                     tx_timestamps: bool = True, on_progress: Callable | None = None,
                     port: int | None = None) -> ProbeResult:
    """ICMP echo probe of ``peer``; concurrent calls in one loop share one raw socket."""
    options.check_common(None, dscp, timeout_s)
    options.probe_count(count, duration_s, interval_s)
    family, addr = await resolve_peer(peer)
    kw = dict(count=count, duration_s=duration_s, interval_s=interval_s, size=size, dscp=dscp,
              timeout_s=timeout_s, on_progress=on_progress)
    if sender is not None:
        result = await sender.run(addr, **kw)
    else:
        with options.shared_sender(_shared, (family, tx_timestamps),
                           lambda: IcmpSender(family, tx_timestamps=tx_timestamps)) as shared:
            result = await shared.run(addr, **kw)
    return options.renamed(result, peer)
