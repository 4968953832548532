"""Prometheus metrics on the daemon's own registry and a tiny asyncio HTTP endpoint.

Names follow the Prometheus conventions (https://prometheus.io/docs/practices/naming/): base units
(seconds, bits per second, ratios 0..1), ``_total`` for counters, labels for peer, direction,
severity and ``stat``; ``promtool check metrics`` reports nothing on the exposition
(tests/test_daemon_promtool.py runs it on a real daemon's scrape).

RTT percentiles are one gauge family with a ``stat`` label (``min``, ``p50``, ``p90``,
``p99``, ``max``: the keys of the probe result's ``rtt_ms``), not a ``quantile`` label and not
one gauge per percentile. ``quantile`` is reserved for summaries, whose quantiles Prometheus
expects beside ``_sum`` and ``_count`` over every observation since start (promtool and the
OpenMetrics parsers reject it on a gauge); these are the order statistics of the last probe
session, computed here. One family keeps one selector for a band
(``wanprobe_rtt_seconds{stat=~"p50|p99"}``), the same series count as before, and the words of
the JSON; the rules read ``stat="p50"`` (fleet/rules.py, which still reads the ``quantile``
label of daemons that predate the change). The one-way delays (owd_metrics.py) and the per-path
fingerprints use the same label. Host counters are ``wanprobe_host_stat_*``: promtool refuses a
metric name that contains a type (``_counter_``). Goodput is in the base unit, bytes
(``wanprobe_throughput_bytes_per_second``; promtool refuses ``bits``); the rules multiply by 8
where they speak bit/s.

``/metrics`` is the text exposition format; ``/healthz`` is 200 with a small JSON body while the
loop is alive and the last history flush succeeded, 503 otherwise; ``/`` and ``/peer/NAME`` are
the read-only page (pictures/routes.py) when the daemon passes ``pages``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    disable_created_metrics,
)
from prometheus_client.core import CounterMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from wanprobe.daemon import loss_metrics, owd_metrics
from wanprobe.daemon.exposition import Exposition
from wanprobe.httpd.server import BoundedHttpServer, HttpLimits, Request, Response
from wanprobe.mesh.peer import Peer

# the ``stat`` label values of wanprobe_rtt_seconds: the keys of a probe result's ``rtt_ms``
RTT_STATS = ("min", "p50", "p90", "p99", "max")
FINGERPRINT_STATS = ("p50", "p99")
SEVERITIES = ("critical", "warning", "info")
# Every path series carries where it starts and ends, so Prometheus can group by site pair
# (Pingmesh's site x site view, Guo et al. SIGCOMM 2015 §4); ``peer`` is the config name.
PATH_LABELS = ("peer", "src_site", "src_host", "dst_site", "dst_host")
LOSS_DIRECTIONS = (("ratio", "round_trip"), ("forward_ratio", "forward"),
                   ("reverse_ratio", "reverse"))
# Series one peer adds per probe method: rtt by stat, loss ratio and lost packets by
# direction, jitter, sessions, sent, received.
SERIES_PER_PEER_METHOD = len(RTT_STATS) + 2 * len(LOSS_DIRECTIONS) + 1 + 1 + 2
# ... and per peer whatever its methods: info, errors, last probe, throughput, throughput bytes,
# and the windowed loss of its primary method (loss_metrics.py)
SERIES_PER_PEER = 5 + loss_metrics.SERIES_PER_PEER
# ... and per host: peers, findings by severity, reloads by result, daemon info
SERIES_PER_HOST = 1 + len(SEVERITIES) + 2 + 1


def series_per_host(peers: int, methods: int = 1, owd: bool = False) -> int:
    """Path and daemon series one host exports for ``peers`` peers probed with ``methods``
    methods each: linear in peers, never quadratic (Goldpinger issue #52). Regression counters
    (at most 4 per peer, only after a regression) and host counter rates come on top; with
    ``owd``, the one-way delay series of sessions whose clock bound is known (owd_metrics.py)."""
    per_method = SERIES_PER_PEER_METHOD + (owd_metrics.SERIES_PER_PEER_METHOD if owd else 0)
    return SERIES_PER_HOST + peers * (SERIES_PER_PEER + methods * per_method)
PATH_EVENTS = ("rerouted", "queueing")
MAX_FINGERPRINTS = 16   # per peer: ECMP fans out to a handful of paths, never more series


class DaemonMetrics:
    """Every metric the daemon exports, registered on ``registry`` (a fresh one by default).

    ``site`` and ``host`` are this daemon's own place in the fleet (``src_site``/``src_host``);
    each peer brings ``dst_site``/``dst_host``. Probe packets are raw ``_total`` counters, so
    Prometheus computes loss over any window with ``rate()``; the gauges hold the last session.
    """

    def __init__(self, registry: CollectorRegistry | None = None, *, site: str = "",
                 host: str = "") -> None:
        """Declare every exported metric (one declaration per series family: name, help,
        labels), by what it describes: probe sessions, the daemon itself, path events."""
        # no ``_created`` twin per counter: it doubles the series and Prometheus does not need it
        disable_created_metrics()
        r = self.registry = registry or CollectorRegistry(auto_describe=True)
        self.site, self.host = site, host
        self._declare_probe_metrics(r, list(PATH_LABELS))
        self._declare_daemon_metrics(r, list(PATH_LABELS))
        self._declare_path_metrics(r)
        self._fingerprints: dict[str, set[str]] = {}
        self.owd = owd_metrics.OwdGauges(r, list(PATH_LABELS))
        self.loss_window = loss_metrics.LossWindowGauges(r, list(PATH_LABELS))
        for sev in SEVERITIES:
            self.findings.labels(severity=sev).set(0)
        for result in ("applied", "refused"):
            self.config_reloads.labels(result=result)
        from wanprobe import __version__

        self.info.labels(site=site, host=host, version=__version__).set(1)
        self._cache: dict[tuple[str, str], dict[str, Any]] = {}
        self._paths: dict[str, tuple[str, ...]] = {}
        self._path_children: dict[str, tuple[Any, Any]] = {}   # peer -> (floor, spread) children
        self._rates: dict[tuple[str, str], Any] = {}
        self._exposition = Exposition()

    def _declare_probe_metrics(self, r: CollectorRegistry, path: list[str]) -> None:
        """What each probe session and throughput test measured, per path."""
        self.rtt = Gauge("wanprobe_rtt_seconds", "Round-trip time of the last probe session; "
                         "stat is min, p50, p90, p99 or max over its replies.",
                         path + ["stat", "method"], registry=r)
        self.loss = Gauge("wanprobe_loss_ratio", "Packet loss ratio of the last probe session; "
                          "direction is round_trip, forward (to the peer) or reverse.",
                          path + ["direction", "method"], registry=r)
        self.jitter = Gauge("wanprobe_jitter_seconds", "IPDV jitter (RFC 5481) of the last probe "
                            "session.", path + ["method"], registry=r)
        self.throughput = Gauge("wanprobe_throughput_bytes_per_second", "Receiver goodput of "
                                "the last scheduled throughput test (x 8 for bit/s).", path,
                                registry=r)
        self.probes = Counter("wanprobe_probe_sessions_total", "Probe sessions run.",
                              path + ["method"], registry=r)
        self.sent = Counter("wanprobe_probe_packets_sent_total", "Probe packets sent.",
                            path + ["method"], registry=r)
        self.received = Counter("wanprobe_probe_packets_received_total", "Probe replies received.",
                                path + ["method"], registry=r)
        self.lost = Counter("wanprobe_probe_packets_lost_total", "Probe packets the path lost: "
                            "round_trip (sent - received, less the reflector's own drops), "
                            "forward (never reached the reflector, RFC 8762 counters) or "
                            "reverse (reflected, reply lost).",
                            path + ["direction", "method"], registry=r)
        self.reflector_drops = Counter(
            "wanprobe_probe_reflector_drops_total", "Probes the peer's reflector received and did "
            "not answer, by cause (rate_limited, replay: a copy refused by authentication, "
            "session_refused: no room for its session in the table), as its Reflector Report "
            "TLV said; never in wanprobe_probe_packets_lost_total. Series appear "
            "with the first drop.",
            path + ["cause", "method"], registry=r)
        self.reflector_resets = Counter(
            "wanprobe_probe_reflector_session_resets_total", "Times the peer's reflector restarted "
            "a probe session (evicted or reset); its unanswered probes around it are not loss.",
            path + ["method"], registry=r)

    def _declare_daemon_metrics(self, r: CollectorRegistry, path: list[str]) -> None:
        """The daemon's own state: failed sessions, peers, findings, regressions, reloads."""
        self.errors = Counter("wanprobe_probe_errors_total", "Probe sessions that failed "
                              "(timeout, unreachable, refused).", path, registry=r)
        self.last_probe = Gauge("wanprobe_last_probe_timestamp_seconds", "Unix time of the last "
                                "successful probe session.", path, registry=r)
        self.peer_info = Gauge("wanprobe_peer_info", "One per probed peer: its address and "
                               "methods (value 1).", path + ["address", "methods"], registry=r)
        self.info = Gauge("wanprobe_daemon_info", "This daemon's site, host and version (value 1).",
                          ["site", "host", "version"], registry=r)
        self.counter_rate = Gauge("wanprobe_host_stat_rate_per_second", "Per-second rate of a "
                                  "host counter between the daemon's last two samples.",
                                  ["source", "counter"], registry=r)
        self.findings = Gauge("wanprobe_findings", "Active findings (counter health rules and "
                              "path regressions) by severity.", ["severity"], registry=r)
        self.regressions = Counter("wanprobe_regressions_total", "Regressions detected against "
                                   "the rolling baseline.", path + ["metric"], registry=r)
        self.throughput_bytes = Counter("wanprobe_throughput_test_bytes_total", "Bytes moved by "
                                        "scheduled throughput tests.", path, registry=r)
        self.peers = Gauge("wanprobe_peers", "Peers currently probed.", registry=r)
        self.config_reloads = Counter("wanprobe_config_reloads_total", "SIGHUP reloads by result.",
                                      ["result"], registry=r)

    def _declare_path_metrics(self, r: CollectorRegistry) -> None:
        """Path events (diagnose/path_watch.py) and the per-path fingerprints of ECMP flows."""
        self.path_floor = Gauge("wanprobe_path_rtt_floor_seconds", "RTT floor: the minimum RTT "
                                "over the last sessions (moves with a route change).",
                                PATH_LABELS, registry=r)
        self.path_spread = Gauge("wanprobe_path_rtt_spread_seconds", "RTT spread: median over "
                                 "the last sessions of p99 - min (grows with queueing).",
                                 PATH_LABELS, registry=r)
        self.path_events = Counter("wanprobe_path_events_total", "Path events: rerouted (floor "
                                   "step, spread unchanged) or queueing (spread up, floor steady).",
                                   [*PATH_LABELS, "event"], registry=r)
        self.fp_rtt = Gauge("wanprobe_path_fingerprint_rtt_seconds", "RTT of the flows on one "
                            "path (fingerprint: hash of the hop list); stat is p50 or p99.",
                            ["peer", "fingerprint", "stat"], registry=r)
        self.fp_loss = Gauge("wanprobe_path_fingerprint_loss_ratio", "Loss of the flows on one "
                             "path; direction round_trip, forward or reverse.",
                             ["peer", "fingerprint", "direction"], registry=r)
        self.fp_flows = Gauge("wanprobe_path_fingerprint_flows", "Probe flows (source ports) "
                              "hashed onto one path.", ["peer", "fingerprint"], registry=r)

    def path_labels(self, peer: Peer) -> tuple[str, ...]:
        """Values of PATH_LABELS for ``peer``, in order."""
        got = self._paths.get(peer.name)
        if got is None:
            got = self._paths[peer.name] = (peer.name, self.site, self.host, peer.site, peer.name)
        return got

    def set_peers(self, peers: tuple[Peer, ...]) -> None:
        """Publish the peer set: ``wanprobe_peers`` and one ``wanprobe_peer_info`` each."""
        self.peers.set(len(peers))
        self.peer_info.clear()
        for p in peers:
            if self._paths.get(p.name, (p.name, self.site, self.host, p.site, p.name))[3] != p.site:
                self.forget_peer(p.name)  # moved to another site: its old series must go
            self.peer_info.labels(*self.path_labels(p), p.address, ",".join(p.methods)).set(1)

    def _children(self, peer: Peer, method: str) -> dict[str, Any]:
        """Label children of one peer, looked up once: ``labels()`` costs more than ``set()``,
        and a daemon probing hundreds of peers does this for every session."""
        key = (peer.name, method)
        ch = self._cache.get(key)
        if ch is None:
            lab = self.path_labels(peer)
            ch = self._cache[key] = {
                "sessions": self.probes.labels(*lab, method),
                "sent": self.sent.labels(*lab, method),
                "received": self.received.labels(*lab, method),
                "rtt": [(k, self.rtt.labels(*lab, k, method)) for k in RTT_STATS],
                "loss": [(k, self.loss.labels(*lab, d, method)) for k, d in LOSS_DIRECTIONS],
                "lost": [(d, self.lost.labels(*lab, d, method)) for _, d in LOSS_DIRECTIONS],
                "jitter": self.jitter.labels(*lab, method),
                "last": self.last_probe.labels(*lab),
                "errors": self.errors.labels(*lab),
            }
        return ch

    def observe_probe(self, peer: Peer, method: str, doc: dict[str, Any]) -> None:
        """Export one ProbeResult ``to_json()`` (milliseconds converted to seconds here)."""
        ch = self._children(peer, method)
        ch["sessions"].inc()
        rtt = doc.get("rtt_ms") or {}
        for key, child in ch["rtt"]:
            if rtt.get(key) is not None:
                child.set(rtt[key] / 1e3)
        loss = doc.get("loss") or {}
        for key, child in ch["loss"]:
            if loss.get(key) is not None:
                child.set(loss[key])
        sent, received = loss.get("sent"), loss.get("received")
        if sent is not None and received is not None:
            ch["sent"].inc(sent)
            ch["received"].inc(received)
            not_path = sum(loss.get(k) or 0 for k in ("reflector_rate_limited", "unattributed",
                                                      "reflector_session_refused"))
            lost = {"round_trip": max(0, sent - received - not_path),
                    "forward": loss.get("forward_lost"), "reverse": loss.get("reverse_lost")}
            for direction, child in ch["lost"]:
                if lost[direction]:
                    child.inc(lost[direction])
            self._observe_reflector(peer, method, loss)
        if doc.get("jitter_ms") is not None:
            ch["jitter"].set(doc["jitter_ms"] / 1e3)
        self.owd.observe(self.path_labels(peer), method, doc)
        ch["last"].set(time.time())

    def _observe_reflector(self, peer: Peer, method: str, loss: dict[str, Any]) -> None:
        """The reflector's drops and session restarts (issue 20), children made on first use."""
        lab = self.path_labels(peer)
        for cause, key in (("rate_limited", "reflector_rate_limited"),
                           ("replay", "reflector_replays_refused"),
                           ("session_refused", "reflector_session_refused")):
            if loss.get(key):
                self.reflector_drops.labels(*lab, cause, method).inc(loss[key])
        if loss.get("reflector_resets"):
            self.reflector_resets.labels(*lab, method).inc(loss["reflector_resets"])

    def observe_path(self, peer: Peer, floor_ms: float | None, spread_ms: float | None) -> None:
        """Export a peer's RTT floor and spread (ms in, seconds out), with the path labels."""
        children = self._path_children.get(peer.name)
        if children is None:   # labels() costs more than set(): looked up once, as _children
            lab = self.path_labels(peer)
            children = self._path_children[peer.name] = (self.path_floor.labels(*lab),
                                                         self.path_spread.labels(*lab))
        floor, spread = children
        if floor_ms is not None:
            floor.set(floor_ms / 1e3)
        if spread_ms is not None:
            spread.set(spread_ms / 1e3)

    def observe_fingerprints(self, peer: str, paths: list[dict[str, Any]]) -> None:
        """Per-path results of a multi-flow session (multiflow.py ``paths``); series of paths
        no longer seen are removed, and at most MAX_FINGERPRINTS (the busiest) are kept."""
        top = sorted((p for p in paths if p.get("fingerprint")), key=lambda p: -p["flows"])
        top = top[:MAX_FINGERPRINTS]
        now = {p["fingerprint"] for p in top}
        self._forget_fingerprints(peer, self._fingerprints.get(peer, set()) - now)
        self._fingerprints[peer] = now
        for p in top:
            fp = p["fingerprint"]
            self.fp_flows.labels(peer, fp).set(p["flows"])
            for key in FINGERPRINT_STATS:
                if p.get("rtt_ms") and p["rtt_ms"].get(key) is not None:
                    self.fp_rtt.labels(peer, fp, key).set(p["rtt_ms"][key] / 1e3)
            for key, d in (("loss_ratio", "round_trip"), ("forward_ratio", "forward"),
                           ("reverse_ratio", "reverse")):
                if p.get(key) is not None:
                    self.fp_loss.labels(peer, fp, d).set(p[key])

    def _forget_fingerprints(self, peer: str, gone: set[str]) -> None:
        for fp in gone:
            for metric, tails in ((self.fp_flows, [()]), (self.fp_rtt, [(k,) for k in FINGERPRINT_STATS]),
                                  (self.fp_loss, [("round_trip",), ("forward",), ("reverse",)])):
                for tail in tails:
                    try:
                        metric.remove(peer, fp, *tail)
                    except KeyError:
                        pass

    def path_event(self, peer: Peer, event: str) -> None:
        self.path_events.labels(*self.path_labels(peer), event).inc()

    def _forget_path(self, lab: tuple[str, ...]) -> None:
        for metric, extra in ((self.path_floor, [()]), (self.path_spread, [()]),
                              (self.path_events, [(e,) for e in PATH_EVENTS])):
            for tail in extra:
                try:
                    metric.remove(*lab, *tail)
                except KeyError:
                    pass

    def observe_probe_error(self, peer: Peer, method: str) -> None:
        ch = self._children(peer, method)
        ch["sessions"].inc()
        ch["errors"].inc()

    def observe_throughput(self, peer: Peer, doc: dict[str, Any]) -> None:
        lab = self.path_labels(peer)
        if doc.get("bits_per_second") is not None:  # base unit bytes (Prometheus naming)
            self.throughput.labels(*lab).set(doc["bits_per_second"] / 8)
        from wanprobe.history.store import link_bytes

        moved = link_bytes(doc)
        if moved:
            self.throughput_bytes.labels(*lab).inc(moved)

    def observe_regression(self, peer: Peer, metric: str) -> None:
        self.regressions.labels(*self.path_labels(peer), metric).inc()

    def observe_rates(self, flat_rates: dict[tuple[str, str], float]) -> None:
        """Publish the latest host counter rates; a counter that vanished (device removed) loses
        its series. Children are kept between samples: re-creating hundreds of labelled
        children every sample cost more than the probing of a peer (bench/daemon_footprint.py)."""
        rates = self._rates
        for key in [k for k in rates if k not in flat_rates]:
            del rates[key]
            self.counter_rate.remove(*key)
        for key, value in flat_rates.items():
            child = rates.get(key)
            if child is None:
                child = rates[key] = self.counter_rate.labels(*key)
            child.set(value)

    def set_findings(self, by_severity: dict[str, int]) -> None:
        for sev in set(SEVERITIES) | set(by_severity):
            self.findings.labels(severity=sev).set(by_severity.get(sev, 0))

    def forget_peer(self, peer: str) -> None:
        """Drop a removed peer's gauges so a stale value is not scraped forever (counters keep
        their history: Prometheus handles a series that stops)."""
        lab = self._paths.pop(peer, None)
        if lab is None:
            return
        removals = []
        for _, method in [k for k in self._cache if k[0] == peer]:
            removals += [(self.rtt, lab + (k, method)) for k in RTT_STATS]
            removals += [(self.loss, lab + (d, method)) for _, d in LOSS_DIRECTIONS]
            removals += [(self.jitter, lab + (method,))]
            self.owd.forget(lab, method)
        removals += [(g, lab) for g in (self.throughput, self.last_probe)]
        self.loss_window.forget(lab)
        for gauge, labels in removals:
            try:
                gauge.remove(*labels)
            except KeyError:
                pass
        for key in [k for k in self._cache if k[0] == peer]:
            del self._cache[key]
        self._path_children.pop(peer, None)
        self._forget_path(lab)
        self._forget_fingerprints(peer, self._fingerprints.pop(peer, set()))

    def watch_refusals(self, source: Callable[[], dict[str, int]]) -> None:
        """``wanprobe_reflector_refusals_total{reason}``: ``source()`` (the reflector's refusal
        counts: not_allowed, unauthenticated, bad_key, over_limit, ...) at every scrape."""
        self.registry.register(_ScrapedCounters(
            "wanprobe_reflector_refusals", "Datagrams and connections the reflector refused, "
            "by reason.", ["reason"], lambda: {(k,): n for k, n in source().items()}))

    def watch_host_counters(self, source: Callable[[], dict[tuple[str, str], int]]) -> None:
        """``wanprobe_host_stat_total{source,counter}``: the host's NIC, RDMA and TCP counters
        as last read (raw; ``rate()`` in Prometheus handles resets), at every scrape."""
        self.registry.register(_ScrapedCounters(
            "wanprobe_host_stat", "A host counter (NIC, RDMA, TCP) as last read by the "
            "daemon; source is the counter group, e.g. netdevs.eth0.stats.", ["source", "counter"],
            source))

    def exposition(self) -> bytes:
        """The text format, as ``generate_latest`` writes it, label text reused (exposition.py)."""
        return self._exposition.render(self.registry)


class _ScrapedCounters:
    """A counter family read from ``source()`` when scraped, so the data path never touches the
    registry: ``{label values: count}``. Used for the reflector's refusals and the host's raw
    NIC/RDMA/TCP counters (exported as read, as node_exporter does; Prometheus takes rates)."""

    def __init__(self, name: str, help_text: str, labels: list[str],
                 source: Callable[[], dict[tuple[str, ...], int]]) -> None:
        self.name, self.help, self.labels, self.source = name, help_text, labels, source

    def describe(self):
        yield CounterMetricFamily(self.name, self.help, labels=self.labels)

    def collect(self):
        family = CounterMetricFamily(self.name, self.help, labels=self.labels)
        try:
            counts = self.source()
        except Exception:  # a scrape must never fail because of one source
            counts = {}
        for labels, n in sorted(counts.items()):
            family.add_metric(list(labels), n)
        yield family


class MetricsServer:
    """``/metrics`` and ``/healthz`` on the daemon's listener, served by the bounded HTTP server
    (``httpd/server.py``: connection cap, head and write timeouts, chunked writes). Other pages
    add routes to ``self.http`` (``route(path, handler, prefix=...)``) before ``start``.

    The exposition is built in a worker thread, so a large registry never stalls the event
    loop, and concurrent scrapes share one build (one body in memory however many ask)."""

    def __init__(self, metrics: DaemonMetrics, health: Callable[[], tuple[bool, dict]],
                 limits: HttpLimits | None = None) -> None:
        self.metrics = metrics
        self.health = health
        self.http = BoundedHttpServer(limits, name="metrics")
        self.http.route("/metrics", self._metrics)
        self.http.route("/healthz", self._healthz)
        self._building: asyncio.Future | None = None

    async def start(self, host: str, port: int) -> tuple[str, int]:
        return await self.http.start(host, port)

    async def close(self) -> None:
        await self.http.close()

    async def _metrics(self, _request: Request) -> Response:
        if self._building is None:  # the first scraper builds; the others wait for it
            loop = asyncio.get_running_loop()
            self._building = loop.run_in_executor(None, self.metrics.exposition)
            self._building.add_done_callback(lambda _f: setattr(self, "_building", None))
        body = await asyncio.shield(self._building)
        return Response(200, body, CONTENT_TYPE_LATEST)

    def _healthz(self, _request: Request) -> Response:
        ok, detail = self.health()
        return Response(200 if ok else 503, (json.dumps(detail) + "\n").encode(),
                        "application/json")
