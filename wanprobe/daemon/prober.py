"""The daemon's STAMP prober: every peer's sessions driven by one timer on shared sockets.

A session per peer every ``interval`` ± ``jitter`` (``count`` probes ``packet_interval`` apart,
the last one waited for ``timeout``), as :func:`wanprobe.probe.sender.probe_stamp` runs it, but
without a task, a future and a timeout per session: one heap of due actions (start a session,
send its next probe, summarise it) and one loop timer, re-armed for the earliest action. With many
peers, actions due within :func:`coalesce_s` (half a packet interval, at most
``MESH_COALESCE_MAX_S``) run in the same wake-up: each probe is stamped when it is actually sent
and each reply by the kernel when it arrives, so a probe sent a little early or a reply read a
little late costs no accuracy. The sockets, the codec, the reply demultiplexing and the TX-stamp
pairing are :class:`wanprobe.probe.sender.StampSender`'s (one per address family); each session
keeps its own SSID (RFC 8972 §3), so the reflector's per-session counters, and with them loss per
direction (RFC 8972 §4.5), mean exactly what they mean for ``probe_stamp``.

TX timestamps are read from the clock immediately before ``sendto`` (as fping does), not from
the socket error queue: at 1,000 peers the error-queue read per probe was the largest single cost
after ``sendto`` itself (bench/daemon_footprint.py), and what it adds to the RTT is one syscall
entry (microseconds, against the milliseconds of the paths the daemon watches). Sessions say so
(``tx_timestamp: "user"``); RX timestamps stay the kernel's (SO_TIMESTAMPING).

Only numeric peer addresses are handled here (no DNS on the timer); the scheduler keeps a task for
peers named by host name.
"""

from __future__ import annotations

import asyncio
import heapq
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from wanprobe.daemon.config import ProbeSettings
from wanprobe.errors import WanprobeError
from wanprobe.mesh.peer import Peer
from wanprobe.probe.peer import numeric_family as peer_family
from wanprobe.probe.peer import session_refused
from wanprobe.probe.sender import COALESCE_SESSIONS, SEND_AHEAD_S, StampSender
from wanprobe.probe.sender_session import session_result as _result
from wanprobe.probe.stamp_packet import HmacKey
from wanprobe.probe.timer_heap import TimerHeap

DoneFn = Callable[[Peer, float, dict[str, Any]], None]
FailedFn = Callable[[Peer, float, str], None]
_START, _SEND, _FINISH = 0, 1, 2
MESH_COALESCE_MAX_S = 0.25
REPLY_TRUESIZE_BYTES = 2048   # what one queued reply costs a receive buffer (skb truesize, generous)


def coalesce_s(settings: ProbeSettings, n_peers: int, rcvbuf_bytes: int) -> float:
    """How early an action may run to share a wake-up. At scale a wake-up costs more than the
    probes it sends (1,000 peers at 1 probe/s: 5.6 % of a core with 25 ms windows, 4.0 % with
    100 ms, 3.3 % with 500 ms; bench/daemon_footprint.py), so the window is as wide as allowed by:
    half the packet interval (a session's probes keep their order), MESH_COALESCE_MAX_S, and the
    replies one window brings, which must fit in half the socket's receive buffer (``rcvbuf_bytes``,
    SO_RCVBUF as granted: replies are read once per wake-up). Nothing to share with a handful
    of peers."""
    if n_peers <= COALESCE_SESSIONS:
        return SEND_AHEAD_S
    replies_per_s = n_peers * settings.count / settings.interval_s
    fits_s = 0.5 * rcvbuf_bytes / REPLY_TRUESIZE_BYTES / replies_per_s
    return max(SEND_AHEAD_S, min(MESH_COALESCE_MAX_S, settings.packet_interval_s / 2, fits_s))


