"""Composition root of the daemon: builds every part once, owns the event loop and the signals.

SIGHUP re-reads the config (and mesh file) as `daemon --check` does; a bad one is logged key by
key, the running config stays. SIGTERM/SIGINT send STOPPING=1 first, then cancel the probe tasks,
close the reflector and HTTP endpoint, flush the history and exit 0, well under 2 s in all.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import socket
import time
from collections import Counter as Tally
from dataclasses import replace
from pathlib import Path
from typing import Any

from wanprobe.atomic_file import atomic_write
from wanprobe.blocking import run_blocking
from wanprobe.daemon import flow_probe, job_ingest, listener, ring_schedule, routes
from wanprobe.daemon import logging as dlog
from wanprobe.daemon.auto_apply import check_plan, request_apply
from wanprobe.daemon.baseline import BaselineTracker, Transition
from wanprobe.daemon.config import DaemonConfig
from wanprobe.daemon.metrics import DaemonMetrics
from wanprobe.daemon.prober import MeshProber
from wanprobe.daemon.reflector_limit import ReflectorPacing
from wanprobe.daemon.runtime import check_runtime, load_runtime
from wanprobe.daemon.scheduler import ProbeFn, Scheduler, ThroughputFn, every
from wanprobe.daemon.sd_notify import Notifier, watchdog_interval_s
from wanprobe.daemon.state_dir import check_state_dir
from wanprobe.diagnose.context import Context, PathChange, Trend
from wanprobe.diagnose.engine import first
from wanprobe.diagnose.path_watch import PathEvent, PathWatch, one_way_spreads
from wanprobe.errors import ConfigError, WanprobeError
from wanprobe.history.store import Flusher, ProbeRow, Store, StoreError
from wanprobe.mesh.peer import Peer
from wanprobe.probe.loss_window import PeerLossWindows
from wanprobe.report.document import dumps as report_text
from wanprobe.report.regression import regression_report
from wanprobe.services import measure
from wanprobe.services.counters import CounterSampler
from wanprobe.services.reflect import ReflectService

FLUSH_INTERVAL_S = 1.0
STOP_BUDGET_S = 1.5


class Daemon:
    """The running daemon. Collaborators are injectable for tests."""

    def __init__(self, cfg: DaemonConfig, peers: tuple[Peer, ...], *, config_path: Path | None = None,
                 prober: ProbeFn = flow_probe.probe_peer,
                 throughput_fn: ThroughputFn = measure.throughput,
                 reflector: Any = None, counters: Any = None, notifier: Notifier | None = None,
                 web_config_file: Path | None = None) -> None:
        self.cfg, self.peers, self.config_path = cfg, peers, config_path
        self.web_override = web_config_file  # `daemon --web-config-file`: wins at each reload
        # peers share the key: their reflectors drop unauthenticated probes (RFC 8762 §4.4)
        real = prober is flow_probe.probe_peer
        self.prober = measure.with_key(prober, cfg.hmac_key) if real else prober
        # the real STAMP prober: every peer on one timer (prober.py); injected fakes run per task
        self.stamp_prober = MeshProber(self.probe_done, self.probe_failed,
                                       hmac_key=cfg.hmac_key) if real else None
        self.throughput_fn = (measure.with_key(throughput_fn, cfg.hmac_key)
                              if throughput_fn is measure.throughput else throughput_fn)
        self.reflector = reflector if reflector is not None else ReflectService.from_config(cfg)
        self.counters = counters if counters is not None else CounterSampler(
            cfg.counters.sys_root, cfg.counters.proc_root)
        self.notifier = notifier or Notifier()
        self.metrics = DaemonMetrics(site=cfg.site,
                                     host=cfg.hostname or socket.gethostname().split(".")[0])
        if hasattr(self.reflector, "refusals"):
            self.metrics.watch_refusals(self.reflector.refusals)
        if hasattr(self.counters, "raw"):
            self.metrics.watch_host_counters(lambda: self.counters.raw)
        self.store: Store | None = None
        self.baseline = BaselineTracker(cfg.baseline)
        self.path_watch = PathWatch()
        self.pacing = ReflectorPacing()   # peers whose reflector answers slower than we send
        self._pending_reroute: dict[str, PathEvent] = {}
        self.stop_event = asyncio.Event()
        self.last_apply_request: float | None = None
        self.metrics_address: tuple[str, int] | None = None
        self.reflector_error: str | None = None
        self.flush_error: str | None = None
        self.last_flush = time.time()
        self.loaded_at = time.time()
        self.active_findings: dict[tuple[str, str], str] = {}
        self._failing: set[str] = set()
        self._last_probe: dict[str, dict] = {}
        # each peer's loss over the short and long windows (probe/loss_window.py, issue 36)
        self.loss_windows = PeerLossWindows(cfg.baseline.loss_short_s, cfg.baseline.loss_long_s)
        self._counter_findings: list[dict] = []
        self.scheduler: Scheduler | None = None

    @property
    def last_probes(self) -> dict[str, dict]:
        """The last session's ProbeResult JSON of each peer (the page shows it)."""
        return self._last_probe

    # -- lifecycle ----------------------------------------------------------------------------
    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop_event.set)
        loop.add_signal_handler(signal.SIGHUP, lambda: asyncio.ensure_future(self.reload()))
        try:
            await self.start()
        except WanprobeError:
            await self.shutdown()
            raise
        await self.stop_event.wait()
        await self.shutdown()
        return 0

    def _tests_of(self, peer: str, since: float) -> list[tuple[float, int, bool]]:
        """A peer's stored throughput tests for the scheduler's spread (throughput_spread.py)."""
        return [(t["ts"], int(t["bytes"] or 0), t["bits_per_second"] is not None)
                for t in self.store.throughput(peer, since=since)]

    async def start(self) -> None:
        check_state_dir(self.cfg.state_dir, self.cfg.reports_dir)  # as `daemon --check` did
        self.store = Store(self.cfg.db_path)
        self._warm_baseline()
        server = listener.build(self.metrics, self.health, self.cfg)  # TLS, auth: httpd/web_config.py
        routes.install(self, server.http)   # the page (pictures/routes.py), /api/sessions
        try:
            self.metrics_address = await server.start(*self.cfg.metrics_listen)
        except OSError as exc:
            raise ConfigError(f"daemon.metrics_listen {self.cfg.metrics_listen[0]}:"
                              f"{self.cfg.metrics_listen[1]}: {exc.strerror or exc}") from None
        self._server = server
        await self._start_reflector()
        self._check_auto_apply()
        self.scheduler = Scheduler(self, self.prober, probe=self.cfg.probe,
                                   throughput=self.cfg.throughput, throughput_fn=self.throughput_fn,
                                   budget_used=self.store.throughput_bytes_since,
                                   stamp_prober=self.stamp_prober, test_history=self._tests_of)
        self.scheduler.pacing = self.pacing
        if self.stamp_prober is not None:
            self.stamp_prober.pacing = self.pacing
        self.scheduler.apply(self.peers, self.cfg.probe, self.cfg.throughput)
        self.metrics.set_peers(self.peers)
        self._flusher = Flusher(self.store, FLUSH_INTERVAL_S, self._flushed)
        self._flusher.start()
        self._tasks = [asyncio.create_task(self.maintain()),  # retention also right at start
                       asyncio.create_task(every(lambda: self.cfg.retention.maintenance_interval_s,
                                                 self.maintain)),
                       asyncio.create_task(self._counter_loop()), ring_schedule.start(self),
                       job_ingest.start(self)]
        wd = watchdog_interval_s()
        if wd:
            self._tasks.append(asyncio.create_task(every(lambda: wd, self._watchdog)))
        # everything built so far lives as long as the daemon: keep it out of every GC pass
        gc.collect()
        gc.freeze()
        status = self.status_line()
        self.notifier.ready(status)
        dlog.log(logging.INFO, "wanprobe daemon started", config=self.cfg.source,
                 peers=len(self.peers), metrics=f"{self.metrics_address[0]}:{self.metrics_address[1]}",
                 state_dir=self.cfg.state_dir, reflector=self.reflector_error or "ok")

    async def shutdown(self) -> None:
        t0 = time.monotonic()
        self.notifier.stopping("stopping: flushing history")
        dlog.log(logging.INFO, "stopping")
        tasks = list(getattr(self, "_tasks", []))
        for t in tasks:
            t.cancel()
        parts = {"tasks": asyncio.gather(*tasks, return_exceptions=True),
                 "reflector": self.reflector.close()}
        if self.scheduler is not None:
            parts["probes"] = self.scheduler.stop()
        if getattr(self, "_server", None) is not None:
            parts["http"] = self._server.close()
        timed = {name: asyncio.ensure_future(_timed(c)) for name, c in parts.items()}
        done, pending = await asyncio.wait(timed.values(), timeout=STOP_BUDGET_S)
        for fut in pending:
            fut.cancel()
        took = {f"{name}_s": (round(f.result(), 3) if f in done and not f.cancelled() else "timeout")
                for name, f in timed.items()}
        flushed = 0
        if getattr(self, "_flusher", None) is not None:
            self._flusher.stop()
        if self.store is not None:
            try:
                flushed = self.store.flush()
                self.store.close()
            except StoreError as exc:
                dlog.log(logging.ERROR, "history not flushed on stop", error=exc)
        dlog.log(logging.INFO, "stopped", rows_flushed=flushed,
                 total_s=round(time.monotonic() - t0, 3), **took)
        self.notifier.close()

    async def _start_reflector(self) -> None:
        if not self.cfg.reflector_enabled:
            return
        try:
            await self.reflector.start(self.cfg.reflector_listen)
        except (OSError, ImportError, WanprobeError) as exc:
            # probing still works without the reflector; say so everywhere, keep running
            self.reflector_error = " ".join(str(exc).split())
            dlog.log(logging.ERROR, "reflector not started", error=self.reflector_error,
                     listen=",".join(f"{h}:{p}" for h, p in self.cfg.reflector_listen))

    def _check_auto_apply(self) -> None:
        if not self.cfg.auto_apply.enabled:
            return
        try:
            changes = check_plan(self.cfg.auto_apply)
            dlog.log(logging.INFO, "auto-apply: signed-off plan ready for wanprobe-tune.service",
                     plan=self.cfg.auto_apply.plan, changes=len(changes))
        except ConfigError as exc:
            dlog.log(logging.WARNING, "auto-apply: plan refused", reason=exc)

    async def reload(self) -> None:
        """SIGHUP: validate the new config as `daemon --check` does; apply it only if good."""
        if self.config_path is None:
            dlog.log(logging.WARNING, "reload: no config file to re-read")
            return
        self.notifier.reloading()
        try:
            cfg, peers, web = await run_blocking(check_runtime, self.config_path, self.web_override)
        except WanprobeError as exc:
            problems = getattr(exc, "problems", None) or [str(exc)]
            for p in problems:
                dlog.log(logging.ERROR, "reload refused, keeping the running config",
                         config=self.config_path, problem=p)
            self.metrics.config_reloads.labels(result="refused").inc()
            self.notifier.ready(self.status_line() + "; last reload refused")
            return
        restart_needed = [k for k in ("state_dir", "metrics_listen", "reflector_listen",
                                      "reflector_enabled", "hmac_key", "allow", "cos_dscp",
                                      "hostname", "site")
                          if getattr(cfg, k) != getattr(self.cfg, k)]
        if restart_needed:
            dlog.log(logging.WARNING, "reload: these keys take effect on restart only",
                     keys=",".join(restart_needed))
            cfg = replace(cfg, **{k: getattr(self.cfg, k) for k in restart_needed})
        self.loss_windows.retune(cfg.baseline.loss_short_s, cfg.baseline.loss_long_s)
        self.cfg, self.peers = cfg, peers
        listener.reload(getattr(self, "_server", None), cfg, web)
        dlog.set_style(cfg.log_format)
        self.baseline.s = cfg.baseline
        if hasattr(self.reflector, "set_limits"):
            self.reflector.set_limits(cfg.throughput_server)
        diff = self.scheduler.apply(peers, cfg.probe, cfg.throughput)
        for name in diff["removed"]:
            for forget in (self.metrics.forget_peer, self.path_watch.forget, flow_probe.forget,
                           self.pacing.forget, self.loss_windows.forget):
                forget(name)
        self.metrics.set_peers(peers)
        self.metrics.config_reloads.labels(result="applied").inc()
        self.loaded_at = time.time()
        self._check_auto_apply()
        self.notifier.ready(self.status_line())
        dlog.log(logging.INFO, "config reloaded", peers=len(peers), **{k: ",".join(v) for k, v in diff.items() if v})

    # -- results (Sink) -----------------------------------------------------------------------
    def probe_done(self, peer: Peer, method: str, ts: float, doc: dict[str, Any]) -> None:
        row = ProbeRow.from_probe_json(ts, peer.name, method, doc)
        self.store.add_probe(row)
        self.metrics.observe_probe(peer, method, doc)
        self._last_probe[peer.name] = doc
        if method == peer.methods[0]:
            self.loss_windows.add(peer.name, ts, doc)
            self.metrics.loss_window.observe(self.metrics.path_labels(peer),
                                             self.loss_windows.loss(peer.name, "short", ts))
        if method == "stamp":
            self.pacing.observe(peer.name, doc, self.cfg.probe)
        if peer.name in self._failing:
            self._failing.discard(peer.name)
            dlog.log(logging.INFO, "peer answers again", peer=peer.name, method=method)
        if (sch := self.scheduler) and (sch.ring_running or sch.throughput_running == peer.name):
            return  # our own bulk test (or ring test) inflates RTT/loss: not a baseline sample
        if method != peer.methods[0]:
            return  # one baseline per peer, from its primary method (loss means the same)
        for t in self.baseline.observe_probe(row):
            self._transition(peer, t)
        if doc.get("paths"):
            self.metrics.observe_fingerprints(peer.name, doc["paths"]["paths"])
            pending = self._pending_reroute.pop(peer.name, None)
            if pending is not None:   # this session traced the flows again: hops after
                self._path_event(peer, pending, traced=True)
        rtt = doc.get("rtt_ms") or {}
        fwd, rev = one_way_spreads(doc)   # which direction a queue builds in (STAMP)
        events = self.path_watch.observe(peer.name, rtt.get("min"), rtt.get("p99"),
                                         forward_spread_ms=fwd, reverse_spread_ms=rev)
        self.metrics.observe_path(peer, *self.path_watch.current(peer.name))
        for ev in events:
            self._path_event(peer, ev)

    def _path_event(self, peer: Peer, ev: PathEvent, traced: bool = False) -> None:
        """path.rerouted / path.queueing: a report in the state dir, a finding, a counter. With
        flows > 1 a reroute report waits for the next (traced) session, for hops after."""
        if ev.event == "rerouted" and peer.flows > 1 and not traced:
            flow_probe.request_trace(peer.name)
            self._pending_reroute[peer.name] = ev
            return
        key = (peer.name, "path.queueing")
        if ev.event == "queueing_cleared":
            self.active_findings.pop(key, None)
            self._update_findings_gauge()
            dlog.log(logging.INFO, "path queueing cleared", peer=peer.name,
                     spread_ms=round(ev.new_spread_ms, 3))
            return
        now = time.time()
        before, after = flow_probe.hop_lists(peer.name) if peer.flows > 1 else (None, None)
        finding = first(Context(path_event=PathChange(
            peer.name, peer.address, ev, hops_before=before, hops_after=after,
            link_bps=self.baseline.baseline(peer.name).get("bits_per_second"))))
        if finding is None:  # an event no rule judges
            return
        doc = regression_report(
            peer, [], self._last_probe.get(peer.name), self.baseline.baseline(peer.name),
            started=now - self.cfg.probe.interval_s * ev.sessions, finished=now, findings=[finding])
        path = self._write_report(doc, peer.name, finding.id, now)
        self.store.add_finding(now, finding.to_json(), peer=peer.name,
                               report_path=str(path) if path else None)
        self.metrics.path_event(peer, ev.event)
        if ev.event == "queueing":
            self.active_findings[key] = finding.severity
            self._update_findings_gauge()
        dlog.log(logging.WARNING, finding.title, peer=peer.name, event=ev.event, report=path)

    def probe_failed(self, peer: Peer, method: str, ts: float, error: str) -> None:
        self.store.add_probe(ProbeRow(ts=ts, peer=peer.name, method=method, error=error))
        self.metrics.observe_probe_error(peer, method)
        if peer.name not in self._failing:
            self._failing.add(peer.name)
            dlog.log(logging.WARNING, "probe failed", peer=peer.name, method=method, error=error)

    def throughput_done(self, peer: Peer, ts: float, doc: dict | None, error: str | None) -> None:
        self.store.add_throughput(ts, peer.name, doc, error)
        if doc is None:
            dlog.log(logging.WARNING, "throughput test failed", peer=peer.name, error=error)
            return
        self.metrics.observe_throughput(peer, doc)
        dlog.log(logging.INFO, "throughput test", peer=peer.name,
                 bits_per_second=doc.get("bits_per_second"))
        if doc.get("bits_per_second"):
            for t in self.baseline.observe_throughput(peer.name, float(doc["bits_per_second"])):
                self._transition(peer, t)

    def _transition(self, peer: Peer, t: Transition) -> None:
        key = (peer.name, t.metric)
        if t.state == "recovered":
            self.active_findings.pop(key, None)
            self._update_findings_gauge()
            dlog.log(logging.INFO, "regression cleared", peer=peer.name, metric=t.metric,
                     baseline=round(t.baseline, 6), current=round(t.current, 6))
            return
        now = time.time()
        transition = t.to_json()
        finding = first(Context(trend=Trend(peer.name, peer.address, transition)))
        if finding is None:  # a metric no rule judges
            return
        doc = regression_report(peer, [transition], self._last_probe.get(peer.name),
                                self.baseline.baseline(peer.name),
                                started=now - self.cfg.probe.interval_s * self.cfg.baseline.recent,
                                finished=now, findings=[finding])
        path = self._write_report(doc, peer.name, t.metric, now)
        self.store.add_finding(now, finding.to_json(), peer=peer.name,
                               report_path=str(path) if path else None)
        self.active_findings[key] = finding.severity
        self._update_findings_gauge()
        self.metrics.observe_regression(peer, t.metric)
        dlog.log(logging.WARNING, finding.title, peer=peer.name, metric=t.metric,
                 baseline=round(t.baseline, 6), current=round(t.current, 6), report=path)
        self._request_apply(peer, t.metric, path, now)

    def _request_apply(self, peer: Peer, metric: str, report: Path | None, now: float) -> None:
        """With auto-apply on, a regression asks wanprobe-tune.service (via its .path unit) to
        apply the signed-off plan; the daemon itself never changes a setting."""
        try:
            path = request_apply(self.cfg.auto_apply, self.cfg.state_dir,
                                 reason={"peer": peer.name, "metric": metric,
                                         "report": str(report) if report else None},
                                 now_s=now, last_request_s=self.last_apply_request)
        except ConfigError as exc:
            dlog.log(logging.WARNING, "auto-apply: plan refused, no apply requested", reason=exc)
            return
        except OSError as exc:
            dlog.log(logging.ERROR, "auto-apply: cannot write the apply request",
                     error=exc.strerror or exc)
            return
        if path is not None:
            self.last_apply_request = now
            dlog.log(logging.WARNING, "auto-apply: requested wanprobe-tune.service", peer=peer.name,
                     metric=metric, request=path)

    def _write_report(self, doc: dict, peer: str, metric: str, ts: float) -> Path | None:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(ts))
        path = self.cfg.reports_dir / f"{stamp}-{peer}-{metric}.json"
        try:
            return atomic_write(path, report_text(doc), mode=0o600)
        except OSError as exc:
            dlog.log(logging.ERROR, "cannot write report", path=path, error=exc.strerror or exc)
            return None

    def _update_findings_gauge(self) -> None:
        tally = Tally(self.active_findings.values())
        tally.update(f.get("severity", "info") for f in self._counter_findings)
        self.metrics.set_findings(dict(tally))

    # -- periodic -----------------------------------------------------------------------------
    def _flushed(self, error: StoreError | None) -> None:
        """The Flusher's report, from its thread: plain attribute writes, read by health()."""
        if error is None:
            self.flush_error = None
            self.last_flush = time.time()
            return
        if self.flush_error is None:
            dlog.log(logging.ERROR, "history write failed; will retry", error=error)
        self.flush_error = str(error)

    async def maintain(self) -> None:
        r = self.cfg.retention
        now = time.time()
        try:
            folded = await run_blocking(lambda: self.store.downsample(now=now, raw_s=r.raw_s,
                                                                      bucket_s=r.bucket_s))
            deleted = await run_blocking(lambda: self.store.expire(
                now=now, raw_s=r.raw_s, downsampled_s=r.downsampled_s))
            if folded or deleted:
                dlog.log(logging.INFO, "history maintenance", downsampled=folded, expired=deleted)
        except Exception as exc:  # noqa: BLE001 - maintenance must not take the daemon down
            dlog.log(logging.ERROR, "history maintenance failed", error=exc)

    async def _counter_loop(self) -> None:
        reported = False
        while True:
            await asyncio.sleep(self.cfg.counters.interval_s)
            if not self.cfg.counters.enabled:
                continue
            ts = time.time()
            try:
                rates, flat, findings = await run_blocking(self.counters.sample)
            except Exception as exc:  # noqa: BLE001 - a collector failure is reported, not fatal
                if not reported:
                    dlog.log(logging.WARNING, "counter sampling failed", error=exc)
                    reported = True
                continue
            if rates is None:
                continue
            self.store.add_counter_rates(ts, self.cfg.counters.interval_s, rates)
            self.metrics.observe_rates(flat)
            for f in findings:
                self.store.add_finding(ts, f)
            self._counter_findings = findings
            self._update_findings_gauge()

    async def _watchdog(self) -> None:
        # only a loop that is alive and writing its history counts as healthy
        if time.time() - self.last_flush < 10 * FLUSH_INTERVAL_S + 30:
            self.notifier.watchdog()

    def status_line(self) -> str:
        s = f"probing {len(self.peers)} peers every {self.cfg.probe.interval_s:g} s"
        if self.reflector_error:
            s += "; reflector down"
        return s

    def health(self) -> tuple[bool, dict[str, Any]]:
        ok = self.flush_error is None and time.time() - self.last_flush < 30
        return ok, {"ok": ok, "peers": len(self.peers),  # a count: 10,000 names is a DoS
                    "config": self.cfg.source, "config_loaded_at": self.loaded_at,
                    "probe_interval_s": self.cfg.probe.interval_s,
                    "reflector": self.reflector_error or "ok", "history": self.flush_error or "ok",
                    "last_flush_age_s": round(time.time() - self.last_flush, 3)}

    def _warm_baseline(self) -> None:
        n = self.cfg.baseline.window + self.cfg.baseline.recent
        for p in self.peers:
            for row in self.store.probes(p.name, limit=n):
                self.baseline.observe_probe(row)


async def _timed(coro) -> float:
    t0 = time.monotonic()
    await asyncio.gather(coro, return_exceptions=True)
    return time.monotonic() - t0


def run(config_path: Path | str, web_config_file: Path | None = None, **inject: Any) -> int:
    """Entry point of ``wanprobe daemon``: load, validate, run until SIGTERM."""
    path = Path(config_path)
    dlog.setup("journal")
    cfg, peers = load_runtime(path, web_config_file)
    dlog.set_style(cfg.log_format)

    async def main() -> int:
        return await Daemon(cfg, peers, config_path=path, web_config_file=web_config_file,
                            **inject).run()

    return asyncio.run(main())
