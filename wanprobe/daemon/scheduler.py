"""One asyncio loop schedules everything the daemon measures.

- one task per peer: a probe session per method (side by side) every ``interval`` ± ``jitter``
  (uniform, so a fleet restarted together does not probe in lock-step); the first at a random
  offset inside the first interval. A session is bounded by its own deadline (packets × spacing
  + timeout + 1 s), so a peer that is down costs one timeout and never delays the others.
  With a ``stamp_prober`` (the daemon's :class:`wanprobe.daemon.prober.MeshProber`), STAMP to
  peers with a numeric address runs there instead, on one timer for all peers, with the same
  schedule and the same sink; the per-peer task then runs only the peer's other methods.
- one throughput task: tests run one at a time (never two at once on any link, so never two on
  the same one), only inside the allowed windows, each peer at most once per interval, only in
  an hour of the week that has the fewest of the peer's tests (throughput_spread.py: every hour gets
  samples for the transfer-window profile), and only when the test's byte cap still fits in the
  rolling 24 h budgets of the host and of the peer. A test holds ``heavy_lock`` while it runs,
  as a scheduled ring test does (ring_schedule.py): neither starts while the other runs.
- one counter task: a snapshot every counter interval, rates against the previous one.

Blocking work (throughput, counter reads, SQLite) runs in daemon threads through
:func:`wanprobe.blocking.run_blocking`, so stopping never waits for it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from wanprobe.blocking import run_blocking
from wanprobe.daemon.config import ProbeSettings, ThroughputSettings, TimeWindow
from wanprobe.daemon.prober import next_delay_s, numeric_family
from wanprobe.daemon.throughput_spread import SpreadLedger, reachable_hours
from wanprobe.history.store import link_bytes
from wanprobe.mesh.peer import Peer

ProbeFn = Callable[[Peer, str, ProbeSettings], Awaitable[dict[str, Any]]]
ThroughputFn = Callable[[Peer, ThroughputSettings], dict[str, Any]]
TestHistory = Callable[[str, float], list[tuple[float, int, bool]]]   # (ts, bytes, gave a rate)
DAY_S = 86400.0


class Sink(Protocol):
    """Where results go (the daemon: store, metrics, baseline)."""

    def probe_done(self, peer: Peer, method: str, ts: float, doc: dict[str, Any]) -> None: ...
    def probe_failed(self, peer: Peer, method: str, ts: float, error: str) -> None: ...
    def throughput_done(self, peer: Peer, ts: float, doc: dict[str, Any] | None,
                        error: str | None) -> None: ...


def session_deadline_s(s: ProbeSettings) -> float:
    """Upper bound of one probe session: all packets sent, the last one waited for, plus 1 s."""
    return s.count * s.packet_interval_s + s.timeout_s + 1.0


SESSION_GRID_S = 0.05


def in_windows(windows: tuple[TimeWindow, ...], ts: float) -> bool:
    """True when ``ts`` (local time) falls in one of the windows, or there are none."""
    if not windows:
        return True
    t = time.localtime(ts)
    return any(w.contains(t.tm_hour * 60 + t.tm_min) for w in windows)


@dataclass
class _Session:
    peer: Peer
    task: asyncio.Task | None   # None: every method of the peer runs in the stamp prober


class Scheduler:
    """Owns the per-peer probe tasks, the throughput task and their settings."""

    def __init__(self, sink: Sink, prober: ProbeFn, *, probe: ProbeSettings,
                 throughput: ThroughputSettings, throughput_fn: ThroughputFn | None = None,
                 budget_used: Callable[[float], int] | None = None,
                 clock: Callable[[], float] = time.time, rng: random.Random | None = None,
                 stamp_prober: Any = None, test_history: TestHistory | None = None) -> None:
        self.sink = sink
        self.test_history = test_history
        self.ledger = SpreadLedger(throughput.lookback_s, self._testable)
        self._testable_cache: tuple[int, set[int]] = (-1, set())
        self.stamp_prober = stamp_prober
        self.prober = prober
        self.probe_settings = probe
        self.throughput_settings = throughput
        self.throughput_fn = throughput_fn
        self.budget_used = budget_used or (lambda since: 0)
        self.clock = clock
        self.rng = rng or random.Random()
        self.sessions: dict[str, _Session] = {}
        self.last_throughput: dict[str, float] = {}
        self.throughput_running: str | None = None
        self.ring_running = False   # a scheduled ring test runs (ring_schedule.py)
        self.delivery_errors = 0
        self.pacing: Any = None   # reflector_limit.ReflectorPacing: per-peer STAMP settings
        self._stopping = False
        self._tput_task: asyncio.Task | None = None
        self._tput_lock = asyncio.Lock()
        self._tput_wake = asyncio.Event()   # apply() sets it: a reload may enable tests

    # -- plan ---------------------------------------------------------------------------------
    def apply(self, peers: tuple[Peer, ...], probe: ProbeSettings,
              throughput: ThroughputSettings) -> dict[str, list[str]]:
        """Reconcile running sessions with ``peers``; return added/removed/restarted names."""
        settings_changed = probe != self.probe_settings
        self.probe_settings, self.throughput_settings = probe, throughput
        self.ledger.lookback_s = throughput.lookback_s
        self._testable_cache = (-1, set())
        self._seed_tests(peers)
        wanted = {p.name: p for p in peers}
        diff: dict[str, list[str]] = {"added": [], "removed": [], "restarted": []}
        for name in list(self.sessions):
            if name not in wanted:
                _cancel(self.sessions.pop(name))
                diff["removed"].append(name)
        for name, peer in wanted.items():
            old = self.sessions.get(name)
            if old is not None and old.peer == peer and not settings_changed:
                continue
            if old is not None:
                _cancel(old)
                diff["restarted"].append(name)
            else:
                diff["added"].append(name)
            task = None
            if self.task_methods(peer):
                task = asyncio.create_task(self._peer_loop(peer), name=f"probe-{name}")
            self.sessions[name] = _Session(peer, task)
        if self.stamp_prober is not None:
            self.stamp_prober.on_done = self._prober_done
            self.stamp_prober.on_failed = self._prober_failed
            self.stamp_prober.apply([p for p in peers if self.in_prober(p)], probe)
        if self._tput_task is None or self._tput_task.done():
            self._tput_task = asyncio.create_task(self._throughput_loop(), name="throughput")
        self._tput_wake.set()
        return diff

    def _seed_tests(self, peers: tuple[Peer, ...]) -> None:
        """Tests the store holds for peers new to the ledger: their spread and spacing survive
        a restart. A peer without any gets its first test at a random point of the first
        interval, so neither a daemon's peers nor a fleet started together test in one burst."""
        if self.test_history is None:
            return
        now = self.clock()
        interval = self.throughput_settings.interval_s
        since = now - max(self.throughput_settings.lookback_s, DAY_S)
        for p in peers:
            if p.name not in self.last_throughput and self.ledger.last(p.name) is None:
                self.ledger.seed(p.name, self.test_history(p.name, since))
                last = self.ledger.last(p.name)
                self.last_throughput[p.name] = (last if last is not None
                                                else now - self.rng.uniform(0, interval))

    def _testable(self, hour: int) -> bool:
        """Whether the allowed windows reach ``hour`` of the week (recomputed daily: DST)."""
        now = self.clock()
        day = int(now // DAY_S)
        if self._testable_cache[0] != day:
            windows = self.throughput_settings.windows
            self._testable_cache = (day, reachable_hours(lambda ts: in_windows(windows, ts), now))
        return hour in self._testable_cache[1]

    def in_prober(self, peer: Peer) -> bool:
        """True when the peer's STAMP sessions run in the stamp prober: a numeric address and
        one flow (a peer spread over several source ports, ``flows`` > 1, keeps its task)."""
        return (self.stamp_prober is not None and "stamp" in peer.methods
                and peer.flows == 1 and numeric_family(peer.address) is not None)

    def task_methods(self, peer: Peer) -> tuple[str, ...]:
        """The methods the peer's own task runs (all but the stamp prober's)."""
        if self.in_prober(peer):
            return tuple(m for m in peer.methods if m != "stamp")
        return peer.methods

    def _prober_done(self, peer: Peer, ts: float, doc: dict[str, Any]) -> None:
        self._deliver(self.sink.probe_done, peer, "stamp", ts, doc)

    def _prober_failed(self, peer: Peer, ts: float, error: str) -> None:
        self._deliver(self.sink.probe_failed, peer, "stamp", ts, error)

    @property
    def heavy_lock(self) -> asyncio.Lock:
        """Held by whatever loads the WAN, a throughput test or a ring test: one at a time."""
        return self._tput_lock

    @property
    def peers(self) -> tuple[Peer, ...]:
        return tuple(s.peer for s in self.sessions.values())

    async def stop(self, timeout_s: float = 1.0) -> None:
        """Cancel every task and wait for them, at most ``timeout_s``. Python 3.11's
        ``wait_for`` can swallow a cancellation (gh-86296), so the loops also check a flag and a
        task that ignores cancel is re-cancelled rather than awaited forever."""
        self._stopping = True
        if self.stamp_prober is not None:
            self.stamp_prober.close()
        tasks = [s.task for s in self.sessions.values() if s.task is not None]
        if self._tput_task is not None:
            tasks.append(self._tput_task)
        deadline = time.monotonic() + timeout_s
        pending = {t for t in tasks if not t.done()}
        while pending and time.monotonic() < deadline:
            for t in pending:
                t.cancel()
            _, pending = await asyncio.wait(pending, timeout=min(0.1, deadline - time.monotonic()))
        self.sessions.clear()

    # -- probing ------------------------------------------------------------------------------
    async def _peer_loop(self, peer: Peer) -> None:
        await self._sleep_on_grid(self.rng.uniform(0, self.probe_settings.interval_s))
        while not self._stopping and self._is_current(peer.name):
            started = time.monotonic()
            # methods of one peer run side by side (own sockets), so adding icmp/tcp to a
            # peer does not stretch its stamp interval
            methods = self.task_methods(peer)
            if len(methods) == 1:
                await self.probe_once(peer, methods[0])
            else:
                await asyncio.gather(*(self.probe_once(peer, m) for m in methods))
            elapsed = time.monotonic() - started
            await self._sleep_on_grid(next_delay_s(self.probe_settings, self.rng) - elapsed)

    async def _sleep_on_grid(self, delay_s: float) -> None:
        """Sleep ``delay_s``, rounded up to a grid of at most 50 ms (a twentieth of the
        interval): with hundreds of peers, sessions that start in the same slot share one
        wake-up of the loop instead of one each (bench/daemon_footprint.py)."""
        loop = asyncio.get_running_loop()
        grid = min(SESSION_GRID_S, self.probe_settings.interval_s / 20)
        wake = math.ceil((loop.time() + max(0.0, delay_s)) / grid) * grid
        await asyncio.sleep(max(0.0, wake - loop.time()))

    def _is_current(self, name: str) -> bool:
        """False once a reload replaced or removed this peer's session (even if the cancel of
        the old task was swallowed somewhere below)."""
        session = self.sessions.get(name)
        return session is not None and session.task is asyncio.current_task()

    async def probe_once(self, peer: Peer, method: str) -> None:
        """One session; every failure (timeout, refusal, bug in a prober) becomes probe_failed."""
        s = self.probe_settings
        if self.pacing is not None and method == "stamp":
            s = self.pacing.settings_for(peer.name, s)
        ts = self.clock()
        try:
            async with asyncio.timeout(session_deadline_s(s)):  # not wait_for: see stop()
                doc = await self.prober(peer, method, s)
        except asyncio.CancelledError:
            raise
        except TimeoutError:
            self._deliver(self.sink.probe_failed, peer, method, ts,
                          f"no answer within {session_deadline_s(s):.1f} s")
        except Exception as exc:  # noqa: BLE001 - a probe failure must never stop the loop
            self._deliver(self.sink.probe_failed, peer, method, ts,
                          " ".join(str(exc).split()) or type(exc).__name__)
        else:
            self._deliver(self.sink.probe_done, peer, method, ts, doc)

    def _deliver(self, fn: Callable[..., None], *args: Any) -> None:
        """Hand a result to the sink; a failure there is logged, never ends the peer's loop."""
        try:
            fn(*args)
        except Exception as exc:  # noqa: BLE001
            self.delivery_errors += 1
            logging.getLogger("wanprobe.daemon").error(
                "result handling failed", exc_info=exc,
                extra={"fields": {"peer": args[0].name, "handler": fn.__name__}})

    # -- throughput ---------------------------------------------------------------------------
    def throughput_due(self, now: float) -> Peer | None:
        """The peer whose throughput test is most overdue, if a test may start now."""
        s = self.throughput_settings
        if not s.enabled or self.throughput_fn is None or not in_windows(s.windows, now):
            return None
        if self.budget_used(now - DAY_S) + s.max_bytes_per_test > s.budget_bytes_per_day:
            return None
        due = [(self.last_throughput.get(p.name, 0.0), p.name, p) for p in self.peers
               if now - self.last_throughput.get(p.name, 0.0) >= s.interval_s
               and self.ledger.bytes_last_day(p.name, now) + s.max_bytes_per_test
               <= s.budget_bytes_per_peer_per_day
               and self.ledger.least_sampled(p.name, now)]
        return min(due)[2] if due else None

    async def _throughput_loop(self) -> None:
        while not self._stopping:
            if not self.throughput_settings.enabled or self.throughput_fn is None:
                # nothing can be due: sleep until a reload, not a wake-up every second
                self._tput_wake.clear()
                await self._tput_wake.wait()
                continue
            await asyncio.sleep(1.0)
            # while a ring test holds the lock, nothing starts (nor queues up behind it)
            peer = None if self._tput_lock.locked() else self.throughput_due(self.clock())
            if peer is not None:
                await self.throughput_once(peer)

    async def throughput_once(self, peer: Peer) -> None:
        async with self._tput_lock:  # one test at a time, whoever asks
            self.throughput_running = peer.name
            ts = self.clock()
            self.last_throughput[peer.name] = ts
            try:
                doc = await run_blocking(self.throughput_fn, peer, self.throughput_settings)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001
                self.ledger.record(peer.name, ts, 0, False)
                self._deliver(self.sink.throughput_done, peer, ts, None, " ".join(str(exc).split()))
            else:
                doc = doc if isinstance(doc, dict) else {}
                self.ledger.record(peer.name, ts, link_bytes(doc) or 0,
                                   doc.get("bits_per_second") is not None)
                self._deliver(self.sink.throughput_done, peer, ts, doc, None)
            finally:
                self.throughput_running = None


def _cancel(session: _Session) -> None:
    if session.task is not None:
        session.task.cancel()


async def every(interval_s: Callable[[], float], fn: Callable[[], Awaitable[None]]) -> None:
    """Call ``fn`` every ``interval_s()`` seconds (re-read each time, so reloads take effect)."""
    while True:
        await asyncio.sleep(interval_s())
        await fn()