def next_delay_s(s: ProbeSettings, rng: random.Random) -> float:
    """The wait before a peer's next session: ``interval`` ± ``jitter``, uniform (so a fleet
    restarted together does not probe in lock-step). The one schedule jitter, for this prober
    and the scheduler's per-peer tasks."""
    return max(0.0, s.interval_s + rng.uniform(-s.jitter_s, s.jitter_s))


def numeric_family(address: str) -> int | None:
    """AF_INET/AF_INET6 for a literal address (``[::1]`` as the config writes it), None for a
    host name."""
    return peer_family(address.strip().strip("[]"))


@dataclass(eq=False)
class _PeerRun:
    """One peer's schedule; ``stopped`` once removed or replaced (its heap entries are skipped)."""

    peer: Peer
    family: int
    address: str
    open: dict = field(default_factory=dict)   # SSID -> (session, wall-clock start)
    stopped: bool = False
    sender: Any = None                         # the StampSender of its family, once started


class MeshProber:
    """STAMP sessions for many peers on one event loop; results go to ``on_done``/``on_failed``
    (the scheduler's sink), with the wall-clock time the session started."""

    def __init__(self, on_done: DoneFn, on_failed: FailedFn, *,
                 hmac_key: bytes | None = None, clock: Callable[[], float] = time.time,
                 rng: random.Random | None = None) -> None:
        self.on_done, self.on_failed = on_done, on_failed
        self.hmac_key = HmacKey.of(hmac_key)   # the keyed hash built once, not per session
        self.clock = clock
        self.rng = rng or random.Random()
        self.settings = ProbeSettings()
        self._coalesce_s = SEND_AHEAD_S
        self.runs: dict[str, _PeerRun] = {}
        self._senders: dict[int, StampSender] = {}
        self._timers = TimerHeap(self._tick)   # every peer's next action, one loop timer
        self._loop: asyncio.AbstractEventLoop | None = None
        self.pacing: Any = None   # reflector_limit.ReflectorPacing: per-peer packet interval

    # -- plan -----------------------------------------------------------------------------------
    def apply(self, peers: tuple[Peer, ...] | list[Peer], settings: ProbeSettings) -> None:
        """Probe exactly ``peers`` (numeric addresses) with ``settings``; a peer that is new or
        changed, or every peer when the settings changed, starts afresh at a random offset
        inside the first interval (a fleet restarted together does not probe in lock-step)."""
        self._loop = asyncio.get_running_loop()
        changed = settings != self.settings
        self.settings = settings
        wanted = {p.name: p for p in peers}
        for name in list(self.runs):
            if changed or name not in wanted or self.runs[name].peer != wanted[name]:
                self._stop_run(self.runs.pop(name))
        now = self._loop.time()
        for name, peer in wanted.items():
            if name in self.runs:
                continue
            family = numeric_family(peer.address)
            if family is None:
                raise WanprobeError(f"peer {name}: {peer.address!r} is not a numeric address")
            run = self.runs[name] = _PeerRun(peer, family, peer.address.strip().strip("[]"))
            self._push(now + self.rng.uniform(0, settings.interval_s), _START, run, None)
        self._coalesce_s = coalesce_s(settings, len(self.runs), self._rcvbuf_bytes())

    def close(self) -> None:
        """Drop every session in flight (no result) and close the sockets."""
        for run in self.runs.values():
            self._stop_run(run)
        self.runs.clear()
        self._timers.clear()
        for sender in self._senders.values():
            sender.close()
        self._senders.clear()

    def _stop_run(self, run: _PeerRun) -> None:
        run.stopped = True
        for sess, _ts in run.open.values():
            run.sender.end_session(sess)
        run.open.clear()

    # -- the timer --------------------------------------------------------------------------------
    def _push(self, due: float, action: int, run: _PeerRun, sess: Any) -> None:
        self._timers.push(self._loop, due, action, run, sess)

    def _tick(self) -> None:
        # The sockets have no reader of their own: every tick reads them first, so one wake-up
        # sends, reads and summarises. Replies wait at most until the next action (a send, at
        # most a packet interval away while a session is open, or its end), which costs no
        # accuracy (kernel RX stamps), and a session that ends in this tick has every reply
        # that arrived before it; what waits is bounded by what one tick sent.
        for sender in self._senders.values():
            sender.poll()
        heap, pop = self._timers.heap, heapq.heappop
        horizon = self._loop.time() + self._coalesce_s
        while heap and heap[0][0] <= horizon:
            due, _t, action, run, sess = pop(heap)
            if run.stopped:
                continue
            if action == _SEND:
                self._send(due, run, sess)
            elif action == _START:
                self._start(due, run)
            else:
                self._finish(run, sess)

    def _start(self, due: float, run: _PeerRun) -> None:
        """Open the peer's next session, send its first probe, schedule the one after it."""
        s = self.settings
        if self.pacing is not None:
            s = self.pacing.settings_for(run.peer.name, s)
        self._push(due + next_delay_s(s, self.rng), _START, run, None)
        ts = self.clock()
        try:
            sender = self._sender(run.family)
            sess = sender.open_session(run.address, run.peer.port, total=s.count,
                                       interval_s=s.packet_interval_s, size=None, dscp=s.dscp,
                                       timeout_s=s.timeout_s, hmac_key=self.hmac_key)
        except WanprobeError as exc:
            self.on_failed(run.peer, ts, " ".join(str(exc).split()))
            return
        sess.t0 = due
        run.open[sess.ssid] = (sess, ts)
        run.sender = sender
        self._send(due, run, sess)

    def _send(self, due: float, run: _PeerRun, sess: Any) -> None:
        """Send the session's next probe (the clock read, then sendto) and schedule the one
        after it, or the session's end."""
        if sess.cancelled:
            return
        try:
            run.sender.send_probe(sess)
        except WanprobeError as exc:
            run.sender.end_session(sess)
            _sess, ts = run.open.pop(sess.ssid)
            self.on_failed(run.peer, ts, " ".join(str(exc).split()))
            return
        if sess.next_seq < sess.total:
            self._push(sess.t0 + sess.next_seq * sess.interval_s, _SEND, run, sess)
        else:
            sess.sending = False
            # a tick may run actions up to _coalesce_s early: never end before the timeout
            self._push(due + self.settings.timeout_s + self._coalesce_s, _FINISH, run, sess)

    def _finish(self, run: _PeerRun, sess: Any) -> None:
        """The last probe's timeout has passed: end the session and hand over its summary."""
        if sess.cancelled:
            return
        _sess, ts = run.open.pop(sess.ssid)
        run.sender.end_session(sess)
        try:
            doc = _result(sess, self._loop.time() - sess.t0).to_json()
        except Exception as exc:  # noqa: BLE001 - a summary bug must not stop every peer
            self.on_failed(run.peer, ts, f"summary failed: {exc}")
            return
        doc["peer"] = run.peer.address   # as configured, like probe_stamp's result ("[::1]")
        loss = doc["loss"]
        if loss["reflector_session_refused"] and not loss["received"]:
            # its reflector refused the session (issue 37): no sample of the path at all
            self.on_failed(run.peer, ts, str(session_refused(
                run.address, run.peer.port, loss["reflector_session_refused"], loss["sent"])))
            return
        self.on_done(run.peer, ts, doc)

    def _rcvbuf_bytes(self) -> int:
        """The smallest receive buffer granted to the sockets the peers need (opened here). A
        family whose socket cannot be opened counts as 0 (no coalescing); its sessions report
        the error when they start, as they always did."""
        sizes = []
        for family in {r.family for r in self.runs.values()}:
            try:
                sizes.append(self._sender(family).rcvbuf_bytes())
            except WanprobeError:
                sizes.append(0)
        return min(sizes, default=0)

    def _sender(self, family: int) -> StampSender:
        sender = self._senders.get(family)
        if sender is None:
            sender = self._senders[family] = StampSender(family, polled=True, tx_timestamps=False)
            sender.open()
        return sender

