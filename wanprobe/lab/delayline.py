"""The delay line's logic: per-direction impairments and release scheduling.

Independent of where packets come from (TUN fds in the forwarder, a recording writer in the
unit tests). See forwarder.py for the timing loop and the GSO/segment approach.
"""

from __future__ import annotations

import heapq
import os
import random
import select
import struct
import time
from dataclasses import dataclass, field

from wanprobe.lab import packet
from wanprobe.lab.arrivals import MATCH_BYTES
from wanprobe.lab.settings import LinkSettings
from wanprobe.lab.tun import VNET_HDR_LEN

READ_SIZE = 65536 + VNET_HDR_LEN + 64
SPIN_MIN_NS = 50_000
SPIN_MAX_NS = 500_000
REORDER_LEAD_NS = 1_000_000  # a reordered packet overtakes what was sent in the previous 1 ms
BATCH = 64
MAX_QUEUED = 200_000  # frames in flight (≥ 10 s of 1500-byte packets at 200 Mbit/s)
WAKE_WINDOW = 32
STAMP_MAX_AGE_NS = 1_000_000_000  # an older "arrival" stamp is a mismatch, not a stall
# Never credit more than this: on a host crowded with other real-time work select() can wake
# late by milliseconds, and crediting that would release packets early (a link faster than set).
WAKE_CREDIT_MAX_NS = 100_000


@dataclass
class Direction:
    """One direction of the link (a→b or b→a) and its counters."""

    name: str
    src_fd: int
    dst_fd: int
    loss: float = 0.0
    delay_ns: int = 0
    jitter_ns: int = 0
    queue_ns: int = 0
    last_release_ns: int = 0
    arrivals: object | None = None  # ArrivalStamps of src_fd's TUN (kernel time of entry)
    counters: dict = field(default_factory=lambda: dict.fromkeys(
        ("packets", "segments", "lost", "black_holed", "bleached", "reordered", "sent",
         "write_errors", "malformed", "overflow", "late_ns_total", "late_ns_max"), 0))


