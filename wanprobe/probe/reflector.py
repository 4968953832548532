"""The STAMP Session-Reflector (RFC 8762, stateful) on one UDP socket.

Without a key it runs in unauthenticated mode (and answers TWAMP-Light). With ``hmac_key`` it
runs in authenticated mode only (RFC 8762 §4.2.2/§4.3.2/§4.4): a datagram shorter than 112 octets
or whose HMAC does not verify is counted (``auth_failed``) and dropped before it touches any
session state, rate-limit bucket or reply; a good one is answered in the authenticated layout
with the reflector's own HMAC, and its TLVs are answered only if their HMAC TLV verifies
(RFC 8972 §4.8; else copied with the I flag, counted in ``tlv_auth_failed``).

Runs inside any asyncio loop (``loop.add_reader`` on a non-blocking socket; no threads). Every
datagram is first offered to ``udp_tap(data, addr, rx_ns)``; True means another service (the
throughput server's UDP tests) consumed it. Sessions are SSID + 4-tuple (RFC 8972 §3). T2 is the
kernel RX timestamp (SO_TIMESTAMPING software RX); T3 is read right before sendmsg, and the
kernel's software TX timestamp of each reply (error queue) is sent back in the Follow-Up
Telemetry TLV of the session's next reply (RFC 8972 §4.7), so a sender can take the Python
send path out of the turnaround time as well. T2/T3 carry this host's Error Estimate (RFC 4656
§4.1.2) and the Timestamp Information and Same-clock TLVs are answered from its clock state
(local_clock.py, refreshed in the background).

What the reflector receives and does not answer is never the path's loss (issue 20): a probe of a
session that the rate limit drops, or that authenticated mode refuses as a replay
(replay_window.py), is still counted as received in the session (Direct Measurement R_RxC,
RFC 8972 §4.5) and counted by cause; every reply carries the session's causes, its epoch and the
rate limit in the Reflector Report TLV (reflector_report.py). A new session that would have to
evict a session that is still probing is refused instead (session_table.py, issue 19), counted
in ``session_refused``; the table shares its room max-min fairly between source groups, so a
flood from many sources cannot lock other probers out (issue 37). A refused probe that carries
the Reflector Report TLV (a wanprobe sender) is answered, within its source's reply rate limit,
with the TLV's session-refused flag and no session behind it, so the sender reports a refusal
rather than path loss (``refusals_answered``).
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from wanprobe.errors import ProbeError
from wanprobe.probe import timestamps as ts
from wanprobe.probe.access import AllowList, DscpPolicy
from wanprobe.probe.local_clock import LOCAL_CLOCK, ClockWatcher
from wanprobe.probe.probe_options import close_socket, ready_socket
from wanprobe.probe.reflect_logic import build_reply
from wanprobe.probe.reflector_report import SESSION_REFUSED, offset_in
from wanprobe.probe.replay_window import fresh
from wanprobe.probe.session_table import (
    EPOCH,
    FOLLOW_UP,
    MAX_SESSIONS,
    PER_SOURCE,
    RATE_LIMITED,
    REFUSED,
    RX,
    START,
    START_SEQS,
    TX,
    SessionTable,
)
from wanprobe.probe.stamp_packet import (
    AUTH_BASE_LEN,
    BASE_LEN,
    TWAMP_REFLECTOR_MIN_LEN,
    HmacKey,
    ntp_from_ns,
)

UdpTap = Callable[[bytes, tuple, int], bool]
MAX_DATAGRAM = 9216            # larger (beyond a 9000-byte jumbo frame) is counted and dropped
SESSION_IDLE_S = 120.0
MAX_SOURCES = 65536
MAX_CMSG_CACHE = 4096
DEFAULT_RATE_PPS = 5000.0      # replies per second per source address (token bucket)
BATCH = 256                    # datagrams handled per wake-up before yielding to the loop


@dataclass(frozen=True)
class SessionStats:
    ssid: int
    peer: str
    peer_port: int
    local: str | None
    rx: int
    tx: int

    def to_json(self) -> dict:
        return {"ssid": self.ssid, "peer": self.peer, "peer_port": self.peer_port,
                "local": self.local, "rx": self.rx, "tx": self.tx}


@dataclass(frozen=True)
class ReflectorStats:
    received: int
    reflected: int
    tapped: int
    short: int
    oversize: int
    malformed: int
    rate_limited: int
    send_errors: int
    sessions: tuple[SessionStats, ...]
    auth_failed: int = 0       # authenticated mode: too short or bad HMAC, dropped
    tlv_auth_failed: int = 0   # authenticated mode: answered, but the HMAC TLV failed (I flag)
    authenticated: bool = False
    not_allowed: int = 0       # source outside --allow / daemon.allow: dropped unparsed
    evicted: int = 0           # idle sessions evicted (per-source share or table full), LRU first
    session_refused: int = 0   # new sessions refused: the share or table held only active ones
    replayed: int = 0          # authenticated mode: refused by the anti-replay window
    refusals_answered: int = 0  # refused probes told so (Reflector Report TLV flag)
    reclaimed: int = 0         # sessions taken from the largest source group for a smaller one

    def to_json(self) -> dict:
        d = {k: getattr(self, k) for k in ("received", "reflected", "tapped", "short",
                                          "oversize", "malformed", "rate_limited",
                                          "send_errors", "auth_failed", "tlv_auth_failed",
                                          "authenticated", "not_allowed", "evicted",
                                          "session_refused", "replayed", "refusals_answered",
                                          "reclaimed")}
        d["sessions"] = [s.to_json() for s in self.sessions]
        return d


class Reflector:
    """Stateful STAMP / TWAMP-Light reflector. ``rate_pps``/``burst`` bound replies per source
    address (token bucket); ``dscp_permitted(dscp)`` is the DSCP policy of replies (default: any
    but 48-63, see access.py); ``hmac_key`` switches to authenticated mode (RFC 8762 §4.4);
    ``allow`` (CIDRs) drops datagrams from other sources before they are parsed; the session
    table gives each source at most ``sessions_per_source`` of ``max_sessions`` (LRU, O(1))."""

    def __init__(self, *, udp_tap: UdpTap | None = None, rate_pps: float = DEFAULT_RATE_PPS,
                 burst: int = 1000, max_datagram: int = MAX_DATAGRAM,
                 dscp_permitted: Callable[[int], bool] | None = None,
                 session_idle_s: float = SESSION_IDLE_S,
                 hmac_key: bytes | str | HmacKey | None = None, allow: tuple[str, ...] = (),
                 max_sessions: int = MAX_SESSIONS, sessions_per_source: int = PER_SOURCE,
                 clock: ClockWatcher | None = None) -> None:
        try:
            self._auth = HmacKey.of(hmac_key)
        except ValueError as exc:
            raise ProbeError(f"reflector HMAC key: {exc}") from None
        self.udp_tap = udp_tap
        self.rate_pps = float(rate_pps)
        self._limit_pps = int(self.rate_pps) if self.rate_pps >= 1 else 1  # as advertised
        self.burst = float(burst)
        self.max_datagram = max_datagram
        self.dscp_permitted = dscp_permitted if dscp_permitted is not None else DscpPolicy()
        self.allow = AllowList(allow) if allow else None  # None: one test per packet, no call
        self.session_idle_s = session_idle_s
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._buf = bytearray(max_datagram + 1)
        self._sessions = SessionTable(max_sessions=max_sessions, per_source=sessions_per_source,
                                      idle_s=session_idle_s)
        # OPT_ID -> (session, reflector seq); emptied when stamps are not coming (no TX stamping)
        self._tx_stamps = ts.TxStampTracker(max_pending=4 * BATCH)
        self._buckets: dict[str, list[float]] = {}    # source -> [tokens, last_s]
        self._c = dict.fromkeys(("received", "reflected", "tapped", "short", "oversize",
                                 "malformed", "rate_limited", "send_errors", "auth_failed",
                                 "tlv_auth_failed", "not_allowed", "replayed",
                                 "refusals_answered"), 0)
        self._last_sweep = time.monotonic()
        self._cmsgs: dict[tuple, list] = {}
        # this host's clock: the Error Estimate of T2/T3 and the clock TLVs (local_clock.py)
        self._clock = clock if clock is not None else LOCAL_CLOCK

    @property
    def address(self) -> tuple:
        if self._sock is None:
            raise ProbeError("reflector is not started")
        return self._sock.getsockname()

    async def start(self, host: str = "0.0.0.0", port: int = 862) -> None:
        """Bind and start answering; raises ProbeError if the address cannot be bound."""
        self._loop = asyncio.get_running_loop()
        self._clock.current()   # the first (synchronous) read, before any packet waits on it
        family = socket.AF_INET6 if ":" in (host or "") else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_DGRAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            ready_socket(sock, tx_timestamps=True, ttl_and_dst=True)
            sock.bind((host, port))
        except OSError as exc:
            sock.close()
            raise ProbeError(f"cannot listen on UDP {host}:{port}: {exc.strerror or exc}") from None
        self._sock = sock
        self._loop.add_reader(sock.fileno(), self._on_readable)

    async def close(self) -> None:
        if self._sock is not None:
            close_socket(self._loop, self._sock)
            self._sock = None

    def stats(self) -> ReflectorStats:
        sessions = tuple(
            SessionStats(k[0], k[1], k[2], k[3], v[0], v[1]) for k, v in self._sessions.items()
        )
        return ReflectorStats(**self._c, sessions=sessions, authenticated=self._auth is not None,
                              evicted=self._sessions.evicted,
                              session_refused=self._sessions.refused,
                              reclaimed=self._sessions.reclaimed)

    def refusals(self) -> dict[str, int]:
        """Datagrams refused, by reason (the daemon's wanprobe_reflector_refusals_total)."""
        c = self._c
        return {"not_allowed": c["not_allowed"], "stamp_unauthenticated": c["auth_failed"],
                "stamp_rate_limited": c["rate_limited"], "oversize": c["oversize"],
                "stamp_replayed": c["replayed"], "stamp_session_share": self._sessions.refused}

    @property
    def authenticated(self) -> bool:
        return self._auth is not None

    # -- datagram path ----------------------------------------------------------------------
    def _on_readable(self) -> None:
        sock = self._sock
        if sock is None:
            return
        for _ in range(BATCH):
            if self._tx_stamps.pending:  # stamps of replies just sent, before a request needs them
                self._read_tx_stamps()
            try:
                nbytes, ancdata, flags, addr = sock.recvmsg_into([self._buf], ts.ANC_BUFSIZE)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                continue  # e.g. a queued ICMP error; keep serving
            if self.allow is not None and not self.allow.permits(addr[0]):
                self._c["not_allowed"] += 1  # before any parsing, the tap included
                continue
            try:
                self._handle(nbytes, ancdata, flags, addr)
            except Exception:  # never let one datagram stop the reflector
                self._c["malformed"] += 1
        now = time.monotonic()
        if now - self._last_sweep > 10.0:
            self._sweep(now)

    def _read_tx_stamps(self) -> None:
        for (sess, seq), tx_ns in self._tx_stamps.drain(self._sock, limit=BATCH):
            sess[FOLLOW_UP] = (seq, ntp_from_ns(tx_ns))

    def _handle(self, nbytes: int, ancdata: list, flags: int, addr: tuple) -> None:
        """Answer one datagram (RFC 8762 §4.3). Long because: the per-packet path is kept inline;
        a helper call per step costs CPU at the reflector's packet rates (bench/probe_scale.py)."""
        c = self._c
        c["received"] += 1
        anc = ts.parse_ancillary(ancdata)
        rx_ns = anc.rx_ns or time.time_ns()
        if nbytes > self.max_datagram or flags & socket.MSG_TRUNC:
            c["oversize"] += 1
            return
        data = bytes(self._buf[:nbytes])
        if self.udp_tap is not None:
            try:
                if self.udp_tap(data, addr, rx_ns):
                    c["tapped"] += 1
                    return
            except Exception:
                pass  # a broken tap must not stop STAMP
        auth = self._auth
        if auth is not None:
            # RFC 8762 §4.4: verify before anything else uses the packet (no session, no bucket)
            if nbytes < AUTH_BASE_LEN or not auth.verify_base(data, nbytes):
                c["auth_failed"] += 1
                return
        elif nbytes < TWAMP_REFLECTOR_MIN_LEN:
            c["short"] += 1
            return
        if auth is not None:
            ssid = int.from_bytes(data[26:28], "big")  # RFC 8972 §3, authenticated layout
        else:
            ssid = int.from_bytes(data[14:16], "big") if nbytes >= 44 else 0
        now = time.monotonic()
        sess = self._sessions.touch((ssid, addr[0], addr[1], anc.local_addr), now)
        if sess is None:   # refused: no room it may take (session_table.py)
            if self._allow(addr[0], now):
                self._refuse(data, addr, anc, rx_ns)
            return
        if auth is not None and not fresh(sess, int.from_bytes(data[:4], "big")):
            sess[REFUSED] += 1   # a replay: not counted as received, no tokens spent
            c["replayed"] += 1
            return
        if not sess[RX] and int.from_bytes(data[:4], "big") < START_SEQS:
            sess[START] = True   # a session's first probes (session_table.py)
        sess[RX] += 1            # received (RFC 8972 §4.5 R_RxC), answered or not
        if not self._allow(addr[0], now):
            sess[RATE_LIMITED] += 1
            c["rate_limited"] += 1
            return
        clock = self._clock.answer()
        rseq = sess[TX]          # stateful: the reflector's own count of what it sent
        reply = build_reply(
            data, reflector_seq=rseq, rx_count=sess[RX], tx_count=rseq + 1,
            t2_ntp=ntp_from_ns(rx_ns), t3_ntp=ntp_from_ns(time.time_ns()),
            ttl=anc.ttl or 0, tos_received=anc.tos or 0, dscp_permitted=self.dscp_permitted,
            follow_up=sess[FOLLOW_UP], auth=auth, base_verified=True,
            error_estimate=clock.error_estimate, clock=clock,
            report=(sess[EPOCH], self._limit_pps, sess[RATE_LIMITED], sess[REFUSED]),
        )
        if reply is None:
            c["short"] += 1
            return
        if reply.malformed_tlv:
            c["malformed"] += 1
        if reply.integrity_failed:
            c["tlv_auth_failed"] += 1
        family = self._sock.family
        if family == socket.AF_INET6 and addr[0].startswith("::ffff:"):
            family = socket.AF_INET  # v4-mapped peer: the kernel sends via the IPv4 path
        ckey = (family, reply.tos, anc.local_addr)
        cmsgs = self._cmsgs.get(ckey)
        if cmsgs is None:  # a handful of (TOS, local address) pairs: build each once
            cmsgs = [ts.tos_cmsg(family, reply.tos)]
            if anc.local_addr and (family == socket.AF_INET6) == (":" in anc.local_addr):
                cmsgs.append(ts.source_cmsg(family, anc.local_addr))
            if len(self._cmsgs) >= MAX_CMSG_CACHE:
                self._cmsgs.clear()
            self._cmsgs[ckey] = cmsgs
        try:
            self._sock.sendmsg([reply.data], cmsgs, 0, addr)
        except OSError:
            c["send_errors"] += 1
            return
        sess[TX] += 1
        c["reflected"] += 1
        self._tx_stamps.sent((sess, rseq))

    def _refuse(self, data: bytes, addr: tuple, anc, rx_ns: int) -> None:
        """Answer a probe whose new session was refused with the Reflector Report TLV's
        session-refused flag (reflector_report.py): no session, epoch and counts 0. Only a probe
        that carries the TLV is answered: any other sender would take the answer for a
        measurement."""
        base = AUTH_BASE_LEN if self._auth is not None else BASE_LEN
        if len(data) <= base or offset_in(data, base) is None:
            return
        clock = self._clock.answer()
        reply = build_reply(
            data, reflector_seq=0, rx_count=0, tx_count=0, t2_ntp=ntp_from_ns(rx_ns),
            t3_ntp=ntp_from_ns(time.time_ns()), ttl=anc.ttl or 0, tos_received=anc.tos or 0,
            dscp_permitted=self.dscp_permitted, auth=self._auth, base_verified=True,
            error_estimate=clock.error_estimate, clock=clock,
            report=(0, self._limit_pps, 0, 0, SESSION_REFUSED))
        if reply is None:
            return
        family = self._sock.family
        if family == socket.AF_INET6 and addr[0].startswith("::ffff:"):
            family = socket.AF_INET
        cmsgs = [ts.tos_cmsg(family, reply.tos)]
        if anc.local_addr and (family == socket.AF_INET6) == (":" in anc.local_addr):
            cmsgs.append(ts.source_cmsg(family, anc.local_addr))
        try:
            self._sock.sendmsg([reply.data], cmsgs, 0, addr)
        except OSError:
            self._c["send_errors"] += 1
            return
        self._c["refusals_answered"] += 1

    def _allow(self, source: str, now: float) -> bool:
        b = self._buckets.get(source)
        if b is None:
            if len(self._buckets) >= MAX_SOURCES:
                self._buckets.clear()
            b = self._buckets[source] = [self.burst, now]
        tokens = min(self.burst, b[0] + (now - b[1]) * self.rate_pps)
        b[1] = now
        if tokens < 1.0:
            b[0] = tokens
            return False
        b[0] = tokens - 1.0
        return True

    def _sweep(self, now: float) -> None:
        self._last_sweep = now
        self._sessions.expire(now, limit=BATCH)
        for k in [k for k, v in self._buckets.items() if now - v[1] > 60.0]:
            del self._buckets[k]
