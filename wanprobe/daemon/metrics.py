"""Prometheus metrics on the daemon's own registry and a tiny asyncio HTTP endpoint.

Names follow the Prometheus conventions (https://prometheus.io/docs/practices/naming/): base units
(seconds, bits per second, ratios 0..1), ``_total`` for counters, labels for peer, quantile,
direction and severity. Prometheus is the aggregation layer; the daemon only exposes.
``/metrics`` is the text exposition format; ``/healthz`` is 200 with a small JSON body while the
loop is alive and the last history flush succeeded, 503 otherwise.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

QUANTILES = (("min", "0"), ("p50", "0.5"), ("p90", "0.9"), ("p99", "0.99"), ("max", "1"))
SEVERITIES = ("critical", "warning", "info")
# Path series carry both ends' site and host, so fleet rules can aggregate by site pair.
PATH_LABELS = ("peer", "src_site", "src_host", "dst_site", "dst_host")
PATH_EVENTS = ("rerouted", "queueing")
MAX_FINGERPRINTS = 16   # per peer: ECMP fans out to a handful of paths, never more series


class DaemonMetrics:
    """Every metric the daemon exports, registered on ``registry`` (a fresh one by default)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry(auto_describe=True)
        self.rtt = Gauge("wanprobe_rtt_seconds", "Round-trip time of the last probe session, "
                         "by quantile (0 = min, 1 = max).", ["peer", "quantile", "method"],
                         registry=r)
        self.loss = Gauge("wanprobe_loss_ratio", "Packet loss ratio of the last probe session; "
                          "direction is round_trip, forward (to the peer) or reverse.",
                          ["peer", "direction", "method"], registry=r)
        self.jitter = Gauge("wanprobe_jitter_seconds", "IPDV jitter (RFC 5481) of the last probe "
                            "session.", ["peer", "method"], registry=r)
        self.throughput = Gauge("wanprobe_throughput_bits_per_second", "Receiver goodput of the "
                                "last scheduled throughput test.", ["peer"], registry=r)
        self.probes = Counter("wanprobe_probe_sessions_total", "Probe sessions run.",
                              ["peer", "method"], registry=r)
        self.errors = Counter("wanprobe_probe_errors_total", "Probe sessions that failed "
                              "(timeout, unreachable, refused).", ["peer"], registry=r)
        self.last_probe = Gauge("wanprobe_last_probe_timestamp_seconds", "Unix time of the last "
                                "successful probe session.", ["peer"], registry=r)
        self.counter_rate = Gauge("wanprobe_counter_rate_per_second", "Per-second rate of a host "
                                  "counter between the last two samples.", ["source", "counter"],
                                  registry=r)
        self.findings = Gauge("wanprobe_findings", "Active findings (counter health rules and "
                              "path regressions) by severity.", ["severity"], registry=r)
        self.regressions = Counter("wanprobe_regressions_total", "Regressions detected against "
                                   "the rolling baseline.", ["peer", "metric"], registry=r)
        self.throughput_bytes = Counter("wanprobe_throughput_test_bytes_total", "Bytes moved by "
                                        "scheduled throughput tests.", ["peer"], registry=r)
        self.peers = Gauge("wanprobe_peers", "Peers currently probed.", registry=r)
        self.config_reloads = Counter("wanprobe_config_reloads_total", "SIGHUP reloads by result.",
                                      ["result"], registry=r)
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
                            "path (fingerprint: hash of the hop list), by quantile.",
                            ["peer", "fingerprint", "quantile"], registry=r)
        self.fp_loss = Gauge("wanprobe_path_fingerprint_loss_ratio", "Loss of the flows on one "
                             "path; direction round_trip, forward or reverse.",
                             ["peer", "fingerprint", "direction"], registry=r)
        self.fp_flows = Gauge("wanprobe_path_fingerprint_flows", "Probe flows (source ports) "
                              "hashed onto one path.", ["peer", "fingerprint"], registry=r)
        self._fingerprints: dict[str, set[str]] = {}
        self._path_labels: dict[str, tuple[str, ...]] = {}
        for sev in SEVERITIES:
            self.findings.labels(severity=sev).set(0)
        self._cache: dict[tuple[str, str], dict[str, Any]] = {}

    def _children(self, peer: str, method: str) -> dict[str, Any]:
        """Label children of one peer, looked up once: ``labels()`` costs more than ``set()``,
        and a daemon probing hundreds of peers does this for every session."""
        key = (peer, method)
        ch = self._cache.get(key)
        if ch is None:
            ch = self._cache[key] = {
                "sessions": self.probes.labels(peer=peer, method=method),
                "rtt": [(k, self.rtt.labels(peer=peer, quantile=q, method=method))
                        for k, q in QUANTILES],
                "loss": [(k, self.loss.labels(peer=peer, direction=d, method=method)) for k, d in
                         (("ratio", "round_trip"), ("forward_ratio", "forward"),
                          ("reverse_ratio", "reverse"))],
                "jitter": self.jitter.labels(peer=peer, method=method),
                "last": self.last_probe.labels(peer=peer),
            }
        return ch

    def observe_probe(self, peer: str, method: str, doc: dict[str, Any]) -> None:
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
        if doc.get("jitter_ms") is not None:
            ch["jitter"].set(doc["jitter_ms"] / 1e3)
        ch["last"].set(time.time())

    def observe_path(self, labels: dict[str, str], floor_ms: float | None,
                     spread_ms: float | None) -> None:
        """Export a peer's floor and spread (ms in, seconds out); ``labels`` has PATH_LABELS."""
        values = tuple(labels[k] for k in PATH_LABELS)
        if self._path_labels.get(labels["peer"], values) != values:
            self._forget_path(labels["peer"])
        self._path_labels[labels["peer"]] = values
        if floor_ms is not None:
            self.path_floor.labels(*values).set(floor_ms / 1e3)
        if spread_ms is not None:
            self.path_spread.labels(*values).set(spread_ms / 1e3)

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
            for key, q in (("p50", "0.5"), ("p99", "0.99")):
                if p.get("rtt_ms") and p["rtt_ms"].get(key) is not None:
                    self.fp_rtt.labels(peer, fp, q).set(p["rtt_ms"][key] / 1e3)
            for key, d in (("loss_ratio", "round_trip"), ("forward_ratio", "forward"),
                           ("reverse_ratio", "reverse")):
                if p.get(key) is not None:
                    self.fp_loss.labels(peer, fp, d).set(p[key])

    def _forget_fingerprints(self, peer: str, gone: set[str]) -> None:
        for fp in gone:
            for metric, tails in ((self.fp_flows, [()]), (self.fp_rtt, [("0.5",), ("0.99",)]),
                                  (self.fp_loss, [("round_trip",), ("forward",), ("reverse",)])):
                for tail in tails:
                    try:
                        metric.remove(peer, fp, *tail)
                    except KeyError:
                        pass

    def path_event(self, labels: dict[str, str], event: str) -> None:
        self.path_events.labels(*(labels[k] for k in PATH_LABELS), event).inc()

    def _forget_path(self, peer: str) -> None:
        values = self._path_labels.pop(peer, None)
        if values is None:
            return
        for metric, extra in ((self.path_floor, [()]), (self.path_spread, [()]),
                              (self.path_events, [(e,) for e in PATH_EVENTS])):
            for tail in extra:
                try:
                    metric.remove(*values, *tail)
                except KeyError:
                    pass

    def observe_probe_error(self, peer: str, method: str) -> None:
        self.probes.labels(peer=peer, method=method).inc()
        self.errors.labels(peer=peer).inc()

    def observe_throughput(self, peer: str, doc: dict[str, Any]) -> None:
        if doc.get("bits_per_second") is not None:
            self.throughput.labels(peer=peer).set(doc["bits_per_second"])
        from wanprobe.daemon.store import link_bytes

        moved = link_bytes(doc)
        if moved:
            self.throughput_bytes.labels(peer=peer).inc(moved)

    def observe_rates(self, flat_rates: dict[tuple[str, str], float]) -> None:
        self.counter_rate.clear()
        for (source, counter), value in flat_rates.items():
            self.counter_rate.labels(source=source, counter=counter).set(value)

    def set_findings(self, by_severity: dict[str, int]) -> None:
        for sev in set(SEVERITIES) | set(by_severity):
            self.findings.labels(severity=sev).set(by_severity.get(sev, 0))

    def forget_peer(self, peer: str) -> None:
        """Drop a removed peer's series so a stale value is not scraped forever."""
        removals = []
        for _, method in [k for k in self._cache if k[0] == peer]:
            removals += [(self.rtt, (peer, q, method)) for _, q in QUANTILES]
            removals += [(self.loss, (peer, d, method)) for d in ("round_trip", "forward", "reverse")]
            removals += [(self.jitter, (peer, method))]
        removals += [(g, (peer,)) for g in (self.throughput, self.last_probe)]
        for gauge, labels in removals:
            try:
                gauge.remove(*labels)
            except KeyError:
                pass
        for key in [k for k in self._cache if k[0] == peer]:
            del self._cache[key]
        self._forget_path(peer)
        self._forget_fingerprints(peer, self._fingerprints.pop(peer, set()))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class MetricsServer:
    """HTTP/1.0-style GET server for ``/metrics`` and ``/healthz`` on the daemon's event loop."""

    def __init__(self, metrics: DaemonMetrics, health: Callable[[], tuple[bool, dict]]) -> None:
        self.metrics = metrics
        self.health = health
        self._server: asyncio.base_events.Server | None = None

    async def start(self, host: str, port: int) -> tuple[str, int]:
        self._server = await asyncio.start_server(self._handle, host, port, reuse_address=True)
        return self._server.sockets[0].getsockname()[:2]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(5.0):
                head = await reader.readuntil(b"\r\n\r\n")
            request_line = head.split(b"\r\n", 1)[0].decode("latin-1").split()
            method, target = (request_line + ["", ""])[:2]
            path = target.split("?", 1)[0]
            if method not in ("GET", "HEAD"):
                status, ctype, body = "405 Method Not Allowed", "text/plain", b"GET only\n"
            elif path == "/metrics":
                status, ctype, body = "200 OK", CONTENT_TYPE_LATEST, self.metrics.exposition()
            elif path == "/healthz":
                ok, detail = self.health()
                status = "200 OK" if ok else "503 Service Unavailable"
                ctype, body = "application/json", (json.dumps(detail) + "\n").encode()
            else:
                status, ctype, body = "404 Not Found", "text/plain", b"try /metrics or /healthz\n"
            writer.write(f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: "
                         f"{len(body)}\r\nConnection: close\r\n\r\n".encode())
            if method != "HEAD":
                writer.write(body)
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        finally:
            writer.close()