class DelayLine:
    """Impairment and scheduling logic, independent of how the fds were obtained."""

    def __init__(self, fd_a: int, fd_b: int, settings: LinkSettings, *, offload: bool = True,
                 rng: random.Random | None = None, write=os.write) -> None:
        self.offload = offload
        self.write = write
        self.rng = rng or random.Random()
        self.ab = Direction("ab", fd_a, fd_b)
        self.ba = Direction("ba", fd_b, fd_a)
        self.by_fd = {fd_a: self.ab, fd_b: self.ba}
        self.heap: list = []
        self.wake_ns = 0
        self.offset_ns = 0
        self.seq = 0
        self.apply(settings)

    def apply(self, settings: LinkSettings) -> None:
        """Switch to new settings; packets already in flight keep their release times."""
        self.settings = settings
        for d, loss in ((self.ab, settings.loss_ab), (self.ba, settings.loss_ba)):
            d.loss, d.jitter_ns = loss, int(settings.jitter_ms * 1e6)
            d.delay_ns = max(0, int(settings.delay_ms(d.name) * 1e6) - self.offset_ns)
            d.queue_ns = int(settings.queue_of(d.name) * 1e6)

    def set_offset(self, offset_ns: int) -> None:
        """Subtract ``offset_ns`` from each direction's delay: the host's own path overhead
        (wake-ups, stack) measured end to end by calibrate.py, so the RTT seen equals the
        configured one."""
        self.offset_ns = max(0, int(offset_ns))
        self.apply(self.settings)

    def stats(self) -> dict:
        out = {"ab": dict(self.ab.counters), "ba": dict(self.ba.counters), "queued": len(self.heap),
               "wake_latency_ns": self.wake_ns, "offset_ns": self.offset_ns}
        for d in (self.ab, self.ba):
            if d.arrivals is not None:
                out[d.name]["arrival_stamps"] = dict(d.arrivals.counters)
        return out

    def receive(self, d: Direction, frame: bytes, now_ns: int) -> None:
        """Apply loss, black hole and bleaching to one frame read from ``d.src_fd``; queue it."""
        s = self.settings
        c = d.counters
        c["packets"] += 1
        if self.offload:
            vnet, pkt = frame[:VNET_HDR_LEN], frame[VNET_HDR_LEN:]
        else:
            vnet, pkt = b"", frame
        gso_size = packet.gso_size_of(vnet, pkt) if vnet else 0
        sizes = packet.segment_sizes(pkt, gso_size) if gso_size else [len(pkt)]
        c["segments"] += len(sizes)
        keep = [True] * len(sizes)
        if d.loss > 0:
            rnd = self.rng.random
            for i in range(len(sizes)):
                if rnd() < d.loss:
                    keep[i] = False
                    c["lost"] += 1
        bh = s.black_hole_mtu
        if bh is not None:
            for i, size in enumerate(sizes):
                if keep[i] and size > bh:
                    keep[i] = False
                    c["black_holed"] += 1
        if s.bleach_dscp:
            bleached = packet.bleach_dscp(pkt)
            if bleached is not pkt:
                c["bleached"] += 1
                pkt = bleached
        if all(keep):
            out = [vnet + pkt]
        elif not any(keep):
            return
        else:
            out = [v + seg for (v, seg), k in zip(packet.segment(pkt, gso_size), keep, strict=True) if k]
        for data in out:
            self._schedule(d, data, now_ns)

    def _schedule(self, d: Direction, data: bytes, now_ns: int) -> None:
        delay = d.delay_ns
        if d.jitter_ns:
            delay = max(0, int(self.rng.gauss(delay, d.jitter_ns)))
        if d.queue_ns:
            # A busy FIFO hop: an M/M/1 queue's sojourn time is exponential with mean
            # 1/(mu - lambda) (Kleinrock 1975, Queueing Systems vol. 1, ch. 3), so the RTT
            # floor stays put while its spread grows.
            delay += int(self.rng.expovariate(1.0 / d.queue_ns))
        release = now_ns + delay
        if self.settings.reorder > 0 and self.rng.random() < self.settings.reorder:
            release = max(now_ns, release - REORDER_LEAD_NS)
            d.counters["reordered"] += 1
        elif release < d.last_release_ns:
            release = d.last_release_ns  # FIFO: jitter delays, it does not reorder
        else:
            d.last_release_ns = release
        if len(self.heap) >= MAX_QUEUED:
            d.counters["overflow"] += 1  # a bounded line: memory must not grow without limit
            return
        self.seq += 1
        heapq.heappush(self.heap, (release, self.seq, d, data))

    def release_due(self, now_ns: int) -> None:
        heap = self.heap
        while heap and heap[0][0] <= now_ns:
            _r, _, d, data = heapq.heappop(heap)
            late = time.monotonic_ns() - _r
            try:
                self.write(d.dst_fd, data)
                d.counters["sent"] += 1
                d.counters["late_ns_total"] += late
                d.counters["late_ns_max"] = max(d.counters["late_ns_max"], late)
            except OSError:
                d.counters["write_errors"] += 1  # e.g. link not up yet: the wire drops it

    def read_ready(self, fd: int, woke_ns: int = 0) -> None:
        """Read up to BATCH frames. A frame's arrival time is the kernel's stamp of its entry
        into the TUN (arrivals.py) when there is one; otherwise the time of read() minus
        ``woke_ns``, the estimated time the process took to wake up for it (0 if it was not
        asleep)."""
        d = self.by_fd[fd]
        arrivals = d.arrivals
        if arrivals is not None:
            arrivals.drain()
        skip = VNET_HDR_LEN if self.offload else 0
        for _ in range(BATCH):
            try:
                frame = os.read(fd, READ_SIZE)
            except BlockingIOError:
                return
            read_ns = time.monotonic_ns()
            now = read_ns - woke_ns
            woke_ns = 0
            if arrivals is not None:
                stamp = arrivals.arrival_ns(frame[skip:skip + MATCH_BYTES])
                if stamp is not None and read_ns - STAMP_MAX_AGE_NS < stamp <= read_ns:
                    now = stamp
            try:
                self.receive(d, frame, now)
            except (IndexError, ValueError, struct.error):
                # a frame the parsers do not understand still crosses the wire, unimpaired
                d.counters["malformed"] += 1
                self._schedule(d, frame, now)


def wake_estimates(overshoots: list[int]) -> tuple[int, int]:
    """(credit, spin) from recent select() overshoots: the median wake-up latency (at most
    WAKE_CREDIT_MAX_NS) is credited to packets that woke the process, and the process spins
    from 1.5 x the 75th percentile before each release (bounded CPU cost)."""
    ordered = sorted(overshoots)
    median = ordered[len(ordered) // 2]
    p75 = ordered[len(ordered) * 3 // 4]
    return min(median, WAKE_CREDIT_MAX_NS), min(max(p75 * 3 // 2, SPIN_MIN_NS), SPIN_MAX_NS)


def calibrate_wakeups(samples: int = WAKE_WINDOW, sleep_s: float = 0.0005) -> list[int]:
    """Measure how late select() returns from short sleeps on this (possibly virtual) host."""
    out = []
    for _ in range(samples):
        target = time.monotonic_ns() + int(sleep_s * 1e9)
        select.select([], [], [], sleep_s)
        out.append(min(max(time.monotonic_ns() - target, 0), SPIN_MAX_NS))
    return out
