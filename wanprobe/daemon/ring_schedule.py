"""The daemon's scheduled ring test (issue 39): ``wanprobe ring`` over ``[ring] hosts``
(services/ring.py), rarely and never beside one of this daemon's throughput tests.

- When: every ``interval`` (default a day, at least an hour) less up to 5 % of it (jitter: runs
  do not drift later each day, nor fall into step with other daily jobs), only inside
  ``windows``. The first at a random point of the first interval, as a peer's first throughput
  test (scheduler.py), unless the history holds an earlier run: a restart keeps the spacing.
  A failed run waits a whole interval too: a ring test is rare whether or not it got through.
- Exclusive: a run holds the scheduler's ``heavy_lock``, which each throughput test holds, and
  starts only while it is free; the throughput loop starts nothing while a ring holds it. Probe
  sessions during a run are no baseline samples (``Scheduler.ring_running``): the ring loads
  the WAN links the probes cross. Other daemons' tests are not seen here: enable ``[ring]`` on
  one daemon per ring; a far end busy with another test refuses its edge (a failed run).
- How: ``run_ring`` in a daemon thread (blocking.run_blocking), never on the event loop.
  Stopping the daemon cancels the task, which sets ``RingOptions.cancel``: every control
  connection closes within ~0.1 s and each host stops its edge (services/ring.py).
- Results: each run is one log line, one ``ring_runs`` row of the history (history/store.py,
  kept as long as throughput tests) and the ring metrics (ring_metrics.py). A failing ring (a
  host down, a refusal, a name that does not resolve) is recorded as a failure; nothing it does
  ends the loop or the daemon.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from wanprobe.blocking import run_blocking
from wanprobe.daemon import logging as dlog
from wanprobe.daemon.config_ring import RingSettings
from wanprobe.daemon.ring_metrics import RingMetrics
from wanprobe.daemon.scheduler import in_windows
from wanprobe.errors import one_line
from wanprobe.ring.model import RingResult
from wanprobe.services.ring import RingOptions, run_ring

RingFn = Callable[[RingOptions], RingResult]
TICK_S = 10.0          # how often the loop looks whether a run is due (and the lock free)
JITTER_FRACTION = 0.05


class Recorder(Protocol):
    """Where a run goes: ``result`` None with ``error`` for a failed run."""

    def __call__(self, ts: float, s: RingSettings, result: RingResult | None,
                 error: str | None, took_s: float) -> None: ...


class RingSchedule:
    """The ring loop. ``heavy`` is the daemon's Scheduler (its ``heavy_lock`` and
    ``ring_running``); ``settings`` and ``key`` are read at each tick, so a reload applies."""

    def __init__(self, settings: Callable[[], RingSettings], key: Callable[[], bytes | None],
                 heavy: Any, record: Recorder, *, run_fn: RingFn = run_ring,
                 clock: Callable[[], float] = time.time, rng: random.Random | None = None,
                 last_run: float | None = None) -> None:
        self.settings, self.key, self.heavy, self.record = settings, key, heavy, record
        self.run_fn, self.clock = run_fn, clock
        self.rng = rng or random.Random()
        self.last_run = last_run
        self.next_at: float | None = None   # planned at the first tick with the ring on
        self._planned_interval_s: float | None = None
        self.running = False
        self.runs = 0
        self.metrics: RingMetrics | None = None

    def plan(self, s: RingSettings, now: float) -> float:
        """When the next run is due: an interval (less jitter) after the last, or a random
        point of the first interval."""
        self._planned_interval_s = s.interval_s
        if self.last_run is None:
            return now + self.rng.uniform(0, s.interval_s)
        return self.last_run + s.interval_s - self.rng.uniform(0, JITTER_FRACTION * s.interval_s)

    def due(self, now: float) -> RingSettings | None:
        """The settings to run with, if a run may start now: on, due, in a window, the lock
        free."""
        s = self.settings()
        if not s.enabled or len(s.hosts) < 2:
            return None
        if self.next_at is None or self._planned_interval_s not in (None, s.interval_s):
            self.next_at = self.plan(s, now)    # the ring turned on, or a reload changed it
        if now < self.next_at or not in_windows(s.windows, now):
            return None
        return None if self.heavy.heavy_lock.locked() else s

    async def loop(self, tick_s: float | None = None) -> None:
        while True:
            await asyncio.sleep(TICK_S if tick_s is None else tick_s)
            s = self.due(self.clock())
            if s is not None:
                await self.run_once(s)

    async def run_once(self, s: RingSettings) -> None:
        """One run under the heavy-test lock; its result or failure to ``record``."""
        async with self.heavy.heavy_lock:
            self.running = self.heavy.ring_running = True
            cancel = threading.Event()
            ts, t0 = self.clock(), time.monotonic()
            self.last_run = ts
            self.next_at = self.plan(s, ts)
            opts = RingOptions(hosts=s.hosts, port=s.port, hmac_key=self.key(),
                               duration_s=s.duration_s, omit_s=s.omit_s, streams=s.streams,
                               site_rtt_ms=s.site_rtt_ms, measure_best=s.measure_best,
                               cancel=cancel)
            result, error = None, None
            try:
                result = await run_blocking(self.run_fn, opts)
            except asyncio.CancelledError:
                cancel.set()   # the daemon stops: close every connection of the ring now
                raise
            except Exception as exc:  # noqa: BLE001 - a failing ring is a result, not a crash
                error = one_line(exc) or type(exc).__name__
            finally:
                self.running = self.heavy.ring_running = False
            self.runs += 1
            self._record(ts, s, result, error, time.monotonic() - t0)

    def _record(self, ts: float, s: RingSettings, result: RingResult | None, error: str | None,
                took_s: float) -> None:
        try:
            self.record(ts, s, result, error, took_s)
        except Exception as exc:  # noqa: BLE001 - a bug in recording never ends the loop
            dlog.log(logging.ERROR, "ring test result not recorded", error=one_line(exc))


class DaemonRecorder:
    """The daemon's recorder: one log line, the history row, the metrics."""

    def __init__(self, store: Any, metrics: RingMetrics) -> None:
        self.store, self.metrics = store, metrics

    def __call__(self, ts: float, s: RingSettings, result: RingResult | None,
                 error: str | None, took_s: float) -> None:
        ring = " -> ".join(s.hosts)
        if result is None:
            self.store.add_ring(ts, s.hosts, None, error, round(took_s, 3))
            self.metrics.failed()
            dlog.log(logging.WARNING, "ring test failed", ring=ring, error=error,
                     took_s=round(took_s, 1))
            return
        self.store.add_ring(ts, s.hosts, result.to_json(), None, round(took_s, 3))
        self.metrics.observe(ts, result)
        dlog.log(logging.INFO, "ring test", ring=ring,
                 bits_per_second=result.ring_bits_per_second,
                 best_bits_per_second=result.best_ring_bits_per_second,
                 shared_bottlenecks=len(result.shared_bottlenecks), took_s=round(took_s, 1))


def last_stored(store: Any, metrics: RingMetrics) -> float | None:
    """The newest stored run's start (its spacing survives a restart); a successful one's
    figures go back into the metrics."""
    rows = store.rings(limit=1)
    if not rows:
        return None
    row = rows[-1]
    if row["ok"] and row["doc"] is not None:
        try:
            metrics.observe(row["ts"], RingResult.from_json(row["doc"]), count=False)
        except Exception:  # noqa: BLE001 - an unreadable row only loses the figures
            pass
    return float(row["ts"])


def start(daemon: Any) -> asyncio.Task[None]:
    """Wire the ring loop into a started daemon (main.py): its store, metrics registry,
    scheduler and config; the task is the daemon's to cancel. ``daemon.ring`` is the schedule."""
    metrics = RingMetrics(lambda: daemon.cfg.ring.enabled)
    daemon.metrics.registry.register(metrics)
    daemon.ring = RingSchedule(lambda: daemon.cfg.ring, lambda: daemon.cfg.hmac_key,
                               daemon.scheduler, DaemonRecorder(daemon.store, metrics),
                               last_run=last_stored(daemon.store, metrics))
    daemon.ring.metrics = metrics
    return asyncio.create_task(daemon.ring.loop(), name="ring")
