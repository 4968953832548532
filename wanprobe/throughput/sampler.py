"""Per-interval sampling of stream counters, sender TCP_INFO and per-core CPU busy."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import psutil

from wanprobe.throughput.datapath import Stream
from wanprobe.throughput.sockopts import read_bbr_bandwidth_bps, read_tcp_info
from wanprobe.throughput.tcp_info import tcp_info_summary


class CpuBusy:
    """Per-core busy percentage between successive calls (psutil.cpu_times, no global state),
    and the host's steal: the share of CPU time a hypervisor gave to other guests while this
    virtual machine had work (the 8th field of /proc/stat's cpu lines, proc(5)), mean over the
    cores, in ``steal_percent`` after each sample (None where the kernel does not report it)."""

    def __init__(self) -> None:
        self._last = psutil.cpu_times(percpu=True)
        self.steal_percent: float | None = None

    def sample(self) -> list[float]:
        now = psutil.cpu_times(percpu=True)
        out = []
        steal = total_all = 0.0
        for a, b in zip(self._last, now, strict=False):
            total = sum(b) - sum(a)
            idle = (b.idle + getattr(b, "iowait", 0.0)) - (a.idle + getattr(a, "iowait", 0.0))
            out.append(round(100.0 * (1 - idle / total), 1) if total > 0 else 0.0)
            steal += getattr(b, "steal", 0.0) - getattr(a, "steal", 0.0)
            total_all += max(total, 0.0)
        has_steal = bool(now) and hasattr(now[0], "steal")
        self.steal_percent = (round(100.0 * steal / total_all, 2)
                              if has_steal and total_all > 0 else None)
        self._last = now
        return out


class IntervalSampler:
    """Every ``interval_s`` from ``t_start``, emit one record of the streams' progress.

    Record: ``{"k", "start_s", "end_s", "streams": [{"id", "direction", "sending", "bytes",
    "tcp_info"}], "cpu_busy_percent": [...], "cpu_steal_percent"}`` (steal: the host's, see
    CpuBusy); ``bytes`` is the interval's delta (written by
    the sender, read by the receiver); ``tcp_info`` is sampled on sending sockets only.
    """

    def __init__(self, streams: list[Stream], *, t_start: float, interval_s: float,
                 emit: Callable[[dict], None], stop: threading.Event) -> None:
        self.streams = streams
        self.t_start = t_start
        self.interval_s = max(interval_s, 0.05)
        self.emit = emit
        self.stop = stop
        self.cpu = CpuBusy()
        self.cpu_max_percent: list[float] = []
        self._last = {id(s): 0 for s in streams}
        self._thread = threading.Thread(target=self._run, name="wanprobe-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _record(self, k: int, start_s: float, end_s: float) -> dict:
        rows = []
        for s in self.streams:
            total = s.bytes
            info = read_tcp_info(s.sock) if s.sending and not s.done.is_set() else None
            if info is None and s.sending and s.done.is_set():
                info = s.final_tcp_info
            # BBR's bottleneck estimate beside TCP_INFO: a cross-check of the path's capacity
            bbr = read_bbr_bandwidth_bps(s.sock) if info is not None and not s.done.is_set() \
                else None
            rows.append({"id": s.stream_id, "direction": s.direction, "sending": s.sending,
                         "bytes": total - self._last[id(s)],
                         "tcp_info": tcp_info_summary(info, bbr)})
            self._last[id(s)] = total
        busy = self.cpu.sample()
        if not self.cpu_max_percent:
            self.cpu_max_percent = list(busy)
        else:
            self.cpu_max_percent = [max(a, b) for a, b in zip(self.cpu_max_percent, busy, strict=False)]
        return {"k": k, "start_s": round(start_s, 6), "end_s": round(end_s, 6),
                "streams": rows, "cpu_busy_percent": busy,
                "cpu_steal_percent": self.cpu.steal_percent}

    def _run(self) -> None:
        # Each record spans from the previous sample to the moment the counters are read, not
        # to the nominal boundary: a sampler that wakes late (a busy host) would otherwise put
        # bytes moved after the boundary into an interval that claims to end at it, and the
        # next one would look faster than the path.
        k = 0
        start = 0.0
        while True:
            boundary = self.t_start + (k + 1) * self.interval_s
            # One wake-up per interval: the caller sets ``stop`` as soon as the streams have
            # finished (or the test is aborted), so there is no polling beside the data thread.
            self.stop.wait(max(boundary - time.monotonic(), 0.0))
            finished = all(s.done.is_set() for s in self.streams)
            if finished or self.stop.is_set():
                end = max((s.t_last or self.t_start) - self.t_start for s in self.streams)
                rec = self._record(k, start, max(end, start))
                if any(r["bytes"] for r in rec["streams"]) or k == 0:
                    self.emit(rec)
                return
            end = time.monotonic() - self.t_start
            self.emit(self._record(k, start, end))
            start = end
            k += 1
