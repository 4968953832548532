"""STAMP Session-Sender: many sessions on one UDP socket and one asyncio loop.

Each ``probe_stamp`` call is a session with its own SSID (RFC 8972 §3); a ``StampSender`` owns
the socket, demultiplexes replies by SSID and source, and matches TX timestamps from the error
queue (SO_TIMESTAMPING + OPT_ID) to sequence numbers. Every probe carries a Class-of-Service TLV
(RFC 8972 §4.4: DSCP/ECN seen at the reflector) and a Direct Measurement TLV (§4.5: reflector
receive count → forward vs reverse loss); a stateful reflector's own sequence number
(RFC 8762 §4.3.1) is the fallback when the reflector does not process TLVs.

Authenticated mode (RFC 8762 §4.2.2/§4.3.2/§4.4, ``hmac_key``): 112-octet base packets with an
HMAC-SHA-256/128 over octets 0-95, and an HMAC TLV (RFC 8972 §4.8) over the sequence number and
the TLVs. A reply whose base HMAC does not verify is dropped (the probe counts as lost); a reply
whose HMAC TLV fails or carries the I flag still measures RTT, but its TLVs are ignored.
Authenticated and unauthenticated sessions can share one socket: a reply is tried against the
authenticated layout first (SSID at octet 26) and only accepted for an authenticated session if
its HMAC verifies with that session's key; unauthenticated sessions never take a reply meant for
an authenticated one.

RTT = (T4 - T1) - (T3 - T2): kernel TX stamp (or the clock read just before sendmsg when TX
stamps are off or missing), kernel RX stamp, minus the reflector's residence time. One-way
delays T2 - T1 and T4 - T3 and the clocks' bound: clock_tlvs.py, owd.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import hmac
import socket
import struct
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

from wanprobe.errors import ProbeError, UsageError
from wanprobe.probe import limits
from wanprobe.probe import timestamps as ts
from wanprobe.probe.clock_tlvs import CLOCK_TLV_BYTES, SessionClock
from wanprobe.probe.local_clock import LOCAL_CLOCK, ClockWatcher
from wanprobe.probe.peer import IP_HEADER_BYTES, resolve_peer
from wanprobe.probe.probe_options import (
    check_common,
    close_socket,
    probe_count,
    ready_socket,
    renamed,
    shared_sender,
)
from wanprobe.probe.probe_summary import Reply
from wanprobe.probe.probe_tlvs import OWN_LAYOUT_LEN, REPORT_TLV_LEN, ReportLog
from wanprobe.probe.probe_tlvs import own_tlvs as _own_tlvs
from wanprobe.probe.probe_tlvs import slow_tlvs as _slow_tlvs
from wanprobe.probe.result import ProbeResult
from wanprobe.probe.sender_session import session_result, template_for
from wanprobe.probe.session_base import SessionIds, SessionRecords, drain_tx_stamps, send_failed
from wanprobe.probe.stamp_packet import (
    AUTH_BASE_LEN,
    BASE_LEN,
    FLAG_I,
    NTP_UNIX_OFFSET_S,
    TLV_HMAC,
    HmacKey,
    check_tlv_hmac,
    parse_tlvs,
)
from wanprobe.probe.stamp_packet import AUTH_REFLECTOR_LAYOUT as _AUTH_REFL
from wanprobe.probe.stamp_packet import AUTH_SENDER_LAYOUT as _AUTH_BASE
from wanprobe.probe.stamp_packet import REFLECTOR_LAYOUT as _REFL
from wanprobe.probe.stamp_packet import SENDER_LAYOUT as _BASE
from wanprobe.probe.timer_heap import TimerHeap

STAMP_PORT = 862
UDP_HEADER = 8
# CoS, Direct Measurement, Follow-Up, Timestamp Information and Same-clock, Reflector Report
TLV_BYTES = 8 + 16 + 20 + CLOCK_TLV_BYTES + REPORT_TLV_LEN
MIN_PAYLOAD = BASE_LEN + TLV_BYTES
SEND_AHEAD_S = 0.0002   # probes due this soon go out in the same timer tick
_TIMESPEC = struct.Struct("qq")
_S_TXC = struct.Struct("!I")
S_TXC_OFFSET = BASE_LEN + 8 + 4   # Direct Measurement TLV: Session-Sender TX count
SOL_SOCKET, IPPROTO_IP, IPPROTO_IPV6 = socket.SOL_SOCKET, socket.IPPROTO_IP, socket.IPPROTO_IPV6
# Authenticated mode (RFC 8762 §4.2.2/§4.3.2): base 0-95, HMAC 96-111, then CoS, DM, Follow-Up,
# Reflector Report, the HMAC TLV (RFC 8972 §4.8) over them, and Extra Padding last.
_U16 = struct.Struct("!H")
AUTH_TLVS_END = AUTH_BASE_LEN + TLV_BYTES                 # 208: the HMAC TLV starts here
AUTH_MIN_PAYLOAD = AUTH_TLVS_END + 4 + 16                 # 228
AUTH_S_TXC_OFFSET = AUTH_BASE_LEN + 8 + 4
_AUTH_TLV_HMAC_AT = AUTH_TLVS_END + 4                     # 212..228: the HMAC TLV value
_NTP_OFFSET_NS = NTP_UNIX_OFFSET_S * 1_000_000_000
_new_reply = tuple.__new__   # Reply(...) without NamedTuple's keyword handling, on the hot path
# With many concurrent sessions, wake-ups are coalesced: replies are read at most every
# COALESCE_S and probes due within COALESCE_S go out together. Kernel timestamps make this free
# for accuracy (they are taken when the packet moves, not when Python looks at it).
COALESCE_SESSIONS = 8
COALESCE_S = 0.025
ProgressFn = Callable[[int, int, int], None]


def min_size_bytes(family: int = socket.AF_INET, authenticated: bool = False) -> int:
    """Smallest STAMP probe wanprobe sends, as an IP packet (header included)."""
    return IP_HEADER_BYTES[family] + UDP_HEADER + (AUTH_MIN_PAYLOAD if authenticated
                                                   else MIN_PAYLOAD)


@dataclass
class _Session(SessionRecords):
    peer: str
    port: int
    ssid: int
    dscp: int
    payload_len: int
    timeout_ns: int
    follow_up_ns: dict[int, int] = field(default_factory=dict)  # reflector seq -> precise T3
    cancelled: bool = False
    next_seq: int = 0
    total: int = 0
    t0: float = 0.0
    interval_s: float = 1.0
    template: bytearray = field(default_factory=bytearray)
    on_progress: ProgressFn | None = None
    all_sent: asyncio.Future | None = None
    cmsgs: list = field(default_factory=list)     # per-session constant control messages
    dest: tuple = ()
    auth: HmacKey | None = None                   # authenticated mode (RFC 8762 §4.4)
    auth_rejected: int = 0                        # replies dropped: too short or bad HMAC
    tlv_rejected: int = 0                         # replies whose TLVs failed RFC 8972 §4.8
    size_bytes: int = 0
    started_ns: int = 0                           # wall clock when the session was opened
    clock: SessionClock | None = None             # both ends' clocks (clock_tlvs.py)
    err_word: int = 0x0001                        # our Error Estimate (RFC 4656 §4.1.2)
    report: ReportLog = field(default_factory=ReportLog)  # the reflector's drops, per reply

    def pending(self) -> int:
        return len(self.tx_user_ns) - len(self.answered)


class StampSender:
    """One UDP socket serving any number of concurrent STAMP sessions in the running loop."""

    def __init__(self, family: int = socket.AF_INET, *, tx_timestamps: bool = True,
                 source_port: int = 0, polled: bool = False,
                 clock: ClockWatcher | None = None) -> None:
        self.family = family
        self.source_port = source_port  # fixed: one ECMP flow (paths.py); 0: any
        self.tx_timestamps = tx_timestamps
        self.polled = polled   # True: no reader on the loop, the owner calls poll() instead
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._by_ssid: dict[int, _Session] = {}
        self._ssids = SessionIds()
        self._tx_stamps = ts.TxStampTracker()  # OPT_ID -> (session, seq)
        self._buf = bytearray(65536)
        self._timers = TimerHeap(self._tick)   # every session's next probe, one loop timer
        self._paused = False
        self._n_auth = 0   # authenticated sessions on this socket: replies get the auth demux
        self._clock = clock if clock is not None else LOCAL_CLOCK

    def open(self) -> None:
        """Create the socket (in the current thread's network namespace) and start reading."""
        if self._sock is not None:
            return
        self._loop = asyncio.get_running_loop()
        sock = socket.socket(self.family, socket.SOCK_DGRAM)
        try:
            ready_socket(sock, tx_timestamps=self.tx_timestamps)
            sock.bind(("::" if self.family == socket.AF_INET6 else "0.0.0.0", self.source_port))
        except OSError as exc:
            sock.close()
            raise ProbeError(f"cannot open a UDP socket for STAMP: {exc}") from None
        self._sock = sock
        if not self.polled:
            self._loop.add_reader(sock.fileno(), self._on_readable)

    def rcvbuf_bytes(self) -> int:
        """The receive buffer the kernel granted (SO_RCVBUF, after net.core.rmem_max)."""
        return self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) if self._sock else 0

    def close(self) -> None:
        if self._sock is not None:
            close_socket(self._loop, self._sock)
            self._sock = None

    # -- session ------------------------------------------------------------------------------
    async def run(self, peer: str, port: int = STAMP_PORT, *, count: int | None = None,
                  duration_s: float | None = None, interval_s: float = 1.0,
                  size: int | None = None, dscp: int = 0, timeout_s: float = 2.0,
                  on_progress: ProgressFn | None = None,
                  hmac_key: bytes | str | HmacKey | None = None) -> ProbeResult:
        """Run one session against ``peer`` (an address of this sender's family); with
        ``hmac_key`` in authenticated mode (RFC 8762 §4.2.2)."""
        total = probe_count(count, duration_s, interval_s)
        sess = self.open_session(peer, port, total=total, interval_s=interval_s, size=size,
                                 dscp=dscp, timeout_s=timeout_s, hmac_key=hmac_key)
        sess.on_progress = on_progress
        loop = self._loop
        t0 = sess.t0
        sess.all_sent = loop.create_future()
        sess.done = asyncio.Event()
        try:
            self._push(sess, t0)
            await sess.all_sent
            if sess.pending() > 0:
                sess.done.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(sess.done.wait(), timeout_s)
        finally:
            self.end_session(sess)
        if on_progress is not None:
            on_progress(total, len(sess.answered), total)
        return session_result(sess, loop.time() - t0)

    def open_session(self, peer: str, port: int, *, total: int, interval_s: float,
                     size: int | None, dscp: int, timeout_s: float,
                     hmac_key: bytes | str | HmacKey | None) -> _Session:
        """Register a session on this socket (own SSID, probe template), its clock started; the
        caller sends its probes (``_push`` or :meth:`send_probe`) and ends it with
        :meth:`end_session`."""
        try:
            auth = HmacKey.of(hmac_key)
        except ValueError as exc:
            raise UsageError(f"HMAC key: {exc}") from None
        smallest = min_size_bytes(self.family, auth is not None)
        size = size if size is not None else smallest
        payload_len = size - IP_HEADER_BYTES[self.family] - UDP_HEADER
        if size < smallest:
            raise UsageError(f"--size {size} is below the {'authenticated ' if auth else ''}"
                             f"STAMP minimum of {smallest} bytes")
        if size > limits.MAX_DATAGRAM_BYTES:
            raise UsageError(f"--size {size} is above the limit of {limits.MAX_DATAGRAM_BYTES} bytes "
                             "(one IP datagram)")
        self.open()
        sess = _Session(peer, port, self._ssids.take(self._by_ssid, "STAMP sessions on one socket"), dscp, payload_len, int(timeout_s * 1e9))
        sess.auth = auth
        sess.clock = SessionClock(self._clock.current())
        sess.err_word = sess.clock.error_word
        self._by_ssid[sess.ssid] = sess
        if auth is not None:
            self._n_auth += 1
        sess.template = template_for(sess)
        sess.cmsgs = [ts.tos_cmsg(self.family, dscp << 2)] if dscp else []
        sess.dest = (peer, port)
        sess.total = total
        sess.interval_s = interval_s
        sess.size_bytes = size
        sess.started_ns = time.time_ns()
        sess.t0 = self._loop.time()
        return sess

    def send_probe(self, sess: _Session) -> None:
        """Send ``sess``'s next probe now (ProbeError when the socket refuses it for good)."""
        self._send(sess, sess.next_seq, sess.template)
        sess.next_seq += 1

    def end_session(self, sess: _Session) -> None:
        """Stop sending for ``sess`` and release its SSID; replies after this are ignored."""
        sess.sending = False
        sess.cancelled = True
        if self._by_ssid.pop(sess.ssid, None) is not None and sess.auth is not None:
            self._n_auth -= 1
        self._tx_stamps.forget(sess)

    # -- one timer for all sessions: sends every probe that is due, then re-arms ------------------
    def _push(self, sess: _Session, due: float) -> None:
        self._timers.push(self._loop, due, sess)

    def _tick(self) -> None:
        heap = self._timers.heap
        many = len(self._by_ssid) > COALESCE_SESSIONS
        loop = self._loop
        horizon = loop.time() + (COALESCE_S if many else SEND_AHEAD_S)
        send, pop, push = self._send, heapq.heappop, self._timers.push
        while heap and heap[0][0] <= horizon:
            sess = pop(heap)[2]
            if sess.cancelled:
                continue
            seq = sess.next_seq
            try:
                send(sess, seq, sess.template)
            except ProbeError as exc:
                sess.cancelled = True
                if not sess.all_sent.done():
                    sess.all_sent.set_exception(exc)
                continue
            seq += 1
            sess.next_seq = seq
            if sess.on_progress is not None:
                sess.on_progress(seq, len(sess.answered), sess.total)
            if seq < sess.total:
                push(loop, sess.t0 + seq * sess.interval_s, sess)
            else:
                sess.sending = False
                if not sess.all_sent.done():
                    sess.all_sent.set_result(None)

    def _send(self, sess: _Session, seq: int, template: bytearray) -> None:
        now = time.time_ns()
        # ntp_from_ns inlined (RFC 5905 §6: 32.32 fixed point from 1900)
        sec, rem_ns = divmod(now + _NTP_OFFSET_NS, 1_000_000_000)
        ntp = ((sec & 0xFFFFFFFF) << 32) | ((rem_ns << 32) // 1_000_000_000)
        auth = sess.auth
        if auth is None:
            _BASE.pack_into(template, 0, seq, ntp, sess.err_word, sess.ssid)
            _S_TXC.pack_into(template, S_TXC_OFFSET, seq + 1)  # DM S_TxC
        else:  # RFC 8762 §4.2.2 layout; HMAC TLV (RFC 8972 §4.8) first, then the base HMAC
            _AUTH_BASE.pack_into(template, 0, seq, ntp, sess.err_word, sess.ssid)
            _S_TXC.pack_into(template, AUTH_S_TXC_OFFSET, seq + 1)
            template[_AUTH_TLV_HMAC_AT:AUTH_MIN_PAYLOAD] = auth.tlv_hmac(
                template[:4], template[AUTH_BASE_LEN:AUTH_TLVS_END])
            template[96:AUTH_BASE_LEN] = auth.digest(template[:96])
        sess.tx_user_ns[seq] = now
        try:
            if sess.cmsgs:
                self._sock.sendmsg([template], sess.cmsgs, 0, sess.dest)
            else:
                self._sock.sendto(template, sess.dest)
        except OSError as exc:
            send_failed(exc, f"to {sess.peer}:{sess.port}")
            return
        if self.tx_timestamps:
            self._tx_stamps.sent((sess, seq))

    # -- receive path --------------------------------------------------------------------------
    def _on_readable(self, limit: int = 256) -> None:
        """Drain replies and TX stamps (at most ``limit`` datagrams). Long because: the per-packet
        receive path is kept inline; a helper call per reply costs CPU at hundreds of sessions
        (bench/probe_scale.py)."""
        sock = self._sock
        if sock is None:
            return
        if self.tx_timestamps and self._tx_stamps.pending:
            drain_tx_stamps(self._tx_stamps, sock)
        by_ssid = self._by_ssid
        recv = sock.recvmsg_into
        anc_size = ts.ANC_BUFSIZE
        scm_ts, ip_tos, ipv6_tclass = ts.SCM_TIMESTAMPING, ts.IP_TOS, ts.IPV6_TCLASS
        buf = self._buf
        for _ in range(limit):
            try:
                n, ancdata, _flags, addr = recv([buf], anc_size)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                continue
            if n < 41:
                continue
            if self._n_auth and n >= AUTH_BASE_LEN:
                got = self._auth_reply(buf, n, addr)
            else:
                got = None
            if got is not None:
                sess, rseq, t3, t2, sseq, cos, dm = got
                if sess is None:
                    continue
            else:
                data = buf if n >= BASE_LEN else bytes(buf[:n]) + bytes(BASE_LEN - n)
                rseq, t3, err, ssid, t2, sseq, _t1, _se, _ttl = _REFL.unpack_from(data)
                sess = by_ssid.get(ssid)
                if sess is None or sess.peer != addr[0] or sess.auth is not None:
                    sess = self._match_without_ssid(addr)
                    if sess is None:
                        continue
                if sseq not in sess.tx_user_ns:
                    continue
                clk = sess.clock
                if err != clk.far_word:
                    clk.note_far(err)   # the reflector's Error Estimate of T2/T3 changed
                if clk.pending and n > BASE_LEN:
                    clk.read_tlvs(data[BASE_LEN:n])
                cos = dm = None
                if n >= OWN_LAYOUT_LEN and data[45] == 4 and data[53] == 5 and data[69] == 7:
                    # fast path: the TLVs this sender put in, at their fixed offsets
                    cos, dm = _own_tlvs(sess, data, BASE_LEN, sseq, n)
                elif n > BASE_LEN:
                    cos, dm = _slow_tlvs(sess, data[BASE_LEN:n], sseq)
            rx_ns = tos = None
            for level, typ, cdata in ancdata:  # inline ts.parse_ancillary: the hot path
                if typ == scm_ts and level == SOL_SOCKET:
                    sec, nsec = _TIMESPEC.unpack_from(cdata)
                    rx_ns = sec * 1_000_000_000 + nsec
                elif typ == ip_tos and level == IPPROTO_IP and cdata:
                    tos = cdata[0]
                elif level == IPPROTO_IPV6 and typ == ipv6_tclass:
                    tos = cdata[0]
            # ns_from_ntp inlined; field order of Reply: sseq, rx_ns, reflector_seq, t2_ns,
            # t3_ns, tos, cos, reflector_rx_count
            sess.replies.append(_new_reply(Reply, (
                sseq, rx_ns or time.time_ns(), rseq,
                (t2 >> 32) * 1_000_000_000 - _NTP_OFFSET_NS
                + (((t2 & 0xFFFFFFFF) * 1_000_000_000) >> 32) if t2 else None,
                (t3 >> 32) * 1_000_000_000 - _NTP_OFFSET_NS
                + (((t3 & 0xFFFFFFFF) * 1_000_000_000) >> 32) if t3 else None,
                tos, cos, dm[1] if dm else None,
            )))
            answered = sess.answered
            answered.add(sseq)
            if not sess.sending and sess.done is not None and len(sess.tx_user_ns) <= len(answered):
                sess.done.set()
        if len(self._by_ssid) > COALESCE_SESSIONS and not self._paused and not self.polled:
            self._paused = True
            self._loop.remove_reader(sock.fileno())
            self._loop.call_later(COALESCE_S, self._resume)

    def poll(self) -> None:
        """Read every reply and TX stamp waiting now (a ``polled`` sender's owner calls this,
        once per wake-up: no batch limit, so nothing that arrived is left for later)."""
        self._on_readable(1 << 16)

    def _resume(self) -> None:
        self._paused = False
        if self._sock is not None:
            self._loop.add_reader(self._sock.fileno(), self._on_readable)

    def _match_without_ssid(self, addr: tuple, authenticated: bool = False) -> _Session | None:
        """A reflector without RFC 8972 support returns SSID 0: match on the peer if unique
        among the sessions of the same mode."""
        found = [s for s in self._by_ssid.values() if s.peer == addr[0] and s.port == addr[1]
                 and (s.auth is not None) == authenticated]
        return found[0] if len(found) == 1 else None

    def _auth_reply(self, buf: bytearray, n: int, addr: tuple):
        """Try ``buf[:n]`` as an authenticated reply (RFC 8762 §4.3.2). None: not for an
        authenticated session (try the unauthenticated layout). Otherwise (session or None when
        dropped, reflector seq, T3, T2, sender seq, CoS, Direct Measurement)."""
        (ssid,) = _U16.unpack_from(buf, 26)
        sess = self._by_ssid.get(ssid)
        if sess is None or sess.auth is None or sess.peer != addr[0]:
            sess = self._match_without_ssid(addr, True) if ssid == 0 else None
            if sess is None:
                return None
        auth = sess.auth
        if not auth.verify_base(buf, n):
            # maybe an unauthenticated reply whose octets 26-27 look like this SSID
            sess.auth_rejected += 1
            return None
        rseq, t3, err, _ssid, t2, sseq, _t1, _se, _ttl = _AUTH_REFL.unpack_from(buf)
        if sseq not in sess.tx_user_ns:
            return (None, 0, 0, 0, 0, None, None)
        if err != sess.clock.far_word:
            sess.clock.note_far(err)
        cos = dm = None
        if n > AUTH_BASE_LEN:
            if (n >= AUTH_MIN_PAYLOAD and buf[113] == 4 and buf[121] == 5 and buf[137] == 7
                    and buf[AUTH_TLVS_END + 1] == TLV_HMAC
                    and not (buf[112] | buf[120] | buf[136] | buf[AUTH_TLVS_END]) & FLAG_I):
                # fast path: our own TLVs at their offsets; RFC 8972 §4.8 check before use
                with memoryview(buf) as mv:
                    ok = hmac.compare_digest(
                        auth.tlv_hmac(mv[:4], mv[AUTH_BASE_LEN:AUTH_TLVS_END]),
                        mv[_AUTH_TLV_HMAC_AT:AUTH_MIN_PAYLOAD])
                if ok:
                    cos, dm = _own_tlvs(sess, buf, AUTH_BASE_LEN, sseq, n)
                    if sess.clock.pending:
                        sess.clock.read_tlvs(buf[AUTH_BASE_LEN:AUTH_TLVS_END])
                else:
                    sess.tlv_rejected += 1
            else:
                data = bytes(buf[:n])
                rest = data[AUTH_BASE_LEN:]
                tlvs, _r = parse_tlvs(rest)
                if check_tlv_hmac(auth, data[:4], rest) is False \
                        or any(t.flags & FLAG_I for t in tlvs):
                    sess.tlv_rejected += 1  # RFC 8972 §4.8: stop processing the TLVs
                else:
                    cos, dm = _slow_tlvs(sess, rest, sseq)
                    if sess.clock.pending:
                        sess.clock.read_tlvs(rest)
        return sess, rseq, t3, t2, sseq, cos, dm


async def probe_stamp(peer: str, *, port: int = STAMP_PORT, count: int | None = None,
                      duration_s: float | None = None, interval_s: float = 1.0,
                      size: int | None = None, dscp: int = 0, timeout_s: float = 2.0,
                      sender: StampSender | None = None, tx_timestamps: bool = True,
                      on_progress: ProgressFn | None = None,
                      hmac_key: bytes | str | HmacKey | None = None) -> ProbeResult:
    """Probe ``peer``'s STAMP reflector. Concurrent calls in one loop share one socket. With
    ``hmac_key`` the session runs in authenticated mode (RFC 8762 §4.2.2/§4.4): replies that do
    not verify count as lost."""
    check_common(port, dscp, timeout_s)
    probe_count(count, duration_s, interval_s)
    try:
        hmac_key = HmacKey.of(hmac_key)
    except ValueError as exc:
        raise UsageError(f"HMAC key: {exc}") from None
    family, addr = await resolve_peer(peer)
    kw = dict(count=count, duration_s=duration_s, interval_s=interval_s, size=size, dscp=dscp,
              timeout_s=timeout_s, on_progress=on_progress, hmac_key=hmac_key)
    if sender is not None:
        result = await sender.run(addr, port, **kw)
    else:
        with shared_sender(_shared, (family, tx_timestamps),
                           lambda: StampSender(family, tx_timestamps=tx_timestamps)) as shared:
            result = await shared.run(addr, port, **kw)
    return renamed(result, peer)


# one socket per (loop, family) while any session uses it
_shared: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
